"""The layer normalizations over the trailing axes: LayerNormalization (ONNX 17, ORT's
ai.onnx-1 and com.microsoft schemas), SimplifiedLayerNormalization (RMSNorm: ORT's own
ai.onnx schema, written by its SimplifiedLayerNormFusion into T5 and Llama training and eval
models) and ORT's fused SkipLayerNormalization / SkipSimplifiedLayerNormalization
(com.microsoft; inference graphs optimized by ORT)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ..dense_kernel import plain_aten_active
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class LayerNorm(OnnxModule):
    """`statistics`: also return Mean and InvStdDev (ONNX's optional outputs 1 and 2)."""

    def __init__(self, axis: int, epsilon: float, statistics: bool = False):
        super().__init__()
        self.axis, self.epsilon, self.statistics = axis, epsilon, statistics

    def forward(self, x, scale, bias=None):
        axis = self.axis if self.axis >= 0 else x.dim() + self.axis
        shape = x.shape[axis:]
        if scale.shape != shape:
            scale = scale.expand(shape)
        if bias is not None and bias.shape != shape:
            bias = bias.expand(shape)
        if not self.statistics:
            return F.layer_norm(x, shape, scale, bias, self.epsilon)
        return torch.native_layer_norm(x, shape, scale, bias, self.epsilon)


# ai.onnx version 1: ORT's own schema below opset 17 (written by its LayerNormFusion), the
# semantics, attributes and optional outputs of ONNX's LayerNormalization-17.
@register("LayerNormalization", 1, 17)
@register("LayerNormalization", 1, domain="com.microsoft")
def _layer_norm(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(LayerNorm(a.get("axis", -1), a.get("epsilon", 1e-5), len(node.output_values) > 1), node)


class SimplifiedLayerNorm(OnnxModule):
    """`statistics`: also return the inverse standard deviation (output 1).  Traced for the
    traced step, without statistics: one operator with a hand-derived backward
    (graph/traced_operators.py)."""

    def __init__(self, axis: int, epsilon: float, statistics: bool = False):
        super().__init__()
        self.axis, self.epsilon, self.statistics = axis, epsilon, statistics

    def forward(self, x: torch.Tensor, scale: torch.Tensor):
        axis = self.axis + x.dim() if self.axis < 0 else self.axis
        if not self.statistics and scale.shape == x.shape[axis:] and plain_aten_active():
            from .. import traced_operators  # registers its operators: only where a trace needs them

            if traced_operators.operators_in_use():  # a trace for the traced step
                return traced_operators.rms_norm(x, scale, axis, float(self.epsilon))[0]
        dims = tuple(range(axis, x.dim()))
        inv_std = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + self.epsilon)
        y = x * inv_std * scale
        return (y, inv_std) if self.statistics else y


@register("SimplifiedLayerNormalization", 1)
def _simplified_layer_norm(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(SimplifiedLayerNorm(a.get("axis", -1), a.get("epsilon", 1e-5), len(node.output_values) > 1), node)


class SkipLayerNorm(OnnxModule):
    """ORT's SkipLayerNormalization / SkipSimplifiedLayerNormalization: normalize
    input + skip (+ bias) over the last axis; the optional outputs are mean, inv_std_var and
    the sum input + skip + bias.  ORT 1.19.2's CPU SkipSimplifiedLayerNormalization ignores
    its fourth input (bias), measured: so does this."""

    def __init__(self, epsilon: float, simplified: bool, outputs: int):
        super().__init__()
        self.epsilon, self.simplified, self.outputs = epsilon, simplified, outputs

    def forward(
        self,
        x: torch.Tensor,
        skip: torch.Tensor,
        gamma: torch.Tensor,
        beta: torch.Tensor = None,
        bias: torch.Tensor = None,
    ):
        if self.simplified:  # inputs: x, skip, gamma, bias (ignored, as ORT)
            beta, bias = None, None
        summed = x + skip if bias is None else x + skip + bias
        if self.simplified:
            inv_std = torch.rsqrt(summed.pow(2).mean(dim=-1, keepdim=True) + self.epsilon)
            mean = torch.zeros_like(inv_std)
            y = summed * inv_std * gamma
        else:
            mean = summed.mean(dim=-1, keepdim=True)
            inv_std = torch.rsqrt((summed - mean).pow(2).mean(dim=-1, keepdim=True) + self.epsilon)
            y = (summed - mean) * inv_std * gamma
            if beta is not None:
                y = y + beta
        if self.outputs == 1:
            return y
        return (y, mean, inv_std, summed)[: self.outputs]


def _skip_layer_norm(simplified: bool):
    def convert(node: OnnxNode, graph: OnnxGraph):
        module = SkipLayerNorm(float(node.attributes.get("epsilon", 1e-12)), simplified, len(node.output_values))
        return result(module, node)

    return convert


register("SkipLayerNormalization", 1, domain="com.microsoft")(_skip_layer_norm(False))
register("SkipSimplifiedLayerNormalization", 1, domain="com.microsoft")(_skip_layer_norm(True))
