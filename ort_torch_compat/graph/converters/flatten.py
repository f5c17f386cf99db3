"""Flatten at every axis ONNX allows, 0 and the input rank included.

onnx2torch flattens with `torch.flatten(end_dim=axis - 1)` then `start_dim=1`, which fails
for axis == rank (the exporter writes that for every 2-D attention mask: `(B, S)` ->
`(B*S, 1)`) and for axis == 0 (`(1, N)`).
"""
from __future__ import annotations

import math

import torch

from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class Flatten(OnnxModule):
    def __init__(self, axis: int):
        super().__init__()
        self.axis = axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axis = self.axis + x.dim() if self.axis < 0 else self.axis
        return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@register("Flatten", 1, 9, 11, 13, 21)
def _flatten(node: OnnxNode, graph: OnnxGraph):
    return result(Flatten(node.attributes.get("axis", 1)), node)
