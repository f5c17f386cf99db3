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


def test_castlike_becomes_cast_for_orts_generator():
    """scripts/prepare_for_artifacts.py: the dynamo exporter's CastLike (ORT 1.19.2 has no
    gradient builder for it) becomes Cast to the known type of its second input; the function
    is unchanged (onnx's reference implementation), a CastLike of unknown type is left alone."""
    from ort_torch_compat.testing.prepare_for_artifacts import castlike_to_cast

    def model_of(nodes, inputs, outputs, initializers=()):
        graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])

    def build():
        return model_of(
            [
                helper.make_node("CastLike", ["i", "x"], ["c"]),  # x: a graph input
                helper.make_node("Mul", ["x", "c"], ["y"]),
                helper.make_node("CastLike", ["y", "k"], ["z"]),
            ],  # k: an initializer
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3]),
            ],
            [helper.make_tensor_value_info("z", TensorProto.DOUBLE, [2, 3])],
            [helper.make_tensor("k", TensorProto.DOUBLE, [1], [0.0])],
        )

    feeds = {
        "x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32),
        "i": np.arange(6, dtype=np.int64).reshape(2, 3),
    }
    expected = ReferenceEvaluator(build()).run(None, feeds)[0]
    rewritten = build()
    assert castlike_to_cast(rewritten) == 2
    assert [n.op_type for n in rewritten.graph.node] == ["Cast", "Mul", "Cast"]
    assert [a.i for n in rewritten.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"] == [
        TensorProto.FLOAT,
        TensorProto.DOUBLE,
    ]
    actual = ReferenceEvaluator(rewritten).run(None, feeds)[0]
    assert actual.dtype == expected.dtype == np.float64
    np.testing.assert_array_equal(actual, expected)
    unknown = model_of(
        [helper.make_node("CastLike", ["x", "u"], ["y"])],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("u", TensorProto.UNDEFINED, None),
        ],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
    )
    assert castlike_to_cast(unknown) == 0 and unknown.graph.node[0].op_type == "CastLike"
