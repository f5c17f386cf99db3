"""Normalizations beyond normalization.py's BatchNorm and LayerNorm: GroupNormalization,
MeanVarianceNormalization, LpNormalization, the legacy BatchNormalization-6/7 (inference
only: `is_test`/`spatial` attributes), and ORT's fused SkipLayerNormalization and
SkipSimplifiedLayerNormalization (com.microsoft; inference graphs optimized by ORT)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .normalization import BatchNorm


class GroupNorm(OnnxModule):
    """GroupNormalization: scale/bias per group (18) or per channel (21)."""

    def __init__(self, groups: int, epsilon: float, per_group_affine: bool):
        super().__init__()
        self.groups, self.epsilon, self.per_group_affine = groups, epsilon, per_group_affine

    def forward(self, x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        if self.per_group_affine:
            scale = scale.repeat_interleave(channels // self.groups)
            bias = bias.repeat_interleave(channels // self.groups)
        return F.group_norm(x, self.groups, scale, bias, self.epsilon)


def _group_norm(per_group_affine: bool):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        return result(GroupNorm(int(a["num_groups"]), float(a.get("epsilon", 1e-5)), per_group_affine), node)
    return convert


register("GroupNormalization", 18)(_group_norm(True))
register("GroupNormalization", 21)(_group_norm(False))


class MeanVarianceNorm(OnnxModule):
    def __init__(self, axes):
        super().__init__()
        self.axes = list(axes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=self.axes, keepdim=True)
        centered = x - mean
        variance = (centered * centered).mean(dim=self.axes, keepdim=True)
        return centered / torch.sqrt(variance + 1e-9)


@register("MeanVarianceNormalization", 9, 13)
def _mvn(node: OnnxNode, graph: OnnxGraph):
    return result(MeanVarianceNorm(node.attributes.get("axes", [0, 2, 3])), node)


class LpNorm(OnnxModule):
    def __init__(self, axis: int, p: int):
        super().__init__()
        self.axis, self.p = axis, p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = x.abs().sum(dim=self.axis, keepdim=True) if self.p == 1 else x.pow(2).sum(dim=self.axis, keepdim=True).sqrt()
        return x / norm


@register("LpNormalization", 1)
def _lp_norm(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(LpNorm(int(a.get("axis", -1)), int(a.get("p", 2))), node)


@register("BatchNormalization", 6, 7)
def _batch_norm_legacy(node: OnnxNode, graph: OnnxGraph):
    """BatchNormalization-6/7: ORT runs these as inference (is_test/spatial=1); training
    graphs carry BatchNormInternal instead."""
    a = node.attributes
    if not a.get("spatial", 1):
        raise NotImplementedError("BatchNormalization with spatial=0")
    if len(node.output_values) > 1:
        raise NotImplementedError("BatchNormalization-6/7 with running-stat or saved outputs in use")
    return result(BatchNorm(float(a.get("epsilon", 1e-5)), float(a.get("momentum", 0.9)), False), node)


class SkipLayerNorm(OnnxModule):
    """ORT's SkipLayerNormalization / SkipSimplifiedLayerNormalization: normalize
    input + skip (+ bias) over the last axis; the optional outputs are mean, inv_std_var and
    the sum input + skip + bias.  ORT 1.19.2's CPU SkipSimplifiedLayerNormalization ignores
    its fourth input (bias), measured: so does this."""

    def __init__(self, epsilon: float, simplified: bool, outputs: int):
        super().__init__()
        self.epsilon, self.simplified, self.outputs = epsilon, simplified, outputs

    def forward(self, x: torch.Tensor, skip: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor = None,
                bias: torch.Tensor = None):
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
