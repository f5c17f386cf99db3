"""Elementwise ops onnx2torch lacks, or lacks at some schema versions.

Legacy versions keep their own semantics: Max/Min/Sum/Mean-6 take equal-shape inputs (no
broadcasting), Selu-1/6 and Clip-1/6 carry their parameters as attributes, Hardmax before 13
coerces the input to 2-D at `axis` like Softmax did.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Dict, Sequence

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ..gradient_quirks import ort_gradient, reproduce_ort_gradients
from ._common import OnnxGraph, OnnxModule, OnnxNode, constants_or_fed, result


class Elementwise(OnnxModule):
    """One torch function applied to the inputs."""

    def __init__(self, function: Callable):
        super().__init__()
        self.function = function

    def forward(self, *inputs):
        return self.function(*inputs)


def _shrink(x: torch.Tensor, lambd: float, bias: float) -> torch.Tensor:
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, torch.zeros_like(x)))


def _thresholded_relu(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.where(x > alpha, x, torch.zeros_like(x))


_UNARY: Dict[str, Callable] = {
    "Acosh": torch.acosh,
    "Asinh": torch.asinh,
    "Atanh": torch.atanh,
    "Cosh": torch.cosh,
    "Sinh": torch.sinh,
    "Mish": F.mish,
    "BitwiseNot": torch.bitwise_not,
}
_BINARY: Dict[str, Callable] = {
    "BitwiseAnd": torch.bitwise_and,
    "BitwiseOr": torch.bitwise_or,
    "BitwiseXor": torch.bitwise_xor,
}


def _unary(op: str):
    def convert(node: OnnxNode, graph: OnnxGraph):
        return result(Elementwise(_UNARY[op]), node)

    return convert


def _binary(op: str):
    def convert(node: OnnxNode, graph: OnnxGraph):
        return result(Elementwise(_BINARY[op]), node)

    return convert


for _op, _version in (
    ("Acosh", 9),
    ("Asinh", 9),
    ("Atanh", 9),
    ("Cosh", 9),
    ("Sinh", 9),
    ("Mish", 18),
    ("BitwiseNot", 18),
):
    register(_op, _version)(_unary(_op))
for _op in _BINARY:
    register(_op, 18)(_binary(_op))


def _shift(x: torch.Tensor, amount: torch.Tensor, left: bool) -> torch.Tensor:
    """ONNX BitShift on unsigned types (torch shifts no uint16/32/64 on the CPU): shift in int64,
    keep the type's bits."""
    bits = x.element_size() * 8
    wide, by = x.to(torch.int64), amount.to(torch.int64)
    shifted = torch.bitwise_left_shift(wide, by) if left else torch.bitwise_right_shift(wide, by)
    if bits < 64:
        shifted = shifted & ((1 << bits) - 1)
    return shifted.to(x.dtype)


@register("BitShift", 11)
def _bit_shift(node: OnnxNode, graph: OnnxGraph):
    left = node.attributes["direction"] == "LEFT"
    return result(Elementwise(functools.partial(_shift, left=left)), node)


