"""TensorDataType codes of the checkpoint file and their numpy / torch counterparts.

The checkpoint stores a tensor's element type as the ONNX ``TensorProto.DataType``
integer (ORT's flatbuffers ``TensorDataType`` uses the same numbers), and its payload as
little-endian C-order bytes.  This module is the single place that knows how to turn such
``(code, bytes)`` pairs into numpy arrays or torch tensors and back, so the rest of the
library never hard-codes a dtype table.

numpy has no bfloat16 / float8 types; ``ml_dtypes`` (a dependency of onnx) provides them,
imported when such a type is first asked for (ml_dtypes 0.7.0 takes 0.7 s to import, eight
times this package's own import after torch; a numpy array of its types means it is loaded).
torch conversion deliberately avoids numpy for the payload so those dtypes stay lossless
and no pickling is involved.
"""

from __future__ import annotations

import math
import sys
from enum import IntEnum
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .records import TensorRecord

__all__ = [
    "TensorDataType",
    "numpy_dtype",
    "torch_dtype",
    "code_from_numpy",
    "code_from_torch",
    "element_size",
    "dtype_name",
    "tensor_nbytes",
    "tensor_record_from_numpy",
    "tensor_record_to_numpy",
    "tensor_record_from_torch",
    "tensor_record_to_torch",
    "torch_to_numpy",
    "numpy_to_torch",
]


class TensorDataType(IntEnum):
    """ONNX / ORT tensor element types, numbered as in ``TensorProto.DataType``."""

    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20


# Bytes per element; STRING and UNDEFINED have no fixed size and are absent on purpose.
_ELEMENT_SIZE: Dict[int, int] = {
    TensorDataType.FLOAT: 4,
    TensorDataType.UINT8: 1,
    TensorDataType.INT8: 1,
    TensorDataType.UINT16: 2,
    TensorDataType.INT16: 2,
    TensorDataType.INT32: 4,
    TensorDataType.INT64: 8,
    TensorDataType.BOOL: 1,
    TensorDataType.FLOAT16: 2,
    TensorDataType.DOUBLE: 8,
    TensorDataType.UINT32: 4,
    TensorDataType.UINT64: 8,
    TensorDataType.COMPLEX64: 8,
    TensorDataType.COMPLEX128: 16,
    TensorDataType.BFLOAT16: 2,
    TensorDataType.FLOAT8E4M3FN: 1,
    TensorDataType.FLOAT8E4M3FNUZ: 1,
    TensorDataType.FLOAT8E5M2: 1,
    TensorDataType.FLOAT8E5M2FNUZ: 1,
}

_NUMPY: Dict[int, np.dtype] = {
    TensorDataType.FLOAT: np.dtype("<f4"),
    TensorDataType.UINT8: np.dtype("u1"),
    TensorDataType.INT8: np.dtype("i1"),
    TensorDataType.UINT16: np.dtype("<u2"),
    TensorDataType.INT16: np.dtype("<i2"),
    TensorDataType.INT32: np.dtype("<i4"),
    TensorDataType.INT64: np.dtype("<i8"),
    TensorDataType.STRING: np.dtype(object),
    TensorDataType.BOOL: np.dtype("?"),
    TensorDataType.FLOAT16: np.dtype("<f2"),
    TensorDataType.DOUBLE: np.dtype("<f8"),
    TensorDataType.UINT32: np.dtype("<u4"),
    TensorDataType.UINT64: np.dtype("<u8"),
    TensorDataType.COMPLEX64: np.dtype("<c8"),
    TensorDataType.COMPLEX128: np.dtype("<c16"),
}
_EXTENDED = {  # ml_dtypes' name of each type numpy lacks
    TensorDataType.BFLOAT16: "bfloat16",
    TensorDataType.FLOAT8E4M3FN: "float8_e4m3fn",
    TensorDataType.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    TensorDataType.FLOAT8E5M2: "float8_e5m2",
    TensorDataType.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
}

# Reverse map keyed by the dtype with native byte order, so '>f4' and '<f4' both match.
_NUMPY_REVERSE: Dict[np.dtype, int] = {
    dt.newbyteorder("="): code for code, dt in _NUMPY.items() if code != TensorDataType.STRING
}


def _add_extended(ml_dtypes: Any) -> None:
    """Add ml_dtypes' types to both maps (again is harmless)."""
    for code, name in _EXTENDED.items():
        dt = np.dtype(getattr(ml_dtypes, name))
        _NUMPY[code] = dt
        _NUMPY_REVERSE[dt.newbyteorder("=")] = code


def _extended_numpy_dtype(code: int) -> np.dtype:
    """numpy dtype of a type numpy lacks: ml_dtypes imported now (KeyError without it)."""
    try:
        import ml_dtypes
    except ImportError:  # ml_dtypes ships with onnx; without it only these types are missing
        raise KeyError(code) from None
    _add_extended(ml_dtypes)
    return _NUMPY[code]


