"""Pad keeps its input's element type (ONNX: output T = input T), for every mode and fill,
against onnx's reference implementation and onnxruntime's InferenceSession when installed.

The pads stay within what every implementation accepts: a reflect pad must be shorter than
its axis (at most size - 1); numpy (onnx's reference) reflects longer pads again, older ORT
gave another result, and ORT 1.30+ refuses the model.  Over-long pads are not the subject."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator

from ort_torch_compat.graph import build_graph_module

SHAPE = (3, 4)  # pads [1, 0, 2, 1]: every reflect pad <= axis size - 1


def _pad_model(dtype: np.dtype, mode: str, value) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = ["x", "pads"] + (["value"] if value is not None else [])
    initializers = [onnx.numpy_helper.from_array(np.array([1, 0, 2, 1], dtype=np.int64), "pads")]
    if value is not None:
        initializers.append(onnx.numpy_helper.from_array(np.array(value, dtype=dtype), "value"))
    graph = helper.make_graph(
        [helper.make_node("Pad", inputs, ["y"], mode=mode)],
        "g",
        [helper.make_tensor_value_info("x", elem, list(SHAPE))],
        [helper.make_tensor_value_info("y", elem, None)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.float64])
@pytest.mark.parametrize("mode, value", [("constant", None), ("constant", 7), ("edge", None), ("reflect", None)])
def test_pad_keeps_the_element_type(dtype, mode, value):
    x = np.arange(int(np.prod(SHAPE)), dtype=dtype).reshape(SHAPE)
    model = _pad_model(dtype, mode, value)
    module = build_graph_module(model.graph, {"": 13}, ["x"], ["y"], "pad")
    ours = module(torch.from_numpy(x))[0].numpy()
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert ours.dtype == expected.dtype
    np.testing.assert_array_equal(ours, expected)
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(ours, session.run(["y"], {"x": x})[0])
