"""What other exporters and ORT's optimizations write into graphs.

Attributes that are empty lists, as the dynamo exporter writes them (torch >= 2.9's
default `torch.onnx.export`): `Constant(value_ints=[])` as an Expand's target shape,
`axes=[]` on reductions.  onnx2torch's parser read them as absent and handed converters the
raw AttributeProto ("Could not infer dtype of AttributeProto" at `Module()`); now each
node's attributes are read by their declared type (graph/builder.typed_attributes).
Differential against onnx's reference implementation.  And com.microsoft::ScaledSum.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import AttributeProto, TensorProto, helper
from onnx.reference import ReferenceEvaluator

from ort_torch_compat.graph import build_graph_module

INTS, FLOATS = AttributeProto.INTS, AttributeProto.FLOATS


def _node(op, inputs, outputs, **attributes):
    node = helper.make_node(op, inputs, outputs)
    for name, (value, kind) in attributes.items():
        node.attribute.append(helper.make_attribute(name, value, attr_type=kind))
    return node


CASES = {
    "Expand to Constant(value_ints=[])": (
        18,
        [_node("Constant", [], ["s"], value_ints=([], INTS)), _node("Expand", ["x", "s"], ["y"])],
    ),
    "Constant(value_floats=[])": (18, [_node("Constant", [], ["y"], value_floats=([], FLOATS))]),
    "Constant(value_int=3)": (18, [_node("Constant", [], ["y"], value_int=(3, AttributeProto.INT))]),
    "Constant(value_ints=[2, 3])": (13, [_node("Constant", [], ["y"], value_ints=([2, 3], INTS))]),
    "Transpose perm=[]": (13, [_node("Transpose", ["x"], ["y"], perm=([], INTS))]),
    "ReduceMean-13 axes=[]": (13, [_node("ReduceMean", ["x"], ["y"], axes=([], INTS))]),
    "ReduceMax-13 axes=[]": (13, [_node("ReduceMax", ["x"], ["y"], axes=([], INTS))]),
    "ReduceSum-11 axes=[]": (11, [_node("ReduceSum", ["x"], ["y"], axes=([], INTS))]),
    "Squeeze-11 axes=[]": (11, [_node("Squeeze", ["x"], ["y"], axes=([], INTS))]),
    # the dynamo exporter's Unsqueeze axes (GPT-J, BART: scripts/architecture_sweep.py)
    "Unsqueeze-13 axes=Constant(value_ints=[1])": (
        13,
        [_node("Constant", [], ["a"], value_ints=([1], INTS)), _node("Unsqueeze", ["x", "a"], ["y"])],
    ),
    "Unsqueeze-13 axes=Constant(value_ints=[-1, 0])": (
        13,
        [_node("Constant", [], ["a"], value_ints=([-1, 0], INTS)), _node("Unsqueeze", ["x", "a"], ["y"])],
    ),
    "Unsqueeze-21 axes=Constant(value_ints=[-2])": (
        21,
        [_node("Constant", [], ["a"], value_ints=([-2], INTS)), _node("Unsqueeze", ["x", "a"], ["y"])],
    ),
    # an empty slice of the shape is int64 too (GPT-J's repeat_interleave, dynamo exporter)
    "Shape-15 start=rank, Concat with int64": (
        15,
        [
            _node("Shape", ["x"], ["e"], start=(3, AttributeProto.INT)),
            _node("Shape", ["x"], ["s"], end=(-1, AttributeProto.INT)),
            _node("Concat", ["s", "e"], ["y"], axis=(0, AttributeProto.INT)),
        ],
    ),
    "Shape-15 start=-2": (15, [_node("Shape", ["x"], ["y"], start=(-2, AttributeProto.INT))]),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_empty_list_attributes_convert_like_onnx_reference(case):
    opset, nodes = CASES[case]
    x = np.random.default_rng(0).standard_normal((2, 1, 3)).astype(np.float32)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    module = build_graph_module(model.graph, {"": opset}, ["x"], ["y"], "test model", "ort", False)
    actual = module(torch.from_numpy(x))[0]
    assert actual.dtype == torch.from_numpy(np.asarray(expected)).dtype
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-6, atol=0)
    assert actual.shape == tuple(np.asarray(expected).shape)


@pytest.mark.parametrize("count", [2, 3])
def test_scaled_sum_as_orts_kernel(count):
    """com.microsoft::ScaledSum, written by ORT's training graph optimizations (ORT has only
    a CUDA kernel, so the reference is its kernel's formula: sum of input_i * scale_i)."""
    node = helper.make_node(
        "ScaledSum",
        [f"x{i}" for i in range(count)],
        ["y"],
        domain="com.microsoft",
        scale_0=0.5,
        scale_1=-2.0,
        **({"scale_2": 3.0} if count == 3 else {}),
    )
    inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [2, 3]) for i in range(count)]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    module = build_graph_module(
        graph, {"": 17, "com.microsoft": 1}, [f"x{i}" for i in range(count)], ["y"], "test model", "ort", True
    )
    values = [torch.randn(2, 3, requires_grad=True) for _ in range(count)]
    actual = module(*values)[0]
    expected = sum(v * s for v, s in zip(values, [0.5, -2.0, 3.0]))
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    actual.sum().backward()
    assert [float(v.grad[0, 0]) for v in values] == [0.5, -2.0, 3.0][:count]
