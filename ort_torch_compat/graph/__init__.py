"""ONNX graph -> torch module conversion (the engine's only view of ONNX graphs)."""
from . import _onnx2torch_import  # noqa: F401  (first: loads onnx2torch without torchvision)
from .builder import build_graph_module, missing_operators
from .errors import GraphConversionError, UnsupportedOperatorError
from .options import GRADIENT_MODES
from .subgraph import forward_graph

__all__ = ["build_graph_module", "missing_operators", "forward_graph", "GraphConversionError", "UnsupportedOperatorError",
           "GRADIENT_MODES"]
