"""The converters real architectures needed (Flatten at axis 0 and rank, ORT's LayerNormalization
below opset 17 and SimplifiedLayerNormalization, Trilu, ConvTranspose with a fed weight), one
node at a time against onnx's reference implementation (ai.onnx ops) or the schema's formula
(ORT's own schemas), and against onnxruntime's InferenceSession when it is installed.
The whole models are tested in tests/test_real_architectures.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from ort_torch_compat.graph import build_graph_module

RNG = np.random.default_rng(0)


def _single_node(op: str, inputs, attrs, opset: int, fed=(), outputs=1, domain: str = ""):
    """A one-node model; `inputs` maps name -> array (initializer unless in `fed`)."""
    names = list(inputs)
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], domain=domain, **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(inputs[n].dtype), inputs[n].shape)
        for n in names
        if n in fed
    ]
    initializers = [onnx.numpy_helper.from_array(inputs[n], n) for n in names if n not in fed]
    graph = helper.make_graph(
        [node],
        "g",
        graph_inputs,
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(outputs)],
        initializers,
    )
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def _ours(model: onnx.ModelProto, inputs, fed):
    opsets = {o.domain: o.version for o in model.opset_import}
    module = build_graph_module(model.graph, opsets, list(fed), ["y0"], "test")
    tensors = [torch.from_numpy(inputs[n]) for n in fed]
    return module(*tensors)[0].detach().numpy(), module, tensors


def _ort(model: onnx.ModelProto, inputs, fed):
    ort = pytest.importorskip("onnxruntime")
    model.ir_version = min(model.ir_version, 8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["y0"], {n: inputs[n] for n in fed})[0]


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten_every_axis(axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    model = _single_node("Flatten", {"x": x}, {"axis": axis}, 13, fed=["x"])
    ours, *_ = _ours(model, {"x": x}, ["x"])
    np.testing.assert_array_equal(ours, ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1])
@pytest.mark.parametrize("fed_k", [False, True])
def test_trilu(upper, k, fed_k):
    x = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    inputs = {"x": x} if k is None else {"x": x, "k": np.array(k, dtype=np.int64)}
    fed = ["x", "k"] if fed_k and k is not None else ["x"]
    model = _single_node("Trilu", inputs, {"upper": upper}, 14, fed=fed)
    ours, *_ = _ours(model, inputs, fed)
    np.testing.assert_array_equal(ours, ReferenceEvaluator(model).run(None, {n: inputs[n] for n in fed})[0])


def _layer_norm_reference(x, scale, bias, axis, epsilon, simplified=False):
    dims = tuple(range(axis % x.ndim, x.ndim))
    x64 = x.astype(np.float64)
    if simplified:
        y = x64 / np.sqrt(np.mean(x64**2, axis=dims, keepdims=True) + epsilon)
    else:
        centered = x64 - x64.mean(axis=dims, keepdims=True)
        y = centered / np.sqrt(np.mean(centered**2, axis=dims, keepdims=True) + epsilon)
    y = y * scale
    return y if bias is None else y + bias


@pytest.mark.parametrize("axis", [-1, -2, 1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_in_the_onnx_domain_below_opset_17(axis, with_bias):
    """ORT's own LayerNormalization schema (ai.onnx, since 1) that generate_artifacts writes at opset 14."""
    x = (RNG.standard_normal((2, 3, 4)) * 3 + 1).astype(np.float32)
    shape = x.shape[axis % 3 :]
    inputs = {"x": x, "scale": RNG.standard_normal(shape).astype(np.float32)}
    if with_bias:
        inputs["bias"] = RNG.standard_normal(shape).astype(np.float32)
    model = _single_node("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, 14, fed=list(inputs))
    ours, *_ = _ours(model, inputs, list(inputs))
    expected = _layer_norm_reference(x, inputs["scale"], inputs.get("bias"), axis, 1e-3)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours, _ort(model, inputs, list(inputs)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm(axis):
    """ORT's RMSNorm rewrite (T5, Llama): x / sqrt(mean(x^2) + eps) * scale."""
    x = (RNG.standard_normal((2, 3, 4)) + 0.5).astype(np.float32)
    inputs = {"x": x, "scale": RNG.standard_normal(x.shape[axis % 3 :]).astype(np.float32)}
    model = _single_node("SimplifiedLayerNormalization", inputs, {"axis": axis, "epsilon": 1e-6}, 14, fed=list(inputs))
    ours, *_ = _ours(model, inputs, list(inputs))
    np.testing.assert_allclose(
        ours, _layer_norm_reference(x, inputs["scale"], None, axis, 1e-6, True), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(ours, _ort(model, inputs, list(inputs)), rtol=1e-5, atol=1e-6)


CONV_TRANSPOSE_CASES = {
    "stride2": dict(kernel=(2, 2), attrs={"strides": [2, 2]}),
    "symmetric_pads": dict(kernel=(3, 3), attrs={"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "asymmetric_pads": dict(kernel=(3, 3), attrs={"strides": [2, 1], "pads": [0, 1, 2, 0]}),
    "output_padding": dict(kernel=(3, 3), attrs={"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 0]}),
    "output_shape": dict(kernel=(3, 3), attrs={"strides": [2, 2], "output_shape": [10, 9]}),
    "same_upper": dict(kernel=(3, 3), attrs={"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": dict(kernel=(4, 4), attrs={"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "dilation_group": dict(kernel=(3, 3), attrs={"dilations": [2, 1], "group": 2}),
    "conv1d": dict(kernel=(3,), attrs={"strides": [3], "pads": [1, 2]}),
}


@pytest.mark.parametrize("case", sorted(CONV_TRANSPOSE_CASES))
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv_transpose_with_a_fed_weight(case, with_bias):
    kernel, attrs = CONV_TRANSPOSE_CASES[case]["kernel"], CONV_TRANSPOSE_CASES[case]["attrs"]
    group = attrs.get("group", 1)
    x = RNG.standard_normal((1, 2) + (5,) * len(kernel)).astype(np.float32)
    inputs = {"x": x, "w": RNG.standard_normal((2, 4 // group) + kernel).astype(np.float32)}
    if with_bias:
        inputs["b"] = RNG.standard_normal(4).astype(np.float32)
    model = _single_node("ConvTranspose", inputs, attrs, 11, fed=list(inputs))
    ours, module, tensors = _ours(model, inputs, list(inputs))
    if group == 1 and "output_shape" not in attrs:  # onnx's reference fails on these two
        expected = ReferenceEvaluator(model).run(None, inputs)[0]
        assert ours.shape == expected.shape
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours, _ort(model, inputs, list(inputs)), rtol=1e-5, atol=1e-5)
    if with_bias:  # the weight is fed, so it trains: float64 gradients agree with finite differences
        doubles = [t.double().requires_grad_(True) for t in tensors]
        assert torch.autograd.gradcheck(lambda *args: module.double()(*args)[0], doubles, eps=1e-6, atol=1e-5)
