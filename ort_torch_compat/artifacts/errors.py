"""Errors of artifact generation.  All are raised before any file is written."""
from __future__ import annotations

from typing import List, Sequence, Tuple

from ..errors import OrtTorchCompatError


class ArtifactGenerationError(OrtTorchCompatError, ValueError):
    """The model or the arguments cannot make training artifacts (the message says which part)."""


class UnsupportedGradientError(ArtifactGenerationError):
    """Ops on the path from the trainable parameters to the loss that have no gradient builder.

    ``ops`` lists ``(domain, op_type, node name, reason)`` for every such node, so one error
    names all of them.
    """

    def __init__(self, ops: Sequence[Tuple[str, str, str, str]]):
        self.ops: List[Tuple[str, str, str, str]] = list(ops)
        kinds = sorted({f"{domain}::{op}" if domain not in ("", "ai.onnx") else op for domain, op, _, _ in self.ops})
        lines = [f"  {op} (node {name!r}): {reason}" for _, op, name, reason in self.ops]
        super().__init__(
            f"cannot build the gradient graph: no gradient for {', '.join(kinds)}\n" + "\n".join(lines))
