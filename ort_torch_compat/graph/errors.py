"""Errors raised while turning an ONNX graph into a torch module."""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Tuple

from ..errors import ModelLoadError


class GraphConversionError(ModelLoadError):
    """The ONNX graph cannot be turned into a torch module (bad wiring, bad model): a
    ModelLoadError (so RuntimeError and ValueError too), like every other artifact problem."""


class UnsupportedOperatorError(GraphConversionError):
    """Raised once per model, listing *every* operator no converter handles.

    Listing all of them at Module creation (rather than failing on the first, or worse,
    mid-training) lets a user judge the whole porting effort in one go.
    """

    def __init__(
        self,
        model_name: str,
        missing: Iterable[Tuple[str, str, int]],
        reasons: Optional[Mapping[Tuple[str, str, int], str]] = None,
    ):
        self.missing = sorted(set(missing))
        reasons = reasons or {}
        listed = ", ".join(
            f"({domain or 'ai.onnx'}, {op}, opset {version}" + (f": {reasons[key]})" if key in reasons else ")")
            for key in self.missing
            for domain, op, version in [key]
        )
        super().__init__(f"{model_name}: no converter for {len(self.missing)} operator(s): {listed}")
