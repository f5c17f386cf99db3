"""Gather/Scatter family, selection and index-producing ops, at every version.

ONNX indices may be negative (counting from the end); torch's gather/scatter do not accept
that, so indices are wrapped first.  Scatter reductions map to torch's scatter_reduce
("add" -> "sum", "mul" -> "prod", "max"/"min" -> "amax"/"amin") with the data included;
ONNX Runtime's gradient of a reducing scatter is that of the plain (replacing) scatter, which
the "ort" gradients reproduce (see ..gradient_quirks).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ..gradient_quirks import ort_gradient, reproduce_ort_gradients
from ._common import OnnxGraph, OnnxModule, OnnxNode, result

_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _wrap(indices: torch.Tensor, size: int) -> torch.Tensor:
    indices = indices.long()
    return torch.where(indices < 0, indices + size, indices)


class GatherElements(OnnxModule):
    def __init__(self, axis: int):
        super().__init__()
        self.axis = axis

    def forward(self, data: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        axis = self.axis % data.dim()
        return torch.gather(data, axis, _wrap(indices, data.shape[axis]))


@register("GatherElements", 11, 13)
def _gather_elements(node: OnnxNode, graph: OnnxGraph):
    return result(GatherElements(int(node.attributes.get("axis", 0))), node)


class GatherND(OnnxModule):
    def __init__(self, batch_dims: int):
        super().__init__()
        self.batch_dims = batch_dims

    def forward(self, data: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        b = self.batch_dims
        batch_shape = data.shape[:b]
        depth = indices.shape[-1]
        flat_data = data.reshape(math.prod(batch_shape), *data.shape[b:])
        flat_index = indices.reshape(math.prod(batch_shape), -1, depth)
        coords = [_wrap(flat_index[..., k], data.shape[b + k]) for k in range(depth)]
        batch = torch.arange(flat_data.shape[0], device=data.device).view(-1, 1).expand_as(coords[0])
        picked = flat_data[(batch, *coords)]
        return picked.reshape(*indices.shape[:-1], *data.shape[b + depth :])


@register("GatherND", 11, 12, 13)
def _gather_nd(node: OnnxNode, graph: OnnxGraph):
    return result(GatherND(int(node.attributes.get("batch_dims", 0))), node)


class ScatterElements(OnnxModule):
    def __init__(self, axis: int, reduction: str):
        super().__init__()
        self.axis, self.reduction = axis, reduction
        self.ort_replace_gradient = reduction != "none" and reproduce_ort_gradients()

    def forward(self, data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
        axis = self.axis % data.dim()
        index = _wrap(indices, data.shape[axis])
        replaced = data.scatter(axis, index, updates)
        if self.reduction == "none":
            return replaced
        reduced = data.scatter_reduce(axis, index, updates, _REDUCE[self.reduction], include_self=True)
        # ORT's gradient ignores the reduction (..gradient_quirks)
        return ort_gradient(reduced, replaced) if self.ort_replace_gradient else reduced


def _scatter_elements(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(ScatterElements(int(a.get("axis", 0)), a.get("reduction", "none")), node)


register("ScatterElements", 11, 13, 16, 18)(_scatter_elements)
register("Scatter", 9, 11)(_scatter_elements)


class ScatterND(OnnxModule):
    def __init__(self, reduction: str):
        super().__init__()
        self.reduction = reduction
        self.ort_replace_gradient = reduction != "none" and reproduce_ort_gradients()

    def forward(self, data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
        depth = indices.shape[-1]
        rows = indices.reshape(-1, depth)
        flat = torch.zeros(rows.shape[0], dtype=torch.long, device=data.device)
        for k in range(depth):
            flat = flat * data.shape[k] + _wrap(rows[:, k], data.shape[k])
        target = data.reshape(math.prod(data.shape[:depth]), -1)
        values = updates.reshape(rows.shape[0], -1)
        index = flat.view(-1, 1).expand_as(values)
        replaced = target.scatter(0, index, values).reshape(data.shape)
        if self.reduction == "none":
            return replaced
        reduced = target.scatter_reduce(0, index, values, _REDUCE[self.reduction], include_self=True).reshape(
            data.shape
        )
        return ort_gradient(reduced, replaced) if self.ort_replace_gradient else reduced


@register("ScatterND", 11, 13, 16, 18)
def _scatter_nd(node: OnnxNode, graph: OnnxGraph):
    return result(ScatterND(node.attributes.get("reduction", "none")), node)


class Compress(OnnxModule):
    def __init__(self, axis):
        super().__init__()
        self.axis = axis

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        if self.axis is None:
            x, axis = x.reshape(-1), 0
        else:
            axis = self.axis % x.dim()
        keep = torch.nonzero(condition.reshape(-1).bool()[: x.shape[axis]]).reshape(-1)
        return x.index_select(axis, keep)


@register("Compress", 9, 11)
def _compress(node: OnnxNode, graph: OnnxGraph):
    return result(Compress(node.attributes.get("axis")), node)


class OneHot(OnnxModule):
    def __init__(self, axis: int):
        super().__init__()
        self.axis = axis

    def forward(self, indices: torch.Tensor, depth: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        size = int(depth.reshape(-1)[0])
        index = indices.long()
        index = torch.where(index < 0, index + size, index)
        valid = (index >= 0) & (index < size)
        hot = F.one_hot(torch.where(valid, index, torch.zeros_like(index)), size) * valid.unsqueeze(-1)
        out = values[0] + (values[1] - values[0]) * hot.to(values.dtype)
        axis = self.axis % out.dim()
        return out.movedim(-1, axis)


@register("OneHot", 9, 11)
def _one_hot(node: OnnxNode, graph: OnnxGraph):
    return result(OneHot(int(node.attributes.get("axis", -1))), node)


class TopK(OnnxModule):
    """TopK-1 (k an attribute); later versions are onnx2torch's."""

    def __init__(self, k: int, axis: int, outputs: int):
        super().__init__()
        self.k, self.axis, self.outputs = k, axis, outputs

    def forward(self, x: torch.Tensor):
        values, indices = torch.topk(x, self.k, dim=self.axis, largest=True, sorted=True)
        return (values, indices) if self.outputs > 1 else values


