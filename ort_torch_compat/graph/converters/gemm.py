"""Gemm as one fused BLAS call.

onnx2torch's functional Gemm multiplies by alpha and beta even when they are 1, adding two
full passes over the activations (and their backward) to every dense layer; training
steps are dominated by dense layers, so this matters.  The common dense layer
(transB=1, alpha=beta=1, 1-D bias) goes through `..kernels.linear`.
"""

from __future__ import annotations

import torch

from ..converter_registry import register
from ..dense_kernel import linear
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class Gemm(OnnxModule):
    def __init__(self, alpha: float, beta: float, trans_a: bool, trans_b: bool):
        super().__init__()
        self.alpha, self.beta, self.trans_a, self.trans_b = alpha, beta, trans_a, trans_b
        self.linear = trans_b and not trans_a and alpha == 1.0 and beta == 1.0

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor = None) -> torch.Tensor:
        if self.linear and (c is None or c.dim() == 1):
            return linear(a, b, c)
        if self.trans_a:
            a = a.t()
        if self.trans_b:
            b = b.t()
        if c is None or self.beta == 0.0:
            out = torch.mm(a, b)
            return out if self.alpha == 1.0 else out * self.alpha
        return torch.addmm(c, a, b, beta=self.beta, alpha=self.alpha)


@register("Gemm", 1, 6, 7, 9, 11, 13)
def _gemm(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    module = Gemm(
        float(a.get("alpha", 1.0)), float(a.get("beta", 1.0)), bool(a.get("transA", 0)), bool(a.get("transB", 0))
    )
    return result(module, node)
