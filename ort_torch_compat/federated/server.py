"""The server side: Flower's `ServerApp` and strategies, with ORT checkpoints in and out.

`CheckpointStrategy` wraps any of Flower's (legacy, NumPy-parameter) strategies, FedAvg by
default, and leaves the aggregation to it.  What it adds:

* the initial global parameters are read from an ORT checkpoint (the trainable parameters,
  in the checkpoint's order);
* every client gets the parameter names, its round number, the local epochs and the learning
  rate in its fit config;
* before the wrapped strategy aggregates, each update is checked (names, count, shapes, dtype
  kind, finite values); a bad one is moved to the round's failures with its reason logged, so
  Flower's failure handling (``accept_failures``, ``min_fit_clients``) decides the round;
* after every round the global model is written as an ORT checkpoint,
  ``<out_dir>/round_<r>/global/checkpoint`` (no optimizer state: a device resumes from it with
  a fresh optimizer), beside ``num_examples.json`` (the accepted clients' example counts) and
  ``metrics.json``.  A non-finite aggregate is never written: the previous global model stays.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from typing import Callable, Dict, List, Optional, Tuple, Union

from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg, Strategy

from ..api import CheckpointState
from .client import CLIENT_ID_KEY, EPOCHS_KEY, LR_KEY, ROUND_KEY
from .params import PARAM_NAMES_KEY, ParameterSpec, assign_arrays, trainable_arrays, write_checkpoint

logger = logging.getLogger("ort_torch_compat.federated")


class RejectedUpdate(Exception):
    """A client's update that failed the checks (listed among the round's failures)."""

    def __init__(self, client_id: str, reason: str):
        super().__init__(f"update of client {client_id} rejected: {reason}")
        self.client_id = client_id
        self.reason = reason


class CheckpointStrategy(Strategy):
    """Flower strategy wrapper: ORT checkpoint in, checked updates, ORT checkpoint out per round."""

    def __init__(
        self,
        checkpoint: Union[str, os.PathLike],
        out_dir: Optional[Union[str, os.PathLike]] = None,
        strategy: Optional[Strategy] = None,
        *,
        local_epochs: int = 1,
        learning_rate: Optional[float] = None,
    ):
        self.state = CheckpointState.load_checkpoint(checkpoint)
        self.spec = ParameterSpec.from_state(self.state)
        self.out_dir = None if out_dir is None else pathlib.Path(out_dir)
        self.inner = (
            strategy
            if strategy is not None
            else FedAvg(min_fit_clients=1, min_evaluate_clients=1, min_available_clients=1)
        )
        self.local_epochs = int(local_epochs)
        self.learning_rate = learning_rate
        self.current: Parameters = ndarrays_to_parameters(trainable_arrays(self.state, self.spec))
        self.rejected: Dict[int, List[Tuple[str, str]]] = {}  # round -> [(client id, reason)]
        self.eval_losses: Dict[int, float] = {}  # round -> Flower's aggregated (federated) eval loss
        self._fit_metrics: Dict[int, Dict[str, Scalar]] = {}

    def __repr__(self) -> str:
        return f"CheckpointStrategy({self.inner!r})"

    # ---- parameters in --------------------------------------------------------------------
    def initialize_parameters(self, client_manager: ClientManager) -> Optional[Parameters]:
        # The checkpoint is the initial model (even where the wrapped strategy has its own).
        return self.current

    def _config(self, server_round: int) -> Dict[str, Scalar]:
        config: Dict[str, Scalar] = {
            PARAM_NAMES_KEY: self.spec.names_json(),
            ROUND_KEY: server_round,
            EPOCHS_KEY: self.local_epochs,
        }
        if self.learning_rate is not None:
            config[LR_KEY] = float(self.learning_rate)
        return config

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> List[Tuple[ClientProxy, FitIns]]:
        self.current = parameters
        pairs = self.inner.configure_fit(server_round, parameters, client_manager)
        return [(proxy, FitIns(ins.parameters, {**ins.config, **self._config(server_round)})) for proxy, ins in pairs]

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> List[Tuple[ClientProxy, EvaluateIns]]:
        pairs = self.inner.configure_evaluate(server_round, parameters, client_manager)
        return [
            (proxy, EvaluateIns(ins.parameters, {**ins.config, **self._config(server_round)})) for proxy, ins in pairs
        ]

    # ---- updates ----------------------------------------------------------------------------
    def _check(self, proxy: ClientProxy, res: FitRes) -> Optional[str]:
        try:
            arrays = parameters_to_ndarrays(res.parameters)  # np.load(allow_pickle=False): no pickles
        except Exception as error:  # noqa: BLE001  (any undecodable payload is a rejected update)
            return f"undecodable parameters ({type(error).__name__}: {error})"
        if not isinstance(res.num_examples, int) or res.num_examples <= 0:
            return f"num_examples must be a positive int, got {res.num_examples!r}"
        return self.spec.check(res.metrics.get(PARAM_NAMES_KEY), arrays)

    def aggregate_fit(
        self,
        server_round: int,
        results: List[Tuple[ClientProxy, FitRes]],
        failures: List[Union[Tuple[ClientProxy, FitRes], BaseException]],
    ):
        accepted, failures = [], list(failures)
        for proxy, res in results:
            client_id = str(res.metrics.get(CLIENT_ID_KEY, proxy.cid))
            reason = self._check(proxy, res)
            if reason is None:
                accepted.append((proxy, res))
            else:
                logger.warning("round %d: rejected the update of client %s: %s", server_round, client_id, reason)
                self.rejected.setdefault(server_round, []).append((client_id, reason))
                failures.append(RejectedUpdate(client_id, reason))
        for failure in failures:
            if isinstance(failure, RejectedUpdate):
                continue
            if isinstance(failure, BaseException):
                logger.warning("round %d: a client failed: %r", server_round, failure)
            else:  # (proxy, FitRes) with a non-OK status
                logger.warning(
                    "round %d: client %s failed: %s", server_round, failure[0].cid, failure[1].status.message
                )
        parameters, metrics = self.inner.aggregate_fit(server_round, accepted, failures) if accepted else (None, {})
        if parameters is not None:
            problem = self.spec.check_arrays(parameters_to_ndarrays(parameters))
            if problem:
                logger.error(
                    "round %d: the aggregate is unusable (%s); keeping the previous global model", server_round, problem
                )
                parameters = None
        if parameters is None:
            logger.warning("round %d: no aggregate; the global model is unchanged", server_round)
        else:
            parameters = ndarrays_to_parameters(self.spec.cast(parameters_to_ndarrays(parameters)))
            self.current = parameters
        self._write_round(server_round, accepted)
        return parameters, metrics

    def _write_round(self, server_round: int, accepted: List[Tuple[ClientProxy, FitRes]]) -> None:
        if self.out_dir is None:
            return
        assign_arrays(self.state, self.spec, parameters_to_ndarrays(self.current))
        self.state.properties["federated_round"] = server_round
        round_dir = self.out_dir / f"round_{server_round}"
        write_checkpoint(self.state, round_dir / "global" / "checkpoint", include_optimizer_state=False)
        counts = {str(res.metrics.get(CLIENT_ID_KEY, proxy.cid)): res.num_examples for proxy, res in accepted}
        (round_dir / "num_examples.json").write_text(json.dumps(counts, indent=1, sort_keys=True))
        rejected = [{"client": c, "reason": r} for c, r in self.rejected.get(server_round, [])]
        (round_dir / "rejected.json").write_text(json.dumps(rejected, indent=1))

    # ---- evaluation -------------------------------------------------------------------------
    def aggregate_evaluate(
        self,
        server_round: int,
        results: List[Tuple[ClientProxy, EvaluateRes]],
        failures: List[Union[Tuple[ClientProxy, EvaluateRes], BaseException]],
    ):
        loss, metrics = self.inner.aggregate_evaluate(server_round, results, failures)
        if loss is not None:
            self.eval_losses[server_round] = float(loss)
            logger.info("round %d: global eval loss %.5f (%d clients)", server_round, loss, len(results))
            if self.out_dir is not None:
                path = self.out_dir / "eval_loss.json"
                path.write_text(json.dumps({str(k): v for k, v in sorted(self.eval_losses.items())}, indent=1))
        return loss, metrics

    def evaluate(self, server_round: int, parameters: Parameters):
        return self.inner.evaluate(server_round, parameters)


def server_app(
    checkpoint: Union[str, os.PathLike, None] = None,
    out_dir: Union[str, os.PathLike, None] = None,
    *,
    num_rounds: int = 3,
    strategy_fn: Optional[Callable[[], Strategy]] = None,
    local_epochs: int = 1,
    learning_rate: Optional[float] = None,
    round_timeout: Optional[float] = None,
    on_strategy: Optional[Callable[[CheckpointStrategy], None]] = None,
):
    """A Flower `ServerApp` over an ORT checkpoint.

    Arguments left as None are read from the run config (``flwr run``'s
    ``[tool.flwr.app.config]``): ``checkpoint`` (or ``artifacts``, the folder that holds it), ``out-dir``, ``num-server-rounds``,
    ``local-epochs``, ``learning-rate``, ``min-clients``, ``round-timeout``.
    `strategy_fn()` builds the Flower strategy to wrap (FedAvg when None).
    `on_strategy` sees the `CheckpointStrategy` of each run (tests read its records).
    """
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig

    def server_fn(context) -> "ServerAppComponents":
        run = dict(context.run_config)
        ckpt = checkpoint if checkpoint is not None else run.get("checkpoint")
        if not ckpt and run.get("artifacts"):
            ckpt = pathlib.Path(str(run["artifacts"])) / "checkpoint"
        if not ckpt:
            raise ValueError("no initial ORT checkpoint: pass checkpoint= or set 'checkpoint' in the run config")
        out = out_dir if out_dir is not None else (run.get("out-dir") or None)
        rounds = int(run.get("num-server-rounds", num_rounds))
        epochs = int(run.get("local-epochs", local_epochs))
        lr = run.get("learning-rate", learning_rate)
        timeout = run.get("round-timeout", round_timeout)
        if strategy_fn is not None:
            inner = strategy_fn()
        else:
            clients = int(run.get("min-clients", 1))
            inner = FedAvg(min_fit_clients=clients, min_evaluate_clients=clients, min_available_clients=clients)
        strategy = CheckpointStrategy(
            ckpt, out, inner, local_epochs=epochs, learning_rate=None if lr is None else float(lr)
        )
        if on_strategy is not None:
            on_strategy(strategy)
        return ServerAppComponents(
            strategy=strategy,
            config=ServerConfig(num_rounds=rounds, round_timeout=None if timeout is None else float(timeout)),
        )

    return ServerApp(server_fn=server_fn)