def _torch_table() -> Dict[int, Any]:
    """Built lazily so that importing the codec never imports torch."""
    import torch

    table: Dict[int, Any] = {}
    wanted = {
        TensorDataType.FLOAT: "float32",
        TensorDataType.UINT8: "uint8",
        TensorDataType.INT8: "int8",
        TensorDataType.UINT16: "uint16",
        TensorDataType.INT16: "int16",
        TensorDataType.INT32: "int32",
        TensorDataType.INT64: "int64",
        TensorDataType.BOOL: "bool",
        TensorDataType.FLOAT16: "float16",
        TensorDataType.DOUBLE: "float64",
        TensorDataType.UINT32: "uint32",
        TensorDataType.UINT64: "uint64",
        TensorDataType.COMPLEX64: "complex64",
        TensorDataType.COMPLEX128: "complex128",
        TensorDataType.BFLOAT16: "bfloat16",
        TensorDataType.FLOAT8E4M3FN: "float8_e4m3fn",
        TensorDataType.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
        TensorDataType.FLOAT8E5M2: "float8_e5m2",
        TensorDataType.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
    }
    for code, attr in wanted.items():
        dt = getattr(torch, attr, None)  # older torch lacks uint16/32/64 and float8
        if dt is not None:
            table[code] = dt
    return table


_TORCH: Optional[Dict[int, Any]] = None


def _torch_map() -> Dict[int, Any]:
    global _TORCH
    if _TORCH is None:
        _TORCH = _torch_table()
    return _TORCH


def dtype_name(code: int) -> str:
    """Upper-case ONNX name of ``code`` (``"FLOAT"``); never raises, for use in messages."""
    try:
        return TensorDataType(code).name
    except ValueError:
        return f"UNKNOWN({code})"


def element_size(code: int) -> int:
    """Bytes per element of a fixed-size type; ValueError for STRING/UNDEFINED/unknown."""
    try:
        return _ELEMENT_SIZE[code]
    except KeyError:
        raise ValueError(f"TensorDataType {dtype_name(code)} has no fixed element size") from None


def numpy_dtype(code: int) -> np.dtype:
    """Little-endian numpy dtype for ``code`` (STRING maps to ``object``)."""
    try:
        return _NUMPY[code] if code in _NUMPY or code not in _EXTENDED else _extended_numpy_dtype(code)
    except KeyError:
        raise ValueError(f"TensorDataType {dtype_name(code)} has no numpy dtype") from None


def torch_dtype(code: int) -> Any:
    """torch dtype for ``code``; ValueError for STRING and for types this torch lacks."""
    table = _torch_map()
    try:
        return table[code]
    except KeyError:
        raise ValueError(f"TensorDataType {dtype_name(code)} has no torch dtype") from None


def code_from_numpy(dtype: Any) -> int:
    """TensorDataType code of a numpy dtype; str/bytes/object dtypes map to STRING."""
    dt = np.dtype(dtype)
    if dt.kind in ("U", "S", "O"):
        return int(TensorDataType.STRING)
    native = dt.newbyteorder("=")
    if native not in _NUMPY_REVERSE and "ml_dtypes" in sys.modules:  # an array of its types exists
        _add_extended(sys.modules["ml_dtypes"])
    try:
        return int(_NUMPY_REVERSE[native])
    except KeyError:
        raise ValueError(f"numpy dtype {dt} has no ONNX TensorDataType") from None


def code_from_torch(dtype: Any) -> int:
    """TensorDataType code of a torch dtype."""
    for code, dt in _torch_map().items():
        if dt == dtype:
            return int(code)
    raise ValueError(f"torch dtype {dtype} has no ONNX TensorDataType")


def tensor_nbytes(data_type: int, dims: Sequence[int]) -> int:
    """Raw byte size implied by ``dims`` and ``data_type`` (a 0-d tensor holds one element)."""
    return math.prod(int(d) for d in dims) * element_size(data_type)


#: numpy's limit (torch allows more, but every tensor here must also convert to numpy).
MAX_RANK = 64


def _check_dims(record: TensorRecord, itemsize: int) -> None:
    """Dims numpy and torch can represent: rank <= 64, no negative size, and strides that
    fit in int64 even when a zero dim makes the tensor empty ((0, 2**62) has 0 elements
    but a stride of 2**62 elements: numpy refuses it, torch overflows later)."""
    dims = [int(d) for d in record.dims]
    if len(dims) > MAX_RANK:
        raise ValueError(f"tensor {record.name!r}: rank {len(dims)} exceeds {MAX_RANK}")
    if any(d < 0 for d in dims):
        raise ValueError(f"tensor {record.name!r}: negative dimension in {tuple(dims)}")
    if math.prod(max(d, 1) for d in dims) * itemsize > 2**63 - 1:
        raise ValueError(f"tensor {record.name!r}: dims {dims} overflow a 64-bit size")


def _check_payload(record: TensorRecord) -> int:
    _check_dims(record, element_size(record.data_type))
    need = tensor_nbytes(record.data_type, record.dims)
    if len(record.raw_data) != need:
        raise ValueError(
            f"tensor {record.name!r}: {dtype_name(record.data_type)}{list(record.dims)} needs "
            f"{need} bytes of raw_data, the record has {len(record.raw_data)}"
        )
    return need


