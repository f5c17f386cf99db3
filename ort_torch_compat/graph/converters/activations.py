"""GELU family: ai.onnx Gelu-20 and the com.microsoft fusions ORT writes into training graphs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ..gradient_quirks import ort_gradient, reproduce_ort_gradients
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class Gelu(OnnxModule):
    def __init__(self, approximate: str = "none", ort_erf_gradient: bool = False):
        super().__init__()
        self.approximate, self.ort_erf_gradient = approximate, ort_erf_gradient

    def forward(self, x: torch.Tensor, bias: torch.Tensor = None) -> torch.Tensor:
        if bias is not None:
            x = x + bias
        y = F.gelu(x, approximate=self.approximate)
        if self.ort_erf_gradient:  # ORT differentiates erf GELU here (..gradient_quirks)
            return ort_gradient(y, F.gelu(x))
        return y


class QuickGelu(OnnxModule):
    """x * sigmoid(alpha * x); alpha=1 is SiLU."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.alpha == 1.0:
            return F.silu(x)
        return x * torch.sigmoid(self.alpha * x)


@register("Gelu", 20)
def _gelu20(node: OnnxNode, graph: OnnxGraph):
    approximate = node.attributes.get("approximate", "none")
    return result(Gelu(approximate, ort_erf_gradient=approximate == "tanh" and reproduce_ort_gradients()), node)


@register("Gelu", 1, domain="com.microsoft")
@register("BiasGelu", 1, domain="com.microsoft")
def _gelu_ms(node: OnnxNode, graph: OnnxGraph):
    return result(Gelu("none"), node)


@register("FastGelu", 1, domain="com.microsoft")
def _fast_gelu(node: OnnxNode, graph: OnnxGraph):
    return result(Gelu("tanh"), node)


@register("QuickGelu", 1, domain="com.microsoft")
def _quick_gelu(node: OnnxNode, graph: OnnxGraph):
    return result(QuickGelu(float(node.attributes.get("alpha", 1.702))), node)
