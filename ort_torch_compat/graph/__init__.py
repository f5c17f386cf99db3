"""ONNX graph -> torch module conversion (the engine's only view of ONNX graphs)."""

from . import _onnx2torch_import  # noqa: F401  (first: loads onnx2torch without torchvision)
from .errors import GraphConversionError, UnsupportedOperatorError
from .module_builder import build_graph_module, missing_operators
from .options import GRADIENT_MODES
from .running_stats import detach_unowned_running_stats
from .subgraph import forward_graph

__all__ = [
    "build_graph_module",
    "missing_operators",
    "forward_graph",
    "detach_unowned_running_stats",
    "GraphConversionError",
    "UnsupportedOperatorError",
    "GRADIENT_MODES",
]
