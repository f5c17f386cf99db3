"""BatchNormalization (ONNX 6/7, 9, 14, 15) and ORT's BatchNormInternal (com.microsoft).

BatchNorm in training mode must reproduce ORT, not torch: ORT updates the running
variance with the *biased* batch variance and writes the running stats in place into the
frozen parameters of the checkpoint state during train_step.  BatchNormalization-6/7
(`is_test`/`spatial` attributes) runs as inference, as in ORT.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class BatchNorm(OnnxModule):
    def __init__(self, epsilon: float, momentum: float, training_mode: bool):
        super().__init__()
        self.epsilon, self.momentum, self.training_mode = epsilon, momentum, training_mode

    def forward(self, x, scale, bias, running_mean=None, running_var=None):
        if not self.training_mode:
            return F.batch_norm(x, running_mean, running_var, scale, bias, False, 0.0, self.epsilon)
        # The batch statistics come back from the kernel itself (mean, 1/sqrt(var+eps)), so the
        # biased-variance update costs no extra pass over the activations.  A running stat is
        # None where it is not ours to update (see graph/running_stats.py).
        y, mean, inv_std = torch.native_batch_norm(x, scale, bias, None, None, True, 0.0, self.epsilon)
        with torch.no_grad():
            if running_mean is not None:
                running_mean.mul_(self.momentum).add_(mean.detach(), alpha=1.0 - self.momentum)
            if running_var is not None:
                var = inv_std.detach().pow(-2).sub_(self.epsilon)
                running_var.mul_(self.momentum).add_(var, alpha=1.0 - self.momentum)
        return y


def _batch_norm(default_training_mode: int):
    """ONNX BatchNormalization defaults to inference; ORT's BatchNormInternal to training."""

    def convert(node: OnnxNode, graph: OnnxGraph):
        if len(node.output_values) > 1:
            raise NotImplementedError(f"{node.operation_type} with running-stat or saved outputs in use")
        a = node.attributes
        training = bool(a.get("training_mode", default_training_mode))
        return result(BatchNorm(a.get("epsilon", 1e-5), a.get("momentum", 0.9), training), node)

    return convert


register("BatchNormalization", 9, 14, 15)(_batch_norm(0))
register("BatchNormInternal", 1, domain="com.microsoft")(_batch_norm(1))


@register("BatchNormalization", 6, 7)
def _batch_norm_legacy(node: OnnxNode, graph: OnnxGraph):
    """BatchNormalization-6/7: ORT runs these as inference (is_test/spatial=1); training
    graphs carry BatchNormInternal instead."""
    a = node.attributes
    if not a.get("spatial", 1):
        raise NotImplementedError("BatchNormalization with spatial=0")
    if len(node.output_values) > 1:
        raise NotImplementedError("BatchNormalization-6/7 with running-stat or saved outputs in use")
    return result(BatchNorm(float(a.get("epsilon", 1e-5)), float(a.get("momentum", 0.9)), False), node)
