"""Cast and CastLike at every version (onnx2torch has Cast 9 and 13 only).

Numeric casts are torch's `.to()` (float -> int truncates toward zero, as ONNX specifies).
Strings are numpy arrays here (torch has no string tensors): casting to or from them goes
through numpy's string parsing and formatting.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from onnx import TensorProto, helper

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result

_FLOAT8 = {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}


@functools.lru_cache(maxsize=None)  # Cast's forward asks on every step
def torch_dtype(onnx_type: int) -> torch.dtype:
    """The torch dtype of an ONNX TensorProto data type (NotImplementedError if none)."""
    if onnx_type == TensorProto.BFLOAT16:
        return torch.bfloat16
    if onnx_type in _FLOAT8 or onnx_type in (TensorProto.STRING, TensorProto.UINT4, TensorProto.INT4):
        raise NotImplementedError(f"no torch dtype for ONNX type {TensorProto.DataType.Name(onnx_type)}")
    return torch.from_numpy(np.zeros(0, dtype=helper.tensor_dtype_to_np_dtype(onnx_type))).dtype


def cast(value, onnx_type: int):
    """`value` (tensor, or numpy string array) as ONNX type `onnx_type`."""
    if onnx_type == TensorProto.STRING:
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        return array.astype(np.str_)
    if not isinstance(value, torch.Tensor):  # strings -> numbers
        numbers = np.asarray(value).astype(
            np.float64 if onnx_type in (TensorProto.FLOAT, TensorProto.DOUBLE) else np.int64
        )
        return torch.from_numpy(numbers).to(torch_dtype(onnx_type))
    return value.to(torch_dtype(onnx_type))


class Cast(OnnxModule):
    def __init__(self, onnx_type: int):
        super().__init__()
        self.onnx_type = onnx_type

    def forward(self, x):
        return cast(x, self.onnx_type)


class CastLike(OnnxModule):
    def forward(self, x, like):
        if not isinstance(like, torch.Tensor):
            return cast(x, TensorProto.STRING)
        return x.to(like.dtype) if isinstance(x, torch.Tensor) else cast(x, _onnx_type(like.dtype))


def _onnx_type(dtype: torch.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(torch.zeros(0, dtype=dtype).numpy().dtype)


@register("Cast", 1, 6, 9, 13, 19, 21)
def _cast(node: OnnxNode, graph: OnnxGraph):
    to = node.attributes["to"]
    if isinstance(to, str):  # Cast-1 names the type
        to = TensorProto.DataType.Value(to.upper())
    if to != TensorProto.STRING:
        torch_dtype(to)  # types torch lacks are refused now, not at the first step
    return result(Cast(int(to)), node)


@register("CastLike", 15, 19, 21)
def _cast_like(node: OnnxNode, graph: OnnxGraph):
    return result(CastLike(), node)
