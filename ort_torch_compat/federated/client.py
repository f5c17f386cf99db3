"""The device side: a Flower `NumPyClient` that trains ORT artifacts with this library.

Each `fit` is one device's round: take the global parameters (names and arrays checked),
start the optimizer afresh (as ORT does on a checkpoint without optimizer state), set the
learning rate the server chose (`Optimizer.set_learning_rate`), train `local_epochs` epochs on
the local data, and send the trainable parameters back with the number of examples they were
trained on.  `evaluate` runs the eval model on the local evaluation data.
"""

from __future__ import annotations

import os
import pathlib
import zlib
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np
from flwr.client import NumPyClient

from ..api import CheckpointState, Module, Optimizer
from .params import PARAM_NAMES_KEY, ParameterSpec, assign_arrays, trainable_arrays, write_checkpoint

Arrays = Sequence[np.ndarray]  # the model's inputs, labels last, all with the examples on axis 0

# The keys of the config the server sends (see server.py) and of the metrics a client returns.
ROUND_KEY = "server_round"
EPOCHS_KEY = "local_epochs"
LR_KEY = "learning_rate"
CLIENT_ID_KEY = "client_id"


class ArtifactPaths:
    """The four files of ORT training artifacts (generate_artifacts' names by default)."""

    def __init__(
        self,
        directory: Union[str, os.PathLike],
        *,
        checkpoint: str = "checkpoint",
        training_model: str = "training_model.onnx",
        eval_model: str = "eval_model.onnx",
        optimizer_model: str = "optimizer_model.onnx",
    ):
        root = pathlib.Path(directory)
        self.checkpoint = root / checkpoint
        self.training_model = root / training_model
        self.eval_model = root / eval_model
        self.optimizer_model = root / optimizer_model


def _examples(arrays: Optional[Arrays]) -> int:
    if not arrays:
        return 0
    counts = {len(a) for a in arrays}
    if len(counts) != 1:
        raise ValueError(f"data arrays disagree on the number of examples: {sorted(counts)}")
    return counts.pop()


def _loss(output) -> float:
    first = output[0] if isinstance(output, (list, tuple)) else output
    return float(np.asarray(first))