@register("TopK", 1)
def _topk_attribute(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(TopK(int(a["k"]), int(a.get("axis", -1)), len(node.output_values)), node, node.input_values[:1])


class NonZero(OnnxModule):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x).t().contiguous()


@register("NonZero", 9, 13)
def _non_zero(node: OnnxNode, graph: OnnxGraph):
    return result(NonZero(), node)


class Unique(OnnxModule):
    """ONNX Unique: values (sorted, or in order of first occurrence), the index of each first
    occurrence, the inverse indices and the counts."""

    def __init__(self, axis, sorted_: bool, outputs: int):
        super().__init__()
        self.axis, self.sorted, self.outputs = axis, sorted_, outputs

    def forward(self, x: torch.Tensor):
        flat = x.reshape(-1) if self.axis is None else x.movedim(self.axis % x.dim(), 0)
        rows = flat.reshape(flat.shape[0], -1)
        values, inverse, counts = torch.unique(rows, dim=0, sorted=True, return_inverse=True, return_counts=True)
        positions = torch.arange(rows.shape[0], device=x.device)
        first = torch.full((values.shape[0],), rows.shape[0], dtype=torch.long, device=x.device)
        first = first.scatter_reduce(0, inverse, positions, "amin")
        if not self.sorted:
            order = torch.argsort(first)
            rank = torch.empty_like(order)
            rank[order] = torch.arange(order.numel(), device=x.device)
            values, first, counts, inverse = values[order], first[order], counts[order], rank[inverse]
        values = values.reshape(-1, *flat.shape[1:])
        if self.axis is not None:
            values = values.movedim(0, self.axis % x.dim())
        else:
            values = values.reshape(-1)
        return values if self.outputs == 1 else (values, first, inverse, counts)[: self.outputs]


@register("Unique", 11)
def _unique(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    axis = a.get("axis")
    return result(Unique(None if axis is None else int(axis), bool(a.get("sorted", 1)), len(node.output_values)), node)


class Trilu(OnnxModule):
    def __init__(self, upper: bool):
        super().__init__()
        self.upper = upper

    def forward(self, x: torch.Tensor, k: torch.Tensor = None) -> torch.Tensor:
        diagonal = 0 if k is None else int(k.reshape(-1)[0])
        return torch.triu(x, diagonal) if self.upper else torch.tril(x, diagonal)


@register("Trilu", 14)
@register("Trilu", 1, domain="com.microsoft")  # ORT's own schema, same semantics
def _trilu(node: OnnxNode, graph: OnnxGraph):
    return result(Trilu(bool(node.attributes.get("upper", 1))), node)


class ReverseSequence(OnnxModule):
    def __init__(self, batch_axis: int, time_axis: int):
        super().__init__()
        self.batch_axis, self.time_axis = batch_axis, time_axis

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        steps = x.shape[self.time_axis]
        time = torch.arange(steps, device=x.device).view(-1, 1)
        length = lengths.long().view(1, -1)
        source = torch.where(time < length, length - 1 - time, time)  # [time, batch]
        shape = [1] * x.dim()
        shape[self.time_axis], shape[self.batch_axis] = steps, x.shape[self.batch_axis]
        index = source if self.time_axis < self.batch_axis else source.t()
        return torch.gather(x, self.time_axis, index.reshape(shape).expand_as(x))


@register("ReverseSequence", 10)
def _reverse_sequence(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(ReverseSequence(int(a.get("batch_axis", 1)), int(a.get("time_axis", 0))), node)


class Size(OnnxModule):
    def forward(self, x) -> torch.Tensor:
        count = x.numel() if isinstance(x, torch.Tensor) else x.size
        return torch.tensor(count, dtype=torch.int64)


@register("Size", 1, 13, 19, 21)
def _size(node: OnnxNode, graph: OnnxGraph):
    return result(Size(), node)
