"""Dropout that follows the graph's own `training_mode`, not `nn.Module.training`.

ORT's training graph keeps the exported (constant) training_mode input and the eval model
blanks it, so the graph itself says whether dropout is active; onnx2torch ignores it.
Inactive dropout is the identity forward; its gradient is ORT's (see ..gradient_quirks) when
the conversion reproduces ORT's gradients.  The optional mask output is True where an element
was kept: all True when inactive, but all False from ORT's inference-only Dropout-7/10 kernels
(measured), whose mask has the input's type before opset 10.
"""

from __future__ import annotations

import torch

from ..converter_registry import register
from ..gradient_quirks import ort_gradient, reproduce_ort_gradients
from ._common import OnnxGraph, OnnxModule, OnnxNode, constants_or_fed, result, scalar


class Dropout(OnnxModule):
    def __init__(
        self,
        ratio: float,
        training: bool,
        with_mask: bool,
        mask_dtype: torch.dtype,
        ort_scaled_grad: bool,
        legacy: bool = False,
    ):
        super().__init__()
        self.legacy = legacy
        self.ratio, self.training_mode = ratio, training
        self.with_mask, self.mask_dtype, self.ort_scaled_grad = with_mask, mask_dtype, ort_scaled_grad

    def forward(self, x: torch.Tensor, ratio: torch.Tensor = None, training_mode: torch.Tensor = None):
        active = self.training_mode if training_mode is None else bool(training_mode)
        p = self.ratio if ratio is None else float(ratio)
        if active and p > 0.0:
            keep = torch.rand_like(x) >= p
            y = x * keep / (1.0 - p)
        else:
            # p == 0: the scale is 1, the surrogate the identity (four kernels saved per node)
            y = ort_gradient(x, x / (1.0 - p)) if (self.ort_scaled_grad and 0.0 < p < 1.0) else x
            if not self.with_mask:
                return y
            # ORT's inference-only legacy kernels (7, 10) return an all-False mask
            keep = torch.full_like(x, not self.legacy, dtype=torch.bool)
        if self.with_mask:
            return y, keep.to(self.mask_dtype or x.dtype)
        return y


def _opset12(node: OnnxNode, graph: OnnxGraph):
    (ratio, training), inputs = constants_or_fed(node, graph, (1, 2))
    has_ratio = len(node.input_values) > 1 and bool(node.input_values[1])
    # ORT's DropoutGrad scales by 1/(1 - ratio) even when inactive, but only when the node has a
    # ratio input (measured; without one the gradient is the identity).
    module = Dropout(
        float(scalar(ratio, 0.5)),
        bool(scalar(training, False)),
        len(node.output_values) > 1,
        torch.bool,
        ort_scaled_grad=has_ratio and reproduce_ort_gradients(),
    )
    return result(module, node, inputs)


def _legacy(mask_dtype):
    """Before opset 12 the graph has no training flag: ORT treats these as inference-only."""

    def convert(node: OnnxNode, graph: OnnxGraph):
        module = Dropout(
            float(node.attributes.get("ratio", 0.5)),
            False,
            len(node.output_values) > 1,
            mask_dtype,
            ort_scaled_grad=False,
            legacy=True,
        )
        return result(module, node, node.input_values[:1])

    return convert


register("Dropout", 12, 13, 22)(_opset12)
register("Dropout", 10)(_legacy(torch.bool))
register("Dropout", 7)(_legacy(None))
