"""Sequence and Optional ops (eval and inference graphs: ORT has no gradient for them).

A sequence is a Python list of tensors flowing between the fx nodes; an optional is a tensor
or None.  Torch differentiates through the lists, so a graph that trains through them works
here too.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .casting import torch_dtype


def _position(position: Optional[torch.Tensor], length: int, default: int) -> int:
    if position is None:
        return default
    index = int(position.reshape(-1)[0])
    return index + length if index < 0 else index


class SequenceConstruct(OnnxModule):
    def forward(self, *tensors: torch.Tensor) -> List[torch.Tensor]:
        return list(tensors)


class SequenceEmpty(OnnxModule):
    def forward(self) -> List[torch.Tensor]:
        return []


class SequenceAt(OnnxModule):
    def forward(self, sequence: List[torch.Tensor], position: torch.Tensor) -> torch.Tensor:
        return sequence[_position(position, len(sequence), 0)]


class SequenceErase(OnnxModule):
    def forward(self, sequence: List[torch.Tensor], position: torch.Tensor = None) -> List[torch.Tensor]:
        index = _position(position, len(sequence), len(sequence) - 1)
        return sequence[:index] + sequence[index + 1 :]


class SequenceInsert(OnnxModule):
    def forward(self, sequence: List[torch.Tensor], tensor: torch.Tensor, position: torch.Tensor = None):
        index = _position(position, len(sequence), len(sequence))
        return sequence[:index] + [tensor] + sequence[index:]


class SequenceLength(OnnxModule):
    def forward(self, sequence: List[torch.Tensor]) -> torch.Tensor:
        return torch.tensor(len(sequence), dtype=torch.int64)


class SplitToSequence(OnnxModule):
    def __init__(self, axis: int, keepdims: bool):
        super().__init__()
        self.axis, self.keepdims = axis, keepdims

    def forward(self, x: torch.Tensor, split: torch.Tensor = None) -> List[torch.Tensor]:
        axis = self.axis % x.dim()
        if split is None:  # one element per position along the axis
            parts = list(torch.split(x, 1, dim=axis))
            return parts if self.keepdims else [part.squeeze(axis) for part in parts]
        sizes = split.tolist()
        return list(torch.split(x, sizes, dim=axis))  # a scalar: equal chunks, the last may be smaller


class ConcatFromSequence(OnnxModule):
    def __init__(self, axis: int, new_axis: bool):
        super().__init__()
        self.axis, self.new_axis = axis, new_axis

    def forward(self, sequence: List[torch.Tensor]) -> torch.Tensor:
        if self.new_axis:
            return torch.stack(sequence, dim=self.axis)
        return torch.cat(sequence, dim=self.axis)


class OptionalValue(OnnxModule):
    def forward(self, value: torch.Tensor = None):
        return value


class OptionalHasElement(OnnxModule):
    def forward(self, value=None) -> torch.Tensor:
        return torch.tensor(value is not None)


class OptionalGetElement(OnnxModule):
    def forward(self, value):
        if value is None:
            raise RuntimeError("OptionalGetElement on an empty optional")
        return value


def _simple(module_type):
    def convert(node: OnnxNode, graph: OnnxGraph):
        return result(module_type(), node)

    return convert


register("SequenceConstruct", 11)(_simple(SequenceConstruct))
register("SequenceAt", 11)(_simple(SequenceAt))
register("SequenceErase", 11)(_simple(SequenceErase))
register("SequenceInsert", 11)(_simple(SequenceInsert))
register("SequenceLength", 11)(_simple(SequenceLength))
register("Optional", 15)(_simple(OptionalValue))
register("OptionalHasElement", 15, 18)(_simple(OptionalHasElement))
register("OptionalGetElement", 15, 18)(_simple(OptionalGetElement))


@register("SequenceEmpty", 11)
def _sequence_empty(node: OnnxNode, graph: OnnxGraph):
    torch_dtype(int(node.attributes.get("dtype", 1)))  # refuse element types torch lacks now
    return result(SequenceEmpty(), node)


@register("SplitToSequence", 11)
def _split_to_sequence(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(SplitToSequence(int(a.get("axis", 0)), bool(a.get("keepdims", 1))), node)


@register("ConcatFromSequence", 11)
def _concat_from_sequence(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(ConcatFromSequence(int(a["axis"]), bool(a.get("new_axis", 0))), node)
