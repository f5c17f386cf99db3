"""Quantization ops (eval and inference graphs), and ORT's FakeQuant (quantization-aware
training: straight-through gradient inside the quantization range).

Rounding is half-to-even (torch.round), as ONNX specifies; integer products are computed in
float64, exact for int8/uint8 operands, then cast to int32."""

from __future__ import annotations

import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .casting import torch_dtype
from .convolution import Conv

_LIMITS = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.uint16: (0, 65535),
    torch.int16: (-32768, 32767),
    torch.int32: (-(2**31), 2**31 - 1),
}


def _per_axis(value: torch.Tensor, like: torch.Tensor, axis: int, block: int = 0) -> torch.Tensor:
    """A scale/zero point broadcast against `like`: scalar, per-axis (1-D) or blocked."""
    if value.dim() == 0 or value.numel() == 1 and value.dim() <= 1:
        return value.reshape(())
    axis = axis % like.dim()
    if block:
        value = value.repeat_interleave(block, dim=axis).narrow(axis, 0, like.shape[axis])
        return value
    shape = [1] * like.dim()
    shape[axis] = -1
    return value.reshape(shape)


class QuantizeLinear(OnnxModule):
    def __init__(self, axis: int, block: int, dtype):
        super().__init__()
        self.axis, self.block, self.dtype = axis, block, dtype

    def forward(self, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor = None) -> torch.Tensor:
        dtype = self.dtype or (zero_point.dtype if zero_point is not None else torch.uint8)
        low, high = _LIMITS[dtype]
        scale = _per_axis(scale, x, self.axis, self.block).to(torch.float32)
        shifted = torch.round(x.to(torch.float32) / scale)
        if zero_point is not None:
            shifted = shifted + _per_axis(zero_point, x, self.axis, self.block).to(torch.float32)
        return shifted.clamp(low, high).to(dtype)


