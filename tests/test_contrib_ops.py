"""The com.microsoft ops ONNX Runtime 1.19.2 writes into training artifacts (inventory:
docs/op-coverage.md, "com.microsoft ops ORT writes into artifacts").

Two kinds of test, both with ORT 1.19.2 as the reference:

- *fusions*: a small ai.onnx pattern goes through ORT's own pre-training graph transformers
  (`get_optimized_model`, what `generate_artifacts` runs before building the gradient graph);
  the test checks the com.microsoft op it is known to produce is there, converts the fused
  graph with our converters and compares with ORT running the unfused pattern (which works
  even where ORT 1.19.2 has no CPU kernel for the fused op: IsAllFinite, ScaledSum).  Where the
  fused op is differentiable, its gradient (torch autograd, float64) must equal that of the
  unfused pattern converted by us (ai.onnx ops whose gradients tests/test_op_coverage.py checks
  against ORT's);
- *single nodes* for the ops onnxblock writes itself or whose attributes the fusions set
  (ReduceAllL2, SoftmaxCrossEntropyLossInternal's output_type, NegativeLogLikelihoodLossInternal),
  against ORT's CPU kernel, with a float64 gradcheck.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from ort_torch_compat.graph import build_graph_module, forward_graph

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(27)


def _vi(name: str, shape, elem=T.FLOAT) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, shape)


def _const(name: str, value, dtype=np.float32) -> onnx.TensorProto:
    return nh.from_array(np.asarray(value, dtype=dtype), name)


def _model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset), h.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8  # ORT 1.19 refuses the IR versions onnx >= 1.17 writes
    return model


def _ort_run(model: onnx.ModelProto, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _module(model: onnx.ModelProto):
    """Our module for `model`'s outputs, through the engine's forward cut (which blanks
    the outputs nobody reads: BatchNormInternal's saved statistics, LSTMTraining's all-H...)."""
    opsets = {o.domain: o.version for o in model.opset_import}
    inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    outputs = [o.name for o in model.graph.output]
    graph = forward_graph(model, outputs, inputs, "test")
    return build_graph_module(graph, opsets, inputs, outputs, "test"), inputs


def _ours(model: onnx.ModelProto, feeds: Dict[str, np.ndarray], dtype=None) -> List[torch.Tensor]:
    module, inputs = _module(model)
    tensors = [torch.from_numpy(feeds[n]) for n in inputs]
    if dtype is not None:
        tensors = [t.to(dtype) if t.is_floating_point() else t for t in tensors]
    out = module(*tensors)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _close(ours, expected: np.ndarray) -> None:
    ours = ours.detach().numpy() if isinstance(ours, torch.Tensor) else ours
    assert ours.dtype == expected.dtype and ours.shape == expected.shape, (
        ours.dtype,
        ours.shape,
        expected.dtype,
        expected.shape,
    )
    if expected.dtype == np.bool_:
        np.testing.assert_array_equal(ours, expected)
    else:
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)


# ---- fusions ORT's generate_artifacts writes ------------------------------------------------------

_OPTIMIZE = """
import json, sys, onnxruntime
from onnxruntime.capi import _pybind_state as pybind
options = onnxruntime.SessionOptions()
options.log_severity_level = 3  # its INFO log lists every transformer
for path, trainable in json.load(open(sys.argv[1])):
    data = open(path, "rb").read()
    open(path + ".out", "wb").write(pybind.get_optimized_model(data, set(trainable), options))
