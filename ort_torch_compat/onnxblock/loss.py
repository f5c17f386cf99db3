"""The four built-in loss blocks, with onnxruntime-training 1.19.2's graphs and names.

Each adds its target input (``target``, or ``labels`` for cross entropy) unless a tensor of
that name already exists, and returns the loss output's name.  The graphs are ORT's on
purpose, quirks included: BCEWithLogits is the naive ``-(log(sigmoid(x))*t +
log(1-sigmoid(x))*(1-t))``, which overflows for large logits where torch's stable form
does not, because artifacts made here must train to the numbers ORT's artifacts train to.
"""

from __future__ import annotations

import copy
from typing import Optional

import numpy as np
import onnx

from . import _graph_utils, blocks

__all__ = ["MSELoss", "CrossEntropyLoss", "BCEWithLogitsLoss", "L1Loss"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise RuntimeError(f"Reduction {reduction} not supported.")


def _reduce_block(reduction: str) -> blocks.Block:
    """The final reduction.  ``"none"`` passes the per-element loss through (in
    onnxruntime-training 1.19.2 it raises TypeError: it calls ``PassThrough(keepdims=False)``)."""
    if reduction == "mean":
        return blocks.ReduceMean(keepdims=False)
    if reduction == "sum":
        return blocks.ReduceSum(keepdims=False)
    return blocks.PassThrough()


class MSELoss(blocks.Block):
    """``reduce((input - target) ** 2)``."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        _check_reduction(reduction)
        self._reduce = _reduce_block(reduction)
        self._sub = blocks.Sub()
        self._square = blocks.Pow(2.0)

    def build(self, loss_input_name: str, target_name: str = "target"):
        if not _graph_utils.node_arg_exists(self.base, target_name):
            target_name = blocks.InputLike(loss_input_name)(target_name)
        return self._reduce(self._square(self._sub(loss_input_name, target_name)))


class CrossEntropyLoss(blocks.Block):
    """``SoftmaxCrossEntropyLoss(scores, labels[, weight])``; classes are the last dimension."""

    def __init__(
        self, weight: Optional[np.ndarray] = None, reduction: str = "mean", ignore_index: Optional[int] = None
    ):
        super().__init__()
        _check_reduction(reduction)
        self._weight = weight
        self._reduction = reduction
        self._ignore_index = ignore_index

    def build(self, scores_input_name: str, labels_name: str = "labels") -> str:
        # The name is drawn even without a weight, so the numbering stays ORT's.
        weight_name = _graph_utils.generate_graph_name("celoss.weight")
        if self._weight is not None:
            from onnx import numpy_helper

            self.base.graph.initializer.append(numpy_helper.from_array(np.asarray(self._weight), weight_name))
        if not _graph_utils.node_arg_exists(self.base, labels_name):
            labels = copy.deepcopy(_graph_utils.get_output_from_output_name(self.base, scores_input_name))
            labels.name = labels_name
            labels.type.tensor_type.elem_type = onnx.TensorProto.INT64
            del labels.type.tensor_type.shape.dim[-1]
            self.base.graph.input.append(labels)
        inputs = [scores_input_name, labels_name]
        # onnxruntime-training tests `if self._weight:`, which fails for arrays of more than
        # one element; a weight given is a weight used.
        if self._weight is not None:
            inputs.append(weight_name)
        loss_name = _graph_utils.generate_graph_name("loss")
        log_prob_name = _graph_utils.generate_graph_name("log_prob")
        node = onnx.helper.make_node(
            "SoftmaxCrossEntropyLoss",
            inputs,
            [loss_name, log_prob_name],
            reduction=self._reduction,
            ignore_index=self._ignore_index,
            name=_graph_utils.generate_graph_name("SoftmaxCrossEntropyLoss"),
        )
        self.base.graph.node.append(node)
        return loss_name


class BCEWithLogitsLoss(blocks.Block):
    """``reduce(-(log(sigmoid(x)) * t [* pos_weight] + log(1 - sigmoid(x)) * (1 - t)) [* weight])``."""

    def __init__(
        self, weight: Optional[np.ndarray] = None, reduction: str = "mean", pos_weight: Optional[np.ndarray] = None
    ):
        super().__init__()
        _check_reduction(reduction)
        self._weight = weight
        self._pos_weight = pos_weight
        self._reduce = _reduce_block(reduction)
        self._sigmoid = blocks.Sigmoid()
        self._log = blocks.Log()
        self._sub = blocks.Sub()
        self._add = blocks.Add()
        self._mul = blocks.Mul()
        self._neg = blocks.Neg()

    def build(self, loss_input_name: str, target_name: str = "target"):
        from onnx import numpy_helper

        pos_weight_name = _graph_utils.generate_graph_name("bceloss.pos_weight")
        if self._pos_weight is not None:
            self.base.graph.initializer.append(numpy_helper.from_array(np.asarray(self._pos_weight), pos_weight_name))
        weight_name = _graph_utils.generate_graph_name("bceloss.weight")
        if self._weight is not None:
            self.base.graph.initializer.append(numpy_helper.from_array(np.asarray(self._weight), weight_name))
        ones = []
        for _ in range(2):
            name = _graph_utils.generate_graph_name("bceloss.sub_ones")
            self.base.graph.initializer.append(onnx.helper.make_tensor(name, onnx.TensorProto.FLOAT, [1], [1.0]))
            ones.append(name)
        if not _graph_utils.node_arg_exists(self.base, target_name):
            target = copy.deepcopy(_graph_utils.get_output_from_output_name(self.base, loss_input_name))
            target.name = target_name
            self.base.graph.input.append(target)

        sigmoid = self._sigmoid(loss_input_name)
        positive = self._mul(self._log(sigmoid), target_name)
        if self._pos_weight is not None:
            positive = self._mul(positive, pos_weight_name)
        negative = self._mul(self._log(self._sub(ones[0], sigmoid)), self._sub(ones[1], target_name))
        loss = self._neg(self._add(positive, negative))
        if self._weight is not None:
            loss = self._mul(weight_name, loss)
        return self._reduce(loss)


class L1Loss(blocks.Block):
    """``reduce(abs(input - target))``."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        _check_reduction(reduction)
        self._reduce = _reduce_block(reduction)
        self._abs = blocks.Abs()
        self._sub = blocks.Sub()

    def build(self, loss_input_name: str, target_name: Optional[str] = "target"):
        if not _graph_utils.node_arg_exists(self.base, target_name):
            target_name = blocks.InputLike(loss_input_name)(target_name)
        return self._reduce(self._abs(self._sub(loss_input_name, target_name)))
