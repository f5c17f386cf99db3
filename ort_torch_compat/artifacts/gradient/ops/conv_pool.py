"""Gradients of convolution and pooling (ORT's ConvGrad, MaxPoolGrad and AveragePoolGrad kernels)."""
from __future__ import annotations

import math

from ..context import MS_DOMAIN, GradientContext
from ..registry import register


@register("Conv")
def conv(ctx: GradientContext) -> None:
    outputs = [ctx.GI(i) for i in range(ctx.num_inputs())]  # "" = not needed (optional outputs)
    ctx.emit("ConvGrad", [ctx.GO(0), ctx.I(0), ctx.I(1)], outputs, domain=MS_DOMAIN, **ctx.source_attributes())


@register("MaxPool")
def max_pool(ctx: GradientContext) -> None:
    # MaxPoolGrad lives in ORT's registration of the ai.onnx domain; it reads the argmax indices.
    ctx.emit("MaxPoolGrad", [ctx.GO(0), ctx.O(1)], [ctx.GI(0)], **ctx.source_attributes())


@register("AveragePool")
def average_pool(ctx: GradientContext) -> None:
    ctx.emit("AveragePoolGrad", [ctx.GO(0)], [ctx.GI(0)], **ctx.source_attributes())


@register("GlobalAveragePool")
def global_average_pool(ctx: GradientContext) -> None:
    """Each input element gets ``dY / (H * W ...)`` of its channel."""
    x = ctx.I(0)
    shape = ctx.shape(x)
    if shape is not None and len(shape) >= 3 and all(isinstance(d, int) for d in shape[2:]):
        scale = ctx.constant("Scale", float(math.prod(shape[2:])), dtype=ctx.np_dtype(x))
    else:
        x_size = ctx.emit("Size", [x], [ctx.IA("X_Size")])[0]
        y_size = ctx.emit("Size", [ctx.O(0)], [ctx.IA("Y_Size")])[0]
        scale = ctx.emit("Div", [x_size, y_size], [ctx.IA("Scale")])[0]
    scaled = ctx.emit("Scale", [ctx.GO(0), scale], [ctx.IA("scaled_dY")], domain=MS_DOMAIN, scale_down=1)[0]
    x_shape = ctx.emit("Shape", [x], [ctx.IA("x_shape")])[0]
    ctx.emit("Expand", [scaled, x_shape], [ctx.GI(0)])
