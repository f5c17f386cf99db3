"""Exceptions shared by every layer.

ORT surfaces most misuse as `RuntimeError` subclasses (its pybind `Fail`,
`InvalidArgument`...).  Ours derive from RuntimeError too, so code that catches ORT's errors
keeps working, and from ValueError where the cause is a bad value the caller passed.
"""
from __future__ import annotations


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
