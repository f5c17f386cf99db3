"""Graph input/output declarations and the checks a step applies to user inputs.

Checks are precomputed per input (dtype plus the fixed dims) so a step pays only a few
comparisons; like ORT there is no implicit cast, and errors say which input is wrong.
String inputs stay numpy arrays (torch has no string tensors) until `string_inputs`
converts them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
import torch

from ..codec.dtypes import torch_dtype
from ..errors import InvalidInputError

ONNX_TYPE_NAMES = {v: k.lower() for k, v in onnx.TensorProto.DataType.items()}
STRING = onnx.TensorProto.STRING
StepInput = Union[torch.Tensor, np.ndarray]  # numpy only for string inputs


def is_string_array(value: object) -> bool:
    """True for the numpy arrays ORT feeds as a string tensor (str, bytes or object elements)."""
    return isinstance(value, np.ndarray) and value.dtype.kind in ("U", "S", "O")


@dataclass(frozen=True)
class ValueSpec:
    name: str
    elem_type: int                      # ONNX TensorProto data type code (0 = unknown)
    shape: Optional[Tuple[Optional[int], ...]]  # None = rank unknown; None dims are symbolic

    @property
    def dtype(self) -> Optional[torch.dtype]:
        return torch_dtype(self.elem_type) if self.elem_type and self.elem_type != STRING else None

    @property
    def type_name(self) -> str:
        return f"tensor({ONNX_TYPE_NAMES.get(self.elem_type, 'undefined')})"


def value_spec(info: onnx.ValueInfoProto) -> ValueSpec:
    tensor_type = info.type.tensor_type
    shape = None
    if tensor_type.HasField("shape"):
        shape = tuple(dim.dim_value if dim.HasField("dim_value") else None for dim in tensor_type.shape.dim)
    return ValueSpec(info.name, tensor_type.elem_type, shape)


def check_inputs(specs: Sequence[ValueSpec], tensors: Sequence[StepInput], step: str) -> None:
    """Raise InvalidInputError naming the first input whose count, dtype or shape is wrong."""
    if len(tensors) != len(specs):
        names = [spec.name for spec in specs]
        raise InvalidInputError(f"{step} expects {len(specs)} input(s) {names}, got {len(tensors)}")
    for spec, tensor in zip(specs, tensors):
        dtype = spec.dtype
        strings = is_string_array(tensor)
        if (spec.elem_type == STRING) != strings or (dtype is not None and tensor.dtype != dtype):
            actual = f"numpy {tensor.dtype} array" if strings else tensor.dtype
            raise InvalidInputError(
                f"{step}: unexpected input data type for '{spec.name}'. Actual: {actual}, expected: {spec.type_name}"
            )
        shape = spec.shape
        if shape is None:
            continue
        actual = tuple(tensor.shape)
        if len(actual) != len(shape) or any(want is not None and want != got for want, got in zip(shape, actual)):
            expected = tuple("?" if d is None else d for d in shape)
            raise InvalidInputError(
                f"{step}: got invalid dimensions for input '{spec.name}': {list(actual)}, expected {list(expected)}"
            )


def names(specs: Sequence[ValueSpec]) -> List[str]:
    return [spec.name for spec in specs]
