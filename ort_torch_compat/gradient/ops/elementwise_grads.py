"""Gradients of elementwise math: arithmetic with broadcasting, unary functions, Where, Cast.

Broadcast inputs get their gradient summed back to their own shape (``ctx.reduce_to``).
The formulas are ORT's (e.g. ``d sqrt(x) = dy * (0.5 / y)``, Erf through ``2/sqrt(pi) *
exp(-x^2)``), so ORT running these graphs rounds like ORT running its own.
"""

from __future__ import annotations

import math

from ..context import GradientContext
from ..gradient_registry import register


def _reduced(ctx: GradientContext, grad: str, target_slot: int, output: str) -> None:
    """``output`` = ``grad`` (shaped like the node's output) summed to input ``target_slot``'s shape."""
    ctx.reduce_to(grad, ctx.shape(ctx.O(0)), ctx.I(target_slot), output)


@register("Add", "Sub")
def add_sub(ctx: GradientContext) -> None:
    negate = ctx.op_type == "Sub"
    if ctx.requires(0):
        _reduced(ctx, ctx.GO(0), 0, ctx.GI(0))
    if ctx.requires(1):
        if negate:
            summed = ctx.IA("ReshapeReduceSum_2")
            _reduced(ctx, ctx.GO(0), 1, summed)
            ctx.emit("Neg", [summed], [ctx.GI(1)])
        else:
            _reduced(ctx, ctx.GO(0), 1, ctx.GI(1))


@register("Mul")
def mul(ctx: GradientContext) -> None:
    for slot, other in ((0, 1), (1, 0)):
        if ctx.requires(slot):
            product = ctx.IA(f"PreReduceGrad{slot}")
            ctx.emit("Mul", [ctx.GO(0), ctx.I(other)], [product])
            _reduced(ctx, product, slot, ctx.GI(slot))


@register("Div")
def div(ctx: GradientContext) -> None:
    if ctx.requires(1):
        # DivGrad reduces both gradients over broadcast axes itself.
        ctx.emit("DivGrad", [ctx.GO(0), ctx.I(0), ctx.I(1)], [ctx.GI_or_unused(0), ctx.GI(1)], domain="com.microsoft")
    elif ctx.requires(0):
        quotient = ctx.IA("PreReduceGrad0")
        ctx.emit("Div", [ctx.GO(0), ctx.I(1)], [quotient])
        _reduced(ctx, quotient, 0, ctx.GI(0))


@register("Pow", inputs=(0,))
def pow_(ctx: GradientContext) -> None:
    exponent = ctx.I(1)
    base_type, exponent_type = ctx.elem_type(ctx.I(0)), ctx.elem_type(exponent)
    if base_type and exponent_type and base_type != exponent_type:
        cast = ctx.IA("I1_cast")
        ctx.emit("Cast", [exponent], [cast], to=base_type)
        exponent = cast
    one = ctx.scalar_like("OneConstant", 1.0, ctx.I(0), shape=(1,))
    sub = ctx.emit("Sub", [exponent, one], [ctx.IA("Sub_I1")])[0]
    pow_i0 = ctx.emit("Pow", [ctx.I(0), sub], [ctx.IA("Pow_I0")])[0]
    scaled = ctx.emit("Mul", [pow_i0, exponent], [ctx.IA("Mul_Pow_I0_I1")])[0]
    if ctx.shape(ctx.O(0)) == ctx.shape(ctx.I(0)) and ctx.shape(ctx.I(0)) is not None:
        ctx.emit("Mul", [scaled, ctx.GO(0)], [ctx.GI(0)])
    else:
        product = ctx.emit("Mul", [scaled, ctx.GO(0)], [ctx.IA("PreReduceGrad0")])[0]
        _reduced(ctx, product, 0, ctx.GI(0))


@register("Sqrt")
def sqrt(ctx: GradientContext) -> None:
    half = ctx.scalar_like("HalfConstant", 0.5, ctx.O(0), shape=(1,))
    ratio = ctx.emit("Div", [half, ctx.O(0)], [ctx.IA("Div_O0")])[0]
    ctx.emit("Mul", [ctx.GO(0), ratio], [ctx.GI(0)])


@register("Exp")
def exp(ctx: GradientContext) -> None:
    ctx.emit("Mul", [ctx.GO(0), ctx.O(0)], [ctx.GI(0)])


@register("Log")
def log(ctx: GradientContext) -> None:
    ctx.emit("Div", [ctx.GO(0), ctx.I(0)], [ctx.GI(0)])


@register("Neg")
def neg(ctx: GradientContext) -> None:
    ctx.emit("Neg", [ctx.GO(0)], [ctx.GI(0)])


@register("Abs")
def abs_(ctx: GradientContext) -> None:
    sign = ctx.emit("Sign", [ctx.I(0)], [ctx.IA("Sign_Input")])[0]
    ctx.emit("Mul", [ctx.GO(0), sign], [ctx.GI(0)])


@register("Reciprocal")
def reciprocal(ctx: GradientContext) -> None:
    square = ctx.emit("Mul", [ctx.O(0), ctx.O(0)], [ctx.IA("Square_O0")])[0]
    negated = ctx.emit("Neg", [square], [ctx.IA("Neg_Square_O0")])[0]
    ctx.emit("Mul", [ctx.GO(0), negated], [ctx.GI(0)])


@register("Sin")
def sin(ctx: GradientContext) -> None:
    cos = ctx.emit("Cos", [ctx.I(0)], [ctx.IA("Cos_O0")])[0]
    ctx.emit("Mul", [ctx.GO(0), cos], [ctx.GI(0)])


