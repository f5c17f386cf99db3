"""This library's gradient builder: ONNX forward graph -> ONNX gradient graph that ORT's training runtime runs.

``add_gradient_graph(model, requires_grad, loss_name)`` is the entry point; ``ops/`` holds
one module of gradient builders per op family, registered in ``registry``.
"""

from typing import List, Tuple

from . import gradient_registry
from .backward_builder import add_gradient_graph
from .forward import REWRITTEN_OPS


def supported_ops() -> List[Tuple[str, str]]:
    """Every ``(domain, op_type)`` whose gradient can be built ("" is ai.onnx), sorted.

    Includes the ops the training model rewrites first (BatchNormalization, LSTM, GRU)
    besides those with a gradient builder of their own.
    """
    return sorted(set(gradient_registry.supported_ops()) | REWRITTEN_OPS)


__all__ = ["add_gradient_graph", "supported_ops"]
