"""The device string of `Module(..., device=...)`, parsed once with errors that say what is accepted.

ORT takes "cpu", "cuda" or "cuda:N" and raises "Unsupported device type: X" for anything
else; torch would answer with its own list of a dozen device types, none of which is the
fix.  Other torch device strings are still accepted, for users who run on them knowingly.
"""

from __future__ import annotations

from typing import Union

import torch

from ..errors import InvalidArgumentError

ACCEPTED = '"cpu", "cuda" or "cuda:N"'


def parse_device(device: Union[str, torch.device]) -> torch.device:
    """The torch device for `device`; InvalidArgumentError naming it when it cannot be used."""
    if isinstance(device, torch.device):
        parsed = device
    elif isinstance(device, str):
        try:
            parsed = torch.device(device)
        except RuntimeError:
            raise InvalidArgumentError(_refusal(device)) from None
    else:
        raise TypeError(f"device must be a str such as {ACCEPTED}, got {type(device).__name__}")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidArgumentError(
                f"device {str(device)!r}: CUDA is not available to this torch ({torch.__version__}, "
                f'torch.cuda.is_available() is False). Use device="cpu", or install a CUDA build of torch.'
            )
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise InvalidArgumentError(
                f"device {str(device)!r}: there are {count} CUDA device(s) (cuda:0 to cuda:{count - 1})."
            )
    return parsed


def _refusal(device: str) -> str:
    """ORT's sentence for an unknown device type, or what is wrong with the index."""
    kind, _, index = device.partition(":")
    try:
        torch.device(kind)
    except RuntimeError:
        return f"Unsupported device type: {kind}. Use {ACCEPTED}."
    return f"Invalid device {device!r}: the index after ':' must be an integer >= 0. Use {ACCEPTED}."