@register("Cos")
def cos(ctx: GradientContext) -> None:
    sine = ctx.emit("Sin", [ctx.I(0)], [ctx.IA("Sin_O0")])[0]
    negated = ctx.emit("Neg", [sine], [ctx.IA("NegSin_O0")])[0]
    ctx.emit("Mul", [ctx.GO(0), negated], [ctx.GI(0)])


@register("Erf")
def erf(ctx: GradientContext) -> None:
    x = ctx.I(0)
    two_over_sqrt_pi = ctx.constant("Two_Sqrt_Pi", 2.0 / math.sqrt(math.pi), dtype=ctx.np_dtype(x))
    square = ctx.emit("Mul", [x, x], [ctx.IA("Squared_X")])[0]
    negated = ctx.emit("Neg", [square], [ctx.IA("Neg_Squared_X")])[0]
    exponential = ctx.emit("Exp", [negated], [ctx.IA("Exp_Neg_Squared_X")])[0]
    derivative = ctx.emit("Mul", [two_over_sqrt_pi, exponential], [ctx.IA("Mul_Exp_Neg_Squared_X")])[0]
    ctx.emit("Mul", [ctx.GO(0), derivative], [ctx.GI(0)])


@register("Identity")
def identity(ctx: GradientContext) -> None:
    ctx.emit("Identity", [ctx.GO(0)], [ctx.GI(0)])


@register("Cast", inputs=(0,))
def cast(ctx: GradientContext) -> None:
    source_type = ctx.elem_type(ctx.I(0))
    if not source_type:
        raise ctx.unsupported("the input's element type is unknown (run shape inference)")
    ctx.emit("Cast", [ctx.GO(0)], [ctx.GI(0)], to=source_type)


@register("Where", inputs=(1, 2))
def where(ctx: GradientContext) -> None:
    zero = ctx.scalar_like("ZeroConstant", 0.0, ctx.O(0), shape=(1,))
    for slot in (1, 2):
        if not ctx.requires(slot):
            continue
        branches = [ctx.GO(0), zero] if slot == 1 else [zero, ctx.GO(0)]
        if ctx.shape(ctx.I(slot)) == ctx.shape(ctx.O(0)) and ctx.shape(ctx.O(0)) is not None:
            ctx.emit("Where", [ctx.I(0), *branches], [ctx.GI(slot)])
        else:
            selected = ctx.emit("Where", [ctx.I(0), *branches], [ctx.IA(f"PreReduceGrad{slot}")])[0]
            _reduced(ctx, selected, slot, ctx.GI(slot))


@register("Expand", inputs=(0,))
def expand(ctx: GradientContext) -> None:
    _reduced(ctx, ctx.GO(0), 0, ctx.GI(0))


@register("Sum")
def sum_(ctx: GradientContext) -> None:
    for slot in range(ctx.num_inputs()):
        if ctx.requires(slot):
            _reduced(ctx, ctx.GO(0), slot, ctx.GI(slot))


@register("Clip", inputs=(0,))
def clip(ctx: GradientContext) -> None:
    """Gradient 1 inside ``[min, max]`` (bounds included), 0 outside."""
    masks = []
    if ctx.opset < 11:
        raise ctx.unsupported("Clip before opset 11 (bounds as attributes)")
    if ctx.I(1):
        masks.append(ctx.emit("GreaterOrEqual", [ctx.I(0), ctx.I(1)], [ctx.IA("Masked_Min")])[0])
    if ctx.I(2):
        masks.append(ctx.emit("LessOrEqual", [ctx.I(0), ctx.I(2)], [ctx.IA("Masked_Max")])[0])
    if not masks:
        ctx.emit("Identity", [ctx.GO(0)], [ctx.GI(0)])
        return
    mask = masks[0] if len(masks) == 1 else ctx.emit("And", masks, [ctx.IA("Masked_Min_Max")])[0]
    scale = ctx.emit("Cast", [mask], [ctx.IA("Casted_Mask")], to=ctx.elem_type(ctx.I(0)) or 1)[0]
    ctx.emit("Mul", [ctx.GO(0), scale], [ctx.GI(0)])


@register("Max", "Min")
def max_min(ctx: GradientContext) -> None:
    """Each input whose value is the result gets the gradient, shared equally on ties (as ORT)."""
    if ctx.num_inputs() == 1:
        ctx.emit("Identity", [ctx.GO(0)], [ctx.GI(0)])
        return
    elem = ctx.elem_type(ctx.O(0)) or 1
    masks = []
    for slot in range(ctx.num_inputs()):
        equal = ctx.emit("Equal", [ctx.I(slot), ctx.O(0)], [ctx.IA(f"Mask_{slot}")])[0]
        masks.append(ctx.emit("Cast", [equal], [ctx.IA(f"Mask_Cast_{slot}")], to=elem)[0])
    ties = ctx.emit("Sum", masks, [ctx.IA("Scale")])[0]
    shared = ctx.emit("Div", [ctx.GO(0), ties], [ctx.IA("dY_Scaled")])[0]
    for slot in range(ctx.num_inputs()):
        if ctx.requires(slot):
            part = ctx.emit("Mul", [shared, masks[slot]], [ctx.IA(f"PreReduceGrad_{slot}")])[0]
            _reduced(ctx, part, slot, ctx.GI(slot))


@register("CastLike", inputs=(0,))
def cast_like(ctx: GradientContext) -> None:
    """The gradient is cast back to the input's type (ORT 1.19.2 has no CastLike gradient)."""
    ctx.emit("CastLike", [ctx.GO(0), ctx.I(0)], [ctx.GI(0)])