@register("Shrink", 9)
def _shrink_op(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(
        Elementwise(functools.partial(_shrink, lambd=float(a.get("lambd", 0.5)), bias=float(a.get("bias", 0.0)))), node
    )


@register("ThresholdedRelu", 10)
def _thresholded(node: OnnxNode, graph: OnnxGraph):
    return result(
        Elementwise(functools.partial(_thresholded_relu, alpha=float(node.attributes.get("alpha", 1.0)))), node
    )


@register("Selu", 1, 6)
def _selu(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    alpha, gamma = float(a.get("alpha", 1.67326319217681884765625)), float(a.get("gamma", 1.05070102214813232421875))
    return result(Elementwise(lambda x: gamma * torch.where(x > 0, x, alpha * torch.expm1(x))), node)


@register("IsNaN", 9, 13, 20)
def _is_nan(node: OnnxNode, graph: OnnxGraph):
    return result(Elementwise(torch.isnan), node)


class Hardmax(OnnxModule):
    """1 at the first maximum along `axis` (13+), or of each row of the input coerced to 2-D
    at `axis` (1, 11)."""

    def __init__(self, axis: int, coerce_2d: bool):
        super().__init__()
        self.axis, self.coerce_2d = axis, coerce_2d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axis = self.axis % x.dim() if x.dim() else 0
        if self.coerce_2d:
            flat = x.reshape(math.prod(x.shape[:axis]), -1)
            return F.one_hot(flat.argmax(dim=1), flat.shape[1]).to(x.dtype).reshape(x.shape)
        return F.one_hot(x.argmax(dim=axis), x.shape[axis]).to(x.dtype).movedim(-1, axis)


def _hardmax(coerce_2d: bool):
    def convert(node: OnnxNode, graph: OnnxGraph):
        return result(Hardmax(int(node.attributes.get("axis", 1 if coerce_2d else -1)), coerce_2d), node)

    return convert


register("Hardmax", 1, 11)(_hardmax(True))
register("Hardmax", 13)(_hardmax(False))


def _variadic(op: str):
    reduce_pair = {"Max": torch.maximum, "Min": torch.minimum, "Sum": torch.add, "Mean": torch.add}[op]

    def combine(*inputs):
        out = inputs[0]
        for value in inputs[1:]:
            out = reduce_pair(out, value)
        return out / len(inputs) if op == "Mean" else out

    def convert(node: OnnxNode, graph: OnnxGraph):
        return result(Elementwise(combine), node)

    return convert


for _op in ("Max", "Min", "Sum", "Mean"):
    register(_op, 6)(_variadic(_op))


class Clip(OnnxModule):
    """Clip with bounds from attributes (1, 6) or optional inputs (11+).

    ORT 1.19.2's gradient of Clip-6 ignores the attribute bounds: it passes the gradient
    through everywhere (measured); see ..gradient_quirks."""

    def __init__(self, low, high, bounds_ignored_by_ort_gradient: bool = False):
        super().__init__()
        self.low, self.high = low, high
        self.ort_ignores_bounds = bounds_ignored_by_ort_gradient

    def forward(self, x: torch.Tensor, low: torch.Tensor = None, high: torch.Tensor = None) -> torch.Tensor:
        low = self.low if low is None else low
        high = self.high if high is None else high
        clipped = x
        if low is not None:
            clipped = torch.maximum(clipped, torch.as_tensor(low, dtype=x.dtype, device=x.device))
        if high is not None:
            clipped = torch.minimum(clipped, torch.as_tensor(high, dtype=x.dtype, device=x.device))
        if self.ort_ignores_bounds:
            return ort_gradient(clipped, x)
        return clipped


@register("Clip", 1, 6)
def _clip_attributes(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    module = Clip(a.get("min"), a.get("max"), bounds_ignored_by_ort_gradient=reproduce_ort_gradients())
    return result(module, node, node.input_values[:1])


@register("Clip", 11, 12, 13)
def _clip_inputs(node: OnnxNode, graph: OnnxGraph):
    (low, high), inputs = constants_or_fed(node, graph, (1, 2))
    return result(Clip(low, high), node, inputs)


class CumSum(OnnxModule):
    def __init__(self, exclusive: bool, reverse: bool):
        super().__init__()
        self.exclusive, self.reverse = exclusive, reverse

    def forward(self, x: torch.Tensor, axis: torch.Tensor) -> torch.Tensor:
        dim = int(axis.reshape(-1)[0]) % x.dim()
        if self.reverse:
            x = x.flip(dim)
        out = torch.cumsum(x, dim)
        if self.exclusive:
            out = out - x
        return out.flip(dim) if self.reverse else out


@register("CumSum", 11, 14)
def _cumsum(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(CumSum(bool(a.get("exclusive", 0)), bool(a.get("reverse", 0))), node)


@register("Scale", 1, domain="com.microsoft")
def _scale(node: OnnxNode, graph: OnnxGraph):
    down = bool(node.attributes.get("scale_down", 0))
    return result(Elementwise(lambda x, scale: x / scale if down else x * scale), node)


class ScaledSum(OnnxModule):
    """com.microsoft ScaledSum (written by ORT's training graph optimizations): the sum of
    two or three inputs, each times its `scale_i` attribute, in input order as ORT's kernel."""

    def __init__(self, scales: Sequence[float]):
        super().__init__()
        self.scales = list(scales)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        total = inputs[0] * self.scales[0]
        for value, scale in zip(inputs[1:], self.scales[1:]):
            total = total + value * scale
        return total


@register("ScaledSum", 1, domain="com.microsoft")
def _scaled_sum(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    scales = [a["scale_0"], a["scale_1"], a.get("scale_2", 1.0)][: len(node.input_values)]
    return result(ScaledSum(scales), node)


@register("Det", 11)
def _det(node: OnnxNode, graph: OnnxGraph):
    return result(Elementwise(torch.linalg.det), node)
