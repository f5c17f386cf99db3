"""Gradients of batch and layer normalization.

``BatchNormalization`` reaches the builder as com.microsoft ``BatchNormInternal`` (see
``forward.py``), whose saved batch mean and inverse standard deviation feed
``BatchNormalizationGrad``; LayerNormalization's own Mean/InvStdDev outputs feed
``LayerNormalizationGrad``.  The gradient kernels always write all their outputs, so the
gradients nobody needs still get (unused) names.
"""
from __future__ import annotations

from ..context import MS_DOMAIN, GradientContext
from ..gradient_registry import register

BATCH_NORM_DEFAULT_EPSILON = 1e-5


@register("BatchNormInternal", domain=MS_DOMAIN, inputs=(0, 1, 2))
def batch_norm_internal(ctx: GradientContext) -> None:
    outputs = [ctx.GI_or_unused(i) for i in range(3)]
    ctx.emit("BatchNormalizationGrad", [ctx.GO(0), ctx.I(0), ctx.I(1), ctx.O(3), ctx.O(4)], outputs,
             domain=MS_DOMAIN, epsilon=float(ctx.attr("epsilon", BATCH_NORM_DEFAULT_EPSILON)))


@register("LayerNormalization")
def layer_norm(ctx: GradientContext) -> None:
    outputs = [ctx.GI_or_unused(i) for i in range(3)]
    ctx.emit("LayerNormalizationGrad", [ctx.GO(0), ctx.I(0), ctx.I(1), ctx.O(1), ctx.O(2)], outputs,
             domain=MS_DOMAIN, **ctx.source_attributes())