"""


def _optimize(jobs: Sequence, directory) -> Optional[str]:
    """Run ORT's pre-training transformers (what generate_artifacts runs, training build only) over
    `jobs` [(model path, trainable names)] in a child process; its stderr tail when it fails."""
    listing = directory / f"jobs{len(list(directory.iterdir()))}.json"
    listing.write_text(json.dumps([[str(path), list(trainable)] for path, trainable in jobs]))
    done = subprocess.run([sys.executable, "-c", _OPTIMIZE, str(listing)], capture_output=True)
    return None if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.decode()[-2000:]}"


@pytest.fixture(scope="module")
def fused_models(tmp_path_factory):
    """{fusion name: (original model, ORT's fused model or the error)}: one child process for all,
    then one per model if that one fails (a crash in ORT's transformers, see _log_softmax_nll,
    then fails only its own test)."""
    pybind = pytest.importorskip("onnxruntime.capi._pybind_state")
    if not hasattr(pybind, "get_optimized_model"):
        pytest.skip("onnxruntime without the training API (get_optimized_model)")
    directory = tmp_path_factory.mktemp("fusions")
    originals = {name: FUSIONS[name][0]() for name in FUSIONS}
    jobs = {}
    for name, model in originals.items():
        path = directory / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        jobs[name] = (path, FUSIONS[name][1])
    errors = {}
    if _optimize(list(jobs.values()), directory) is not None:
        errors = {name: _optimize([job], directory) for name, job in jobs.items()}
    result = {}
    for name, (path, _) in jobs.items():
        if errors.get(name):
            result[name] = (originals[name], errors[name])
            continue
        fused = onnx.load_from_string(pathlib.Path(f"{path}.out").read_bytes())
        fused.ir_version = 8
        result[name] = (originals[name], fused)
    return result


X24 = _vi("x", [2, 4])
Y = _vi("y", None)
W44 = RNG.standard_normal((4, 4)).astype(np.float32)
B4 = RNG.standard_normal(4).astype(np.float32)


def _gelu_bias():
    return _model(
        [
            h.make_node("MatMul", ["x", "w"], ["mm"]),
            h.make_node("Add", ["mm", "b"], ["a"]),
            h.make_node("Div", ["a", "sqrt2"], ["d"]),
            h.make_node("Erf", ["d"], ["e"]),
            h.make_node("Add", ["e", "one"], ["e1"]),
            h.make_node("Mul", ["a", "e1"], ["m"]),
            h.make_node("Mul", ["m", "half"], ["y"]),
        ],
        [X24],
        [Y],
        [_const("w", W44), _const("b", B4), _const("sqrt2", 1.4142135), _const("one", 1.0), _const("half", 0.5)],
    )


def _gelu():
    return _model(
        [
            h.make_node("Div", ["x", "sqrt2"], ["d"]),
            h.make_node("Erf", ["d"], ["e"]),
            h.make_node("Add", ["e", "one"], ["e1"]),
            h.make_node("Mul", ["x", "e1"], ["m"]),
            h.make_node("Mul", ["m", "half"], ["y"]),
        ],
        [X24],
        [Y],
        [_const("sqrt2", 1.4142135), _const("one", 1.0), _const("half", 0.5)],
    )


def _quick_gelu():
    return _model(
        [
            h.make_node("Mul", ["x", "a"], ["xa"]),
            h.make_node("Sigmoid", ["xa"], ["s"]),
            h.make_node("Mul", ["x", "s"], ["y"]),
        ],
        [X24],
        [Y],
        [_const("a", 1.702)],
    )


def _layer_norm():
    return _model(
        [
            h.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
            h.make_node("Sub", ["x", "mu"], ["d"]),
            h.make_node("Pow", ["d", "two"], ["p"]),
            h.make_node("ReduceMean", ["p"], ["var"], axes=[-1]),
            h.make_node("Add", ["var", "eps"], ["ve"]),
            h.make_node("Sqrt", ["ve"], ["sd"]),
            h.make_node("Div", ["d", "sd"], ["n"]),
            h.make_node("Mul", ["n", "g"], ["ng"]),
            h.make_node("Add", ["ng", "b"], ["y"]),
        ],
        [X24],
        [Y],
        [_const("two", 2.0), _const("eps", 1e-5), _const("g", RNG.standard_normal(4)), _const("b", B4)],
        opset=13,
    )


def _rms_norm():
    return _model(
        [
            h.make_node("Pow", ["x", "two"], ["p"]),
            h.make_node("ReduceMean", ["p"], ["var"], axes=[-1]),
            h.make_node("Add", ["var", "eps"], ["ve"]),
            h.make_node("Sqrt", ["ve"], ["sd"]),
            h.make_node("Div", ["x", "sd"], ["n"]),
            h.make_node("Mul", ["n", "g"], ["y"]),
        ],
        [X24],
        [Y],
        [_const("two", 2.0), _const("eps", 1e-5), _const("g", RNG.standard_normal(4))],
        opset=13,
    )


def _concat():
    return _model([h.make_node("Concat", ["x", "x2"], ["y"], axis=0)], [X24, _vi("x2", [3, 4])], [Y])


def _batch_norm():
    return _model(
        [h.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1)],
        [_vi("x", [3, 2, 4])],
        [Y],
        [_const("g", [1.5, 0.5]), _const("b", [0.1, -0.2]), _const("m", [0.0, 0.0]), _const("v", [1.0, 1.0])],
        opset=15,
    )


def _lstm():
    return _model(
        [h.make_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=3)],
        [_vi("x", [4, 2, 2])],
        [Y],
        [
            _const("W", RNG.standard_normal((1, 12, 2)) * 0.5),
            _const("R", RNG.standard_normal((1, 12, 3)) * 0.5),
            _const("B", RNG.standard_normal((1, 24)) * 0.1),
        ],
    )


def _gru():
    return _model(
        [h.make_node("GRU", ["x", "W", "R", "B"], ["y"], hidden_size=3, linear_before_reset=1)],
        [_vi("x", [4, 2, 2])],
        [Y],
        [
            _const("W", RNG.standard_normal((1, 9, 2)) * 0.5),
            _const("R", RNG.standard_normal((1, 9, 3)) * 0.5),
            _const("B", RNG.standard_normal((1, 18)) * 0.1),
        ],
    )


def _is_inf_reduce_sum():
    return _model(
        [
            h.make_node("IsInf", ["x"], ["i"]),
            h.make_node("Cast", ["i"], ["ci"], to=T.INT64),
            h.make_node("ReduceSum", ["ci"], ["r"], keepdims=0),
            h.make_node("Greater", ["r", "zero"], ["y"]),
        ],
        [X24],
        [_vi("y", None, T.BOOL)],
        [_const("zero", 0, np.int64)],
        opset=13,
    )


def _scaled_sum():
    return _model(
        [
            h.make_node("Div", ["x", "s1"], ["a"]),
            h.make_node("Div", ["x2", "s2"], ["b"]),
            h.make_node("Add", ["a", "b"], ["s"]),
            h.make_node("Relu", ["s"], ["y"]),
        ],
        [X24, _vi("x2", [2, 4])],
        [Y],
        [_const("s1", 2.0), _const("s2", 0.5)],
    )


def _log_softmax_nll():
    # torch's cross_entropy as ORT's exporter writes it; ORT fuses it into SoftmaxCrossEntropyLossInternal.
    # (The logits come from a node: ORT 1.19.2's fusion crashes the process when LogSoftmax reads a graph input.)
    return _model(
        [
            h.make_node("MatMul", ["x", "w"], ["z"]),
            h.make_node("LogSoftmax", ["z"], ["l"], axis=1),
            h.make_node(
                "NegativeLogLikelihoodLossInternal",
                ["l", "label", "", "ignore"],
                ["y"],
                domain="com.microsoft",
                reduction="mean",
            ),
        ],
        [_vi("x", [3, 4]), _vi("label", [3], T.INT64)],
        [Y],
        [_const("ignore", -1, np.int64), _const("w", RNG.standard_normal((4, 5)))],
        opset=12,
    )


def _transpose():
    return _model([h.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1, 3])], [_vi("x", [2, 1, 3, 4])], [Y])


# (pattern, trainable initializers, the com.microsoft op ORT writes (None: an ai.onnx op), differentiable input)
FUSIONS = {
    "BiasGelu": (_gelu_bias, ["w", "b"], "BiasGelu", "x"),
    "Gelu": (_gelu, [], "Gelu", "x"),
    "QuickGelu": (_quick_gelu, [], "QuickGelu", "x"),
    "LayerNormalization": (_layer_norm, ["g", "b"], None, "x"),
    "SimplifiedLayerNormalization": (_rms_norm, ["g"], None, "x"),
    "ConcatTraining": (_concat, [], "ConcatTraining", "x"),
    "BatchNormInternal": (_batch_norm, ["g", "b"], "BatchNormInternal", "x"),
    "LSTMTraining": (_lstm, ["W"], "LSTMTraining", "x"),
    "GRUTraining": (_gru, ["W"], "GRUTraining", "x"),
    "IsAllFinite": (_is_inf_reduce_sum, [], "IsAllFinite", None),
    "ScaledSum": (_scaled_sum, [], "ScaledSum", "x"),
    "SoftmaxCrossEntropyLossInternal": (_log_softmax_nll, ["w"], "SoftmaxCrossEntropyLossInternal", "x"),
    "TransposeReplacement": (_transpose, [], None, "x"),
}


def _feeds(model: onnx.ModelProto, special: str) -> Dict[str, np.ndarray]:
    feeds = {}
    inits = {t.name for t in model.graph.initializer}
    for info in model.graph.input:
        if info.name in inits:
            continue
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        if info.type.tensor_type.elem_type == T.INT64:
            feeds[info.name] = RNG.integers(0, 5, size=shape)  # labels: 5 classes.astype(np.int64)
        else:
            feeds[info.name] = RNG.standard_normal(shape).astype(np.float32)
    if special == "IsAllFinite":
        feeds["x"][1, 2] = np.inf
    return feeds


@pytest.mark.parametrize("name", list(FUSIONS))
def test_fusion_written_by_ort_converts(name, fused_models):
    _, _, op, grad_input = FUSIONS[name]
    original, fused = fused_models[name]
    assert not isinstance(fused, str), f"ORT's get_optimized_model failed: {fused}"
    ms_ops = [n.op_type for n in fused.graph.node if n.domain == "com.microsoft"]
    if op is not None:
        assert op in ms_ops, f"ORT did not write {op}: {[n.op_type for n in fused.graph.node]}"
    else:
        assert not ms_ops and name.replace("TransposeReplacement", "Reshape") in [n.op_type for n in fused.graph.node]
    feeds = _feeds(original, name)
    expected = _ort_run(original, feeds)
    ours = _ours(fused, feeds)
    _close(ours[0], expected[0])
    if name == "IsAllFinite":  # and without an infinity
        feeds["x"][1, 2] = np.nan  # isinf_only: a NaN is "finite"
        _close(_ours(fused, feeds)[0], _ort_run(original, feeds)[0])
    if grad_input is None:
        return
    grads = []
    for model in (fused, original):
        module, inputs = _module(model)
        module = module.double()  # constants too
        tensors = [
            torch.from_numpy(feeds[n]).double() if feeds[n].dtype == np.float32 else torch.from_numpy(feeds[n])
            for n in inputs
        ]
        tensors[inputs.index(grad_input)].requires_grad_(True)
        out = module(*tensors)
        out = out[0] if isinstance(out, (tuple, list)) else out
        weight = torch.from_numpy(np.random.default_rng(1).standard_normal(tuple(out.shape))).to(out.dtype)
        (out * weight).sum().backward()
        grads.append(tensors[inputs.index(grad_input)].grad)
    # float64 gradients; the tolerance of the forward, as the pattern's float32 constants (sqrt(2) as
    # 1.4142135, 1.702, 1e-5...) differ from the fused op's own at float32 rounding
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)


# ---- single nodes ---------------------------------------------------------------------------------


def _single(op: str, feeds: Dict[str, np.ndarray], attrs, out_types, opset: int = 17, inits=()):
    init_names = {t.name for t in inits}
    node = h.make_node(op, list(feeds), [f"y{i}" for i in range(len(out_types))], domain="com.microsoft", **attrs)
    inputs = [
        _vi(n, list(v.shape), h.np_dtype_to_tensor_dtype(v.dtype)) for n, v in feeds.items() if n not in init_names
    ]
    return _model([node], inputs, [_vi(f"y{i}", None, t) for i, t in enumerate(out_types)], inits, opset)


@pytest.mark.parametrize("with_lengths", [False, True])
def test_concat_training_of_one_input(with_lengths):
    """ORT's exports of a cache-less attention concatenate one tensor (Llama's keys and values):
    the converter passes it on uncopied; the values, the lengths output and the gradient are
    a Concat's.  Against ORT's kernel where this onnxruntime has it (training builds)."""
    feeds = {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)}
    model = _single("ConcatTraining", feeds, {"axis": -2}, [T.FLOAT, T.INT64][: 1 + with_lengths])
    ours = _ours(model, feeds)
    np.testing.assert_array_equal(ours[0].numpy(), feeds["x"])
    if with_lengths:
        np.testing.assert_array_equal(ours[1].numpy(), np.array([3], np.int64))
    try:
        expected = _ort_run(model, feeds)
    except Exception as error:  # noqa: BLE001  (plain onnxruntime: no ConcatTraining kernel)
        assert "ConcatTraining" in str(error)
    else:
        for a, e in zip(ours, expected):
            _close(a, e)
    module, _ = _module(model)
    x = torch.from_numpy(feeds["x"]).requires_grad_(True)
    out = module(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert out.data_ptr() == x.data_ptr()  # not copied
    weight = torch.randn(out.shape)
    (out * weight).sum().backward()
    assert torch.equal(x.grad, weight)


@pytest.mark.parametrize("dtype,out", [(np.float32, T.FLOAT), (np.float16, T.FLOAT), (np.float16, T.FLOAT16)])
def test_reduce_all_l2(dtype, out):
    feeds = {"a": RNG.standard_normal((2, 3)).astype(dtype), "b": RNG.standard_normal(5).astype(dtype)}
    model = _single("ReduceAllL2", feeds, {}, [out])
    expected = _ort_run(model, feeds)[0]
    ours = _ours(model, feeds)[0]
    if dtype == np.float16 and out == T.FLOAT16:
        np.testing.assert_allclose(ours.numpy().astype(np.float32), expected.astype(np.float32), rtol=1e-3)
        assert ours.numpy().dtype == expected.dtype and ours.shape == expected.shape
    else:
        _close(ours, expected)


def test_reduce_all_l2_gradient():
    feeds = {"a": RNG.standard_normal((2, 3)).astype(np.float32), "b": RNG.standard_normal(5).astype(np.float32)}
    module, _ = _module(_single("ReduceAllL2", feeds, {}, [T.DOUBLE]))
    args = tuple(torch.from_numpy(v).double().requires_grad_(True) for v in feeds.values())
    assert torch.autograd.gradcheck(lambda *xs: module(*xs)[0], args)


@pytest.mark.parametrize("attrs", [{}, {"isinf_only": 1}, {"isnan_only": 1}])
@pytest.mark.parametrize("bad", [None, np.inf, -np.inf, np.nan])
def test_is_all_finite_schema(attrs, bad):
    """No CPU kernel in ORT 1.19.2 (CUDA only): checked against the schema's documented semantics
    (a bool scalar: true when no input holds an Inf (isinf_only), a NaN (isnan_only) or either)."""
    feeds = {"a": RNG.standard_normal((2, 3)).astype(np.float32), "b": RNG.standard_normal(4).astype(np.float32)}
    if bad is not None:
        feeds["b"][2] = bad
    model = _single("IsAllFinite", feeds, attrs, [T.BOOL])
    ours = _ours(model, feeds)[0]
    values = np.concatenate([v.ravel() for v in feeds.values()])
    if attrs.get("isinf_only"):
        expected = not np.isinf(values).any()
    elif attrs.get("isnan_only"):
        expected = not np.isnan(values).any()
    else:
        expected = bool(np.isfinite(values).all())
    assert ours.dtype == torch.bool and ours.shape == () and bool(ours) == expected
    with pytest.raises(Exception):  # ORT 1.19.2: no CPU kernel (if this starts passing, compare with it)
        _ort_run(model, feeds)


@pytest.mark.parametrize("in_dtype,output_type", [(np.float16, T.FLOAT), (np.float32, T.DOUBLE), (np.float32, T.FLOAT)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_sce_internal_output_type(in_dtype, output_type, reduction):
    """CastSceLossFusion folds a float16 -> float Cast into SoftmaxCrossEntropyLossInternal with
    output_type: ORT returns loss and log_prob in output_type."""
    feeds = {"x": RNG.standard_normal((4, 5)).astype(in_dtype), "label": np.array([0, 4, 2, 1], np.int64)}
    model = _single(
        "SoftmaxCrossEntropyLossInternal",
        feeds,
        {"reduction": reduction, "output_type": output_type},
        [output_type, output_type],
    )
    expected = _ort_run(model, feeds)
    ours = _ours(model, feeds)
    for o, e in zip(ours, expected):
        if in_dtype == np.float16:  # ORT and we both read the float16 scores: compare at float32 rounding
            assert o.detach().numpy().dtype == e.dtype and o.shape == e.shape
            np.testing.assert_allclose(o.detach().numpy(), e, rtol=1e-5, atol=1e-5)
        else:
            _close(o, e)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 2])
def test_nll_internal(reduction, weighted, ignore):
    """NegativeLogLikelihoodLossInternal (ORT's exporter's nll_loss): an ONNX function in ORT,
    which runs it at opset 12 (its body's Unsqueeze takes axes as an attribute)."""
    scores = RNG.standard_normal((4, 3)).astype(np.float32)
    feeds = {"x": scores - np.log(np.exp(scores).sum(1, keepdims=True)), "label": np.array([0, 2, 1, 2], np.int64)}
    inits = []
    inputs = ["x", "label"]
    if weighted or ignore is not None:
        inputs.append("w" if weighted else "")
        if weighted:
            inits.append(_const("w", [1.0, 2.0, 0.5]))
    if ignore is not None:
        inputs.append("ignore")
        inits.append(_const("ignore", ignore, np.int64))
    node = h.make_node("NegativeLogLikelihoodLossInternal", inputs, ["y0"], domain="com.microsoft", reduction=reduction)
    model = _model([node], [_vi("x", [4, 3]), _vi("label", [4], T.INT64)], [_vi("y0", None)], inits, opset=12)
    expected = _ort_run(model, feeds)[0]
    _close(_ours(model, feeds)[0], expected)
    module, _ = _module(model)
    module = module.double()
    x = torch.from_numpy(feeds["x"]).double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: module(t, torch.from_numpy(feeds["label"]))[0], (x,))


# ---- the optimizer model: InplaceClipGradNorm --------------------------------------------------------


def _clip_artifacts(directory, max_norm: float, optimizer: str):
    training = pytest.importorskip("onnxruntime.training")
    from onnxruntime.training import artifacts, onnxblock

    weight = RNG.standard_normal((3, 4)).astype(np.float32)
    bias = RNG.standard_normal(3).astype(np.float32)
    base = _model(
        [h.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1)],
        [_vi("x", [2, 4])],
        [_vi("y", [2, 3])],
        [nh.from_array(weight, "W"), nh.from_array(bias, "B")],
    )
    clip = onnxblock.optim.ClipGradNorm(max_norm)
    block = onnxblock.optim.AdamW(clip_grad=clip) if optimizer == "adamw" else onnxblock.optim.SGD(clip_grad=clip)
    artifacts.generate_artifacts(
        base,
        requires_grad=["W", "B"],
        loss=artifacts.LossType.MSELoss,
        optimizer=block,
        artifact_directory=str(directory),
    )
    for path in directory.glob("*.onnx"):  # onnx >= 1.17 writes IR versions ORT 1.19 refuses
        model = onnx.load(str(path))
        model.ir_version = 10
        onnx.save(model, str(path))
    assert "InplaceClipGradNorm" in [n.op_type for n in onnx.load(str(directory / "optimizer_model.onnx")).graph.node]
    return training


