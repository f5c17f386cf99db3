"""MaxPool / AveragePool / LpPool / global pools, with the rank taken from the input at run time
(onnx2torch needs shape inference for it, which stops at ORT's contrib ops).

ONNX pads each side separately and decides per window what AveragePool divides by; torch pads
symmetrically and has one flag.  Where torch's pooling means the same (symmetric pads, no
dilation, no ceil_mode for averages) it runs as is; otherwise windows are summed with a
ones-kernel depthwise convolution and divided by the count of the elements ONNX counts:
real elements only (count_include_pad=0), or the kernel size (=1: ONNX Runtime divides by it
even in the extra windows ceil_mode adds, measured).
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ..gradient_quirks import ort_gradient, reproduce_ort_gradients
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .convolution import same_padding, torch_pad_order

_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def pool_geometry(
    in_sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    auto_pad: str,
    ceil_mode: bool,
):
    """(pads [begins..., ends...], output sizes) by the ONNX formulas."""
    rank = len(in_sizes)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_padding(in_sizes, kernel, strides, dilations, auto_pad == "SAME_UPPER")
    elif auto_pad == "VALID" or not pads:
        pads = [0] * (2 * rank)
    outs = []
    for axis in range(rank):
        span = (kernel[axis] - 1) * dilations[axis] + 1
        room = in_sizes[axis] + pads[axis] + pads[axis + rank] - span
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = math.ceil(in_sizes[axis] / strides[axis])
        elif ceil_mode:
            out = math.ceil(room / strides[axis]) + 1
            if (out - 1) * strides[axis] >= in_sizes[axis] + pads[axis]:
                out -= 1  # the last window would start in the end padding
        else:
            out = room // strides[axis] + 1
        outs.append(out)
    return list(pads), outs


def _window_sums(x: torch.Tensor, kernel, strides, dilations) -> torch.Tensor:
    channels = x.shape[1]
    ones = x.new_ones((channels, 1, *kernel))
    return _CONV[x.dim() - 2](x, ones, None, strides, 0, dilations, channels)


class Pool(OnnxModule):
    def __init__(
        self,
        kind: str,
        kernel,
        strides,
        pads,
        dilations,
        ceil_mode,
        auto_pad,
        count_include_pad,
        storage_order: int = 0,
        with_indices: bool = False,
        p: float = 2.0,
    ):
        super().__init__()
        self.ort_gradient_geometry = kind == "avg" and reproduce_ort_gradients()
        self.kind, self.kernel, self.strides, self.pads = kind, list(kernel), strides, pads
        self.dilations, self.ceil_mode, self.auto_pad = dilations, bool(ceil_mode), auto_pad
        self.count_include_pad, self.storage_order = bool(count_include_pad), storage_order
        self.with_indices, self.p = with_indices, p

    def forward(self, x: torch.Tensor):
        rank = x.dim() - 2
        strides = list(self.strides or [1] * rank)
        dilations = list(self.dilations or [1] * rank)
        pads, outs = pool_geometry(
            list(x.shape[2:]), self.kernel, strides, dilations, self.pads, self.auto_pad, self.ceil_mode
        )
        if self.kind == "max":
            return self._max(x, pads, outs, strides, dilations)
        if self.kind == "lp":
            return self._average_or_sum(x.abs().pow(self.p), pads, outs, strides, dilations, total=True).pow(
                1.0 / self.p
            )
        y = self._average_or_sum(x, pads, outs, strides, dilations, total=False)
        if self.ort_gradient_geometry and (self.auto_pad == "SAME_LOWER" or any(d != 1 for d in dilations)):
            # ORT's AveragePoolGrad: SAME_UPPER padding, no dilation (..gradient_quirks)
            upper, _ = pool_geometry(
                list(x.shape[2:]),
                self.kernel,
                strides,
                [1] * rank,
                self.pads,
                "SAME_UPPER" if self.auto_pad == "SAME_LOWER" else self.auto_pad,
                self.ceil_mode,
            )
            surrogate = self._average_or_sum(x, upper, outs, strides, [1] * rank, total=False)
            index = (Ellipsis,) + tuple(slice(0, o) for o in outs)
            y = ort_gradient(y, surrogate[index])
        return y

    def _max(self, x, pads, outs, strides, dilations):
        rank = x.dim() - 2
        begins, ends = pads[:rank], pads[rank:]
        extra = [
            max(0, (o - 1) * s + (k - 1) * d + 1 - (size + b + e))
            for o, s, k, d, size, b, e in zip(outs, strides, self.kernel, dilations, x.shape[2:], begins, ends)
        ]
        symmetric = begins == ends and all(2 * b <= k for b, k in zip(begins, self.kernel))
        if symmetric and not any(extra):  # torch pads itself; its indices count input positions
            y, indices = _MAX[rank](x, self.kernel, strides, begins, dilations, False, True)
            padded_shape, offset = None, [0] * rank
        else:  # pad with -inf ourselves; indices count positions of the padded tensor
            ends = [e + more for e, more in zip(ends, extra)]
            padded = F.pad(x, torch_pad_order(list(begins) + ends), value=float("-inf"))
            y, indices = _MAX[rank](padded, self.kernel, strides, 0, dilations, False, True)
            padded_shape, offset = list(padded.shape[2:]), list(begins)
        if not self.with_indices:
            return y
        return y, self._onnx_indices(indices, x.shape, padded_shape, offset)

    def _onnx_indices(self, indices: torch.Tensor, shape, padded_shape: Optional[List[int]], offset: List[int]):
        """torch's per-channel flat index (into the padded tensor) -> ONNX's index into the input
        (flattened N*C*spatial, row-major, or column-major spatial for storage_order=1)."""
        spatial = list(shape[2:])
        coords = []
        flat = indices
        for size in reversed(padded_shape or spatial):
            coords.append(flat % size)
            flat = flat // size
        coords = [c - o for c, o in zip(reversed(coords), offset)]
        index = torch.zeros_like(indices)
        order = range(len(spatial)) if self.storage_order == 0 else reversed(range(len(spatial)))
        for axis in order:
            index = index * spatial[axis] + coords[axis]
        per_channel = math.prod(spatial)
        n = torch.arange(shape[0], device=indices.device).view(-1, *[1] * (indices.dim() - 1))
        c = torch.arange(shape[1], device=indices.device).view(1, -1, *[1] * (indices.dim() - 2))
        return index + (n * shape[1] + c) * per_channel

    def _average_or_sum(self, x, pads, outs, strides, dilations, total: bool):
        rank = x.dim() - 2
        begins, ends = pads[:rank], pads[rank:]
        plain = (
            begins == ends
            and all(d == 1 for d in dilations)
            and not self.ceil_mode
            and all(2 * b <= k for b, k in zip(begins, self.kernel))
        )
        if plain and not total:
            return _AVG[rank](x, self.kernel, strides, begins, False, self.count_include_pad)
        extra = [
            max(0, (o - 1) * s + (k - 1) * d + 1 - (size + b + e))
            for o, s, k, d, size, b, e in zip(outs, strides, self.kernel, dilations, x.shape[2:], begins, ends)
        ]
        order = torch_pad_order(list(begins) + [e + x_ for e, x_ in zip(ends, extra)])
        sums = _window_sums(F.pad(x, order), self.kernel, strides, dilations)
        if total:
            return sums
        if self.count_include_pad:  # ORT divides by the kernel size, also in ceil_mode's extra windows
            return sums / math.prod(self.kernel)
        counts = _window_sums(F.pad(x.new_ones((1, 1, *x.shape[2:])), order), self.kernel, strides, dilations)
        return sums / counts


def _pool(kind):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        with_indices = len(node.output_values) > 1
        if with_indices and kind != "max":
            raise NotImplementedError(f"{node.operation_type} with a second output")
        p = float(a.get("p", 2))
        module = Pool(
            kind,
            a["kernel_shape"],
            a.get("strides"),
            a.get("pads"),
            a.get("dilations"),
            a.get("ceil_mode", 0),
            a.get("auto_pad", "NOTSET"),
            a.get("count_include_pad", 0),
            a.get("storage_order", 0),
            with_indices,
            p,
        )
        return result(module, node)

    return convert


register("MaxPool", 1, 8, 10, 11, 12)(_pool("max"))
register("AveragePool", 1, 7, 10, 11, 19)(_pool("avg"))
register("LpPool", 1, 2, 11, 18)(_pool("lp"))


class GlobalPool(OnnxModule):
    def __init__(self, kind: str, p: float = 2.0):
        super().__init__()
        self.kind, self.p = kind, p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = list(range(2, x.dim()))
        if self.kind == "max":
            return x.amax(dim=dims, keepdim=True)
        if self.kind == "lp":
            return x.abs().pow(self.p).sum(dim=dims, keepdim=True).pow(1.0 / self.p)
        return x.mean(dim=dims, keepdim=True)


@register("GlobalAveragePool", 1)
def _global_avg(node: OnnxNode, graph: OnnxGraph):
    return result(GlobalPool("avg"), node)


@register("GlobalMaxPool", 1)
def _global_max(node: OnnxNode, graph: OnnxGraph):
    return result(GlobalPool("max"), node)


@register("GlobalLpPool", 1, 2)
def _global_lp(node: OnnxNode, graph: OnnxGraph):
    return result(GlobalPool("lp", float(node.attributes.get("p", 2))), node)