class OrtClient(NumPyClient):
    """Flower client over ORT training artifacts, trained by `ort_torch_compat.api`.

    `train_data` / `eval_data`: the model's inputs in order (the training model's, labels
    included), each with the examples on axis 0.  `checkpoint_dir`: where to keep the device's
    trained state of each round, `<dir>/round_<r>/client_<id>/checkpoint` (with optimizer state).
    """

    def __init__(
        self,
        artifacts: Union[str, os.PathLike, ArtifactPaths],
        train_data: Arrays,
        eval_data: Optional[Arrays] = None,
        *,
        batch_size: int = 32,
        client_id: Union[int, str] = 0,
        checkpoint_dir: Optional[Union[str, os.PathLike]] = None,
        seed: int = 0,
        device: str = "cpu",
    ):
        self.paths = artifacts if isinstance(artifacts, ArtifactPaths) else ArtifactPaths(artifacts)
        self.train_data = [np.asarray(a) for a in train_data]
        self.eval_data = None if eval_data is None else [np.asarray(a) for a in eval_data]
        self.num_train = _examples(self.train_data)
        self.num_eval = _examples(self.eval_data)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.client_id = client_id
        self.checkpoint_dir = None if checkpoint_dir is None else pathlib.Path(checkpoint_dir)
        self.seed = seed
        self.state = CheckpointState.load_checkpoint(self.paths.checkpoint)
        self.spec = ParameterSpec.from_state(self.state)
        self.module = Module(self.paths.training_model, self.state, self.paths.eval_model, device)
        self.optimizer = Optimizer(self.paths.optimizer_model, self.module)

    # ---- parameters ----------------------------------------------------------------------
    def _receive(self, parameters: Arrays, config: Dict) -> None:
        problem = self.spec.check(config.get(PARAM_NAMES_KEY), parameters)
        if problem:
            raise ValueError(f"client {self.client_id}: refusing the server's parameters: {problem}")
        assign_arrays(self.state, self.spec, parameters)

    def _reset_optimizer(self) -> None:
        """A fresh optimizer (zero moments, step 0): what ORT builds over a checkpoint without
        optimizer state, which is what the server's global checkpoint is."""
        self.state._state.optimizer = None
        self.optimizer = Optimizer(self.paths.optimizer_model, self.module)

    def get_parameters(self, config: Dict) -> list:
        return trainable_arrays(self.state, self.spec)

    # ---- rounds --------------------------------------------------------------------------
    def fit(self, parameters: Arrays, config: Dict) -> Tuple[list, int, Dict]:
        self._receive(parameters, config)
        self._reset_optimizer()
        if LR_KEY in config:
            self.optimizer.set_learning_rate(float(config[LR_KEY]))
        epochs = int(config.get(EPOCHS_KEY, 1))
        server_round = int(config.get(ROUND_KEY, 0))
        rng = np.random.default_rng([self.seed, server_round, zlib.crc32(str(self.client_id).encode())])
        self.module.train()
        total, seen = 0.0, 0
        for _ in range(epochs):
            order = rng.permutation(self.num_train)
            for start in range(0, self.num_train, self.batch_size):
                index = order[start : start + self.batch_size]
                loss = self.module(*[a[index] for a in self.train_data])
                self.optimizer.step()
                self.module.lazy_reset_grad()
                total += _loss(loss) * len(index)
                seen += len(index)
        if self.checkpoint_dir is not None:
            path = self.checkpoint_dir / f"round_{server_round}" / f"client_{self.client_id}" / "checkpoint"
            write_checkpoint(self.state, path, include_optimizer_state=True)
        metrics = {
            PARAM_NAMES_KEY: self.spec.names_json(),
            CLIENT_ID_KEY: str(self.client_id),
            "train_loss": total / max(seen, 1),
        }
        return trainable_arrays(self.state, self.spec), self.num_train, metrics

    def evaluate(self, parameters: Arrays, config: Dict) -> Tuple[float, int, Dict]:
        if not self.num_eval:
            raise ValueError(f"client {self.client_id} has no evaluation data")
        self._receive(parameters, config)
        self.module.eval()
        total = 0.0
        for start in range(0, self.num_eval, self.batch_size):
            batch = [a[start : start + self.batch_size] for a in self.eval_data]
            total += _loss(self.module(*batch)) * len(batch[0])
        return total / self.num_eval, self.num_eval, {CLIENT_ID_KEY: str(self.client_id)}


def client_app(client_fn: Callable[..., NumPyClient]):
    """A Flower `ClientApp` whose `client_fn(context)` builds the `NumPyClient` (e.g. an
    `OrtClient` over the node's local data: `context.node_config["partition-id"]` in
    simulation and on SuperNodes started with ``--node-config "partition-id=..."``)."""
    from flwr.client import ClientApp
    from flwr.common import Context

    def _client_fn(context: Context):
        return client_fn(context).to_client()

    return ClientApp(client_fn=_client_fn)


def ort_client_app(
    artifacts: Union[str, os.PathLike, ArtifactPaths],
    data_fn: Callable[..., Tuple[Arrays, Optional[Arrays]]],
    **client_kwargs,
):
    """The usual `ClientApp`: `data_fn(context)` returns the node's (train_data, eval_data);
    the client id is the node's partition-id (its node id when it has none)."""

    def make(context) -> OrtClient:
        train_data, eval_data = data_fn(context)
        client_id = context.node_config.get("partition-id", context.node_id)
        return OrtClient(artifacts, train_data, eval_data, client_id=client_id, **client_kwargs)

    return client_app(make)
