"""Converting user-facing values (numpy, OrtValue, torch) to tensors and back.

Outputs come back in the kind the inputs came in, as ORT's do: numpy for numpy inputs,
onnxruntime's own `OrtValue` for onnxruntime OrtValues (so `isinstance(out,
onnxruntime.OrtValue)` holds where onnxruntime is installed), our torch-backed `OrtValue`
for ours, and torch tensors for torch tensors.  String arrays stay numpy: torch has no
string tensors, and the engine parses them where the graph casts them.
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple, Union

import numpy as np
import torch

from ..engine.io_spec import StepInput, is_string_array
from ..errors import InvalidInputError
from .ortvalue import OrtValue


def _is_onnxruntime_value(value: Any) -> bool:
    """onnxruntime's OrtValue (or its C.OrtValue), recognised without importing onnxruntime."""
    return type(value).__module__.startswith("onnxruntime") and callable(getattr(value, "numpy", None))


def to_tensor(value: Any, what: str) -> StepInput:
    """A tensor view of `value` without copying where possible (numpy shares memory)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, OrtValue):
        return value.to_torch()
    if isinstance(value, np.ndarray):
        if is_string_array(value):
            return value
        return torch.from_numpy(value if value.flags.c_contiguous and value.flags.writeable else np.array(value))
    numpy_method = getattr(value, "numpy", None)
    if callable(numpy_method):  # onnxruntime's own OrtValue (or C.OrtValue)
        array = np.array(numpy_method())
        return array if is_string_array(array) else torch.from_numpy(array)
    raise InvalidInputError(f"{what}: expected a numpy array, OrtValue or torch tensor, got {type(value).__name__}")


def to_tensors(values: Sequence[Any]) -> Tuple[List[StepInput], str]:
    """Tensors for `values` (None skipped, as ORT does) and the kind of value to return."""
    present = [v for v in values if v is not None]
    if any(isinstance(v, np.ndarray) for v in present):
        kind = "numpy"
    elif present and all(isinstance(v, torch.Tensor) for v in present):
        kind = "torch"
    elif any(_is_onnxruntime_value(v) for v in present):
        kind = "onnxruntime"
    else:
        kind = "ortvalue"
    return [to_tensor(v, f"input {i}") for i, v in enumerate(present)], kind


def outputs_as(tensors: Sequence[torch.Tensor], kind: str) -> list:
    """The outputs as a list of values of `kind` (see `to_tensors`).

    onnxruntime OrtValues are CPU copies in memory onnxruntime owns: one that borrowed the
    tensor's memory (`ortvalue_from_numpy`) would leave `module(...).numpy()` pointing at
    freed memory once the temporary OrtValue is gone, since ORT's `numpy()` is a view.
    """
    if kind == "numpy":
        return [t.detach().cpu().numpy() for t in tensors]
    if kind == "torch":
        return list(tensors)
    if kind == "onnxruntime":
        from onnxruntime import OrtValue as OnnxRuntimeOrtValue

        return [_onnxruntime_copy(OnnxRuntimeOrtValue, t.detach().cpu().numpy()) for t in tensors]
    return [OrtValue(t) for t in tensors]


def _onnxruntime_copy(ortvalue_class: Any, array: np.ndarray) -> Any:
    value = ortvalue_class.ortvalue_from_shape_and_type(list(array.shape), array.dtype)
    value.update_inplace(np.ascontiguousarray(array))
    return value


def from_tensors(tensors: Sequence[torch.Tensor], kind: str) -> Union[Any, tuple]:
    """One value for a single output, else a tuple, in the kind the inputs came in."""
    values = outputs_as(tensors, kind)
    return values[0] if len(values) == 1 else tuple(values)
