"""Errors raised while turning an ONNX graph into a torch module."""
from __future__ import annotations

from typing import Iterable, Tuple


class GraphConversionError(RuntimeError):
    """The ONNX graph cannot be turned into a torch module (bad wiring, bad model)."""


class UnsupportedOperatorError(GraphConversionError):
    """Raised once per model, listing *every* operator no converter handles.

    Listing all of them at Module creation (rather than failing on the first, or worse,
    mid-training) lets a user judge the whole porting effort in one go.
    """

    def __init__(self, model_name: str, missing: Iterable[Tuple[str, str, int]]):
        self.missing = sorted(set(missing))
        listed = ", ".join(f"({domain or 'ai.onnx'}, {op}, opset {version})" for domain, op, version in self.missing)
        super().__init__(f"{model_name}: no converter for {len(self.missing)} operator(s): {listed}")
