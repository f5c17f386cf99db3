"""SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (onnx2torch has neither).

ONNX puts classes in dim 1 of (N, C, d1, ...) exactly like torch's nll_loss, so the
mapping is direct; ORT computes log_softmax then the weighted NLL, as we do.

Which labels are ignored follows ORT 1.19.2 (measured: tests/fixtures/reliability/):
SoftmaxCrossEntropyLoss without an ``ignore_index`` attribute ignores label -1 (its
kernel's default) and its mean over no counted label is 0; NegativeLogLikelihoodLoss (an
ONNX function in ORT) ignores nothing unless told.  torch's own default, -100, is never
used.  A label outside [0, C) that is not ignored reads out of bounds in ORT's kernel; here
it raises an IndexError saying so, which the engine turns into an InvalidInputError naming
the label input (engine/step_failure.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ..gradient_quirks import reproduce_ort_gradients
from ._common import OnnxGraph, OnnxModule, OnnxNode, constant_or_none, result

#: Passed to torch when no label is to be ignored: no int64 label equals it in practice.
_NO_LABEL = -(2**63)


class NllLoss(OnnxModule):
    def __init__(
        self,
        op_type: str,
        reduction: str,
        ignore_index,
        with_softmax: bool,
        log_prob_out: bool,
        compute_dtype: torch.dtype = None,
    ):
        super().__init__()
        self.compute_dtype = compute_dtype  # SoftmaxCrossEntropyLossInternal's output_type
        self.op_type, self.reduction, self.with_softmax, self.log_prob_out = (
            op_type,
            reduction,
            with_softmax,
            log_prob_out,
        )
        if ignore_index is None:
            ignore_index = -1 if with_softmax else _NO_LABEL
        self.ignore_index = int(ignore_index)
        # ORT's SoftmaxCrossEntropyLossGrad ignores gradients arriving through log_prob
        self.ort_detached_log_prob = log_prob_out and with_softmax and reproduce_ort_gradients()

    def forward(self, scores: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor = None):
        if self.compute_dtype is not None:
            scores = scores.to(self.compute_dtype)
            weights = None if weights is None else weights.to(self.compute_dtype)
        log_prob = F.log_softmax(scores, dim=1) if self.with_softmax else scores
        labels = labels.long()
        try:
            if self.with_softmax and self.reduction == "mean":
                loss = self._mean_or_zero(log_prob, labels, weights)
            else:
                loss = F.nll_loss(log_prob, labels, weights, ignore_index=self.ignore_index, reduction=self.reduction)
        except IndexError as error:  # torch: "Target 5 is out of bounds."
            raise IndexError(
                f"{self.op_type}: a label is outside [0, {scores.shape[1]}) and is not the ignored label "
                f"{self.ignore_index} ({error})"
            ) from error
        if self.log_prob_out:
            return loss, (log_prob.detach() if self.ort_detached_log_prob else log_prob)
        return loss

    def _mean_or_zero(self, log_prob: torch.Tensor, labels: torch.Tensor, weights) -> torch.Tensor:
        """Weighted mean over the counted labels, 0 (not torch's NaN) when none counts."""
        total = F.nll_loss(log_prob, labels, weights, ignore_index=self.ignore_index, reduction="sum")
        counted = labels != self.ignore_index
        if weights is None:  # an integer count: dividing by max(count, 1) is the same (total is 0 at 0), 3 ops fewer
            return total / counted.sum().clamp_(min=1)
        mass = (weights[labels.clamp(0, weights.shape[0] - 1)] * counted).sum()
        return total / torch.where(mass == 0, torch.ones_like(mass), mass)


def _loss(op_type: str, with_softmax: bool):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        module = NllLoss(
            op_type, a.get("reduction", "mean"), a.get("ignore_index"), with_softmax, len(node.output_values) > 1
        )
        return result(module, node)

    return convert


register("SoftmaxCrossEntropyLoss", 12, 13)(_loss("SoftmaxCrossEntropyLoss", True))
register("NegativeLogLikelihoodLoss", 12, 13, 22)(_loss("NegativeLogLikelihoodLoss", False))


def _internal_loss(op_type: str, with_softmax: bool):
    """ORT's com.microsoft losses, whose ignore_index is input 3 (a constant in the graphs ORT
    writes).  SoftmaxCrossEntropyLossInternal is written by SoftmaxCrossEntropyLossInternalFusion
    (LogSoftmax + NegativeLogLikelihoodLossInternal); CastSceLossFusion then folds a float16 ->
    float Cast of the scores into it with ``output_type`` = FLOAT: ORT computes and returns
    both outputs (loss, log_prob) in ``output_type``.  NegativeLogLikelihoodLossInternal is the
    loss ORT's exporter writes for torch's nll_loss / cross_entropy."""

    def convert(node: OnnxNode, graph: OnnxGraph):
        ignore_index = constant_or_none(node, graph, 3)
        if len(node.input_values) > 3 and node.input_values[3] and ignore_index is None:
            raise NotImplementedError(f"{op_type} with an ignore_index computed at run time")
        ignore_index = ignore_index[0] if isinstance(ignore_index, list) else ignore_index
        output_type = node.attributes.get("output_type")
        if output_type is not None:
            from .casting import torch_dtype

            output_type = torch_dtype(int(output_type))
        module = NllLoss(
            op_type,
            node.attributes.get("reduction", "mean"),
            ignore_index,
            with_softmax,
            len(node.output_values) > 1,
            output_type,
        )
        return result(module, node, node.input_values[:3])

    return convert


register("SoftmaxCrossEntropyLossInternal", 1, domain="com.microsoft")(
    _internal_loss("SoftmaxCrossEntropyLossInternal", True)
)
register("NegativeLogLikelihoodLossInternal", 1, domain="com.microsoft")(
    _internal_loss("NegativeLogLikelihoodLossInternal", False)
)
