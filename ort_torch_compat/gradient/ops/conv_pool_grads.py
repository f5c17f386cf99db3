"""Gradients of convolution and pooling (ORT's ConvGrad, MaxPoolGrad and AveragePoolGrad kernels;
ConvTranspose, which ORT 1.19.2 has no gradient for, through standard Conv ops)."""

from __future__ import annotations

import math

import numpy as np

from ..context import MS_DOMAIN, GradientContext
from ..gradient_registry import register
from ._helpers import reduce


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
    shape = ctx.shape(ctx.I(0))
    if shape is not None and all(isinstance(d, int) for d in shape):
        ctx.emit("AveragePoolGrad", [ctx.GO(0)], [ctx.GI(0)], **ctx.source_attributes())
    else:
        _average_pool_by_transposed_conv(ctx, shape)


def _average_pool_by_transposed_conv(ctx: GradientContext, shape) -> None:
    """AveragePool's gradient for inputs with a symbolic (batch) dim.

    ORT's AveragePoolGrad kernel reads dX's shape from the graph and crashes (segfault,
    ORT 1.19.2, ORT's own artifacts included) when a dim is symbolic.  The same gradient is
    a depthwise ConvTranspose of ``dY / count`` with a kernel of ones: every input element
    receives the scaled gradient of each window it belongs to.
    """
    if shape is None or not all(isinstance(d, int) for d in shape[1:]):
        raise ctx.unsupported("AveragePool on an input whose channel or spatial dims are not static")
    kernel = list(ctx.attr("kernel_shape"))
    rank = len(kernel)
    strides = list(ctx.attr("strides", [1] * rank))
    pads = list(ctx.attr("pads", [0] * 2 * rank))
    if (
        ctx.attr("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")
        or ctx.attr("ceil_mode", 0)
        or any(d != 1 for d in ctx.attr("dilations", [1] * rank))
    ):
        raise ctx.unsupported("AveragePool with auto_pad, ceil_mode or dilations on an input with a symbolic dim")
    spatial = shape[2:]
    outputs = [(size + pads[i] + pads[i + rank] - kernel[i]) // strides[i] + 1 for i, size in enumerate(spatial)]
    output_padding = [
        size - (strides[i] * (outputs[i] - 1) + kernel[i] - pads[i] - pads[i + rank]) for i, size in enumerate(spatial)
    ]
    dtype = ctx.np_dtype(ctx.I(0))
    window = float(math.prod(kernel))
    if ctx.attr("count_include_pad", 0) or not any(pads):
        count = ctx.constant("window_size", window, dtype=dtype)
    else:  # windows at the border average over fewer elements: count them with the forward op
        one = ctx.constant("one", 1.0, dtype=dtype)
        ones = ctx.emit("Expand", [one, ctx.emit("Shape", [ctx.I(0)], [ctx.IA("x_shape")])[0]], [ctx.IA("ones")])[0]
        fraction = ctx.emit(
            "AveragePool",
            [ones],
            [ctx.IA("window_fraction")],
            kernel_shape=kernel,
            strides=strides,
            pads=pads,
            count_include_pad=1,
        )[0]
        count = ctx.emit("Mul", [fraction, ctx.constant("window_size", window, dtype=dtype)], [ctx.IA("count")])[0]
    scaled = ctx.emit("Div", [ctx.GO(0), count], [ctx.IA("scaled_dY")])[0]
    weights = ctx.constant("ones_kernel", np.ones([shape[1], 1, *kernel], dtype=dtype))
    ctx.emit(
        "ConvTranspose",
        [scaled, weights],
        [ctx.GI(0)],
        group=shape[1],
        kernel_shape=kernel,
        strides=strides,
        pads=pads,
        output_padding=output_padding,
    )


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


@register("ConvTranspose")
def conv_transpose(ctx: GradientContext) -> None:
    """ConvTranspose's gradient from standard Conv ops (ORT 1.19.2 has no ConvTranspose gradient).

    ``y[n, g*Cog + o, i*s + k*d - pad] += x[n, c, i] * W[c, o, k]`` (c in group g), so
    ``dX = Conv(dY, W)`` with the same strides, dilations, pads and group; ``dW`` is a Conv of
    ``dY`` (batch and channels swapped: input ``[Cog, g*N, Hy]``) with ``x`` as the kernel
    (``[Cin, N, Hx]``), stride and dilation exchanged, cut to the kernel size; ``dB`` sums
    ``dY`` over every axis but the channels.
    """
    x, w, dy = ctx.I(0), ctx.I(1), ctx.GO(0)
    w_shape = ctx.shape(w)
    if w_shape is None or not all(isinstance(d, int) for d in w_shape):
        raise ctx.unsupported("ConvTranspose with a weight of unknown shape")
    rank = len(w_shape) - 2
    kernel = list(ctx.attr("kernel_shape", w_shape[2:]))
    strides = list(ctx.attr("strides", [1] * rank))
    dilations = list(ctx.attr("dilations", [1] * rank))
    pads = list(ctx.attr("pads", [0] * 2 * rank))
    output_padding = list(ctx.attr("output_padding", [0] * rank))
    group = int(ctx.attr("group", 1))
    if ctx.attr("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or ctx.attr("output_shape") is not None:
        raise ctx.unsupported("ConvTranspose with auto_pad or output_shape (only explicit pads are supported)")
    if ctx.requires(2):
        reduce(ctx, "ReduceSum", dy, [0, *range(2, rank + 2)], False, ctx.GI(2))
    if ctx.requires(0):
        ctx.emit(
            "Conv",
            [dy, w],
            [ctx.GI(0)],
            kernel_shape=kernel,
            strides=strides,
            dilations=dilations,
            pads=pads,
            group=group,
        )
    if not ctx.requires(1):
        return
    dy_shape = ctx.shape(ctx.O(0))
    if dy_shape is None or not all(isinstance(d, int) for d in dy_shape[1:]):
        raise ctx.unsupported("the gradient of ConvTranspose's weight needs static channel and spatial dims")
    group_out = w_shape[1]
    split = ctx.int64s("dY_grouped_shape", [0, group, group_out, *dy_shape[2:]])
    grouped = ctx.emit("Reshape", [dy, split], [ctx.IA("dY_grouped")])[0]
    moved = ctx.emit("Transpose", [grouped], [ctx.IA("dY_channels_first")], perm=[2, 1, 0, *range(3, rank + 3)])[0]
    merged = ctx.int64s("dY_as_batch_shape", [group_out, -1, *dy_shape[2:]])
    images = ctx.emit("Reshape", [moved, merged], [ctx.IA("dY_as_batch")])[0]
    filters = ctx.emit("Transpose", [x], [ctx.IA("X_as_kernel")], perm=[1, 0, *range(2, rank + 2)])[0]
    extent = [k + p // d for k, p, d in zip(kernel, output_padding, dilations)]  # the Conv's output size
    full = ctx.emit(
        "Conv",
        [images, filters],
        [ctx.IA("dW_transposed_full")],
        strides=dilations,
        dilations=strides,
        pads=pads,
        group=group,
    )[0]
    if extent != kernel:
        axes = list(range(2, rank + 2))
        full = ctx.emit(
            "Slice",
            [full, ctx.int64s("zeros", [0] * rank), ctx.int64s("kernel_ends", kernel), ctx.int64s("kernel_axes", axes)],
            [ctx.IA("dW_transposed")],
        )[0]
    ctx.emit("Transpose", [full], [ctx.GI(1)], perm=[1, 0, *range(2, rank + 2)])
