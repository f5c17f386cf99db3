"""Float64 replay of ORT training artifacts through our engine: the reference trajectory for
deep nets, where float32 rounding makes two correct implementations drift apart.

`to_float64(model)` rewrites a training or eval model to float64: float32 graph inputs,
outputs, value_info, initializers, `Cast(to=float)` targets, `Constant` /
`ConstantOfShape` values and `dtype` attributes (subgraphs included).  `FLOAT64_API` is a
namespace with the shape of `onnxruntime.training.api` (CheckpointState, Module, Optimizer,
OrtValue) that loads every model through `to_float64`, turns the checkpoint's float32
parameters into float64 ones and feeds float32 inputs as float64, so
`ort_torch_compat.testing.scenario.run_scenario(FLOAT64_API, ...)` replays the exact scenario ORT and we run in
float32.  It is a test instrument, not a product feature: the same converters run in both
precisions, so it measures rounding, and step 1 is checked against ORT separately (see
tests/test_real_architectures.py).
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

import ort_torch_compat.api as ours

FLOAT, DOUBLE = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE


def _retype(value_info: onnx.ValueInfoProto) -> None:
    tensor_type = value_info.type.tensor_type
    if tensor_type.elem_type == FLOAT:
        tensor_type.elem_type = DOUBLE


def _double_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    if tensor.data_type != FLOAT:
        return tensor
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)


def _convert_graph(graph: onnx.GraphProto) -> None:
    for value_info in list(graph.input) + list(graph.output) + list(graph.value_info):
        _retype(value_info)
    for index, init in enumerate(graph.initializer):
        graph.initializer[index].CopyFrom(_double_tensor(init))
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                attribute.t.CopyFrom(_double_tensor(attribute.t))
            elif attribute.type == onnx.AttributeProto.GRAPH:
                _convert_graph(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    _convert_graph(sub)
            elif (
                attribute.name in ("to", "dtype") and attribute.type == onnx.AttributeProto.INT and attribute.i == FLOAT
            ):
                attribute.i = DOUBLE
            elif node.op_type == "Constant" and attribute.name == "value_float":
                value = np.array(attribute.f, dtype=np.float64)
                attribute.CopyFrom(onnx.helper.make_attribute("value", numpy_helper.from_array(value)))
            elif node.op_type == "Constant" and attribute.name == "value_floats":
                value = np.array(list(attribute.floats), dtype=np.float64)
                attribute.CopyFrom(onnx.helper.make_attribute("value", numpy_helper.from_array(value)))


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float64 copy of `model` (float32 tensors, types and casts become float64)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _convert_graph(out.graph)
    return out


def _model_bytes(uri: Any) -> bytes:
    return to_float64(onnx.load(str(uri))).SerializeToString()


class CheckpointState:
    """`load_checkpoint` only: our CheckpointState with its float32 parameters made float64
    (nominal ones stay unfilled, declared float64)."""

    @staticmethod
    def load_checkpoint(uri: Any) -> ours.CheckpointState:
        state = ours.CheckpointState.load_checkpoint(uri)
        for slot in state._state.parameters.values():
            if slot.data_type == FLOAT:
                slot.data_type = DOUBLE
                if slot.tensor is not None:
                    slot.tensor = slot.tensor.double()
        return state


def _float64_inputs(values):
    return [v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v for v in values]


class Module(ours.Module):
    """ours.Module over float64 copies of the models; buffers are exchanged as float64."""

    def __init__(
        self, train_model_uri: Any, state: ours.CheckpointState, eval_model_uri: Any = None, device: str = "cpu"
    ):
        super().__init__(
            _model_bytes(train_model_uri),
            state,
            None if eval_model_uri is None else _model_bytes(eval_model_uri),
            device,
        )

    def __call__(self, *user_inputs):
        return super().__call__(*_float64_inputs(user_inputs))

    def _tensors(self, trainable_only: bool):
        store = self._engine.store
        return [self._engine.state.parameters[name].tensor for name in store.selected(trainable_only)]

    def get_contiguous_parameters(self, trainable_only: bool = False) -> ours.OrtValue:
        return ours.OrtValue(torch.cat([t.detach().reshape(-1) for t in self._tensors(trainable_only)]))

    def copy_buffer_to_parameters(self, buffer, trainable_only: bool = True) -> None:
        flat = torch.as_tensor(np.asarray(buffer.numpy() if hasattr(buffer, "numpy") else buffer), dtype=torch.float64)
        offset = 0
        with torch.no_grad():
            for tensor in self._tensors(trainable_only):
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()
        if not trainable_only:
            self._engine.state.is_nominal = False


FLOAT64_API = types.SimpleNamespace(
    CheckpointState=CheckpointState, Module=Module, Optimizer=ours.Optimizer, OrtValue=ours.OrtValue
)
