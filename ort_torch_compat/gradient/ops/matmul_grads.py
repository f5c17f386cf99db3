"""Gradients of MatMul and Gemm.

MatMul follows ORT's case split: 2-D x 2-D gives two Gemms; batched products use
com.microsoft FusedMatMul (a MatMul with transposed operands) and sum broadcast batch axes
away; a 2-D weight ``B[K, N]`` gets ``dB = A'[M, K]^T dY'[M, N]`` with A and dY flattened to
2-D, one GEMM for the whole batch.  Unknown shapes fall back to run-time axes.
"""

from __future__ import annotations

from typing import List

from ..context import MS_DOMAIN, GradientContext, broadcast_reduction_axes
from ..gradient_registry import register
from ..graph_index import is_static


def _weight_grad_2d(ctx: GradientContext) -> None:
    """``dB`` for a 2-D ``B``: flatten A to ``[-1, K]`` and dY to ``[-1, N]``, then one Gemm."""
    a, b = ctx.I(0), ctx.I(1)
    b_shape = ctx.shape(b)
    if b_shape is not None and all(isinstance(d, int) for d in b_shape):
        a_target = ctx.int64s("A_target_shape", [-1, b_shape[0]])
        dy_target = ctx.int64s("dY_target_shape", [-1, b_shape[1]])
    else:
        zero = ctx.int64s("zero_int64", [0])
        one = ctx.int64s("one", [1])
        minus_one = ctx.int64s("neg_one", [-1])
        dims = ctx.emit("Shape", [b], [ctx.IA("B_shape")])[0]
        k = ctx.emit("Gather", [dims, zero], [ctx.IA("K_dim")], axis=0)[0]
        a_target = ctx.emit("Concat", [minus_one, k], [ctx.IA("A_target_shape")], axis=0)[0]
        n = ctx.emit("Gather", [dims, one], [ctx.IA("N_dim")], axis=0)[0]
        dy_target = ctx.emit("Concat", [minus_one, n], [ctx.IA("dY_target_shape")], axis=0)[0]
    a_2d = ctx.emit("Reshape", [a, a_target], [ctx.IA("A_reshape_2d")])[0]
    dy_2d = ctx.emit("Reshape", [ctx.GO(0), dy_target], [ctx.IA("dY_reshape_2d")])[0]
    ctx.emit("Gemm", [a_2d, dy_2d], [ctx.GI(1)], transA=1)


def _batched(ctx: GradientContext, slot: int, inputs: List[str], full_shape, **attributes) -> None:
    """``GI(slot)`` = FusedMatMul(inputs), summed over the batch axes the operand was broadcast along."""
    target = ctx.I(slot)
    target_shape = ctx.shape(target)
    if full_shape is not None and is_static(target_shape):
        if not broadcast_reduction_axes(target_shape, full_shape):
            ctx.emit("FusedMatMul", inputs, [ctx.GI(slot)], domain=MS_DOMAIN, **attributes)
            return
    product = ctx.emit("FusedMatMul", inputs, [ctx.IA(f"PreReduceGrad{slot}")], domain=MS_DOMAIN, **attributes)[0]
    ctx.reduce_to(product, full_shape, target, ctx.GI(slot))


@register("MatMul")
def matmul(ctx: GradientContext) -> None:
    a, b, y = ctx.I(0), ctx.I(1), ctx.O(0)
    a_shape, b_shape, y_shape = ctx.shape(a), ctx.shape(b), ctx.shape(y)
    for name, shape in ((a, a_shape), (b, b_shape)):
        if shape is not None and len(shape) < 2:
            raise ctx.unsupported(f"operand {name!r} is 1-D (only operands of rank >= 2 are supported)")
    static = is_static(a_shape) and is_static(b_shape) and is_static(y_shape)
    if static and len(a_shape) == 2 and len(b_shape) == 2:
        if ctx.requires(0):
            ctx.emit("Gemm", [ctx.GO(0), b], [ctx.GI(0)], beta=0.0, transB=1)
        if ctx.requires(1):
            ctx.emit("Gemm", [a, ctx.GO(0)], [ctx.GI(1)], beta=0.0, transA=1)
        return
    if ctx.requires(0):
        full = y_shape[:-1] + [b_shape[-2]] if static else None
        _batched(ctx, 0, [ctx.GO(0), b], full, transB=1)
    if ctx.requires(1):
        if b_shape is not None and len(b_shape) == 2:
            _weight_grad_2d(ctx)
        else:
            full = y_shape[:-2] + [a_shape[-1], y_shape[-1]] if static else None
            _batched(ctx, 1, [a, ctx.GO(0)], full, transA=1)


@register("Gemm")
def gemm(ctx: GradientContext) -> None:
    alpha = float(ctx.attr("alpha", 1.0))
    beta = float(ctx.attr("beta", 1.0))
    trans_a, trans_b = bool(ctx.attr("transA", 0)), bool(ctx.attr("transB", 0))
    a, b, dy = ctx.I(0), ctx.I(1), ctx.GO(0)
    shared = {"beta": 0.0}
    if alpha != 1.0:
        shared["alpha"] = alpha
    # Y = alpha * op(A) op(B): dA and dB are one Gemm each, with the transposes that undo op().
    if ctx.requires(0):
        if trans_a:
            ctx.emit("Gemm", [b, dy], [ctx.GI(0)], transA=int(trans_b), transB=1, **shared)
        else:
            ctx.emit("Gemm", [dy, b], [ctx.GI(0)], transB=int(not trans_b), **shared)
    if ctx.requires(1):
        if trans_b:
            ctx.emit("Gemm", [dy, a], [ctx.GI(1)], transA=1, transB=int(trans_a), **shared)
        else:
            ctx.emit("Gemm", [a, dy], [ctx.GI(1)], transA=int(not trans_a), **shared)
    if ctx.requires(2):
        if beta == 0.0:
            raise ctx.unsupported("beta = 0 with a C input that needs a gradient")
        if beta == 1.0:
            ctx.reduce_to(dy, ctx.shape(ctx.O(0)), ctx.I(2), ctx.GI(2))
        else:
            reduced = ctx.IA("dC_reduced")
            ctx.reduce_to(dy, ctx.shape(ctx.O(0)), ctx.I(2), reduced)
            scale = ctx.constant("Scale", beta, dtype=ctx.np_dtype(dy if ctx.elem_type(dy) else ctx.O(0)))
            ctx.emit("Mul", [reduced, scale], [ctx.GI(2)])
