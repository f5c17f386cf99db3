"""Helpers shared by our converters: attribute access and the result shape onnx2torch expects."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from onnx2torch.onnx_graph import OnnxGraph
from onnx2torch.onnx_node import OnnxNode
from onnx2torch.utils.common import OnnxMapping, OnnxToTorchModule, OperationConverterResult, get_const_value
from torch import nn

__all__ = ["OnnxModule", "result", "constant_or_none", "OnnxGraph", "OnnxNode"]


class OnnxModule(nn.Module, OnnxToTorchModule):
    """Base class of our per-node modules (the onnx2torch marker mixin included)."""


def result(module: nn.Module, node: OnnxNode, inputs: Optional[Sequence[str]] = None) -> OperationConverterResult:
    """Wire `module` to the node's inputs (or the given subset) and all its outputs."""
    return OperationConverterResult(
        torch_module=module,
        onnx_mapping=OnnxMapping(inputs=tuple(node.input_values if inputs is None else inputs), outputs=node.output_values),
    )


def constant_or_none(node: OnnxNode, graph: OnnxGraph, position: int):
    """The value of input `position` when it is an initializer or Constant, else None."""
    if position >= len(node.input_values) or not node.input_values[position]:
        return None
    try:
        value = get_const_value(node.input_values[position], graph)
    except KeyError:
        return None
    return value.tolist() if isinstance(value, torch.Tensor) else value
