"""ONNX graph -> torch module conversion (the engine's only view of ONNX graphs)."""
from .builder import build_graph_module, missing_operators
from .errors import GraphConversionError, UnsupportedOperatorError
from .subgraph import forward_graph

__all__ = ["build_graph_module", "missing_operators", "forward_graph", "GraphConversionError", "UnsupportedOperatorError"]
