"""Helpers shared by our converters: attribute access and the result shape onnx2torch expects."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from onnx2torch.onnx_graph import OnnxGraph
from onnx2torch.onnx_node import OnnxNode
from onnx2torch.utils.common import OnnxMapping, OnnxToTorchModule, OperationConverterResult, get_const_value
from torch import nn

__all__ = ["OnnxModule", "result", "constant_or_none", "constants_or_fed", "scalar", "OnnxGraph", "OnnxNode"]


class OnnxModule(nn.Module, OnnxToTorchModule):
    """Base class of our per-node modules (the onnx2torch marker mixin included)."""


def result(module: nn.Module, node: OnnxNode, inputs: Optional[Sequence[str]] = None) -> OperationConverterResult:
    """Wire `module` to the node's inputs (or the given subset) and all its outputs."""
    return OperationConverterResult(
        torch_module=module,
        onnx_mapping=OnnxMapping(
            inputs=tuple(node.input_values if inputs is None else inputs), outputs=node.output_values
        ),
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


def scalar(value, default):
    """A constant input's value as one number (constants come back as lists), or `default`."""
    if value is None:
        return default
    return value[0] if isinstance(value, list) else value


def constants_or_fed(node: OnnxNode, graph: OnnxGraph, positions: Sequence[int]) -> Tuple[List, List[str]]:
    """For optional inputs that are usually constants (pads, scales, sizes...): their values
    where constant (else None) and the module's inputs: input 0, then per position the fed
    name where it is not a constant, "" where it is or is absent, trailing "" dropped.  The
    module thus reads a value at run time only where the graph computes it."""
    values = [constant_or_none(node, graph, position) for position in positions]
    inputs: List[str] = [node.input_values[0]]
    for position, value in zip(positions, values):
        present = position < len(node.input_values) and bool(node.input_values[position])
        inputs.append(node.input_values[position] if present and value is None else "")
    while inputs[-1] == "":
        inputs.pop()
    return values, inputs
