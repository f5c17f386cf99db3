"""Conv with weights fed at run time (onnx2torch only converts initializer weights)."""

from __future__ import annotations

import math
from typing import List, Sequence

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def same_padding(
    in_sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], upper: bool
) -> List[int]:
    """ONNX SAME_UPPER/SAME_LOWER pads as [begin..., end...] for the given input sizes."""
    begins, ends = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
        out = math.ceil(size / s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if upper else large)
        ends.append(large if upper else small)
    return begins + ends


def torch_pad_order(pads: Sequence[int]) -> List[int]:
    """ONNX [b1, b2, e1, e2] -> torch F.pad [b_last, e_last, ..., b1, e1]."""
    rank = len(pads) // 2
    order: List[int] = []
    for axis in reversed(range(rank)):
        order += [pads[axis], pads[axis + rank]]
    return order


class Conv(OnnxModule):
    def __init__(self, strides, dilations, group, pads, auto_pad, kernel_shape):
        super().__init__()
        self.strides, self.dilations, self.group = strides, dilations, group
        self.pads, self.auto_pad, self.kernel_shape = pads, auto_pad, kernel_shape

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor = None) -> torch.Tensor:
        rank = x.dim() - 2
        kernel = self.kernel_shape or list(weight.shape[2:])
        strides = self.strides or [1] * rank
        dilations = self.dilations or [1] * rank
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pads = same_padding(x.shape[2:], kernel, strides, dilations, self.auto_pad == "SAME_UPPER")
        elif self.auto_pad == "VALID":
            pads = [0] * (2 * rank)
        else:
            pads = self.pads or [0] * (2 * rank)
        if pads[:rank] == pads[rank:]:
            padding = pads[:rank]
        else:
            x = F.pad(x, torch_pad_order(pads))
            padding = 0
        return _CONV[rank](x, weight, bias, strides, padding, dilations, self.group)


@register("Conv", 1, 11)
def _conv(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    module = Conv(
        a.get("strides"),
        a.get("dilations"),
        a.get("group", 1),
        a.get("pads"),
        a.get("auto_pad", "NOTSET"),
        a.get("kernel_shape"),
    )
    return result(module, node)
