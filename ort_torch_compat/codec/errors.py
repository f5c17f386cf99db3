"""Exceptions raised by the checkpoint codec.

A corrupt checkpoint must fail with one predictable exception type whose message says
*which* file and *what* is wrong: users hit these when a download was cut short or a disk
filled up, and "unpack requires a buffer of 4 bytes" helps nobody.  ``CheckpointFormatError``
also subclasses ``ValueError`` so generic ``except ValueError`` handlers keep working.
"""

from __future__ import annotations

from ..errors import OrtTorchCompatError

__all__ = ["CheckpointError", "CheckpointFormatError"]


class CheckpointError(OrtTorchCompatError):
    """Base class of every error the checkpoint codec raises on purpose (part of the
    library's one family: `except OrtTorchCompatError` catches it)."""


class CheckpointFormatError(CheckpointError, ValueError, RuntimeError):
    """The bytes are not a valid ORT ``ODTC`` checkpoint (or its ``.data`` companion).

    ``source`` is the file path, or ``"<buffer>"`` when decoding bytes in memory, and
    ``reason`` the specific problem; ``str()`` gives ``"checkpoint <source>: <reason>"``.
    """

    def __init__(self, source: str, reason: str) -> None:
        # Both parts go to Exception.__init__ so the error pickles and copies cleanly.
        super().__init__(source, reason)
        self.source = source
        self.reason = reason

    def __str__(self) -> str:
        return f"checkpoint {self.source}: {self.reason}"
