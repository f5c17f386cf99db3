"""ORT's own normalization schemas in the ai.onnx domain, which its training graph
transformers (LayerNormFusion, SimplifiedLayerNormFusion) write into training and eval
models: `LayerNormalization` below opset 17 (ORT registers a schema of its own there, since
version 1, with the semantics, attributes and optional Mean/InvStdDev outputs of the later
ONNX op) and `SimplifiedLayerNormalization` (RMSNorm: `x / sqrt(mean(x^2) + eps) * scale`,
optional output 1 the inverse standard deviation).  The optional outputs feed only ORT's
gradient ops, which are not part of the converted forward graph.
"""
from __future__ import annotations

import torch

from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .normalization import LayerNorm


class SimplifiedLayerNorm(OnnxModule):
    def __init__(self, axis: int, epsilon: float):
        super().__init__()
        self.axis, self.epsilon = axis, epsilon

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        axis = self.axis + x.dim() if self.axis < 0 else self.axis
        dims = tuple(range(axis, x.dim()))
        return x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + self.epsilon) * scale


@register("LayerNormalization", 1)
def _layer_norm_ort_schema(node: OnnxNode, graph: OnnxGraph):
    if len(node.output_values) > 1:
        raise NotImplementedError("LayerNormalization with Mean/InvStdDev outputs in use")
    a = node.attributes
    return result(LayerNorm(a.get("axis", -1), a.get("epsilon", 1e-5)), node)


@register("SimplifiedLayerNormalization", 1)
def _simplified_layer_norm(node: OnnxNode, graph: OnnxGraph):
    if len(node.output_values) > 1:
        raise NotImplementedError("SimplifiedLayerNormalization with the inv_std_var output in use")
    a = node.attributes
    return result(SimplifiedLayerNorm(a.get("axis", -1), a.get("epsilon", 1e-5)), node)
