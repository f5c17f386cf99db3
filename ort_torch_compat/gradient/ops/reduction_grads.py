"""Gradients of the reductions: ReduceMean and ReduceSum broadcast the output gradient back over the
reduced axes; ReduceMax/ReduceMin route it to the extrema, ReduceL2 scales it by ``x / y``.

Opset 18 moved ReduceMean's axes from an attribute to an input (ReduceSum moved at 13); both
forms are handled.  Without ``keepdims`` the reduced axes are re-inserted first.
"""

from __future__ import annotations

from typing import Optional, Union

from ..context import MS_DOMAIN, GradientContext
from ..gradient_registry import register
from ._helpers import keep_reduced, reduce, reduced_axes


def _axes(ctx: GradientContext, attribute_until: int) -> Optional[Union[str, list]]:
    """The reduced axes: a list (attribute), a tensor name (input), or None (all axes)."""
    if ctx.opset < attribute_until:
        axes = ctx.attr("axes")
        return list(axes) if axes is not None else None
    return ctx.I(1) or None


def _unreduced_grad(ctx: GradientContext, attribute_until: int) -> str:
    """The output gradient with the reduced axes put back as size 1 (when keepdims=0)."""
    axes = _axes(ctx, attribute_until)
    if axes is None and ctx.opset >= attribute_until and ctx.attr("noop_with_empty_axes", 0):
        return ""  # no axes and noop: the op was an identity
    if ctx.attr("keepdims", 1) or axes is None:
        return ctx.GO(0)  # keepdims, or a full reduction whose scalar gradient expands directly
    grad = ctx.IA("Unqueezed_Grad")
    ctx.unsqueeze(ctx.GO(0), axes, grad)
    return grad


@register("ReduceMean", inputs=(0,))
def reduce_mean(ctx: GradientContext) -> None:
    grad = _unreduced_grad(ctx, attribute_until=18)
    if not grad:
        ctx.emit("Identity", [ctx.GO(0)], [ctx.GI(0)])
        return
    x_size = ctx.emit("Size", [ctx.I(0)], [ctx.IA("Sized_X")])[0]
    grad_size = ctx.emit("Size", [ctx.GO(0)], [ctx.IA("Sized_Grad")])[0]
    count = ctx.emit("Div", [x_size, grad_size], [ctx.IA("Scale")])[0]
    scaled = ctx.emit("Scale", [grad, count], [ctx.IA("Scaled_Grad")], domain=MS_DOMAIN, scale_down=1)[0]
    x_shape = ctx.emit("Shape", [ctx.I(0)], [ctx.IA("Shaped_X")])[0]
    ctx.emit("Expand", [scaled, x_shape], [ctx.GI(0)])


@register("ReduceSum", inputs=(0,))
def reduce_sum(ctx: GradientContext) -> None:
    grad = _unreduced_grad(ctx, attribute_until=13)
    if not grad:
        ctx.emit("Identity", [ctx.GO(0)], [ctx.GI(0)])
        return
    x_shape = ctx.emit("Shape", [ctx.I(0)], [ctx.IA("Shaped_X")])[0]
    ctx.emit("Expand", [grad, x_shape], [ctx.GI(0)])


# ---- reductions ORT 1.19.2 has no gradient for (standard ops only) ----------------------------


def _is_noop(ctx: GradientContext, axes) -> bool:
    return (
        axes is None
        and ctx.opset >= (13 if ctx.op_type == "ReduceSum" else 18)
        and bool(ctx.attr("noop_with_empty_axes", 0))
    )


@register("ReduceMax", "ReduceMin", inputs=(0,))
def reduce_max_min(ctx: GradientContext) -> None:
    """The gradient goes to the elements equal to the result, shared equally among ties.

    That is what torch's ``amax``/``amin`` backward does (``torch.max(x, dim)``, which returns
    indices, gives it all to one element instead).
    """
    axes = reduced_axes(ctx)
    if _is_noop(ctx, axes):
        ctx.emit("Identity", [ctx.GO(0)], [ctx.GI(0)])
        return
    x = ctx.I(0)
    y = keep_reduced(ctx, ctx.O(0), axes, "Unsqueezed_Y")
    grad = keep_reduced(ctx, ctx.GO(0), axes, "Unsqueezed_Grad")
    equal = ctx.emit("Equal", [x, y], [ctx.IA("Is_Extremum")])[0]
    mask = ctx.emit("Cast", [equal], [ctx.IA("Extremum_Mask")], to=ctx.elem_type(x) or 1)[0]
    ties = reduce(ctx, "ReduceSum", mask, axes, True, ctx.IA("Ties"))
    shared = ctx.emit("Div", [grad, ties], [ctx.IA("Shared_Grad")])[0]
    ctx.emit("Mul", [mask, shared], [ctx.GI(0)])


@register("ReduceL2", inputs=(0,))
def reduce_l2(ctx: GradientContext) -> None:
    """``d sqrt(sum x^2) = dy * x / y``, and 0 where the norm is 0 (as torch's ``norm`` backward)."""
    axes = reduced_axes(ctx)
    if _is_noop(ctx, axes):
        ctx.emit("Identity", [ctx.GO(0)], [ctx.GI(0)])
        return
    x = ctx.I(0)
    y = keep_reduced(ctx, ctx.O(0), axes, "Unsqueezed_Y")
    grad = keep_reduced(ctx, ctx.GO(0), axes, "Unsqueezed_Grad")
    zero = ctx.scalar_like("ZeroConstant", 0.0, x, shape=(1,))
    is_zero = ctx.emit("Equal", [y, zero], [ctx.IA("Norm_Is_Zero")])[0]
    ratio = ctx.emit("Div", [grad, y], [ctx.IA("Grad_Over_Norm")])[0]
    safe = ctx.emit("Where", [is_zero, zero, ratio], [ctx.IA("Safe_Grad_Over_Norm")])[0]
    ctx.emit("Mul", [x, safe], [ctx.GI(0)])
