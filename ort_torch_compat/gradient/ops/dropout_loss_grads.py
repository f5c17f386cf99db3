"""Gradients of Dropout (the forward mask) and SoftmaxCrossEntropyLoss (the forward log-probabilities)."""

from __future__ import annotations

from ..context import MS_DOMAIN, GradientContext
from ..gradient_registry import register


@register("Dropout", inputs=(0,))
def dropout(ctx: GradientContext) -> None:
    """``DropoutGrad(dY, mask, ratio, training_mode)``: dY where the mask kept, scaled by 1/(1-ratio)."""
    if ctx.opset < 12:
        raise ctx.unsupported("Dropout before opset 12 (ratio as an attribute)")
    inputs = [ctx.GO(0), ctx.O(1), *ctx.node.input[1:]]
    ctx.emit("DropoutGrad", inputs, [ctx.GI(0)], domain=MS_DOMAIN, **ctx.source_attributes())


@register("SoftmaxCrossEntropyLoss", inputs=(0,))
def softmax_cross_entropy_loss(ctx: GradientContext) -> None:
    inputs = [ctx.GO(0), ctx.O(1), *ctx.node.input[1:]]
    attributes = ctx.source_attributes()
    attributes.setdefault("reduction", "mean")
    ctx.emit("SoftmaxCrossEntropyLossGrad", inputs, [ctx.GI(0)], domain=MS_DOMAIN, **attributes)
