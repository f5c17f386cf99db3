"""Resize (10, 11, 13, 18, 19) and Upsample (7, 9) as ONNX specifies them.

Each resized axis is a matrix product with an (output x input) interpolation matrix built from
the coordinate transformation and the kernel (nearest: one-hot rows; linear: two taps; cubic:
four taps with coefficient `cubic_coeff_a`; antialias: ONNX Runtime's Pillow-style filter).  One code path covers every mode, n-D inputs and any axis, and
torch differentiates it.  Resize-10 and Upsample use the asymmetric transform with
floor-nearest, as ONNX Runtime does for them.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, constant_or_none, constants_or_fed, result


def _source(x: torch.Tensor, mode: str, scale: float, in_len: int, out_len: int, roi=None) -> torch.Tensor:
    """Output index -> input coordinate (float64), by coordinate_transformation_mode."""
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        center = in_len / 2
        return center * (1 - adjustment) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else torch.zeros_like(x)
    if mode == "align_corners":
        return x * (in_len - 1) / (out_len - 1) if out_len > 1 else torch.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out_len > 1:
            return start * (in_len - 1) + x * (end - start) * (in_len - 1) / (out_len - 1)
        return torch.full_like(x, 0.5 * (start + end) * (in_len - 1))
    raise NotImplementedError(f"coordinate_transformation_mode {mode!r}")


def _nearest(position: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "floor":
        return position.floor()
    if mode == "ceil":
        return position.ceil()
    floor = position.floor()
    half = (position - floor) == 0.5
    if mode == "round_prefer_floor":
        return torch.where(half, floor, position.round())
    if mode == "round_prefer_ceil":
        return torch.where(half, floor + 1, position.round())
    raise NotImplementedError(f"nearest_mode {mode!r}")


def _cubic(t: torch.Tensor, a: float) -> torch.Tensor:
    t = t.abs()
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return torch.where(t <= 1, near, torch.where(t < 2, far, torch.zeros_like(t)))


class Resize(OnnxModule):
    def __init__(
        self,
        mode: str,
        transform: str,
        nearest_mode: str,
        cubic_a: float,
        exclude_outside: bool,
        extrapolation: float,
        antialias: bool,
        axes: Optional[Sequence[int]],
        aspect_policy: str,
        scales: Optional[Sequence[float]],
        sizes: Optional[Sequence[int]],
        roi: Optional[Sequence[float]],
    ):
        super().__init__()
        self.mode, self.transform, self.nearest_mode = mode, transform, nearest_mode
        self.cubic_a, self.exclude_outside, self.extrapolation = cubic_a, exclude_outside, extrapolation
        self.antialias, self.axes, self.aspect_policy = antialias, axes, aspect_policy
        self.scales, self.sizes, self.roi = scales, sizes, roi

    def forward(
        self, x: torch.Tensor, roi: torch.Tensor = None, scales: torch.Tensor = None, sizes: torch.Tensor = None
    ) -> torch.Tensor:
        rank = x.dim()
        axes = [a % rank for a in self.axes] if self.axes else list(range(rank))
        scales = self.scales if scales is None else scales.tolist()
        sizes = self.sizes if sizes is None else sizes.tolist()
        roi = self.roi if roi is None else roi.tolist()
        if sizes:
            sizes = [int(s) for s in sizes]
            if self.aspect_policy in ("not_larger", "not_smaller"):
                ratios = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
                common = min(ratios) if self.aspect_policy == "not_larger" else max(ratios)
                sizes = [int(math.floor(x.shape[a] * common + 0.5)) for a in axes]
                scale_list = [common] * len(axes)
            else:
                scale_list = [s / x.shape[a] for s, a in zip(sizes, axes)]
        else:
            scale_list = [float(s) for s in scales]
            sizes = [int(math.floor(x.shape[a] * s)) for a, s in zip(axes, scale_list)]
        for index, axis in enumerate(axes):
            in_len, out_len, scale = x.shape[axis], sizes[index], scale_list[index]
            if in_len == out_len and scale == 1.0 and self.transform != "tf_crop_and_resize":
                continue
            axis_roi = None
            if roi:
                axis_roi = (
                    (roi[index], roi[index + len(axes)]) if len(roi) == 2 * len(axes) else (roi[axis], roi[axis + rank])
                )
            matrix, outside = self._matrix(in_len, out_len, scale, axis_roi, x)
            x = torch.tensordot(x, matrix, dims=([axis], [1])).movedim(-1, axis)
            if outside is not None:
                shape = [1] * rank
                shape[axis] = out_len
                x = torch.where(outside.view(shape), torch.full_like(x, self.extrapolation), x)
        return x

    def _antialias(self, position, in_len: int, out_len: int, scale: float, columns) -> torch.Tensor:
        """Pillow-style filter weights, as ONNX Runtime computes them: the kernel stretched by
        1/scale when downsampling, taps beyond the input folded onto the edge elements (or
        dropped with exclude_outside), normalised by the sum of all taps."""
        stretch = max(1.0 / scale, 1.0)
        support = (1.0 if self.mode == "linear" else 2.0) * stretch
        center = position + 0.5
        first = torch.floor(center - support + 0.5)
        last = torch.floor(center + support + 0.5)
        weights = torch.zeros(out_len, in_len, dtype=torch.float64)
        total = torch.zeros(out_len, dtype=torch.float64)
        for offset in range(int(math.ceil(support)) * 2 + 1):
            source = first + offset
            distance = (source - center + 0.5) / stretch
            tap = (1 - distance.abs()).clamp(min=0) if self.mode == "linear" else _cubic(distance, self.cubic_a)
            tap = tap * (source < last)
            if self.exclude_outside:
                tap = tap * ((source >= 0) & (source <= in_len - 1))
            total += tap
            weights += (columns[None, :] == source.clamp(0, in_len - 1)[:, None]) * tap[:, None]
        return weights / torch.where(total == 0, torch.ones_like(total), total)[:, None]

    def _matrix(self, in_len: int, out_len: int, scale: float, roi, like: torch.Tensor):
        """(out_len x in_len) interpolation weights, and the outputs outside the input
        (tf_crop_and_resize only) or None."""
        position = _source(torch.arange(out_len, dtype=torch.float64), self.transform, scale, in_len, out_len, roi)
        outside = None
        if self.transform == "tf_crop_and_resize":
            outside = (position < 0) | (position > in_len - 1)
        columns = torch.arange(in_len, dtype=torch.float64)
        if self.mode == "nearest":
            index = _nearest(position, self.nearest_mode).clamp(0, in_len - 1)
            weights = (columns[None, :] == index[:, None]).to(torch.float64)
        elif self.antialias:
            weights = self._antialias(position, in_len, out_len, scale, columns)
        elif self.mode == "linear":
            clamped = position.clamp(0, in_len - 1)
            low = clamped.floor()
            frac = clamped - low
            high = (low + 1).clamp(max=in_len - 1)
            weights = (columns[None, :] == low[:, None]) * (1 - frac)[:, None] + (
                columns[None, :] == high[:, None]
            ) * frac[:, None]
        elif self.mode == "cubic":
            base = position.floor()
            weights = torch.zeros(out_len, in_len, dtype=torch.float64)
            for tap in (-1, 0, 1, 2):
                source = base + tap
                coefficient = _cubic(position - source, self.cubic_a)
                inside = (source >= 0) & (source <= in_len - 1)
                if self.exclude_outside:
                    coefficient = coefficient * inside
                weights += (columns[None, :] == source.clamp(0, in_len - 1)[:, None]) * coefficient[:, None]
            if self.exclude_outside:
                weights = weights / weights.sum(dim=1, keepdim=True)
        else:
            raise NotImplementedError(f"Resize mode {self.mode!r}")
        return weights.to(like.dtype).to(like.device), None if outside is None else outside.to(like.device)


def _resize(legacy: bool):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        if legacy:  # Resize-10 / Upsample-9: (X, scales); Upsample-7: scales attribute
            scales = constant_or_none(node, graph, 1) if len(node.input_values) > 1 else a.get("scales")
            if scales is None and "height_scale" in a:
                scales = [1.0, 1.0, a["height_scale"], a["width_scale"]]
            fed = len(node.input_values) > 1 and scales is None
            module = Resize(
                a.get("mode", "nearest"),
                "asymmetric",
                "floor",
                -0.75,
                False,
                0.0,
                False,
                None,
                "stretch",
                scales,
                None,
                None,
            )
            inputs = [node.input_values[0], "", node.input_values[1]] if fed else node.input_values[:1]
            return result(module, node, inputs)
        (roi, scales, sizes), inputs = constants_or_fed(node, graph, (1, 2, 3))
        module = Resize(
            a.get("mode", "nearest"),
            a.get("coordinate_transformation_mode", "half_pixel"),
            a.get("nearest_mode", "round_prefer_floor"),
            float(a.get("cubic_coeff_a", -0.75)),
            bool(a.get("exclude_outside", 0)),
            float(a.get("extrapolation_value", 0.0)),
            bool(a.get("antialias", 0)),
            a.get("axes"),
            a.get("keep_aspect_ratio_policy", "stretch"),
            scales or None,
            sizes or None,
            roi or None,
        )
        return result(module, node, inputs)

    return convert


register("Resize", 10)(_resize(legacy=True))
register("Resize", 11, 13, 18, 19)(_resize(legacy=False))
register("Upsample", 7, 9)(_resize(legacy=True))
