"""Exceptions shared by every layer.

ORT surfaces most misuse as `RuntimeError` subclasses (its pybind `Fail`,
`InvalidArgument`...).  Ours derive from RuntimeError too, so code that catches ORT's errors
keeps working, and from ValueError where the cause is a bad value the caller passed.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple


class OrtTorchCompatError(RuntimeError):
    """Base of this library's own errors."""


class ModelLoadError(OrtTorchCompatError, ValueError):
    """An artifact file is missing, unreadable, not ONNX, or not the kind of model expected."""


class ModelMismatchError(OrtTorchCompatError, ValueError):
    """Artifacts disagree with each other or with the checkpoint (names, shapes, dtypes)."""


class InvalidInputError(OrtTorchCompatError, ValueError):
    """A step got the wrong number, dtype or shape of inputs, or a bad buffer."""


class NominalStateError(OrtTorchCompatError):
    """Values were needed from a nominal checkpoint state before parameters were loaded."""


class ReleasedError(OrtTorchCompatError):
    """A released session or state was used."""


class InvalidArgumentError(OrtTorchCompatError, ValueError):
    """An argument other than a step input is invalid (a device string, export output names)."""


class ArtifactGenerationError(OrtTorchCompatError, ValueError):
    """The model or the arguments cannot make training artifacts (the message says which part).

    Raised by `generate_artifacts` and the onnxblock training block before any file is written.
    """


class UnsupportedGradientError(ArtifactGenerationError):
    """Ops on the path from the trainable parameters to the loss that have no gradient builder.

    ``ops`` lists ``(domain, op_type, node name, reason)`` for every such node, so one error
    names all of them.
    """

    def __init__(self, ops: Sequence[Tuple[str, str, str, str]]):
        self.ops: List[Tuple[str, str, str, str]] = list(ops)
        kinds = sorted({f"{domain}::{op}" if domain not in ("", "ai.onnx") else op for domain, op, _, _ in self.ops})
        lines = [f"  {op} (node {name!r}): {reason}" for _, op, name, reason in self.ops]
        super().__init__(f"cannot build the gradient graph: no gradient for {', '.join(kinds)}\n" + "\n".join(lines))
