"""Dropout that follows the graph's own `training_mode`, not `nn.Module.training`.

ORT's training graph keeps the exported (constant) training_mode input and the eval model
blanks it, so the graph itself says whether dropout is active; onnx2torch ignores it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, constant_or_none, result


class Dropout(OnnxModule):
    def __init__(self, ratio, training):
        super().__init__()
        self.ratio, self.training_mode = ratio, training

    def forward(self, x: torch.Tensor, ratio=None, training_mode=None) -> torch.Tensor:
        active = self.training_mode if training_mode is None else bool(training_mode)
        p = self.ratio if ratio is None else float(ratio)
        if not active or p == 0.0:
            return x
        return F.dropout(x, p, True)


@register("Dropout", 12, 13, 22)
def _dropout(node: OnnxNode, graph: OnnxGraph):
    if len(node.output_values) > 1:
        raise NotImplementedError("Dropout with the mask output in use")
    ratio = constant_or_none(node, graph, 1)
    training = constant_or_none(node, graph, 2)
    inputs = list(node.input_values[:1])
    dynamic = [i for i in (1, 2) if i < len(node.input_values) and node.input_values[i]
               and constant_or_none(node, graph, i) is None]
    if dynamic:  # a value computed at run time: feed it
        inputs = list(node.input_values[: max(dynamic) + 1])
        inputs = [name if (i == 0 or i in dynamic) else "" for i, name in enumerate(inputs)]
    ratio_value = 0.5 if ratio is None else float(ratio if not isinstance(ratio, list) else ratio[0])
    training_value = False if training is None else bool(training if not isinstance(training, list) else training[0])
    return result(Dropout(ratio_value, training_value), node, inputs)


@register("Dropout", 7, 10)
def _dropout_old(node: OnnxNode, graph: OnnxGraph):
    """Before opset 12 the graph has no training flag: ORT treats these as inference-only."""
    if len(node.output_values) > 1:
        raise NotImplementedError("Dropout with the mask output in use")
    return result(Dropout(float(node.attributes.get("ratio", 0.5)), False), node, node.input_values[:1])
