"""Shape/tensor ops onnx2torch lacks at newer opsets, and ORT's training-graph variants."""
from __future__ import annotations

import torch

from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, constant_or_none, result


class Split(OnnxModule):
    def __init__(self, axis: int, sizes, num_outputs: int):
        super().__init__()
        self.axis, self.sizes, self.num_outputs = axis, sizes, num_outputs

    def forward(self, x: torch.Tensor, split: torch.Tensor = None):
        sizes = self.sizes if split is None else split.tolist()
        if sizes is None:
            length = x.shape[self.axis]
            chunk = -(-length // self.num_outputs)  # ceil: the last chunk may be smaller
            sizes = [min(chunk, length - i * chunk) for i in range(self.num_outputs)]
        parts = torch.split(x, sizes, dim=self.axis)
        return parts[0] if len(parts) == 1 else tuple(parts)


@register("Split", 13, 18)
def _split(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    count = int(a.get("num_outputs", len(node.output_values)))
    sizes = constant_or_none(node, graph, 1)
    inputs = node.input_values[:1] if sizes is not None or len(node.input_values) < 2 else node.input_values
    module = Split(a.get("axis", 0), sizes, count)
    return result(module, node, inputs)


class Concat(OnnxModule):
    def __init__(self, axis: int):
        super().__init__()
        self.axis = axis

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return torch.cat(tensors, dim=self.axis)


@register("ConcatTraining", 1, domain="com.microsoft")
def _concat_training(node: OnnxNode, graph: OnnxGraph):
    if len(node.output_values) > 1:
        raise NotImplementedError("ConcatTraining with the per_input_length output in use")
    return result(Concat(node.attributes["axis"]), node)


class FusedMatMul(OnnxModule):
    """alpha * op(A) @ op(B), where op transposes the last two dims when asked."""

    def __init__(self, alpha: float, trans_a: bool, trans_b: bool):
        super().__init__()
        self.alpha, self.trans_a, self.trans_b = alpha, trans_a, trans_b

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.trans_a:
            a = a.transpose(-1, -2)
        if self.trans_b:
            b = b.transpose(-1, -2)
        out = torch.matmul(a, b)
        return out if self.alpha == 1.0 else out * self.alpha


@register("FusedMatMul", 1, domain="com.microsoft")
def _fused_matmul(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    if a.get("transBatchA", 0) or a.get("transBatchB", 0):
        raise NotImplementedError("FusedMatMul with transBatchA/transBatchB")
    return result(FusedMatMul(float(a.get("alpha", 1.0)), bool(a.get("transA", 0)), bool(a.get("transB", 0))), node)
