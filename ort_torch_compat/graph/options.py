"""Choices, made when a Module is built, that change what a converted graph computes.

They reach the converters through a context variable set by `build_graph_module` for the
duration of one conversion, so converters keep onnx2torch's `(node, graph)` signature.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterator

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


def current() -> ConversionOptions:
    """The options of the conversion in progress (the defaults outside one)."""
    return _CURRENT.get()


@contextlib.contextmanager
def converting_with(options: ConversionOptions) -> Iterator[None]:
    token = _CURRENT.set(options)
    try:
        yield
    finally:
        _CURRENT.reset(token)
