"""Shape/tensor ops onnx2torch lacks at newer opsets, and ORT's training-graph variants."""

from __future__ import annotations

import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, constant_or_none, constants_or_fed, result


class Split(OnnxModule):
    def __init__(self, axis: int, sizes, num_outputs: int):
        super().__init__()
        self.axis, self.sizes, self.num_outputs = axis, sizes, num_outputs

    def forward(self, x: torch.Tensor, split: torch.Tensor = None):
        sizes = self.sizes if split is None else split.tolist()
        if sizes is None:
            length = x.shape[self.axis]
            chunk = -(-length // self.num_outputs)  # ceil: the last chunk may be smaller
            sizes = [min(chunk, length - i * chunk) for i in range(self.num_outputs)]
        parts = torch.split(x, sizes, dim=self.axis)
        return parts[0] if len(parts) == 1 else tuple(parts)


@register("Split", 13, 18)
def _split(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    count = int(a.get("num_outputs", len(node.output_values)))
    sizes = constant_or_none(node, graph, 1)
    inputs = node.input_values[:1] if sizes is not None or len(node.input_values) < 2 else node.input_values
    module = Split(a.get("axis", 0), sizes, count)
    return result(module, node, inputs)


class Concat(OnnxModule):
    """ORT's ConcatTraining: Concat, with the inputs' lengths along `axis` as a second output."""

    def __init__(self, axis: int, with_lengths: bool):
        super().__init__()
        self.axis, self.with_lengths = axis, with_lengths

    def forward(self, *tensors: torch.Tensor):
        # one input (ORT's exports of a cache-less attention): the input itself, not a copy
        out = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=self.axis)
        if self.with_lengths:
            return out, torch.tensor([t.shape[self.axis] for t in tensors], dtype=torch.int64, device=out.device)
        return out


@register("ConcatTraining", 1, domain="com.microsoft")
def _concat_training(node: OnnxNode, graph: OnnxGraph):
    return result(Concat(node.attributes["axis"], len(node.output_values) > 1), node)


class Expand(OnnxModule):
    """ONNX Expand: `x` broadcast with `shape` (either may have the larger size along an
    axis).  onnx2torch multiplies by a tensor of ones, which costs a fill and a product
    forward and a product backward; here a broadcast view made contiguous (one copy, none
    where the shape changes nothing), whose backward is one sum.  Same values, any dtype."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor, shape: torch.Tensor = None) -> torch.Tensor:
        target = torch.broadcast_shapes(x.shape, tuple(self.shape if shape is None else shape.tolist()))
        return x.expand(target).contiguous()


@register("Expand", 8)
def _expand(node: OnnxNode, graph: OnnxGraph):
    values, inputs = constants_or_fed(node, graph, [1])
    return result(Expand(values[0]), node, inputs)


class FusedMatMul(OnnxModule):
    """alpha * op(A) @ op(B), where op transposes the last two dims when asked."""

    def __init__(self, alpha: float, trans_a: bool, trans_b: bool):
        super().__init__()
        self.alpha, self.trans_a, self.trans_b = alpha, trans_a, trans_b

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.trans_a:
            a = a.transpose(-1, -2)
        if self.trans_b:
            b = b.transpose(-1, -2)
        out = torch.matmul(a, b)
        return out if self.alpha == 1.0 else out * self.alpha


@register("FusedMatMul", 1, domain="com.microsoft")
def _fused_matmul(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    if a.get("transBatchA", 0) or a.get("transBatchB", 0):
        raise NotImplementedError("FusedMatMul with transBatchA/transBatchB")
    return result(FusedMatMul(float(a.get("alpha", 1.0)), bool(a.get("transA", 0)), bool(a.get("transB", 0))), node)


class Slice(OnnxModule):
    """ONNX Slice; constant starts/ends/axes/steps are baked in, others are fed at run time.

    (onnx2torch indexes with a list of slices, which torch deprecates.)"""

    def __init__(self, starts, ends, axes, steps):
        super().__init__()
        self.starts, self.ends, self.axes, self.steps = starts, ends, axes, steps

    def forward(self, x: torch.Tensor, starts=None, ends=None, axes=None, steps=None) -> torch.Tensor:
        starts = self.starts if starts is None else starts.tolist()
        ends = self.ends if ends is None else ends.tolist()
        axes = self.axes if axes is None else axes.tolist()
        steps = self.steps if steps is None else steps.tolist()
        axes = list(range(len(starts))) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        index = [slice(None)] * x.dim()
        flips = []
        for start, end, axis, step in zip(starts, ends, axes, steps):
            axis = axis % x.dim()
            size = x.shape[axis]
            if step > 0:
                start = max(0, min(size, start + size if start < 0 else start))
                end = max(0, min(size, end + size if end < 0 else end))
                index[axis] = slice(start, max(start, end), step)
            else:  # torch has no negative steps: take the mirrored range, then flip
                start = max(-1, min(size - 1, start + size if start < 0 else start))
                end = max(-1, min(size - 1, end + size if end < 0 else end))
                count = max(0, -(-(start - end) // -step))
                first = start - (count - 1) * (-step) if count else 0
                index[axis] = slice(first, first + (count - 1) * (-step) + 1 if count else 0, -step)
                flips.append(axis)
        out = x[tuple(index)]
        return out.flip(flips) if flips else out


@register("Slice", 1)
def _slice_v1(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(Slice(a["starts"], a["ends"], a.get("axes"), None), node, node.input_values[:1])


@register("Slice", 10, 11, 13)
def _slice(node: OnnxNode, graph: OnnxGraph):
    values, inputs = constants_or_fed(node, graph, range(1, 5))
    return result(Slice(*values), node, inputs)
