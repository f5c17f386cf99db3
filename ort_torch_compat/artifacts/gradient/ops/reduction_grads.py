"""Gradients of ReduceMean and ReduceSum: broadcast the output gradient back over the reduced axes.

Opset 18 moved ReduceMean's axes from an attribute to an input (ReduceSum moved at 13); both
forms are handled.  Without ``keepdims`` the reduced axes are re-inserted first.
"""
from __future__ import annotations

from typing import Optional, Union

from ..context import MS_DOMAIN, GradientContext
from ..gradient_registry import register


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