def _assert_same_training(directory, suffix: str, x, target, ort_api, our_api, evaluate: bool) -> None:
    """Three train steps (and an eval step with `evaluate`) on the artifacts in `directory`
    (training/eval models with `suffix`) through ORT's api and ours: the same losses and parameters."""
    results = []
    for api in (ort_api, our_api):
        state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
        module = api.Module(str(directory / f"training_model.{suffix}"), state, str(directory / f"eval_model.{suffix}"))
        opt = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
        module.train()
        losses = []
        for _ in range(3):
            losses.append(float(module(x, target)))
            opt.step()
            module.lazy_reset_grad()
        if evaluate:
            module.eval()
            losses.append(float(module(x, target)))
        results.append((np.array(losses), module.get_contiguous_parameters().numpy().copy()))
    (ort_losses, ort_params), (our_losses, our_params) = results
    np.testing.assert_allclose(our_losses, ort_losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(our_params, ort_params, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("max_norm", [0.05, 1e3])
def test_clip_grad_norm_optimizer_matches_onnxruntime(tmp_path, optimizer, max_norm):
    """onnxblock's ClipGradNorm (InplaceClipGradNorm before the optimizer node), clipping or not."""
    _clip_artifacts(tmp_path, max_norm, optimizer)
    import onnxruntime.training.api as ort_api

    import ort_torch_compat.api as our_api

    x = (RNG.standard_normal((2, 4)) * 3).astype(np.float32)
    target = RNG.standard_normal((2, 3)).astype(np.float32)
    _assert_same_training(tmp_path, "onnx", x, target, ort_api, our_api, evaluate=False)


def test_optimizer_model_with_an_unknown_node_is_refused():
    from ort_torch_compat.errors import ModelLoadError
    from ort_torch_compat.optim import parse_optimizer_model

    inputs = [h.make_tensor_value_info("learning_rate", T.FLOAT, [1]), h.make_tensor_value_info("step", T.INT64, [1])]
    inputs += [
        h.make_tensor_sequence_value_info(n, T.FLOAT, None) for n in ("params", "gradients", "first_order_moments")
    ]
    nodes = [
        h.make_node("Identity", ["learning_rate"], ["lr2"]),
        h.make_node("SGDOptimizerV2", ["learning_rate", "params", "gradients"], ["done"], domain="com.microsoft"),
    ]
    model = h.make_model(h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info("done", T.BOOL, [1])]))
    with pytest.raises(ModelLoadError, match="Identity"):
        parse_optimizer_model(model, "optimizer.onnx")


