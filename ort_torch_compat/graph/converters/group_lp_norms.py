"""Normalizations over channel groups and given axes: GroupNormalization (18: scale and bias
per group; 21: per channel), InstanceNormalization, MeanVarianceNormalization and LpNormalization."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


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
        norm = (
            x.abs().sum(dim=self.axis, keepdim=True)
            if self.p == 1
            else x.pow(2).sum(dim=self.axis, keepdim=True).sqrt()
        )
        return x / norm


@register("LpNormalization", 1)
def _lp_norm(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(LpNorm(int(a.get("axis", -1)), int(a.get("p", 2))), node)


class InstanceNorm(OnnxModule):
    """InstanceNormalization with scale and bias as inputs.

    onnx2torch's converter reads the input's rank from the graph's value_info when scale and
    bias are initializers, and fails (KeyError) where the graph declares none, as in the
    training model of a dynamo-exported GroupNorm."""

    def __init__(self, epsilon: float):
        super().__init__()
        self.epsilon = epsilon

    def forward(self, x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.instance_norm(x, weight=scale, bias=bias, use_input_stats=True, eps=self.epsilon)


@register("InstanceNormalization", 1, 6)
def _instance_norm(node: OnnxNode, graph: OnnxGraph):
    return result(InstanceNorm(float(node.attributes.get("epsilon", 1e-5))), node)
