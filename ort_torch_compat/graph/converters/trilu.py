"""Trilu (ai.onnx 14 and ORT's com.microsoft Trilu): the causal mask of decoder models.

The diagonal offset `k` is an optional 0-d int64 input; exporters usually pass a constant,
which is baked in, otherwise it is read at run time.
"""
from __future__ import annotations

import torch

from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, constant_or_none, result


class Trilu(OnnxModule):
    def __init__(self, upper: bool, k):
        super().__init__()
        self.upper, self.k = upper, k

    def forward(self, x: torch.Tensor, k: torch.Tensor = None) -> torch.Tensor:
        diagonal = int(k) if k is not None else int(self.k or 0)
        return torch.triu(x, diagonal) if self.upper else torch.tril(x, diagonal)


@register("Trilu", 14)
@register("Trilu", 1, domain="com.microsoft")
def _trilu(node: OnnxNode, graph: OnnxGraph):
    k = constant_or_none(node, graph, 1)
    inputs = node.input_values[:1] if k is not None or len(node.input_values) < 2 else node.input_values[:2]
    return result(Trilu(bool(node.attributes.get("upper", 1)), k), node, inputs)
