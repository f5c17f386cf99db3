"""SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (onnx2torch has neither).

ONNX puts classes in dim 1 of (N, C, d1, ...) exactly like torch's nll_loss, so the
mapping is direct; ORT computes log_softmax then the weighted NLL, as we do.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..gradient_quirks import reproduce_ort_gradients
from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, constant_or_none, result


class NllLoss(OnnxModule):
    def __init__(self, reduction: str, ignore_index, with_softmax: bool, log_prob_out: bool):
        super().__init__()
        self.reduction, self.with_softmax, self.log_prob_out = reduction, with_softmax, log_prob_out
        self.ignore_index = -100 if ignore_index is None else int(ignore_index)
        # ORT's SoftmaxCrossEntropyLossGrad ignores gradients arriving through log_prob
        self.ort_detached_log_prob = log_prob_out and with_softmax and reproduce_ort_gradients()

    def forward(self, scores: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor = None):
        log_prob = F.log_softmax(scores, dim=1) if self.with_softmax else scores
        loss = F.nll_loss(log_prob, labels.long(), weights, ignore_index=self.ignore_index, reduction=self.reduction)
        if self.log_prob_out:
            return loss, (log_prob.detach() if self.ort_detached_log_prob else log_prob)
        return loss


def _loss(with_softmax: bool):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        module = NllLoss(a.get("reduction", "mean"), a.get("ignore_index"), with_softmax, len(node.output_values) > 1)
        return result(module, node)
    return convert


register("SoftmaxCrossEntropyLoss", 12, 13)(_loss(True))
register("NegativeLogLikelihoodLoss", 12, 13, 22)(_loss(False))


@register("SoftmaxCrossEntropyLossInternal", 1, domain="com.microsoft")
def _sce_internal(node: OnnxNode, graph: OnnxGraph):
    """ORT's fused loss (SoftmaxCrossEntropyLossInternalFusion): ignore_index is an input."""
    ignore_index = constant_or_none(node, graph, 3)
    if len(node.input_values) > 3 and node.input_values[3] and ignore_index is None:
        raise NotImplementedError("SoftmaxCrossEntropyLossInternal with an ignore_index computed at run time")
    module = NllLoss(node.attributes.get("reduction", "mean"), ignore_index, True, len(node.output_values) > 1)
    return result(module, node, node.input_values[:3])
