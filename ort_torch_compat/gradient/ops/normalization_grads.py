"""Gradients of batch, layer and instance normalization.

``BatchNormalization`` reaches the builder as com.microsoft ``BatchNormInternal`` (see
``forward.py``), whose saved batch mean and inverse standard deviation feed
``BatchNormalizationGrad``; LayerNormalization's own Mean/InvStdDev outputs feed
``LayerNormalizationGrad``.  The gradient kernels always write all their outputs, so the
gradients nobody needs still get (unused) names.
"""

from __future__ import annotations

from ..context import MS_DOMAIN, GradientContext
from ..gradient_registry import register
from ._helpers import reduce

BATCH_NORM_DEFAULT_EPSILON = 1e-5


@register("BatchNormInternal", domain=MS_DOMAIN, inputs=(0, 1, 2))
def batch_norm_internal(ctx: GradientContext) -> None:
    outputs = [ctx.GI_or_unused(i) for i in range(3)]
    ctx.emit(
        "BatchNormalizationGrad",
        [ctx.GO(0), ctx.I(0), ctx.I(1), ctx.O(3), ctx.O(4)],
        outputs,
        domain=MS_DOMAIN,
        epsilon=float(ctx.attr("epsilon", BATCH_NORM_DEFAULT_EPSILON)),
    )


@register("LayerNormalization")
def layer_norm(ctx: GradientContext) -> None:
    outputs = [ctx.GI_or_unused(i) for i in range(3)]
    ctx.emit(
        "LayerNormalizationGrad",
        [ctx.GO(0), ctx.I(0), ctx.I(1), ctx.O(1), ctx.O(2)],
        outputs,
        domain=MS_DOMAIN,
        **ctx.source_attributes(),
    )


@register("InstanceNormalization")
def instance_norm(ctx: GradientContext) -> None:
    """``y = scale * (x - mean) / sqrt(var + eps) + B`` over the spatial axes, in standard ops.

    ORT 1.19.2 has no InstanceNormalization gradient (GroupNorm exports as
    Reshape -> InstanceNormalization -> Reshape -> Mul -> Add).  The statistics are computed
    again from ``x``; ``dx = inv_std * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))``
    with ``dxhat = dy * scale``.
    """
    x = ctx.I(0)
    shape = ctx.shape(x) or ctx.shape(ctx.O(0))
    if shape is None or len(shape) < 3:
        raise ctx.unsupported("InstanceNormalization on an input of unknown rank (or rank < 3)")
    rank = len(shape)
    spatial = list(range(2, rank))
    epsilon = float(ctx.attr("epsilon", 1e-5))
    dy = ctx.GO(0)
    if ctx.requires(2):
        reduce(ctx, "ReduceSum", dy, [0, *spatial], False, ctx.GI(2))
    if not (ctx.requires(0) or ctx.requires(1)):
        return
    mean = reduce(ctx, "ReduceMean", x, spatial, True, ctx.IA("Mean"))
    centered = ctx.emit("Sub", [x, mean], [ctx.IA("Centered")])[0]
    square = ctx.emit("Mul", [centered, centered], [ctx.IA("Centered_Square")])[0]
    variance = reduce(ctx, "ReduceMean", square, spatial, True, ctx.IA("Variance"))
    eps = ctx.constant("Epsilon", epsilon, dtype=ctx.np_dtype(x))
    std = ctx.emit("Sqrt", [ctx.emit("Add", [variance, eps], [ctx.IA("Variance_Eps")])[0]], [ctx.IA("Std")])[0]
    inv_std = ctx.emit("Reciprocal", [std], [ctx.IA("Inv_Std")])[0]
    normalized = ctx.emit("Mul", [centered, inv_std], [ctx.IA("X_Hat")])[0]
    if ctx.requires(1):
        product = ctx.emit("Mul", [dy, normalized], [ctx.IA("dY_X_Hat")])[0]
        reduce(ctx, "ReduceSum", product, [0, *spatial], False, ctx.GI(1))
    if not ctx.requires(0):
        return
    scale = ctx.IA("Scale_Unsqueezed")
    ctx.unsqueeze(ctx.I(1), list(range(1, rank - 1)), scale)
    dxhat = ctx.emit("Mul", [dy, scale], [ctx.IA("dX_Hat")])[0]
    mean_dxhat = reduce(ctx, "ReduceMean", dxhat, spatial, True, ctx.IA("Mean_dX_Hat"))
    projection = ctx.emit("Mul", [dxhat, normalized], [ctx.IA("dX_Hat_X_Hat")])[0]
    mean_projection = reduce(ctx, "ReduceMean", projection, spatial, True, ctx.IA("Mean_dX_Hat_X_Hat"))
    along = ctx.emit("Mul", [normalized, mean_projection], [ctx.IA("X_Hat_Projection")])[0]
    centered_grad = ctx.emit(
        "Sub",
        [ctx.emit("Sub", [dxhat, mean_dxhat], [ctx.IA("dX_Hat_Centered")])[0], along],
        [ctx.IA("dX_Hat_Orthogonal")],
    )[0]
    ctx.emit("Mul", [centered_grad, inv_std], [ctx.GI(0)])
