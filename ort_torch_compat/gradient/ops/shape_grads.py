"""Gradients of ops that move data without arithmetic: reshape, transpose, (un)squeeze, concat,
split, slice, gather, tile, scatter (Elements and ND).  Each routes the output gradient back to where the input elements came
from; slice and gather scatter it into zeros with ORT's SliceGrad / GatherGrad kernels."""

from __future__ import annotations

from typing import List

import numpy as np
from onnx import numpy_helper

from ..context import MS_DOMAIN, GradientContext
from ..gradient_registry import register
from ._helpers import constant_value, reduce


@register("Reshape", "Flatten", inputs=(0,))
def reshape(ctx: GradientContext) -> None:
    ctx.reshape_like(ctx.GO(0), ctx.I(0), ctx.GI(0))


@register("Transpose")
def transpose(ctx: GradientContext) -> None:
    perm = ctx.attr("perm")
    if perm is None:
        shape = ctx.shape(ctx.I(0)) or ctx.shape(ctx.O(0))
        if shape is None:
            raise ctx.unsupported("Transpose without perm on a tensor of unknown rank")
        perm = list(reversed(range(len(shape))))
    inverse = [0] * len(perm)
    for position, axis in enumerate(perm):
        inverse[axis] = position
    ctx.emit("Transpose", [ctx.GO(0)], [ctx.GI(0)], perm=inverse)


@register("Squeeze", inputs=(0,))
def squeeze(ctx: GradientContext) -> None:
    if ctx.opset >= 13 and ctx.I(1):
        ctx.unsqueeze(ctx.GO(0), ctx.I(1), ctx.GI(0))
    elif ctx.opset < 13 and ctx.attr("axes") is not None:
        ctx.unsqueeze(ctx.GO(0), list(ctx.attr("axes")), ctx.GI(0))
    else:  # every size-1 axis was squeezed: restore the input's shape
        ctx.reshape_like(ctx.GO(0), ctx.I(0), ctx.GI(0))


@register("Unsqueeze", inputs=(0,))
def unsqueeze(ctx: GradientContext) -> None:
    axes = ctx.I(1) if ctx.opset >= 13 else list(ctx.attr("axes", []))
    ctx.squeeze(ctx.GO(0), axes, ctx.GI(0))


@register("Concat")
def concat(ctx: GradientContext) -> None:
    """Split the output gradient into the inputs' extents along the axis."""
    axis = int(ctx.attr("axis"))
    outputs = [ctx.GI_or_unused(i) for i in range(ctx.num_inputs())]
    sizes = []
    for name in ctx.node.input:
        shape = ctx.shape(name)
        position = axis + len(shape) if shape is not None and axis < 0 else axis
        sizes.append(shape[position] if shape is not None and isinstance(shape[position], int) else None)
    if ctx.opset < 13:
        if None in sizes:
            raise ctx.unsupported("Concat before opset 13 needs every input's size along the axis")
        ctx.emit("Split", [ctx.GO(0)], outputs, axis=axis, split=sizes)
        return
    if None not in sizes:
        split = ctx.int64s("split_sizes", sizes)
    else:
        axis_index = ctx.int64s(f"{axis}_int64", [axis])
        parts = []
        for i, name in enumerate(ctx.node.input):
            dims = ctx.emit("Shape", [name], [ctx.IA(f"shape_{i}")])[0]
            parts.append(ctx.emit("Gather", [dims, axis_index], [ctx.IA(f"split_size_{i}")], axis=0)[0])
        split = ctx.emit("Concat", parts, [ctx.IA("split_sizes")], axis=0)[0]
    ctx.emit("Split", [ctx.GO(0), split], outputs, axis=axis)


