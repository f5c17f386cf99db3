"""Choices, made when a Module is built, that change what a converted graph computes, and the
model's opsets (which converters of subgraph-carrying ops need to convert their bodies).

They reach the converters through context variables set by `build_graph_module` for the
duration of one conversion, so converters keep onnx2torch's `(node, graph)` signature.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Dict, Iterator

GRADIENT_MODES = ("ort", "exact")


@dataclass(frozen=True)
class ConversionOptions:
    """`gradients`: "ort" reproduces ONNX Runtime 1.19.2's gradients where they are not the
    derivative of its own forward (see ..gradient_quirks; the Dropout one first of all);
    "exact" differentiates what the forward computes."""

    gradients: str = "ort"

    def __post_init__(self) -> None:
        if self.gradients not in GRADIENT_MODES:
            raise ValueError(f"gradients must be one of {GRADIENT_MODES}, got {self.gradients!r}")


_CURRENT: contextvars.ContextVar[ConversionOptions] = contextvars.ContextVar(
    "ort_torch_compat_conversion_options", default=ConversionOptions()
)


_OPSETS: contextvars.ContextVar[Dict[str, int]] = contextvars.ContextVar("ort_torch_compat_opsets", default={})


def current() -> ConversionOptions:
    """The options of the conversion in progress (the defaults outside one)."""
    return _CURRENT.get()


def current_opsets() -> Dict[str, int]:
    """The opsets of the model being converted (domain -> version)."""
    return _OPSETS.get()


@contextlib.contextmanager
def converting_with(options: ConversionOptions, opsets: Dict[str, int]) -> Iterator[None]:
    tokens = _CURRENT.set(options), _OPSETS.set(dict(opsets))
    try:
        yield
    finally:
        _CURRENT.reset(tokens[0])
        _OPSETS.reset(tokens[1])
