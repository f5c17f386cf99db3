"""This library's gradient builder: ONNX forward graph -> ONNX gradient graph that ORT's training runtime runs.

``add_gradient_graph(model, requires_grad, loss_name)`` is the entry point; ``ops/`` holds
one module of gradient builders per op family, registered in ``registry``.
"""
from .builder import add_gradient_graph
from .registry import supported_ops

__all__ = ["add_gradient_graph", "supported_ops"]
