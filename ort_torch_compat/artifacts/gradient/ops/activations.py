"""Gradients of activations and softmax, through ORT's fused com.microsoft gradient kernels."""
from __future__ import annotations

from ..context import MS_DOMAIN, GradientContext
from ..registry import register


@register("Relu")
def relu(ctx: GradientContext) -> None:
    ctx.emit("ReluGrad", [ctx.GO(0), ctx.I(0)], [ctx.GI(0)], domain=MS_DOMAIN)


@register("Sigmoid")
def sigmoid(ctx: GradientContext) -> None:
    ctx.emit("SigmoidGrad", [ctx.GO(0), ctx.O(0)], [ctx.GI(0)], domain=MS_DOMAIN)


@register("Tanh")
def tanh(ctx: GradientContext) -> None:
    ctx.emit("TanhGrad", [ctx.GO(0), ctx.O(0)], [ctx.GI(0)], domain=MS_DOMAIN)


@register("LeakyRelu")
def leaky_relu(ctx: GradientContext) -> None:
    ctx.emit("LeakyReluGrad", [ctx.GO(0), ctx.O(0)], [ctx.GI(0)], domain=MS_DOMAIN, alpha=ctx.attr("alpha", 0.01))


@register("Gelu")
def gelu(ctx: GradientContext) -> None:
    """ai.onnx Gelu (opset 20): exact erf form or the tanh approximation (ORT's FastGelu)."""
    approximate = ctx.attr("approximate", b"none")
    op = "FastGeluGrad" if approximate in (b"tanh", "tanh") else "GeluGrad"
    ctx.emit(op, [ctx.GO(0), ctx.I(0)], [ctx.GI(0)], domain=MS_DOMAIN)


@register("Gelu", domain=MS_DOMAIN)
def ms_gelu(ctx: GradientContext) -> None:
    ctx.emit("GeluGrad", [ctx.GO(0), ctx.I(0)], [ctx.GI(0)], domain=MS_DOMAIN)


def _bias_gelu(ctx: GradientContext, grad_op: str) -> None:
    """``y = gelu(x + b)``: one fused kernel for dX, whose sum over the leading axes is dB."""
    dx = ctx.GI(0) or ctx.IA("dX")
    ctx.emit(grad_op, [ctx.GO(0), ctx.I(0), ctx.I(1)], [dx], domain=MS_DOMAIN)
    if ctx.requires(1):
        ctx.reduce_to(dx, ctx.shape(ctx.I(0)), ctx.I(1), ctx.GI(1))


@register("BiasGelu", domain=MS_DOMAIN)
def ms_bias_gelu(ctx: GradientContext) -> None:
    _bias_gelu(ctx, "BiasGeluGrad_dX")


@register("FastGelu", domain=MS_DOMAIN)
def ms_fast_gelu(ctx: GradientContext) -> None:
    if ctx.num_inputs() > 1 and ctx.I(1):
        _bias_gelu(ctx, "BiasFastGeluGrad_dX")
    else:
        ctx.emit("FastGeluGrad", [ctx.GO(0), ctx.I(0)], [ctx.GI(0)], domain=MS_DOMAIN)


@register("QuickGelu", domain=MS_DOMAIN)
def ms_quick_gelu(ctx: GradientContext) -> None:
    ctx.emit("QuickGeluGrad", [ctx.GO(0), ctx.I(0)], [ctx.GI(0)], domain=MS_DOMAIN, alpha=ctx.attr("alpha", 1.702))


def _softmax_like(ctx: GradientContext, name: str) -> None:
    # Opset 13 changed the axis semantics (one axis instead of "flatten from axis") and default.
    if ctx.opset < 13:
        op, default_axis = f"{name}Grad", 1
    else:
        op, default_axis = f"{name}Grad_13", -1
    ctx.emit(op, [ctx.GO(0), ctx.O(0)], [ctx.GI(0)], domain=MS_DOMAIN, axis=ctx.attr("axis", default_axis))


@register("Softmax")
def softmax(ctx: GradientContext) -> None:
    _softmax_like(ctx, "Softmax")


@register("LogSoftmax")
def log_softmax(ctx: GradientContext) -> None:
    _softmax_like(ctx, "LogSoftmax")
