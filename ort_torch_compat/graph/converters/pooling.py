"""MaxPool / AveragePool / global pools with the rank taken from the input at run time
(onnx2torch needs shape inference for it, which stops at ORT's contrib ops)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .convolution import same_padding, torch_pad_order

_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


class Pool(OnnxModule):
    def __init__(self, kind, kernel, strides, pads, dilations, ceil_mode, auto_pad, count_include_pad):
        super().__init__()
        self.kind, self.kernel, self.strides, self.pads = kind, kernel, strides, pads
        self.dilations, self.ceil_mode, self.auto_pad = dilations, bool(ceil_mode), auto_pad
        self.count_include_pad = bool(count_include_pad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rank = x.dim() - 2
        strides = self.strides or [1] * rank
        dilations = self.dilations or [1] * rank
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pads = same_padding(x.shape[2:], self.kernel, strides, dilations, self.auto_pad == "SAME_UPPER")
        else:
            pads = self.pads or [0] * (2 * rank)
        padding = pads[:rank]
        if pads[:rank] != pads[rank:]:
            fill = float("-inf") if self.kind == "max" else 0.0
            x = F.pad(x, torch_pad_order(pads), value=fill)
            padding = [0] * rank
        if self.kind == "max":
            return _MAX[rank](x, self.kernel, strides, padding, dilations, self.ceil_mode)
        if any(d != 1 for d in dilations):
            raise NotImplementedError("AveragePool with dilations")
        return _AVG[rank](x, self.kernel, strides, padding, self.ceil_mode, self.count_include_pad)


def _pool(kind):
    def convert(node: OnnxNode, graph: OnnxGraph):
        if len(node.output_values) > 1:
            raise NotImplementedError("MaxPool with the Indices output in use")
        a = node.attributes
        module = Pool(kind, a["kernel_shape"], a.get("strides"), a.get("pads"), a.get("dilations"),
                      a.get("ceil_mode", 0), a.get("auto_pad", "NOTSET"), a.get("count_include_pad", 0))
        return result(module, node)
    return convert


register("MaxPool", 1, 8, 10, 11, 12)(_pool("max"))
register("AveragePool", 1, 7, 10, 11, 19)(_pool("avg"))


class GlobalPool(OnnxModule):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = list(range(2, x.dim()))
        if self.kind == "max":
            return x.amax(dim=dims, keepdim=True)
        return x.mean(dim=dims, keepdim=True)


@register("GlobalAveragePool", 1)
def _global_avg(node: OnnxNode, graph: OnnxGraph):
    return result(GlobalPool("avg"), node)


@register("GlobalMaxPool", 1)
def _global_max(node: OnnxNode, graph: OnnxGraph):
    return result(GlobalPool("max"), node)
