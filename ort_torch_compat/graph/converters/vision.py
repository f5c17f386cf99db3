"""Spatial sampling ops: MaxUnpool, MaxRoiPool, AffineGrid, GridSample."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class MaxUnpool(OnnxModule):
    """Values scattered to their flat indices (into N*C*spatial) of a zero tensor."""

    def __init__(self, kernel, strides, pads):
        super().__init__()
        self.kernel, self.strides, self.pads = kernel, strides, pads

    def forward(self, x: torch.Tensor, indices: torch.Tensor, output_shape: torch.Tensor = None) -> torch.Tensor:
        rank = x.dim() - 2
        if output_shape is not None:
            shape = output_shape.tolist()
        else:
            strides = self.strides or [1] * rank
            pads = self.pads or [0] * (2 * rank)
            spatial = [
                (size - 1) * s + k - pads[i] - pads[i + rank]
                for i, (size, s, k) in enumerate(zip(x.shape[2:], strides, self.kernel))
            ]
            shape = list(x.shape[:2]) + spatial
        out = x.new_zeros(math.prod(shape))
        return out.scatter(0, indices.reshape(-1).long(), x.reshape(-1)).reshape(shape)


@register("MaxUnpool", 9, 11)
def _max_unpool(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(MaxUnpool(a["kernel_shape"], a.get("strides"), a.get("pads")), node)


class MaxRoiPool(OnnxModule):
    """Caffe's ROI max pooling: each ROI (batch, x1, y1, x2, y2) scaled and rounded to pixels,
    split into pooled_shape bins, max per bin (0 for an empty bin)."""

    def __init__(self, pooled, scale: float):
        super().__init__()
        self.pooled, self.scale = pooled, scale

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        pooled_h, pooled_w = self.pooled
        height, width = x.shape[2:]
        out = x.new_zeros(rois.shape[0], x.shape[1], pooled_h, pooled_w)
        for r, roi in enumerate(rois.tolist()):
            batch = int(roi[0])
            x1, y1, x2, y2 = (int(math.floor(v * self.scale + 0.5)) for v in roi[1:])
            roi_h, roi_w = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
            for ph in range(pooled_h):
                h0 = min(max(int(math.floor(ph * roi_h / pooled_h)) + y1, 0), height)
                h1 = min(max(int(math.ceil((ph + 1) * roi_h / pooled_h)) + y1, 0), height)
                for pw in range(pooled_w):
                    w0 = min(max(int(math.floor(pw * roi_w / pooled_w)) + x1, 0), width)
                    w1 = min(max(int(math.ceil((pw + 1) * roi_w / pooled_w)) + x1, 0), width)
                    if h1 > h0 and w1 > w0:
                        out[r, :, ph, pw] = x[batch, :, h0:h1, w0:w1].amax(dim=(1, 2))
        return out


@register("MaxRoiPool", 1)
def _max_roi_pool(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(MaxRoiPool(a["pooled_shape"], float(a.get("spatial_scale", 1.0))), node)


class AffineGrid(OnnxModule):
    def __init__(self, align_corners: bool):
        super().__init__()
        self.align_corners = align_corners

    def forward(self, theta: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        return F.affine_grid(theta, size.tolist(), align_corners=self.align_corners)


@register("AffineGrid", 20)
def _affine_grid(node: OnnxNode, graph: OnnxGraph):
    return result(AffineGrid(bool(node.attributes.get("align_corners", 0))), node)


_GRID_MODES = {
    "bilinear": "bilinear",
    "linear": "bilinear",
    "nearest": "nearest",
    "bicubic": "bicubic",
    "cubic": "bicubic",
}


class GridSample(OnnxModule):
    def __init__(self, mode: str, padding: str, align_corners: bool):
        super().__init__()
        self.mode, self.padding, self.align_corners = mode, padding, align_corners

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(x, grid, mode=self.mode, padding_mode=self.padding, align_corners=self.align_corners)


@register("GridSample", 16, 20)
def _grid_sample(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    mode = _GRID_MODES[a.get("mode", "bilinear")]
    return result(GridSample(mode, a.get("padding_mode", "zeros"), bool(a.get("align_corners", 0))), node)
