"""Graph input/output declarations and the checks a step applies to user inputs.

Checks are precomputed per input (dtype plus the fixed dims) so a step pays only a few
comparisons; like ORT there is no implicit cast, and errors say which input is wrong.
String inputs stay numpy arrays (torch has no string tensors) until `string_inputs`
converts them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..codec.dtypes import code_from_torch, torch_dtype
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
STRING = 8  # onnx.TensorProto.STRING
StepInput = Union[torch.Tensor, np.ndarray]  # numpy only for string inputs


def is_string_array(value: object) -> bool:
    """True for the numpy arrays ORT feeds as a string tensor (str, bytes or object elements)."""
    return isinstance(value, np.ndarray) and value.dtype.kind in ("U", "S", "O")


def onnx_type_name(elem_type: int) -> str:
    """ORT's type string for an ONNX element type code, such as "tensor(float)"."""
    return f"tensor({ONNX_TYPE_NAMES.get(elem_type, 'undefined')})"


def torch_type_name(dtype: torch.dtype) -> str:
    """ORT's type string for a torch dtype."""
    return onnx_type_name(code_from_torch(dtype))


@dataclass(frozen=True)
class ValueSpec:
    name: str
    elem_type: int  # ONNX TensorProto data type code (0 = unknown)
    shape: Optional[Tuple[Optional[int], ...]]  # None = rank unknown; None dims are symbolic

    @property
    def dtype(self) -> Optional[torch.dtype]:
        return torch_dtype(self.elem_type) if self.elem_type and self.elem_type != STRING else None

    @property
    def type_name(self) -> str:
        return onnx_type_name(self.elem_type)


def value_spec(info: "onnx.ValueInfoProto") -> ValueSpec:
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
            raise InvalidInputError(_type_message(spec, tensor, strings, step))
        shape = spec.shape
        if shape is None:
            continue
        actual = tuple(tensor.shape)
        if len(actual) != len(shape) or any(want is not None and want != got for want, got in zip(shape, actual)):
            expected = tuple("?" if d is None else d for d in shape)
            hint = " (? is any size)" if None in shape else ""
            if len(actual) != len(shape):
                hint += f": {len(actual)} dimension(s) where the model declares {len(shape)}; reshape it"
                if shape.count(None) <= 1:  # then one reshape fits: -1 where the free dimension is
                    hint += f", e.g. {spec.name}.reshape({', '.join('-1' if d is None else str(d) for d in shape)})"
            raise InvalidInputError(
                f"{step}: got invalid dimensions for input '{spec.name}': {list(actual)}, expected {list(expected)}{hint}"
            )


def _type_message(spec: ValueSpec, tensor: StepInput, strings: bool, step: str) -> str:
    """ORT's words (in ORT's type names), then what the value was and how to cast it."""
    if strings:
        return (
            f"{step}: unexpected input data type for '{spec.name}'. Actual: tensor(string) (a numpy "
            f"{tensor.dtype} array), expected: {spec.type_name}"
        )
    message = (
        f"{step}: unexpected input data type for '{spec.name}'. Actual: {torch_type_name(tensor.dtype)}, "
        f"expected: {spec.type_name}"
    )
    if spec.dtype is not None:
        wanted = str(spec.dtype).replace("torch.", "")
        message += f"; cast it, e.g. {spec.name}.astype(numpy.{wanted}) or {spec.name}.to(torch.{wanted})"
    return message


def names(specs: Sequence[ValueSpec]) -> List[str]:
    return [spec.name for spec in specs]


# ---- numpy arrays and batch dimensions (issue 17) ---------------------------------------------
def tensor_from_array(array: np.ndarray) -> StepInput:
    """A tensor of a numpy input, sharing its memory where possible.

    Big-endian arrays are converted to native order (ORT 1.19.2 reads their bytes as if
    native: wrong floats, or a segfault for labels; the values here are the caller's).
    Object, str and bytes arrays are what ORT feeds as string tensors: they stay numpy
    (torch has no strings); `check_inputs` refuses them for any input that is not a string
    input, naming it, as ORT does ("Unexpected input data type. Actual: (tensor(string))").
    """
    if is_string_array(array):
        return array
    if array.dtype.byteorder == (">" if np.little_endian else "<"):
        array = array.astype(array.dtype.newbyteorder("="))
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = np.array(array)
    return torch.from_numpy(array)


class BatchCheck:
    """Symbolic dims that several inputs share (``batch``) must agree, and none may be 0.

    Built once per graph from its declared input shapes, so a step pays a few integer
    comparisons.  ORT reports a mismatch from inside a kernel and crashes (SIGFPE) on a
    0-row batch (measured, tests/fixtures/reliability/); here both name the inputs.
    """

    def __init__(self, model: "onnx.ModelProto", input_names: Sequence[str]):
        declared = {info.name: info for info in model.graph.input}
        self.names = list(input_names)
        self.dims: List[Tuple[int, int, str]] = []  # (input index, axis, dim name)
        for index, name in enumerate(self.names):
            info = declared.get(name)
            if info is None or not info.type.tensor_type.HasField("shape"):
                continue
            for axis, dim in enumerate(info.type.tensor_type.shape.dim):
                if dim.dim_param and not dim.HasField("dim_value"):
                    self.dims.append((index, axis, dim.dim_param))

    def __call__(self, tensors: Sequence[torch.Tensor], step: str) -> None:
        seen: Dict[str, Tuple[int, int]] = {}
        for index, axis, name in self.dims:
            size = tensors[index].shape[axis]
            if size == 0:
                raise InvalidInputError(
                    f"{step}: input '{self.names[index]}' has size 0 in dimension '{name}' (an empty batch); "
                    "ONNX Runtime crashes on it"
                )
            if name in seen and seen[name][1] != size:
                first = self.names[seen[name][0]]
                raise InvalidInputError(
                    f"{step}: dimension '{name}' is {seen[name][1]} for input '{first}' but {size} for input "
                    f"'{self.names[index]}'"
                )
            seen.setdefault(name, (index, size))
