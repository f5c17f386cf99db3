"""Reduce* for every opset: axes come from an attribute before opset 18 (ReduceSum: 13)
and from an optional input after, with `noop_with_empty_axes` deciding what "no axes"
means.  onnx2torch lacks the opset-18 forms, which breaks every MSE/L1/BCE loss there.
ArgMax/ArgMin at every version (onnx2torch starts at 11)."""

from __future__ import annotations

import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, constant_or_none, result


def _sum_square(x, dims, keep):
    return (x * x).sum(dim=dims, keepdim=keep)


_KERNELS = {
    "ReduceMean": lambda x, d, k: x.mean(dim=d, keepdim=k),
    "ReduceSum": lambda x, d, k: x.sum(dim=d, keepdim=k),
    "ReduceMax": lambda x, d, k: x.amax(dim=d, keepdim=k),
    "ReduceMin": lambda x, d, k: x.amin(dim=d, keepdim=k),
    "ReduceProd": lambda x, d, k: _prod(x, d, k),
    "ReduceL1": lambda x, d, k: x.abs().sum(dim=d, keepdim=k),
    "ReduceL2": lambda x, d, k: torch.sqrt(_sum_square(x, d, k)),
    "ReduceSumSquare": _sum_square,
    "ReduceLogSum": lambda x, d, k: torch.log(x.sum(dim=d, keepdim=k)),
    "ReduceLogSumExp": lambda x, d, k: torch.logsumexp(x, dim=d, keepdim=k),
}


def _prod(x, dims, keep):
    for dim in sorted((d % x.dim() for d in dims), reverse=True):
        x = x.prod(dim=dim, keepdim=keep)
    return x


class Reduce(OnnxModule):
    def __init__(self, op: str, axes, keepdims: bool, noop_with_empty_axes: bool):
        super().__init__()
        self.kernel = _KERNELS[op]
        self.axes, self.keepdims, self.noop = axes, keepdims, noop_with_empty_axes

    def forward(self, x: torch.Tensor, axes: torch.Tensor = None) -> torch.Tensor:
        dims = self.axes if axes is None else axes.tolist()
        if not dims:
            if self.noop:
                return x
            dims = list(range(x.dim()))
        return self.kernel(x, list(dims), self.keepdims)


def _reduce(op: str, axes_as_input: bool):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        keep = bool(a.get("keepdims", 1))
        noop = bool(a.get("noop_with_empty_axes", 0))
        if not axes_as_input:
            return result(Reduce(op, a.get("axes"), keep, noop), node, node.input_values[:1])
        axes = constant_or_none(node, graph, 1)
        if axes is not None or len(node.input_values) < 2 or not node.input_values[1]:
            return result(Reduce(op, axes, keep, noop), node, node.input_values[:1])
        return result(Reduce(op, None, keep, noop), node)

    return convert


for _op in _KERNELS:
    if _op == "ReduceSum":  # axes became an input at 13
        register(_op, 1, 11)(_reduce(_op, False))
        register(_op, 13)(_reduce(_op, True))
    else:  # ... and at 18 for the others
        register(_op, 1, 11, 13)(_reduce(_op, False))
        register(_op, 18)(_reduce(_op, True))


class ArgExtreme(OnnxModule):
    """ArgMax/ArgMin: int64 indices along `axis`; with select_last_index the last of equal
    extremes (searched on the flipped axis)."""

    def __init__(self, largest: bool, axis: int, keepdims: bool, last: bool):
        super().__init__()
        self.largest, self.axis, self.keepdims, self.last = largest, axis, keepdims, last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axis = self.axis % x.dim()
        find = torch.argmax if self.largest else torch.argmin
        if self.last:
            index = x.shape[axis] - 1 - find(x.flip(axis), dim=axis, keepdim=self.keepdims)
        else:
            index = find(x, dim=axis, keepdim=self.keepdims)
        return index.to(torch.int64)


def _arg(largest: bool):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        module = ArgExtreme(
            largest, int(a.get("axis", 0)), bool(a.get("keepdims", 1)), bool(a.get("select_last_index", 0))
        )
        return result(module, node)

    return convert


register("ArgMax", 1, 11, 12, 13)(_arg(True))
register("ArgMin", 1, 11, 12, 13)(_arg(False))


class ReduceAllL2(OnnxModule):
    """com.microsoft ReduceAllL2 (onnxblock's ``blocks.ReduceAllL2``): the L2 norm of all
    inputs together, sqrt(sum_i sum(x_i^2)), a scalar; ORT's CPU kernel accumulates in float32
    (float16 inputs included; double stays double) and writes the declared output type (float32
    unless the graph says otherwise)."""

    def __init__(self, out_dtype: torch.dtype):
        super().__init__()
        self.out_dtype = out_dtype

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        total = sum(_square_sum(x.to(torch.promote_types(x.dtype, torch.float32))) for x in inputs)
        return torch.sqrt(total).to(self.out_dtype)


def _square_sum(x: torch.Tensor) -> torch.Tensor:
    return (x * x).sum()


class IsAllFinite(OnnxModule):
    """com.microsoft IsAllFinite (ORT's IsInfReduceSumFusion writes it, then a Not, for
    IsInf -> Cast -> ReduceSum -> Greater(0)): a bool scalar, true when no input holds an
    infinity (isinf_only), a NaN (isnan_only) or either (default)."""

    def __init__(self, isinf_only: bool, isnan_only: bool):
        super().__init__()
        if isinf_only and isnan_only:
            raise ValueError("IsAllFinite: isinf_only and isnan_only cannot both be set")
        self.isinf_only, self.isnan_only = isinf_only, isnan_only

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        ok = torch.ones((), dtype=torch.bool, device=inputs[0].device if inputs else None)
        for x in inputs:
            if self.isinf_only:
                bad = torch.isinf(x)
            elif self.isnan_only:
                bad = torch.isnan(x)
            else:
                bad = ~torch.isfinite(x)
            ok = ok & ~bad.any()
        return ok


@register("ReduceAllL2", 1, domain="com.microsoft")
def _reduce_all_l2(node: OnnxNode, graph: OnnxGraph):
    from .casting import torch_dtype

    declared = _declared_elem_type(graph, node.output_values[0])
    return result(ReduceAllL2(torch_dtype(declared) if declared else torch.float32), node)


@register("IsAllFinite", 1, domain="com.microsoft")
def _is_all_finite(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(IsAllFinite(bool(a.get("isinf_only", 0)), bool(a.get("isnan_only", 0))), node)


def _declared_elem_type(graph: OnnxGraph, name: str) -> int:
    """The element type the graph declares for value `name` (0 when it declares none: the
    engine's forward cut keeps the declared types of the graph outputs only)."""
    proto = graph.proto
    for info in list(proto.output) + list(proto.value_info):
        if info.name == name and info.type.HasField("tensor_type"):
            return info.type.tensor_type.elem_type
    return 0
