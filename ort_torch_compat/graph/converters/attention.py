"""The fused-domain ScaledAttention node (graph/attention_pattern.py writes it).

Eagerly and in traces for the compiler it makes the calls of the nodes it replaced, in their
order (onnx2torch's Mul, MatMul, Div, Add and Softmax: `torch.mul`, `torch.matmul`,
`torch.div`, `torch.add`, `torch.softmax`), so values and gradients are those of the graph
as written, bit for bit.  In the traced step's trace (graph/traced_operators.py) it is one
`scaled_attention` operator where the shapes allow: one attention kernel each way.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..converter_registry import register
from ..fusion import FUSED_DOMAIN
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .casting import torch_dtype


class ScaledAttention(OnnxModule):
    """softmax((query [* query_scale]) @ (keys [* keys_scale]) [/ or * scores_scale]
    [+ mask]) [cast to each of `probabilities_types`] @ values; `keys` is K transposed ([..., head size, keys])."""

    def __init__(self, scores_divided: bool, probabilities_types: Sequence[torch.dtype], scale: float):
        super().__init__()
        self.scores_divided = scores_divided
        self.probabilities_types = tuple(probabilities_types)  # the Casts after the softmax, in order
        self.scale = scale  # the product of the factors, for the traced step's operator

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        query_scale: Optional[torch.Tensor] = None,
        keys_scale: Optional[torch.Tensor] = None,
        scores_scale: Optional[torch.Tensor] = None,
        mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        from .. import traced_operators

        if traced_operators.operators_in_use() and all(dtype == query.dtype for dtype in self.probabilities_types):
            kernel = self._on_kernel(query, keys, values, mask)
            if kernel is not None:
                return kernel
        if query_scale is not None:
            query = torch.mul(query, query_scale)
        if keys_scale is not None:
            keys = torch.mul(keys, keys_scale)
        scores = torch.matmul(query, keys)
        if scores_scale is not None:
            scores = torch.div(scores, scores_scale) if self.scores_divided else torch.mul(scores, scores_scale)
        if mask is not None:
            scores = torch.add(scores, mask)
        probabilities = torch.softmax(scores, -1)
        for dtype in self.probabilities_types:
            probabilities = probabilities.to(dtype)
        return torch.matmul(probabilities, values)

    def _on_kernel(self, query, keys, values, mask) -> Optional[torch.Tensor]:
        """The traced step's attention operator's result where it takes these tensors: [batch,
        heads, rows, size] ones, or [batch, rows, size] ones as one head; else None."""
        from .. import traced_operators

        one_head = query.dim() == keys.dim() == values.dim() == 3
        if one_head:
            query, keys, values = query.unsqueeze(1), keys.unsqueeze(1), values.unsqueeze(1)
            if mask is not None and mask.dim() == 3:  # [batch, rows, keys]: the head axis goes between
                mask = mask.unsqueeze(1)
        if not traced_operators.attention_fits(query, keys, values, mask):
            return None
        output = traced_operators.scaled_attention(query, keys.transpose(-1, -2), values, mask, self.scale)
        return output.squeeze(1) if one_head else output


@register("ScaledAttention", 1, domain=FUSED_DOMAIN)
def _scaled_attention(node: OnnxNode, graph: OnnxGraph):
    attributes = node.attributes
    casts = [torch_dtype(int(onnx_type)) for onnx_type in attributes.get("probabilities_casts", [])]
    return result(
        ScaledAttention(bool(attributes.get("scores_divided", 0)), casts, float(attributes["scale"].to_numpy())), node
    )
