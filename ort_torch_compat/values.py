"""The values every user-facing surface takes and returns: `OrtValue`, and the conversion of
numpy arrays, OrtValues and torch tensors to tensors and back.

`api/`, `session.py` and `legacy/` all accept the three kinds and answer in the kind they
were given, so the rule lives here, once, below all three.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple, Union

import numpy as np
import torch

from .engine.io_spec import StepInput, tensor_from_array, torch_type_name
from .errors import InvalidInputError


def _device(device_type: str, device_id: int) -> torch.device:
    return torch.device("cpu") if device_type == "cpu" else torch.device(device_type, device_id)


class OrtValue:
    """A torch-backed stand-in for ORT's `OrtValue`, with its accessors (`numpy()`, `shape()`,
    `data_type()`...).  Holding a torch tensor (not a numpy copy) keeps values on the
    engine's device: a training loop that passes OrtValues pays no host round trip per step.
    """

    def __init__(self, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"OrtValue wraps a torch.Tensor, got {type(tensor).__name__}")
        self._tensor = tensor

    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0) -> "OrtValue":
        tensor = torch.from_numpy(np.ascontiguousarray(numpy_obj))
        return cls(tensor.to(_device(device_type, device_id)))

    @classmethod
    def ortvalue_from_shape_and_type(
        cls, shape: Sequence[int], element_type=np.float32, device_type: str = "cpu", device_id: int = 0
    ) -> "OrtValue":
        dtype = torch.from_numpy(np.empty(0, dtype=element_type)).dtype
        return cls(torch.empty(tuple(shape), dtype=dtype, device=_device(device_type, device_id)))

    @classmethod
    def from_torch(cls, tensor: torch.Tensor) -> "OrtValue":
        return cls(tensor)

    def to_torch(self) -> torch.Tensor:
        """The underlying tensor (shared, not copied)."""
        return self._tensor

    def numpy(self) -> np.ndarray:
        return self._tensor.detach().cpu().numpy()

    def shape(self) -> list:
        return list(self._tensor.shape)

    def data_type(self) -> str:
        return torch_type_name(self._tensor.dtype)

    def element_type(self) -> type:
        return self.numpy().dtype.type

    def device_name(self) -> str:
        return self._tensor.device.type

    def is_tensor(self) -> bool:
        return True

    def has_value(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()}, device={self._tensor.device})"


def _is_onnxruntime_value(value: Any) -> bool:
    """onnxruntime's OrtValue (or its C.OrtValue), recognised without importing onnxruntime."""
    return type(value).__module__.startswith("onnxruntime") and callable(getattr(value, "numpy", None))


def to_tensor(value: Any, what: str) -> StepInput:
    """A tensor view of `value` without copying where possible (numpy shares memory);
    string arrays stay numpy (torch has no strings; the engine parses them where the graph
    casts them)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, OrtValue):
        return value.to_torch()
    if isinstance(value, np.ndarray):
        return tensor_from_array(value)
    numpy_method = getattr(value, "numpy", None)
    if callable(numpy_method):  # onnxruntime's own OrtValue (or C.OrtValue)
        return tensor_from_array(np.array(numpy_method()))
    raise InvalidInputError(f"{what}: expected a numpy array, OrtValue or torch tensor, got {type(value).__name__}")


def to_numpy(value: Any) -> np.ndarray:
    """A numpy array for any value a user may pass (numpy, OrtValue, torch tensor, list, scalar);
    host tensors and arrays are not copied."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    numpy_method = getattr(value, "numpy", None)
    if callable(numpy_method):  # our OrtValue, or onnxruntime's
        return np.asarray(numpy_method())
    return np.asarray(value)


def to_tensors(values: Sequence[Any]) -> Tuple[List[StepInput], str]:
    """Tensors for `values` (None skipped, as ORT does) and the kind of value to return:
    outputs come back in the kind the inputs came in, as ORT's do ("numpy", "torch",
    "onnxruntime" for onnxruntime's own OrtValues, so `isinstance(out, onnxruntime.OrtValue)`
    holds where it is installed, or "ortvalue" for ours)."""
    present = [v for v in values if v is not None]
    if present and all(type(v) is np.ndarray for v in present):  # ORT's usual feeds: the short way
        return [tensor_from_array(v) for v in present], "numpy"
    if present and all(type(v) is torch.Tensor for v in present):  # and torch's: taken as they are
        return present, "torch"
    if any(isinstance(v, np.ndarray) for v in present):
        kind = "numpy"
    elif present and all(isinstance(v, torch.Tensor) for v in present):
        kind = "torch"
    elif any(_is_onnxruntime_value(v) for v in present):
        kind = "onnxruntime"
    else:
        kind = "ortvalue"
    return [to_tensor(v, f"input {i}") for i, v in enumerate(present)], kind


def values_as(tensors: Sequence[torch.Tensor], kind: str) -> list:
    """`tensors` as a list of values of `kind` (see `to_tensors`).

    onnxruntime OrtValues are CPU copies in memory onnxruntime owns: one that borrowed the
    tensor's memory (`ortvalue_from_numpy`) would leave `module(...).numpy()` pointing at
    freed memory once the temporary OrtValue is gone, since ORT's `numpy()` is a view.
    """
    if kind == "numpy":  # host tensors without autograd (a step's outputs) are viewed directly
        return [t.numpy() if t.is_cpu and not t.requires_grad else t.detach().cpu().numpy() for t in tensors]
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
    values = values_as(tensors, kind)
    return values[0] if len(values) == 1 else tuple(values)