# ---- generate_artifacts(ort_format=True): ORT-format files carry the session-time fusions ----------


def _fusable_net() -> onnx.ModelProto:
    """Conv+Relu, MatMul+Add+erf-GELU, Add+LayerNormalization, Transpose+MatMul*scale, Softmax."""
    rng = np.random.default_rng(5)
    nodes = [
        h.make_node("Conv", ["x", "cw", "cb"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("Flatten", ["r1"], ["f"]),
        h.make_node("MatMul", ["f", "w1"], ["m1"]),
        h.make_node("Add", ["m1", "b1"], ["a1"]),
        h.make_node("Div", ["a1", "sqrt2"], ["d"]),
        h.make_node("Erf", ["d"], ["e"]),
        h.make_node("Add", ["e", "one"], ["e1"]),
        h.make_node("Mul", ["a1", "e1"], ["g0"]),
        h.make_node("Mul", ["g0", "half"], ["g"]),
        h.make_node("Add", ["g", "skip"], ["s"]),
        # ORT's LayerNormalization gradient needs the mean / inv_std outputs declared
        h.make_node("LayerNormalization", ["s", "lg", "lb"], ["ln", "lmean", "listd"], axis=-1),
        h.make_node("Transpose", ["w2"], ["w2t"], perm=[1, 0]),
        h.make_node("MatMul", ["ln", "w2t"], ["m2"]),
        h.make_node("Mul", ["m2", "sc"], ["m2s"]),
        h.make_node("Add", ["m2s", "b2"], ["a2"]),
        h.make_node("Softmax", ["a2"], ["y"], axis=-1),
    ]
    inits = [
        _const("cw", rng.standard_normal((2, 1, 3, 3)) * 0.3),
        _const("cb", [0.1, -0.1]),
        _const("w1", rng.standard_normal((32, 8)) * 0.2),
        _const("b1", rng.standard_normal(8)),
        _const("sqrt2", 1.4142135),
        _const("one", 1.0),
        _const("half", 0.5),
        _const("skip", rng.standard_normal(8)),
        _const("lg", np.ones(8)),
        _const("lb", np.zeros(8)),
        _const("w2", rng.standard_normal((5, 8)) * 0.3),
        _const("sc", 0.5),
        _const("b2", rng.standard_normal(5)),
    ]
    return _model(nodes, [_vi("x", [2, 1, 4, 4])], [_vi("y", [2, 5])], inits)


def test_ort_format_artifacts_with_session_fusions_match_onnxruntime(tmp_path):
    """With ort_format=True, generate_artifacts also writes .ort training and eval models optimized
    at level 'all' (tools/convert_onnx_models_to_ort.py, style Fixed): FusedConv, FusedMatMul and
    Gelu, which the .onnx files never hold, are in them.  Train 3 steps and evaluate on both."""
    pytest.importorskip("onnxruntime.training")
    import onnxruntime.training.api as ort_api
    from onnxruntime.training import artifacts

    import ort_torch_compat.api as our_api
    from ort_torch_compat.ortformat import read_ort_model

    base = _fusable_net()
    trained = ["cw", "w1", "b1", "w2", "b2", "lg"]
    artifacts.generate_artifacts(
        base, requires_grad=trained, loss=artifacts.LossType.MSELoss, artifact_directory=str(tmp_path), ort_format=True
    )
    (tmp_path / "opt").mkdir()
    artifacts.generate_artifacts(
        base,
        requires_grad=trained,
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(tmp_path / "opt"),
    )
    optimizer = onnx.load(str(tmp_path / "opt" / "optimizer_model.onnx"))
    optimizer.ir_version = 10
    onnx.save(optimizer, str(tmp_path / "optimizer_model.onnx"))
    for name in ("training_model.ort", "eval_model.ort"):
        ops = {
            n.op_type for n in read_ort_model((tmp_path / name).read_bytes()).graph.node if n.domain == "com.microsoft"
        }
        assert {"FusedConv", "FusedMatMul"} <= ops, (name, ops)

    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 1, 4, 4)).astype(np.float32)
    target = rng.standard_normal((2, 5)).astype(np.float32)
    _assert_same_training(tmp_path, "ort", x, target, ort_api, our_api, evaluate=True)


