"""Unsqueeze with axes as an input (opset 13+).

onnx2torch's converter calls ``.tolist()`` on the constant axes, which fails where they come
from ``Constant(value_ints=[...])`` (a Python list), as the dynamo exporter writes them
(GPT-J, BART in scripts/architecture_sweep.py: "'list' object has no attribute 'tolist'").
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, constant_or_none, result


class _Unsqueeze(OnnxModule):
    """Insert size-1 dims at ``axes`` of the output (negative counted from the output's rank)."""

    def __init__(self, axes: Optional[List[int]]):
        super().__init__()
        self.axes = axes

    def forward(self, x: torch.Tensor, axes: Optional[torch.Tensor] = None) -> torch.Tensor:
        wanted = self.axes if self.axes is not None else [int(a) for a in axes.reshape(-1).tolist()]
        rank = x.dim() + len(wanted)
        for axis in sorted(a + rank if a < 0 else a for a in wanted):
            x = x.unsqueeze(axis)
        return x


@register("Unsqueeze", 13, 21)
def _unsqueeze(node: OnnxNode, graph: OnnxGraph):
    axes = constant_or_none(node, graph, 1)
    if axes is not None:
        axes = [int(a) for a in (axes if isinstance(axes, list) else [axes])]
        return result(_Unsqueeze(axes), node, [node.input_values[0]])
    return result(_Unsqueeze(None), node)
