"""`SimplifiedLayerNormalization`, ORT's own schema in the ai.onnx domain, which its
SimplifiedLayerNormFusion writes into training and eval models of RMSNorm models (T5,
Llama): `x / sqrt(mean(x^2) + eps) * scale`, optional output 1 the inverse standard
deviation.  (ORT's LayerNormalization below opset 17 is converted with ONNX's, see
normalization.py.)
"""
from __future__ import annotations

import torch

from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class SimplifiedLayerNorm(OnnxModule):
    """`statistics`: also return the inverse standard deviation (output 1)."""

    def __init__(self, axis: int, epsilon: float, statistics: bool = False):
        super().__init__()
        self.axis, self.epsilon, self.statistics = axis, epsilon, statistics

    def forward(self, x: torch.Tensor, scale: torch.Tensor):
        axis = self.axis + x.dim() if self.axis < 0 else self.axis
        dims = tuple(range(axis, x.dim()))
        inv_std = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + self.epsilon)
        y = x * inv_std * scale
        return (y, inv_std) if self.statistics else y


@register("SimplifiedLayerNormalization", 1)
def _simplified_layer_norm(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(SimplifiedLayerNorm(a.get("axis", -1), a.get("epsilon", 1e-5), len(node.output_values) > 1), node)
