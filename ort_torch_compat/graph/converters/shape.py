"""Shape (with opset 15's start/end): always int64.

onnx2torch's module builds ``torch.tensor(x.shape[start:end])``, which is float32 when the
slice is empty (``Shape(x, start=rank)``, as the dynamo exporter writes for
``repeat_interleave``); concatenated with int64 pieces it turned a Reshape's target shape
into floats (GPT-J, dynamo opset 18: "reshape(): argument 'shape' ... must be tuple of ints,
but found element of type float"), found by scripts/architecture_sweep.py.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class _Shape(OnnxModule):
    def __init__(self, start: int = 0, end: Optional[int] = None):
        super().__init__()
        self.start = start
        self.end = end

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tensor(x.shape[self.start : self.end], dtype=torch.int64, device=x.device)


@register("Shape", 1, 13, 15)
def _shape(node: OnnxNode, graph: OnnxGraph):
    return result(_Shape(int(node.attributes.get("start", 0)), node.attributes.get("end", None)), node)
