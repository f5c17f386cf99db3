"""Pad at every version: pads as attributes (1: `paddings`, 2: `pads`, value in the `value`
attribute), as inputs from 11 (`constant_value` input), on chosen `axes` from 18, `wrap` mode
from 19.  Any axis can be padded in any mode, and negative pads crop.

Each padded axis is built with index_select (reflect, edge, wrap) or concatenation (constant),
which torch differentiates; torch's F.pad covers only trailing axes for its non-constant modes.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, constants_or_fed, result, scalar


def _pad_axis(x: torch.Tensor, axis: int, begin: int, end: int, mode: str, value) -> torch.Tensor:
    size = x.shape[axis]
    if begin < 0 or end < 0:  # crop first
        x = x.narrow(axis, max(0, -begin), size - max(0, -begin) - max(0, -end))
        begin, end, size = max(0, begin), max(0, end), x.shape[axis]
    if begin == 0 and end == 0:
        return x
    if mode == "constant":
        parts = []
        for count in (begin, end):
            shape = list(x.shape)
            shape[axis] = count
            fill = torch.full(shape, 0, dtype=x.dtype, device=x.device) + value
            parts.append(fill.to(x.dtype))  # a float fill value must not promote an integer input
        return torch.cat([parts[0], x, parts[1]], dim=axis)
    positions = torch.arange(-begin, size + end, device=x.device)
    if mode == "edge":
        index = positions.clamp(0, size - 1)
    elif mode == "wrap":
        index = positions % size
    elif mode == "reflect":
        period = 2 * (size - 1)
        index = positions.abs() % period if period else torch.zeros_like(positions)
        index = torch.where(index >= size, period - index, index)
    else:
        raise NotImplementedError(f"Pad mode {mode!r}")
    return x.index_select(axis, index)


class Pad(OnnxModule):
    def __init__(self, mode: str, pads: Optional[Sequence[int]], value, axes: Optional[Sequence[int]]):
        super().__init__()
        self.mode, self.pads, self.value, self.axes = mode, pads, value, axes

    def forward(
        self, x: torch.Tensor, pads: torch.Tensor = None, constant_value: torch.Tensor = None, axes: torch.Tensor = None
    ) -> torch.Tensor:
        pads = list(self.pads) if pads is None else pads.tolist()
        axes = self.axes if axes is None else axes.tolist()
        axes = list(range(x.dim())) if axes is None else [a % x.dim() for a in axes]
        value = self.value if constant_value is None else constant_value.reshape(()).to(x.dtype)
        count = len(axes)
        for index, axis in enumerate(axes):
            x = _pad_axis(x, axis, int(pads[index]), int(pads[index + count]), self.mode, value)
        return x


def _attributes(node: OnnxNode, graph: OnnxGraph):
    """Pad-1 and Pad-2: everything in attributes, the fill value in `value`."""
    a = node.attributes
    pads = a.get("pads", a.get("paddings"))
    return result(Pad(a.get("mode", "constant"), pads, float(a.get("value", 0.0)), None), node, node.input_values[:1])


def _inputs(node: OnnxNode, graph: OnnxGraph):
    (pads, value, axes), inputs = constants_or_fed(node, graph, (1, 2, 3))
    fill = scalar(value, 0.0)
    return result(Pad(node.attributes.get("mode", "constant"), pads, fill, axes), node, inputs)


register("Pad", 1, 2)(_attributes)
register("Pad", 11, 18, 19)(_inputs)
