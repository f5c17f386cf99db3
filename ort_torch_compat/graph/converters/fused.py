"""Converters for the nodes our own graph rewrites create (see ..fusion)."""

from __future__ import annotations

import torch

from ..converter_registry import register
from ..dense_kernel import linear
from ..fusion import FUSED_DOMAIN
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class MatMulBias(OnnxModule):
    """x @ W + b for a 2-D W [in, out], as one dense-layer kernel."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return linear(x, weight.t(), bias)


@register("MatMulBias", 1, domain=FUSED_DOMAIN)
def _matmul_bias(node: OnnxNode, graph: OnnxGraph):
    return result(MatMulBias(), node)


class LinearBias(OnnxModule):
    """x @ weight^T + b (the exporter's MatMul(x, Transpose(weight)) + b) as torch's linear."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return linear(x, weight, bias)


@register("LinearBias", 1, domain=FUSED_DOMAIN)
def _linear_bias(node: OnnxNode, graph: OnnxGraph):
    return result(LinearBias(), node)


class Linear(OnnxModule):
    """x @ weight^T (the exporter's MatMul(x, Transpose(weight))) as torch's linear."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return linear(x, weight)


@register("Linear", 1, domain=FUSED_DOMAIN)
def _linear(node: OnnxNode, graph: OnnxGraph):
    return result(Linear(), node)


class Identity(OnnxModule):
    """ONNX Identity.  onnx2torch clones (for its quantization passes); nothing here
    mutates activations in place, so the tensor itself is passed on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@register("Identity", 1, 13, 14, 16, 19, 21)
def _identity(node: OnnxNode, graph: OnnxGraph):
    return result(Identity(), node)
