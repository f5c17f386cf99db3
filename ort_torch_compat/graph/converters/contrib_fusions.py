"""ORT's inference fusions (com.microsoft FusedConv, FusedGemm): a Conv or Gemm followed by
an activation (and, for FusedConv, an added tensor), as ORT's optimizer writes them into
exported inference models.  ORT has no gradient for them."""

from __future__ import annotations

from typing import Sequence

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .convolution import Conv
from .gemm import Gemm
from .named_activations import named_activation


def activation(name: str, params: Sequence[float]):
    """ORT's fused activation: `activation_params` are alpha (and beta; Clip: min, max)."""
    return named_activation(name, *list(params)[:2])


class FusedConv(OnnxModule):
    def __init__(self, conv: Conv, act):
        super().__init__()
        self.conv, self.act = conv, act

    def forward(self, x, weight, bias=None, addend=None):
        y = self.conv(x, weight, bias)
        if addend is not None:
            y = y + addend
        return self.act(y)


@register("FusedConv", 1, domain="com.microsoft")
def _fused_conv(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    conv = Conv(
        a.get("strides"),
        a.get("dilations"),
        a.get("group", 1),
        a.get("pads"),
        a.get("auto_pad", "NOTSET"),
        a.get("kernel_shape"),
    )
    return result(FusedConv(conv, activation(a.get("activation", "Relu"), a.get("activation_params", []))), node)


class FusedGemm(OnnxModule):
    def __init__(self, gemm: Gemm, act):
        super().__init__()
        self.gemm, self.act = gemm, act

    def forward(self, a, b, c=None):
        return self.act(self.gemm(a, b, c))


@register("FusedGemm", 1, domain="com.microsoft")
def _fused_gemm(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    gemm = Gemm(
        float(a.get("alpha", 1.0)), float(a.get("beta", 1.0)), bool(a.get("transA", 0)), bool(a.get("transB", 0))
    )
    name = a.get("activation", "Relu")
    # Only these two read activation_alpha/beta; absent ones take named_activation's defaults.
    alpha, beta = (
        (a.get("activation_alpha"), a.get("activation_beta")) if name in ("LeakyRelu", "HardSigmoid") else (None, None)
    )
    return result(FusedGemm(gemm, named_activation(name, alpha, beta)), node)
