"""Resize's gradient as products with transposed interpolation matrices (ORT 1.19.2 has none).

Nearest, linear and cubic Resize are linear in the input and separable: each resized axis
is ``y = M x`` along that axis with an ``(out x in)`` matrix that depends only on the sizes
and attributes.  With static sizes the matrices are computed here (numpy, the formulas of
``graph/converters/resize.py``), and the gradient applies ``M^T`` along each resized axis,
last axis first: a MatMul (``dY M`` on the last axis, ``M^T dY`` on the one before it,
Transposes around it for other axes).  Nearest upsampling by an integer factor that repeats
each element (what ``nn.Upsample(scale_factor=2)`` exports) skips the matrix: one Reshape to
``[..., in, s, ...]`` and a ReduceSum over the ``s`` axes.  Plain ONNX ops, so ORT runs it.

Symbolic dims are fine on axes that are not resized (scale 1: a dynamic batch).  Refused:
antialias, tf_crop_and_resize, a resized axis of unknown size, and scales/sizes computed in the
graph when the output's size along a resized axis is not static either.
"""

from __future__ import annotations

import math
from typing import List

import numpy as np

from ..context import GradientContext
from ..gradient_registry import register
from ._helpers import constant_value, reduce


def _text(value, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _source(x: np.ndarray, mode: str, scale: float, in_len: int, out_len: int) -> np.ndarray:
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        return in_len / 2 * (1 - adjustment) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else np.zeros_like(x)
    if mode == "align_corners":
        return x * (in_len - 1) / (out_len - 1) if out_len > 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    raise ValueError(mode)


def _nearest(position: np.ndarray, mode: str) -> np.ndarray:
    if mode == "floor":
        return np.floor(position)
    if mode == "ceil":
        return np.ceil(position)
    floor = np.floor(position)
    half = (position - floor) == 0.5
    if mode == "round_prefer_floor":
        return np.where(half, floor, np.round(position))
    if mode == "round_prefer_ceil":
        return np.where(half, floor + 1, np.round(position))
    raise ValueError(mode)


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def interpolation_matrix(
    mode: str,
    transform: str,
    nearest_mode: str,
    cubic_a: float,
    exclude_outside: bool,
    in_len: int,
    out_len: int,
    scale: float,
) -> np.ndarray:
    """The ``(out_len x in_len)`` float64 matrix of one resized axis."""
    position = _source(np.arange(out_len, dtype=np.float64), transform, scale, in_len, out_len)
    columns = np.arange(in_len, dtype=np.float64)
    if mode == "nearest":
        index = np.clip(_nearest(position, nearest_mode), 0, in_len - 1)
        return (columns[None, :] == index[:, None]).astype(np.float64)
    if mode == "linear":
        clamped = np.clip(position, 0, in_len - 1)
        low = np.floor(clamped)
        frac = clamped - low
        high = np.minimum(low + 1, in_len - 1)
        return (columns[None, :] == low[:, None]) * (1 - frac)[:, None] + (columns[None, :] == high[:, None]) * frac[
            :, None
        ]
    if mode == "cubic":
        base = np.floor(position)
        weights = np.zeros((out_len, in_len))
        for tap in (-1, 0, 1, 2):
            source = base + tap
            coefficient = _cubic(position - source, cubic_a)
            if exclude_outside:
                coefficient = coefficient * ((source >= 0) & (source <= in_len - 1))
            weights += (columns[None, :] == np.clip(source, 0, in_len - 1)[:, None]) * coefficient[:, None]
        if exclude_outside:
            weights = weights / weights.sum(axis=1, keepdims=True)
        return weights
    raise ValueError(mode)


def _axes_and_scales(ctx: GradientContext, in_shape: List, out_shape):
    """``[(axis, in_len, out_len, scale)]`` for the resized axes (``out_shape`` may be None or partial)."""
    rank = len(in_shape)
    axes = ctx.attr("axes")
    axes = [int(a) % rank for a in axes] if axes is not None else list(range(rank))
    if ctx.opset < 11:
        scales = constant_value(ctx, ctx.I(1))
        sizes = None
    else:
        scales = constant_value(ctx, ctx.I(2)) if ctx.num_inputs() > 2 and ctx.I(2) else None
        sizes = constant_value(ctx, ctx.I(3)) if ctx.num_inputs() > 3 and ctx.I(3) else None
    scales = None if scales is None or scales.size == 0 else [float(s) for s in scales.reshape(-1)]
    sizes = None if sizes is None or sizes.size == 0 else [int(s) for s in sizes.reshape(-1)]
    policy = _text(ctx.attr("keep_aspect_ratio_policy"), "stretch")
    if sizes is not None and any(not isinstance(in_shape[a], int) for a in axes):
        raise ctx.unsupported("Resize to constant sizes of an input whose shape is not static")
    if sizes is not None and policy in ("not_larger", "not_smaller"):
        ratios = [s / in_shape[a] for s, a in zip(sizes, axes)]
        common = min(ratios) if policy == "not_larger" else max(ratios)
        scales = [common] * len(axes)
        sizes = [int(math.floor(in_shape[a] * common + 0.5)) for a in axes]
    result = []
    for index, axis in enumerate(axes):
        in_len = in_shape[axis]
        if not isinstance(in_len, int):
            unchanged = (scales is not None and scales[index] == 1.0) or (
                scales is None and out_shape is not None and out_shape[axis] == in_len
            )
            if not unchanged:
                raise ctx.unsupported(
                    f"Resize along axis {axis}, whose size is not static (the interpolation "
                    f"matrices are built with the artifacts)"
                )
            continue  # a symbolic (batch) axis that is not resized
        if sizes is not None:
            out_len = sizes[index]
        elif scales is not None:
            out_len = int(math.floor(in_len * scales[index]))
        elif out_shape is not None and isinstance(out_shape[axis], int):
            out_len = out_shape[axis]  # scales computed in the graph: the inferred static size
        else:
            raise ctx.unsupported(
                "Resize whose scales/sizes are computed in the graph and whose output shape is not static"
            )
        scale = scales[index] if scales is not None else out_len / in_len
        result.append((axis, in_len, out_len, scale))
    return result


def _is_repeat(matrix: np.ndarray) -> bool:
    """Nearest upsampling by an integer factor that repeats each input element (``o -> o // s``)."""
    out_len, in_len = matrix.shape
    if out_len % in_len or out_len == in_len:
        return False
    return np.array_equal(matrix, np.repeat(np.eye(in_len), out_len // in_len, axis=0))


def _fits_reshape(in_shape: List, repeated) -> bool:
    """At most one dim of the split shape is unknown (it becomes Reshape's -1)."""
    return sum(not isinstance(d, int) for d in in_shape) <= 1


def _sum_repeats(ctx: GradientContext, grad: str, dims: List, repeated, output: str) -> None:
    """Axes that repeat each element ``s`` times: dY reshaped to ``[..., in, s, ...]``, summed over ``s``.

    (The same as the matrix product, without the ``out x in`` matrix.)"""
    split: List[int] = []
    summed: List[int] = []
    for axis, dim in enumerate(dims):  # dY's dims, with the input's length along the repeated axes
        split.append(dim if isinstance(dim, int) else -1)
        if axis in repeated:
            summed.append(len(split))
            split.append(repeated[axis])
    reshaped = ctx.emit("Reshape", [grad, ctx.int64s("dY_split_shape", split)], [ctx.IA("dY_split")])[0]
    reduce(ctx, "ReduceSum", reshaped, summed, False, output)


@register("Resize", inputs=(0,))
def resize(ctx: GradientContext) -> None:
    mode = _text(ctx.attr("mode"), "nearest")
    if ctx.opset < 11:  # Resize-10: asymmetric coordinates, floor nearest (as ORT)
        transform, nearest_mode = "asymmetric", "floor"
    else:
        transform = _text(ctx.attr("coordinate_transformation_mode"), "half_pixel")
        nearest_mode = _text(ctx.attr("nearest_mode"), "round_prefer_floor")
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.unsupported(f"Resize mode {mode!r}")
    if ctx.attr("antialias", 0):
        raise ctx.unsupported("Resize with antialias=1")
    if transform == "tf_crop_and_resize":
        raise ctx.unsupported("Resize with coordinate_transformation_mode 'tf_crop_and_resize'")
    in_shape, out_shape = ctx.shape(ctx.I(0)), ctx.shape(ctx.O(0))
    if in_shape is None:
        raise ctx.unsupported("Resize of an input of unknown rank")
    rank = len(in_shape)
    matrices = []
    for axis, in_len, out_len, scale in _axes_and_scales(ctx, in_shape, out_shape):
        matrix = interpolation_matrix(
            mode,
            transform,
            nearest_mode,
            float(ctx.attr("cubic_coeff_a", -0.75)),
            bool(ctx.attr("exclude_outside", 0)),
            in_len,
            out_len,
            scale,
        )
        if matrix.shape == (in_len, in_len) and np.array_equal(matrix, np.eye(in_len)):
            continue
        matrices.append((axis, matrix))
    grad = ctx.GO(0)
    if not matrices:
        ctx.emit("Identity", [grad], [ctx.GI(0)])
        return
    repeated = {axis: matrix.shape[0] // matrix.shape[1] for axis, matrix in matrices if _is_repeat(matrix)}
    if repeated and _fits_reshape(in_shape, repeated):
        dims = list(in_shape)  # dY's dims: the output's along the axes resized by a matrix
        for axis, matrix in matrices:
            if axis not in repeated:
                dims[axis] = matrix.shape[0]
        matrices = [(axis, matrix) for axis, matrix in matrices if axis not in repeated]
        output = ctx.GI(0) if not matrices else ctx.IA("dX_repeats_summed")
        _sum_repeats(ctx, grad, dims, repeated, output)
        grad = output
    dtype = ctx.np_dtype(ctx.I(0))
    for step, (axis, matrix) in enumerate(sorted(matrices, reverse=True, key=lambda item: item[0])):
        output = ctx.GI(0) if step == len(matrices) - 1 else ctx.IA(f"dX_axis{axis}")
        if axis == rank - 1:
            ctx.emit("MatMul", [grad, ctx.constant(f"Interpolation_axis{axis}", matrix.astype(dtype))], [output])
        elif axis == rank - 2:
            ctx.emit("MatMul", [ctx.constant(f"Interpolation_T_axis{axis}", matrix.T.astype(dtype)), grad], [output])
        else:
            perm = list(range(rank))
            perm[axis], perm[rank - 2] = rank - 2, axis
            moved = ctx.emit("Transpose", [grad], [ctx.IA(f"dY_axis{axis}_moved")], perm=perm)[0]
            product = ctx.emit(
                "MatMul",
                [ctx.constant(f"Interpolation_T_axis{axis}", matrix.T.astype(dtype)), moved],
                [ctx.IA(f"dX_axis{axis}_moved")],
            )[0]
            ctx.emit("Transpose", [product], [output], perm=perm)
        grad = output