@register("QuantizeLinear", 10, 13, 19, 21)
def _quantize(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    dtype = torch_dtype(int(a["output_dtype"])) if a.get("output_dtype") else None
    return result(QuantizeLinear(int(a.get("axis", 1)), int(a.get("block_size", 0)), dtype), node)


class DequantizeLinear(OnnxModule):
    def __init__(self, axis: int, block: int):
        super().__init__()
        self.axis, self.block = axis, block

    def forward(self, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor = None) -> torch.Tensor:
        values = x.to(torch.float32)
        if zero_point is not None:
            values = values - _per_axis(zero_point, x, self.axis, self.block).to(torch.float32)
        return (values * _per_axis(scale, x, self.axis, self.block)).to(scale.dtype)


@register("DequantizeLinear", 10, 13, 19, 21)
def _dequantize(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(DequantizeLinear(int(a.get("axis", 1)), int(a.get("block_size", 0))), node)


class DynamicQuantizeLinear(OnnxModule):
    def __init__(self, outputs: int):
        super().__init__()
        self.outputs = outputs

    def forward(self, x: torch.Tensor):
        low = torch.clamp(x.min(), max=0.0)
        high = torch.clamp(x.max(), min=0.0)
        scale = (high - low) / 255.0
        zero_point = torch.clamp(torch.round(-low / scale), 0, 255)
        y = torch.clamp(torch.round(x / scale) + zero_point, 0, 255)
        values = (y.to(torch.uint8), scale, zero_point.to(torch.uint8))[: self.outputs]
        return values[0] if self.outputs == 1 else values


@register("DynamicQuantizeLinear", 11)
def _dynamic_quantize(node: OnnxNode, graph: OnnxGraph):
    return result(DynamicQuantizeLinear(len(node.output_values)), node)


def _centered(value: torch.Tensor, zero_point: torch.Tensor = None) -> torch.Tensor:
    out = value.to(torch.float64)
    return out if zero_point is None else out - zero_point.to(torch.float64)


class MatMulInteger(OnnxModule):
    def forward(self, a, b, a_zero_point=None, b_zero_point=None) -> torch.Tensor:
        if a_zero_point is not None and a_zero_point.dim() == 1 and a_zero_point.numel() > 1:
            a_zero_point = a_zero_point.unsqueeze(-1)  # per row of A
        return torch.matmul(_centered(a, a_zero_point), _centered(b, b_zero_point)).to(torch.int32)


@register("MatMulInteger", 10)
def _matmul_integer(node: OnnxNode, graph: OnnxGraph):
    return result(MatMulInteger(), node)


class ConvInteger(OnnxModule):
    def __init__(self, conv: Conv):
        super().__init__()
        self.conv = conv

    def forward(self, x, w, x_zero_point=None, w_zero_point=None) -> torch.Tensor:
        if w_zero_point is not None and w_zero_point.numel() > 1:
            w_zero_point = w_zero_point.reshape(-1, *[1] * (w.dim() - 1))
        return self.conv(_centered(x, x_zero_point), _centered(w, w_zero_point)).round().to(torch.int32)


def _conv_attributes(node: OnnxNode) -> Conv:
    a = node.attributes
    return Conv(
        a.get("strides"),
        a.get("dilations"),
        a.get("group", 1),
        a.get("pads"),
        a.get("auto_pad", "NOTSET"),
        a.get("kernel_shape"),
    )


@register("ConvInteger", 10)
def _conv_integer(node: OnnxNode, graph: OnnxGraph):
    return result(ConvInteger(_conv_attributes(node)), node)


class QLinearMatMul(OnnxModule):
    def forward(self, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) -> torch.Tensor:
        product = torch.matmul(_centered(a, a_zp), _centered(b, b_zp)) * (a_scale.double() * b_scale.double())
        low, high = _LIMITS[y_zp.dtype]
        return (torch.round(product / y_scale.double()) + y_zp.double()).clamp(low, high).to(y_zp.dtype)


@register("QLinearMatMul", 10, 21)
def _qlinear_matmul(node: OnnxNode, graph: OnnxGraph):
    return result(QLinearMatMul(), node)


class QLinearConv(OnnxModule):
    def __init__(self, conv: Conv):
        super().__init__()
        self.conv = conv

    def forward(self, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None) -> torch.Tensor:
        if w_zp.numel() > 1:
            w_zp = w_zp.reshape(-1, *[1] * (w.dim() - 1))
        accumulated = self.conv(_centered(x, x_zp), _centered(w, w_zp))
        if bias is not None:
            accumulated = accumulated + bias.double().reshape(1, -1, *[1] * (accumulated.dim() - 2))
        w_scale = (
            w_scale.double().reshape(1, -1, *[1] * (accumulated.dim() - 2)) if w_scale.numel() > 1 else w_scale.double()
        )
        real = accumulated * x_scale.double() * w_scale
        low, high = _LIMITS[y_zp.dtype]
        return (torch.round(real / y_scale.double()) + y_zp.double()).clamp(low, high).to(y_zp.dtype)


@register("QLinearConv", 10)
def _qlinear_conv(node: OnnxNode, graph: OnnxGraph):
    return result(QLinearConv(_conv_attributes(node)), node)


class FakeQuant(OnnxModule):
    """ORT's FakeQuant: quantize-dequantize; the gradient passes where the value was inside
    [quant_min, quant_max] (the second output, a mask)."""

    def __init__(self, quant_min: int, quant_max: int, outputs: int):
        super().__init__()
        self.quant_min, self.quant_max, self.outputs = quant_min, quant_max, outputs

    def forward(self, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor):
        quantized = torch.round(x / scale) + zero_point
        inside = (quantized >= self.quant_min) & (quantized <= self.quant_max)
        value = (quantized.clamp(self.quant_min, self.quant_max) - zero_point) * scale
        passed = x * inside
        y = passed + (value - passed).detach()
        return (y, inside) if self.outputs > 1 else y


@register("FakeQuant", 1, domain="com.microsoft")
def _fake_quant(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(FakeQuant(int(a.get("quant_min", 0)), int(a.get("quant_max", 255)), len(node.output_values)), node)