def test_training_model_with_ops_ort_has_no_cpu_kernel_for(tmp_path):
    """generate_artifacts writes ScaledSum and IsAllFinite into the training model (this CUDA
    build's pre-training transformers), which ORT 1.19.2 cannot run on CPU; the eval model keeps
    the unfused ai.onnx pattern, which it can.  Our training-mode loss equals ORT's eval loss
    (no dropout or batch statistics in the model); the gradient is the analytic one."""
    pytest.importorskip("onnxruntime.training")
    from onnxruntime.training import artifacts

    import ort_torch_compat.api as our_api

    rng = np.random.default_rng(8)
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["a"]),
        h.make_node("Div", ["a", "s1"], ["p"]),
        h.make_node("Div", ["x", "s2"], ["q"]),
        h.make_node("Add", ["p", "q"], ["s"]),
        h.make_node("IsInf", ["s"], ["i"]),
        h.make_node("Cast", ["i"], ["ci"], to=T.INT64),
        h.make_node("ReduceSum", ["ci"], ["r"]),
        h.make_node("Greater", ["r", "zero"], ["bad"]),
        h.make_node("Where", ["bad", "zeros", "s"], ["y"]),
    ]
    inits = [
        _const("w", rng.standard_normal((4, 4))),
        _const("s1", 2.0),
        _const("s2", 0.5),
        _const("zero", 0, np.int64),
        _const("zeros", np.zeros((2, 4))),
    ]
    base = _model(nodes, [_vi("x", [2, 4])], [_vi("y", [2, 4])], inits, opset=13)
    artifacts.generate_artifacts(
        base, requires_grad=["w"], loss=artifacts.LossType.MSELoss, artifact_directory=str(tmp_path)
    )
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert {"ScaledSum", "IsAllFinite"} <= {n.op_type for n in training.graph.node}
    evaluation = onnx.load(str(tmp_path / "eval_model.onnx"))
    evaluation.ir_version = 8
    x = rng.standard_normal((2, 4)).astype(np.float32)
    target = rng.standard_normal((2, 4)).astype(np.float32)
    weight = nh.to_array(next(t for t in base.graph.initializer if t.name == "w"))
    expected = _ort_run(evaluation, {"x": x, "target": target, "w": weight})[0]

    state = our_api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = our_api.Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    module.train()
    loss = module(x, target)
    np.testing.assert_allclose(np.asarray(loss), expected, rtol=1e-5, atol=1e-6)
    y = x.astype(np.float64) @ weight / 2.0 + x / 0.5  # MSELoss = mean((y - target)^2)
    expected_grad = x.T.astype(np.float64) @ (2.0 * (y - target) / y.size) / 2.0
    np.testing.assert_allclose(state.parameters["w"].grad, expected_grad, rtol=1e-5, atol=1e-6)