@register("Split", inputs=(0,))
def split(ctx: GradientContext) -> None:
    """Concatenate the outputs' gradients; outputs without one contribute zeros."""
    parts: List[str] = []
    for i, name in enumerate(ctx.node.output):
        if ctx.GO(i):
            parts.append(ctx.GO(i))
            continue
        dims = ctx.emit("Shape", [name], [ctx.IA(f"shape_{i}")])[0]
        zero = np.zeros([1], dtype=ctx.np_dtype(name))
        parts.append(
            ctx.emit("ConstantOfShape", [dims], [ctx.IA(f"zeros_{i}")], value=numpy_helper.from_array(zero))[0]
        )
    ctx.emit("Concat", parts, [ctx.GI(0)], axis=int(ctx.attr("axis", 0)))


@register("Slice", inputs=(0,))
def slice_(ctx: GradientContext) -> None:
    if ctx.opset < 10:
        raise ctx.unsupported("Slice before opset 10 (starts/ends as attributes)")
    dims = ctx.emit("Shape", [ctx.I(0)], [ctx.IA("I0_shape")])[0]
    ctx.emit("SliceGrad", [ctx.GO(0), dims, *ctx.node.input[1:]], [ctx.GI(0)], domain=MS_DOMAIN)


@register("Gather", inputs=(0,))
def gather(ctx: GradientContext) -> None:
    dims = ctx.emit("Shape", [ctx.I(0)], [ctx.IA("I0_shape")])[0]
    ctx.emit("GatherGrad", [dims, ctx.I(1), ctx.GO(0)], [ctx.GI(0)], domain=MS_DOMAIN, axis=int(ctx.attr("axis", 0)))


@register("GatherElements", inputs=(0,))
def gather_elements(ctx: GradientContext) -> None:
    dims = ctx.emit("Shape", [ctx.I(0)], [ctx.IA("x_shape")])[0]
    ctx.emit(
        "GatherElementsGrad", [ctx.GO(0), dims, ctx.I(1)], [ctx.GI(0)], domain=MS_DOMAIN, axis=int(ctx.attr("axis", 0))
    )


@register("Pad", inputs=(0,))
def pad(ctx: GradientContext) -> None:
    """Constant padding: the gradient is the output gradient with the padding cut off (negative pads)."""
    if ctx.opset < 11:
        raise ctx.unsupported("Pad before opset 11 (pads as an attribute)")
    mode = ctx.attr("mode", b"constant")
    if mode not in (b"constant", "constant"):
        raise ctx.unsupported(f"Pad mode {mode!r} (only constant padding has a gradient)")
    negative = ctx.emit("Neg", [ctx.I(1)], [ctx.IA("Neg_pads")])[0]
    axes = [ctx.I(3)] if ctx.num_inputs() > 3 and ctx.I(3) else []
    ctx.emit("Pad", [ctx.GO(0), negative, *([""] + axes if axes else [])], [ctx.GI(0)])


@register("Tile", inputs=(0,))
def tile(ctx: GradientContext) -> None:
    """Sum the copies: dY reshaped to ``[r0, d0, r1, d1, ...]`` and summed over the ``r`` axes."""
    shape = ctx.shape(ctx.I(0))
    repeats = constant_value(ctx, ctx.I(1))
    if shape is None and repeats is None:
        raise ctx.unsupported("Tile of an input of unknown rank")
    rank = len(shape) if shape is not None else int(np.asarray(repeats).size)
    if shape is not None and repeats is not None and all(isinstance(d, int) for d in shape):
        interleaved = ctx.int64s(
            "interleaved_shape", [v for pair in zip(np.asarray(repeats).reshape(-1).tolist(), shape) for v in pair]
        )
    else:
        x_dims = ctx.emit("Shape", [ctx.I(0)], [ctx.IA("X_shape")])[0]
        columns = [ctx.IA("repeats_column"), ctx.IA("dims_column")]
        ctx.unsqueeze(ctx.I(1), [1], columns[0])
        ctx.unsqueeze(x_dims, [1], columns[1])
        pairs = ctx.emit("Concat", columns, [ctx.IA("repeat_dim_pairs")], axis=1)[0]
        interleaved = ctx.emit("Reshape", [pairs, ctx.int64s("flat", [-1])], [ctx.IA("interleaved_shape")])[0]
    split = ctx.emit("Reshape", [ctx.GO(0), interleaved], [ctx.IA("dY_split")])[0]
    reduce(ctx, "ReduceSum", split, list(range(0, 2 * rank, 2)), False, ctx.GI(0))


