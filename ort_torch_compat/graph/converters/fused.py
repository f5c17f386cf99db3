"""Converters for the nodes our own graph rewrites create (see ..fusion)."""
from __future__ import annotations

import torch

from ..fusion import FUSED_DOMAIN
from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class MatMulBias(OnnxModule):
    """x @ W + b for a 2-D W, as one addmm over the flattened leading dims.

    The weight gradient comes out as x^T @ grad, already in W's [in, out] layout, so
    storing it needs no transposed copy (F.linear would produce it transposed)."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return torch.addmm(bias, x, weight)
        flat = torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight)
        return flat.view(*x.shape[:-1], weight.shape[1])


@register("MatMulBias", 1, domain=FUSED_DOMAIN)
def _matmul_bias(node: OnnxNode, graph: OnnxGraph):
    return result(MatMulBias(), node)


class Identity(OnnxModule):
    """ONNX Identity.  onnx2torch clones (for its quantization passes); nothing here
    mutates activations in place, so the tensor itself is passed on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@register("Identity", 1, 13, 14, 16, 19, 21)
def _identity(node: OnnxNode, graph: OnnxGraph):
    return result(Identity(), node)
