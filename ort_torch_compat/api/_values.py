"""Converting user-facing values (numpy, OrtValue, torch) to tensors and back."""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np
import torch

from ..engine.io_spec import tensor_from_array
from ..errors import InvalidInputError
from .ortvalue import OrtValue


def to_tensor(value: Any, what: str) -> torch.Tensor:
    """A tensor view of `value` without copying where possible (numpy shares memory)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, OrtValue):
        return value.to_torch()
    if isinstance(value, np.ndarray):
        return tensor_from_array(value, what)
    numpy_method = getattr(value, "numpy", None)
    if callable(numpy_method):  # onnxruntime's own OrtValue (or C.OrtValue)
        return torch.from_numpy(np.array(numpy_method()))
    raise InvalidInputError(f"{what}: expected a numpy array, OrtValue or torch tensor, got {type(value).__name__}")


def to_tensors(values: Sequence[Any]) -> Tuple[List[torch.Tensor], str]:
    """Tensors for `values` (None skipped, as ORT does) and the kind of value to return."""
    present = [v for v in values if v is not None]
    if any(isinstance(v, np.ndarray) for v in present):
        kind = "numpy"
    elif present and all(isinstance(v, torch.Tensor) for v in present):
        kind = "torch"
    else:
        kind = "ortvalue"
    return [to_tensor(v, f"input {i}") for i, v in enumerate(present)], kind


def from_tensors(tensors: Sequence[torch.Tensor], kind: str):
    """One value for a single output, else a tuple, in the kind the inputs came in."""
    if kind == "numpy":
        values = [t.cpu().numpy() for t in tensors]
    elif kind == "torch":
        values = list(tensors)
    else:
        values = [OrtValue(t) for t in tensors]
    return values[0] if len(values) == 1 else tuple(values)
