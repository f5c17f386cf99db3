"""Ops that move elements without computing: legacy Reshape/Flatten, Reshape's allowzero,
Depth/SpaceToDepth, CenterCropPad, Col2Im, and Constant."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, constant_or_none, result


class Reshape(OnnxModule):
    """ONNX Reshape: 0 copies the input's dimension unless `allowzero`, -1 is inferred."""

    def __init__(self, shape, allowzero: bool):
        super().__init__()
        self.shape, self.allowzero = shape, allowzero

    def forward(self, x: torch.Tensor, shape: torch.Tensor = None) -> torch.Tensor:
        target = list(self.shape) if shape is None else shape.tolist()
        if not self.allowzero:
            target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
        return x.reshape(target)


@register("Reshape", 1)
def _reshape_attribute(node: OnnxNode, graph: OnnxGraph):
    return result(Reshape(node.attributes["shape"], False), node, node.input_values[:1])


@register("Reshape", 5, 13, 14)
def _reshape(node: OnnxNode, graph: OnnxGraph):
    shape = constant_or_none(node, graph, 1)
    module = Reshape(shape, bool(node.attributes.get("allowzero", 0)))
    return result(module, node, node.input_values[:1] if shape is not None else node.input_values)


class Flatten(OnnxModule):
    def __init__(self, axis: int):
        super().__init__()
        self.axis = axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axis = self.axis + x.dim() if self.axis < 0 else self.axis
        return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@register("Flatten", 1, 9, 11, 13, 21)  # every version: onnx2torch's fails for axis 0 and axis == rank
def _flatten(node: OnnxNode, graph: OnnxGraph):
    return result(Flatten(int(node.attributes.get("axis", 1))), node)


class DepthToSpace(OnnxModule):
    def __init__(self, block: int, mode: str, inverse: bool):
        super().__init__()
        self.block, self.mode, self.inverse = block, mode, inverse

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.block
        n, c, h, w = x.shape
        if self.inverse:  # SpaceToDepth
            tmp = x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
            return tmp.reshape(n, c * b * b, h // b, w // b)
        if self.mode == "DCR":
            tmp = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
        else:
            tmp = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
        return tmp.reshape(n, c // (b * b), h * b, w * b)


@register("DepthToSpace", 1, 11, 13)
def _depth_to_space(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(DepthToSpace(int(a["blocksize"]), a.get("mode", "DCR"), False), node)


@register("SpaceToDepth", 1, 13)
def _space_to_depth(node: OnnxNode, graph: OnnxGraph):
    return result(DepthToSpace(int(node.attributes["blocksize"]), "DCR", True), node)


class CenterCropPad(OnnxModule):
    def __init__(self, axes):
        super().__init__()
        self.axes = axes

    def forward(self, x: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
        target = shape.tolist()
        axes = [a % x.dim() for a in self.axes] if self.axes else list(range(x.dim()))
        for axis, size in zip(axes, target):
            current = x.shape[axis]
            if size < current:  # crop: the extra element goes to the end
                x = x.narrow(axis, (current - size) // 2, size)
            elif size > current:  # pad with zeros: the extra element goes to the end
                before = (size - current) // 2
                moved = x.movedim(axis, -1)
                x = F.pad(moved, (before, size - current - before)).movedim(-1, axis)
        return x


@register("CenterCropPad", 18)
def _center_crop_pad(node: OnnxNode, graph: OnnxGraph):
    return result(CenterCropPad(node.attributes.get("axes")), node)


class Col2Im(OnnxModule):
    def __init__(self, dilations, pads, strides):
        super().__init__()
        self.dilations, self.pads, self.strides = dilations, pads, strides

    def forward(self, x: torch.Tensor, image_shape: torch.Tensor, block_shape: torch.Tensor) -> torch.Tensor:
        size, block = image_shape.tolist(), block_shape.tolist()
        rank = len(size)
        if rank != 2:
            raise NotImplementedError("Col2Im with other than 2 spatial dimensions")
        pads = self.pads or [0] * (2 * rank)
        if pads[:rank] != pads[rank:]:
            raise NotImplementedError("Col2Im with asymmetric pads")
        return F.fold(x, size, block, dilation=self.dilations or 1, padding=pads[:rank], stride=self.strides or 1)


@register("Col2Im", 18)
def _col2im(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(Col2Im(a.get("dilations"), a.get("pads"), a.get("strides")), node)


class Constant(OnnxModule):
    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.register_buffer("value", value)

    def forward(self) -> torch.Tensor:
        return self.value


_CONSTANT_DTYPES = {
    "value_float": torch.float32,
    "value_floats": torch.float32,
    "value_int": torch.int64,
    "value_ints": torch.int64,
}


@register("Constant", 1, 9, 11, 12, 13, 19, 21, 23, 24)
def _constant(node: OnnxNode, graph: OnnxGraph):
    """Every form of Constant.  onnx2torch builds value_ints with torch.tensor, so an empty
    list (the dynamo exporter's `Constant(value_ints=[])`, an Expand's target shape) came
    out float32; here the attribute's ONNX type decides the dtype."""
    ((name, value),) = node.attributes.items()
    if name == "value":
        return result(Constant(value.to_torch()), node)
    if name in _CONSTANT_DTYPES:
        return result(Constant(torch.tensor(value, dtype=_CONSTANT_DTYPES[name])), node)
    if name == "sparse_value":
        from onnx import numpy_helper

        dense = numpy_helper.to_array(value.values)
        flat = torch.zeros(math.prod(value.dims), dtype=torch.from_numpy(dense).dtype)
        indices = torch.from_numpy(numpy_helper.to_array(value.indices).astype("int64"))
        if indices.dim() == 2:  # [NNZ, rank] coordinates
            strides = torch.tensor([math.prod(value.dims[i + 1 :]) for i in range(len(value.dims))])
            indices = (indices * strides).sum(dim=1)
        flat[indices] = torch.from_numpy(dense.reshape(-1))
        return result(Constant(flat.reshape(list(value.dims))), node)
    raise NotImplementedError(f"Constant with attribute '{name}' (strings have no torch tensor)")
