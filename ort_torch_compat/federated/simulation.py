"""Flower's Simulation Runtime, in one process, without Ray.

Flower's simulation (`flwr.simulation.run_simulation`) runs the ServerApp against an in-memory
SuperLink and hands each ClientApp message to a simulation *backend*; the only backend Flower
ships is Ray's (the ``flwr[simulation]`` extra: ray, about 230 MB installed, plus a Ray cluster
of processes per run).  `run_simulation` here runs the same Simulation Runtime with
`InProcessBackend`, an implementation of Flower's own `Backend` interface that calls the
ClientApp in the calling process, one message at a time: Flower's message routing, failure
handling and strategies are all unchanged.  ``backend="ray"`` runs Flower's own Ray backend.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Callable, Dict, Optional

from flwr.clientapp.client_app import ClientApp, ClientAppException, LoadClientAppError
from flwr.server.superlink.fleet.vce.backend import Backend, BackendConfig

_RAY_BACKEND_MODULE = "flwr.server.superlink.fleet.vce.backend.raybackend"


class InProcessBackend(Backend):
    """Runs each ClientApp message in this process, sequentially (one worker)."""

    def __init__(self, backend_config: BackendConfig) -> None:
        super().__init__(backend_config)
        self.app_fn: Optional[Callable[[], ClientApp]] = None

    def build(self, app_fn: Callable[[], ClientApp]) -> None:
        self.app_fn = app_fn

    @property
    def num_workers(self) -> int:
        return 1

    def is_worker_idle(self) -> bool:
        return True

    def terminate(self) -> None:
        self.app_fn = None

    def process_message(self, message, context):
        if self.app_fn is None:
            raise ValueError("InProcessBackend.build() was not called")
        try:
            app = self.app_fn()
            return app(message=message, context=context), context
        except LoadClientAppError:
            raise
        except Exception as error:  # as Ray's actor does: Flower reports it as the client's failure
            raise ClientAppException(str(error)) from error


@contextlib.contextmanager
def _in_process_backend():
    """Flower's Simulation Runtime builds its backend from ``raybackend.RayBackend`` (imported at
    run time); point that name at `InProcessBackend` for the duration of the run."""
    saved = sys.modules.get(_RAY_BACKEND_MODULE)
    stub = types.ModuleType(_RAY_BACKEND_MODULE)
    stub.RayBackend = InProcessBackend
    sys.modules[_RAY_BACKEND_MODULE] = stub
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop(_RAY_BACKEND_MODULE, None)
        else:
            sys.modules[_RAY_BACKEND_MODULE] = saved


def run_simulation(
    server_app,
    client_app: ClientApp,
    num_supernodes: int,
    *,
    backend: str = "inprocess",
    backend_config: Optional[Dict] = None,
    verbose_logging: bool = False,
) -> None:
    """Run `server_app` with `num_supernodes` simulated nodes of `client_app` (Flower's Simulation
    Runtime).  ``backend="inprocess"`` (default) needs no Ray; ``"ray"`` is Flower's own."""
    import warnings

    from flwr.simulation import run_simulation as flwr_run_simulation

    if backend not in ("inprocess", "ray"):
        raise ValueError(f"backend must be 'inprocess' or 'ray', got {backend!r}")
    context = _in_process_backend() if backend == "inprocess" else contextlib.nullcontext()
    with context, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        flwr_run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=num_supernodes,
            backend_name=backend,
            backend_config=backend_config or {},
            verbose_logging=verbose_logging,
        )
