"""Which forward ops have a gradient builder, and through which inputs gradients flow.

Like onnx2torch's converter registry: each op family module registers its builders with
``@register("Relu")``; the builder gets a :class:`~.context.GradientContext` for one node
and emits that node's backward nodes.  ``inputs`` names the differentiable input slots
(default: every floating-point input); reachability only follows those, so integer
indices, shapes and masks never ask for gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence, Tuple

import onnx

if TYPE_CHECKING:  # pragma: no cover
    from .context import GradientContext

GradientFunction = Callable[["GradientContext"], None]
InputSelector = Callable[[onnx.NodeProto, int], Sequence[int]]

ONNX_DOMAIN = ""
MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class GradientBuilder:
    op_type: str
    domain: str
    build: GradientFunction
    inputs: Optional[InputSelector]  # None: every input may carry a gradient

    def differentiable_inputs(self, node: onnx.NodeProto, opset: int) -> Sequence[int]:
        if self.inputs is None:
            return range(len(node.input))
        return self.inputs(node, opset)


_REGISTRY: Dict[Tuple[str, str], GradientBuilder] = {}


def canonical_domain(domain: str) -> str:
    return ONNX_DOMAIN if domain in ("", "ai.onnx") else domain


def register(*op_types: str, domain: str = ONNX_DOMAIN, inputs: "Sequence[int] | InputSelector | None" = None):
    """Decorator registering a gradient builder for ``op_types`` in ``domain``.

    ``inputs`` is a tuple of differentiable input indices, or a function
    ``(node, opset) -> indices`` when that depends on the node, or None for all inputs.
    """
    if inputs is None or callable(inputs):
        selector = inputs
    else:
        fixed = tuple(inputs)
        selector = lambda node, opset: [i for i in fixed if i < len(node.input)]  # noqa: E731

    def decorate(function: GradientFunction) -> GradientFunction:
        for op_type in op_types:
            key = (canonical_domain(domain), op_type)
            if key in _REGISTRY:
                raise ValueError(f"gradient builder for {key} registered twice")
            _REGISTRY[key] = GradientBuilder(op_type, canonical_domain(domain), function, selector)
        return function

    return decorate


def lookup(node: onnx.NodeProto) -> Optional[GradientBuilder]:
    _load_op_families()
    return _REGISTRY.get((canonical_domain(node.domain), node.op_type))


def supported_ops() -> Sequence[Tuple[str, str]]:
    """Every ``(domain, op_type)`` with a gradient builder, sorted ("" is ai.onnx)."""
    _load_op_families()
    return sorted(_REGISTRY)


def _load_op_families() -> None:
    from . import ops  # noqa: F401  (importing registers every family)