def _strings_of(flat: Sequence[Any]) -> List[str]:
    out: List[str] = []
    for item in flat:
        if isinstance(item, (bytes, bytearray, np.bytes_)):
            out.append(bytes(item).decode("utf-8"))
        else:
            out.append(str(item))
    return out


def tensor_record_from_numpy(name: str, array: Any, doc_string: str = "") -> TensorRecord:
    """Record holding ``array`` as little-endian C-order bytes (strings go to ``string_data``)."""
    arr = np.asarray(array)
    code = code_from_numpy(arr.dtype)
    dims = tuple(int(d) for d in arr.shape)
    if code == TensorDataType.STRING:
        return TensorRecord(
            name=name,
            data_type=code,
            dims=dims,
            raw_data=b"",
            doc_string=doc_string,
            string_data=_strings_of(arr.reshape(-1).tolist()),
        )
    little = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return TensorRecord(name=name, data_type=code, dims=dims, raw_data=little.tobytes(), doc_string=doc_string)


def tensor_record_to_numpy(record: TensorRecord) -> np.ndarray:
    """Writable numpy array of ``record``; ValueError if raw_data does not match dims/dtype."""
    dims = tuple(int(d) for d in record.dims)
    if record.data_type == TensorDataType.STRING:
        _check_dims(record, 1)
        strings = list(record.string_data or [])
        if math.prod(dims) != len(strings):
            raise ValueError(
                f"tensor {record.name!r}: STRING{list(dims)} needs {math.prod(dims)} strings, "
                f"the record has {len(strings)}"
            )
        arr = np.empty(len(strings), dtype=object)
        arr[:] = strings
        return arr.reshape(dims)
    dt = numpy_dtype(record.data_type)
    _check_payload(record)
    return np.frombuffer(bytearray(record.raw_data), dtype=dt).reshape(dims)


def torch_to_numpy(tensor: Any) -> np.ndarray:
    """A numpy copy of a torch tensor of any dtype in the table, bfloat16 and float8
    included (numpy has no such types; ml_dtypes provides them, and torch's ``.numpy()``
    refuses them), through a byte view so no value is converted."""
    import torch

    t = tensor.detach().to("cpu").contiguous()
    try:
        return t.numpy().copy()
    except TypeError:
        dt = numpy_dtype(code_from_torch(t.dtype))
    raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
    return raw.view(dt).reshape(tuple(t.shape)).copy()


def numpy_to_torch(array: np.ndarray) -> Any:
    """A torch tensor sharing nothing with ``array``, for every dtype in the table (the
    inverse of `torch_to_numpy`; ``torch.from_numpy`` refuses ml_dtypes' types)."""
    import torch

    arr = np.ascontiguousarray(array)
    code = code_from_numpy(arr.dtype)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    dt = torch_dtype(code)
    if arr.size == 0:
        return torch.empty(arr.shape, dtype=dt)
    return torch.from_numpy(arr.reshape(-1).view(np.uint8).copy()).view(dt).reshape(arr.shape)


def tensor_record_from_torch(name: str, tensor: Any, doc_string: str = "", *, copy: bool = True) -> TensorRecord:
    """Record holding a torch tensor's bytes, read through a uint8 view (no numpy dtype needed).

    ``copy=False``: for a contiguous CPU tensor, ``raw_data`` is a memoryview of the
    tensor's own memory (no copy), valid while the tensor lives and showing its changes:
    for writing the tensor out at once (the checkpoint writer streams it to disk).
    """
    import torch

    code = code_from_torch(tensor.dtype)
    t = tensor.detach()
    if t.layout != torch.strided:
        raise ValueError(f"tensor {name!r}: only dense tensors can be stored, got {t.layout}")
    t = t.resolve_conj().resolve_neg().to("cpu").contiguous()
    dims = tuple(int(d) for d in t.shape)
    if t.numel() == 0:
        raw = b""
    else:
        raw = t.reshape(-1).view(torch.uint8).numpy()
        raw = raw.tobytes() if copy else memoryview(raw)
    return TensorRecord(name=name, data_type=code, dims=dims, raw_data=raw, doc_string=doc_string)


def tensor_record_to_torch(record: TensorRecord) -> Any:
    """CPU torch tensor of ``record``, owning its memory.

    Bytes are copied once, into the new tensor's storage; a lazily read payload (a
    ``Payload`` of ``open_checkpoint``, anything with ``readinto``) is read straight into it.
    """
    import torch

    dt = torch_dtype(record.data_type)
    dims = tuple(int(d) for d in record.dims)
    _check_payload(record)
    tensor = torch.empty(dims, dtype=dt)
    if len(record.raw_data) == 0:
        return tensor
    target = tensor.reshape(-1).view(torch.uint8).numpy()
    raw = record.raw_data
    if hasattr(raw, "readinto"):
        raw.readinto(memoryview(target))
    else:
        target[:] = np.frombuffer(raw, dtype=np.uint8)
    return tensor
