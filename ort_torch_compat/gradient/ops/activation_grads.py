"""Gradients of activations and softmax, through ORT's fused com.microsoft gradient kernels."""

from __future__ import annotations

from ..context import MS_DOMAIN, GradientContext
from ..gradient_registry import register


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


def _inside_mask(ctx: GradientContext, pre: str, low: float, high: float) -> str:
    """``low < pre < high`` as a float mask of ``pre``'s type."""
    lo = ctx.constant("low", low, dtype=ctx.np_dtype(ctx.I(0)))
    hi = ctx.constant("high", high, dtype=ctx.np_dtype(ctx.I(0)))
    above = ctx.emit("Greater", [pre, lo], [ctx.IA("above")])[0]
    below = ctx.emit("Less", [pre, hi], [ctx.IA("below")])[0]
    inside = ctx.emit("And", [above, below], [ctx.IA("inside")])[0]
    return ctx.emit("Cast", [inside], [ctx.IA("inside_mask")], to=ctx.elem_type(ctx.I(0)) or 1)[0]


@register("HardSigmoid")
def hard_sigmoid(ctx: GradientContext) -> None:
    """``y = clip(alpha * x + beta, 0, 1)``: slope ``alpha`` where the clip is not active."""
    alpha, beta = float(ctx.attr("alpha", 0.2)), float(ctx.attr("beta", 0.5))
    dtype = ctx.np_dtype(ctx.I(0))
    scaled = ctx.emit("Mul", [ctx.I(0), ctx.constant("alpha", alpha, dtype=dtype)], [ctx.IA("scaled")])[0]
    pre = ctx.emit("Add", [scaled, ctx.constant("beta", beta, dtype=dtype)], [ctx.IA("pre")])[0]
    slope = ctx.emit(
        "Mul", [_inside_mask(ctx, pre, 0.0, 1.0), ctx.constant("alpha_slope", alpha, dtype=dtype)], [ctx.IA("slope")]
    )[0]
    ctx.emit("Mul", [ctx.GO(0), slope], [ctx.GI(0)])


@register("HardSwish")
def hard_swish(ctx: GradientContext) -> None:
    """``y = x * clip(x/6 + 1/2, 0, 1)``: ``dy/dx`` is 0 below -3, 1 above 3, ``x/3 + 1/2`` between."""
    x, dtype = ctx.I(0), ctx.np_dtype(ctx.I(0))
    ramp = ctx.emit(
        "Add",
        [
            ctx.emit("Mul", [x, ctx.constant("third", 1.0 / 3.0, dtype=dtype)], [ctx.IA("x_third")])[0],
            ctx.constant("half", 0.5, dtype=dtype),
        ],
        [ctx.IA("ramp")],
    )[0]
    inside = _inside_mask(ctx, x, -3.0, 3.0)
    above = ctx.emit(
        "Cast",
        [ctx.emit("GreaterOrEqual", [x, ctx.constant("three", 3.0, dtype=dtype)], [ctx.IA("at_least_three")])[0]],
        [ctx.IA("above_mask")],
        to=ctx.elem_type(x) or 1,
    )[0]
    slope = ctx.emit("Add", [ctx.emit("Mul", [ramp, inside], [ctx.IA("ramp_inside")])[0], above], [ctx.IA("slope")])[0]
    ctx.emit("Mul", [ctx.GO(0), slope], [ctx.GI(0)])


@register("Softplus")
def softplus(ctx: GradientContext) -> None:
    """``y = log(1 + exp(x))``: ``dy/dx = sigmoid(x)`` (ORT 1.19.2 has no Softplus gradient)."""
    slope = ctx.emit("Sigmoid", [ctx.I(0)], [ctx.IA("Sigmoid_X")])[0]
    ctx.emit("Mul", [ctx.GO(0), slope], [ctx.GI(0)])