@register("ScatterElements", inputs=(0, 2))
def scatter_elements(ctx: GradientContext) -> None:
    """``data`` gets dY with the written positions zeroed (added to, with reduction="add");
    ``updates`` gets dY gathered at the indices."""
    reduction = ctx.attr("reduction", b"none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("none", "add"):
        raise ctx.unsupported(f"ScatterElements with reduction={reduction!r} (only none and add)")
    axis = int(ctx.attr("axis", 0))
    if ctx.requires(0):
        if reduction == "add":
            ctx.emit("Identity", [ctx.GO(0)], [ctx.GI(0)])
        else:
            dims = ctx.emit("Shape", [ctx.I(2)], [ctx.IA("updates_shape")])[0]
            zeros = ctx.emit(
                "ConstantOfShape",
                [dims],
                [ctx.IA("zeros")],
                value=numpy_helper.from_array(np.zeros([1], dtype=ctx.np_dtype(ctx.I(0)))),
            )[0]
            ctx.emit("ScatterElements", [ctx.GO(0), ctx.I(1), zeros], [ctx.GI(0)], axis=axis)
    if ctx.requires(2):
        ctx.emit("GatherElements", [ctx.GO(0), ctx.I(1)], [ctx.GI(2)], axis=axis)


def _zeros_like(ctx: GradientContext, like: str, name: str) -> str:
    dims = ctx.emit("Shape", [like], [ctx.IA(f"{name}_shape")])[0]
    return ctx.emit(
        "ConstantOfShape",
        [dims],
        [ctx.IA(name)],
        value=numpy_helper.from_array(np.zeros([1], dtype=ctx.np_dtype(like))),
    )[0]


@register("GatherND", inputs=(0,))
def gather_nd(ctx: GradientContext) -> None:
    """dY added into zeros at the gathered positions: ``ScatterND(zeros, indices, dY, reduction="add")``
    (repeated indices add up).  Standard ONNX ops, unlike ORT's GatherNDGrad."""
    if int(ctx.attr("batch_dims", 0)):
        raise ctx.unsupported("GatherND with batch_dims > 0 (ScatterND has no batch_dims)")
    if ctx.opset < 16:
        raise ctx.unsupported("GatherND before opset 16 (its gradient needs ScatterND-16's reduction='add')")
    zeros = _zeros_like(ctx, ctx.I(0), "zeros")
    ctx.emit("ScatterND", [zeros, ctx.I(1), ctx.GO(0)], [ctx.GI(0)], reduction="add")


@register("ScatterND", inputs=(0, 2))
def scatter_nd(ctx: GradientContext) -> None:
    """``data`` gets dY with the written positions zeroed (all of dY with reduction="add");
    ``updates`` gets dY gathered at the indices."""
    reduction = ctx.attr("reduction", b"none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("none", "add"):
        raise ctx.unsupported(f"ScatterND with reduction={reduction!r} (only none and add)")
    if ctx.requires(0):
        if reduction == "add":
            ctx.emit("Identity", [ctx.GO(0)], [ctx.GI(0)])
        else:
            zeros = _zeros_like(ctx, ctx.I(2), "zeros")
            ctx.emit("ScatterND", [ctx.GO(0), ctx.I(1), zeros], [ctx.GI(0)])
    if ctx.requires(2):
        ctx.emit("GatherND", [ctx.GO(0), ctx.I(1)], [ctx.GI(2)])
