"""Federated training of ORT artifacts on Flower (``pip install "ort_torch_compat[federated]"``).

Devices run ORT training artifacts (with onnxruntime-training or with this library); Flower
runs the federation: `OrtClient` / `ort_client_app` on the devices, `server_app` with
Flower's strategies (FedAvg by default, wrapped by `CheckpointStrategy`) on the server, which
starts from an ORT checkpoint and writes the global model as an ORT checkpoint every round.
`run_simulation` runs a federation in one process.  See docs/federated.md.
"""

try:
    from flwr import __version__ as FLWR_VERSION
except ImportError as error:  # pragma: no cover  (exercised by tests in a subprocess)
    raise ImportError(
        "ort_torch_compat.federated needs Flower (flwr), which is not installed: "
        'pip install "ort_torch_compat[federated]"'
    ) from error

from .client import ArtifactPaths, OrtClient, client_app, ort_client_app  # noqa: E402
from .params import PARAM_NAMES_KEY, ParameterSpec  # noqa: E402
from .server import CheckpointStrategy, RejectedUpdate, server_app  # noqa: E402
from .simulation import InProcessBackend, run_simulation  # noqa: E402

__all__ = [
    "FLWR_VERSION",
    "ArtifactPaths",
    "OrtClient",
    "client_app",
    "ort_client_app",
    "ParameterSpec",
    "PARAM_NAMES_KEY",
    "CheckpointStrategy",
    "RejectedUpdate",
    "server_app",
    "InProcessBackend",
    "run_simulation",
]
