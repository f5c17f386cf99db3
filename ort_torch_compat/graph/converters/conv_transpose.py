"""ConvTranspose with the weight fed at run time (a trainable parameter is a graph input
here; onnx2torch only converts initializer weights), every padding mode included.

ONNX output size per spatial axis: `stride*(in-1) + output_padding + (k-1)*dilation + 1
- pad_begin - pad_end`.  With `output_shape` (or auto_pad SAME_*) the pads are derived from
the wanted size; SAME_UPPER puts the odd element at the end, anything else at the start.  A
wanted size above the unpadded one gives no negative pads (ONNX Runtime clamps them at 0): the
output is extended at the end.  Symmetric pads run as one torch call; others run unpadded,
then the full result is cropped and zero-extended (`output_padding` and the extension above:
positions that receive only the bias).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result

_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


class ConvTranspose(OnnxModule):
    def __init__(self, strides, dilations, group: int, pads, auto_pad: str, output_padding, output_shape):
        super().__init__()
        self.strides, self.dilations, self.group = strides, dilations, group
        self.pads, self.auto_pad = pads, auto_pad
        self.output_padding, self.output_shape = output_padding, output_shape

    def _wanted(self, in_sizes: Sequence[int], rank: int) -> Optional[List[int]]:
        """The output sizes asked for (output_shape or SAME_*), or None: pads decide."""
        if self.output_shape is not None:
            return list(self.output_shape)[-rank:]
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            return [size * stride for size, stride in zip(in_sizes, self.strides or [1] * rank)]
        return None

    def _pads(self, wanted: Optional[Sequence[int]], full: Sequence[int], rank: int) -> List[int]:
        """[begin..., end...] (`full`: the unpadded output sizes)."""
        if wanted is None:
            return list(self.pads or [0] * (2 * rank))
        totals = [max(0, size - want) for size, want in zip(full, wanted)]
        small = [total // 2 for total in totals]
        large = [total - total // 2 for total in totals]
        return small + large if self.auto_pad == "SAME_UPPER" else large + small

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor = None) -> torch.Tensor:
        rank = x.dim() - 2
        strides = self.strides or [1] * rank
        dilations = self.dilations or [1] * rank
        extra = self.output_padding or [0] * rank
        kernel = weight.shape[2:]
        in_sizes = x.shape[2:]
        full = [s * (n - 1) + e + (k - 1) * d + 1 for n, k, s, d, e in zip(in_sizes, kernel, strides, dilations, extra)]
        wanted = self._wanted(in_sizes, rank)
        pads = self._pads(wanted, full, rank)
        cropped = [size - b - e for size, b, e in zip(full, pads[:rank], pads[rank:])]
        grow = [0] * rank if wanted is None else [max(0, want - size) for want, size in zip(wanted, cropped)]
        conv = _CONV_TRANSPOSE[rank]
        if (
            pads[:rank] == pads[rank:]
            and not any(grow)
            and all(e < max(s, d) for e, s, d in zip(extra, strides, dilations))
        ):
            return conv(x, weight, bias, strides, pads[:rank], extra, self.group, dilations)
        y = conv(x, weight, None, strides, 0, 0, self.group, dilations)
        if any(extra):  # output_padding: zero rows at the end, before cropping
            y = F.pad(y, [p for e in reversed(extra) for p in (0, e)])
        index = [slice(None), slice(None)] + [slice(b, size - e) for b, e, size in zip(pads[:rank], pads[rank:], full)]
        y = y[tuple(index)]
        if any(grow):  # output_shape above the unpadded size: zero rows at the end
            y = F.pad(y, [p for g in reversed(grow) for p in (0, g)])
        if bias is not None:
            y = y + bias.reshape(1, -1, *([1] * rank))
        return y


@register("ConvTranspose", 1, 11)
def _conv_transpose(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    module = ConvTranspose(
        a.get("strides"),
        a.get("dilations"),
        a.get("group", 1),
        a.get("pads"),
        a.get("auto_pad", "NOTSET"),
        a.get("output_padding"),
        a.get("output_shape"),
    )
    return result(module, node)
