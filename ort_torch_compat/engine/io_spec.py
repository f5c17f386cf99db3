"""Graph input/output declarations and the checks a step applies to user inputs.

Checks are precomputed per input (dtype plus the fixed dims) so a step pays only a few
comparisons; like ORT there is no implicit cast, and errors say which input is wrong.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ..codec.dtypes import torch_dtype
from ..errors import InvalidInputError

if TYPE_CHECKING:
    import onnx


class _OnnxTypeNames(Mapping):
    """ONNX's element type names by code ('float', 'int64', ...), read from onnx on first use
    (importing onnx costs about 0.1 s, which `import ort_torch_compat.api` does not pay)."""

    @functools.cached_property
    def _names(self) -> Dict[int, str]:
        import onnx

        return {v: k.lower() for k, v in onnx.TensorProto.DataType.items()}

    def __getitem__(self, code: int) -> str:
        return self._names[code]

    def __iter__(self) -> Iterator[int]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


ONNX_TYPE_NAMES = _OnnxTypeNames()


@dataclass(frozen=True)
class ValueSpec:
    name: str
    elem_type: int                      # ONNX TensorProto data type code (0 = unknown)
    shape: Optional[Tuple[Optional[int], ...]]  # None = rank unknown; None dims are symbolic

    @property
    def dtype(self) -> Optional[torch.dtype]:
        return torch_dtype(self.elem_type) if self.elem_type else None

    @property
    def type_name(self) -> str:
        return f"tensor({ONNX_TYPE_NAMES.get(self.elem_type, 'undefined')})"


def value_spec(info: "onnx.ValueInfoProto") -> ValueSpec:
    tensor_type = info.type.tensor_type
    shape = None
    if tensor_type.HasField("shape"):
        shape = tuple(dim.dim_value if dim.HasField("dim_value") else None for dim in tensor_type.shape.dim)
    return ValueSpec(info.name, tensor_type.elem_type, shape)


def check_inputs(specs: Sequence[ValueSpec], tensors: Sequence[torch.Tensor], step: str) -> None:
    """Raise InvalidInputError naming the first input whose count, dtype or shape is wrong."""
    if len(tensors) != len(specs):
        names = [spec.name for spec in specs]
        raise InvalidInputError(f"{step} expects {len(specs)} input(s) {names}, got {len(tensors)}")
    for spec, tensor in zip(specs, tensors):
        dtype = spec.dtype
        if dtype is not None and tensor.dtype != dtype:
            raise InvalidInputError(
                f"{step}: unexpected input data type for '{spec.name}'. Actual: {tensor.dtype}, expected: {spec.type_name}"
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
