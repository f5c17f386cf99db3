"""Helpers shared by the gradient builders of ops ORT 1.19.2 has no gradient for.

``constant_value`` reads a tensor that is fixed when the artifacts are built (an initializer
or a ``Constant`` node's output); ``reduce`` emits a reduction whose axes are an attribute or
an input depending on the opset (ReduceSum moved them at 13, the other reductions at 18).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np
import onnx
from onnx import numpy_helper

from ..context import GradientContext

Axes = Union[Sequence[int], str, None]


def constant_value(ctx: GradientContext, name: str, depth: int = 0) -> Optional[np.ndarray]:
    """``name``'s value when it is fixed when the artifacts are built, else None.

    Fixed: an initializer that is not a parameter, a ``Constant`` node's output, or an
    ``Identity``/``Cast``/``Concat``/``Unsqueeze``/``Squeeze`` of fixed tensors (the
    TorchScript exporter writes Resize's scales as a Concat of Constants).
    """
    if not name or depth > 8:
        return None
    graph = ctx.index.graph
    if name in {i.name for i in graph.input}:
        return None  # a parameter or a fed input
    for tensor in graph.initializer:
        if tensor.name == name:
            return numpy_helper.to_array(tensor)
    producer = next((n for n in graph.node if name in n.output), None)
    if producer is None or producer.domain not in ("", "ai.onnx"):
        return None
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in producer.attribute}
    if producer.op_type == "Constant":
        if "value" in attributes:
            return numpy_helper.to_array(attributes["value"])
        for key in ("value_float", "value_int", "value_floats", "value_ints"):
            if key in attributes:
                value = attributes[key]
                return np.asarray(list(value) if isinstance(value, (list, tuple)) else value)
        return None
    operands = [constant_value(ctx, i, depth + 1) if i else None for i in producer.input]
    if (
        producer.op_type not in ("Identity", "Cast", "Concat", "Unsqueeze", "Squeeze")
        or any(v is None for v in operands[:1])
        or (producer.op_type == "Concat" and any(v is None for v in operands))
    ):
        return None
    if producer.op_type == "Identity":
        return operands[0]
    if producer.op_type == "Cast":
        return operands[0].astype(onnx.helper.tensor_dtype_to_np_dtype(attributes["to"]))
    if producer.op_type == "Concat":
        return np.concatenate([np.atleast_1d(v) for v in operands], axis=int(attributes.get("axis", 0)))
    axes = attributes.get("axes")
    if axes is None and len(operands) > 1:
        if operands[1] is None:
            return None
        axes = operands[1].reshape(-1).tolist()
    if producer.op_type == "Unsqueeze":
        result = operands[0]
        rank = result.ndim + len(axes)
        for axis in sorted(a % rank for a in axes):
            result = np.expand_dims(result, axis)
        return result
    return np.squeeze(operands[0], axis=None if axes is None else tuple(int(a) for a in axes))


def reduce(ctx: GradientContext, op: str, data: str, axes: Axes, keepdims: bool, output: str) -> str:
    """``output = op(data)`` over ``axes`` (a list, an axes tensor name, or None for all axes)."""
    attribute_until = 13 if op == "ReduceSum" else 18
    attributes = {"keepdims": int(keepdims)}
    if ctx.opset < attribute_until:
        if isinstance(axes, str):
            raise ctx.unsupported(f"{op} by an axes tensor before opset {attribute_until}")
        if axes is not None:
            attributes["axes"] = list(axes)
        ctx.emit(op, [data], [output], **attributes)
        return output
    inputs = [data]
    if axes is not None:
        inputs.append(axes if isinstance(axes, str) else ctx.int64s(f"axes_for_{output}", list(axes)))
    ctx.emit(op, inputs, [output], **attributes)
    return output


def reduced_axes(ctx: GradientContext) -> Axes:
    """The axes a forward Reduce* node reduced: a list (attribute), a tensor name (input) or None (all)."""
    attribute_until = 13 if ctx.op_type == "ReduceSum" else 18
    if ctx.opset < attribute_until:
        axes = ctx.attr("axes")
        return list(axes) if axes is not None else None
    if not ctx.I(1):
        return None
    value = constant_value(ctx, ctx.I(1))
    if value is not None:
        return [int(a) for a in np.asarray(value).reshape(-1)] or None
    return ctx.I(1)


def keep_reduced(ctx: GradientContext, tensor: str, axes: Axes, name: str) -> str:
    """``tensor`` (a Reduce* result) with the reduced axes back as size 1 when the node dropped them."""
    if ctx.attr("keepdims", 1) or axes is None:
        return tensor  # keepdims, or a full reduction whose result broadcasts as a scalar
    output = ctx.IA(name)
    ctx.unsqueeze(tensor, axes, output)
    return output
