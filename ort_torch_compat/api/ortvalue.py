"""A torch-backed stand-in for ORT's `OrtValue`, so OrtValue-style code keeps working.

Holding a torch tensor (not a numpy copy) keeps values on the engine's device: a training
loop that passes OrtValues pays no host round trip per step.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..codec.dtypes import code_from_torch
from ..engine.io_spec import ONNX_TYPE_NAMES


def _device(device_type: str, device_id: int) -> torch.device:
    return torch.device("cpu") if device_type == "cpu" else torch.device(device_type, device_id)


class OrtValue:
    """A tensor value with ORT's OrtValue accessors (`numpy()`, `shape()`, `data_type()`...)."""

    def __init__(self, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"OrtValue wraps a torch.Tensor, got {type(tensor).__name__}")
        self._tensor = tensor

    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0) -> "OrtValue":
        tensor = torch.from_numpy(np.ascontiguousarray(numpy_obj))
        return cls(tensor.to(_device(device_type, device_id)))

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape: Sequence[int], element_type=np.float32, device_type: str = "cpu",
                                     device_id: int = 0) -> "OrtValue":
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
        return f"tensor({ONNX_TYPE_NAMES[code_from_torch(self._tensor.dtype)]})"

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
