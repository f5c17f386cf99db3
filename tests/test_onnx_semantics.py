"""Issue 18: ONNX semantics at every opset, each a differential test against ONNX Runtime
1.19.2 (the op coverage fixtures, and live when onnxruntime is importable).

1. ORT's Dropout gradient: tests/test_dropout_gradient.py (the drop-in API on generated
   artifacts) and the Dropout cases of the op coverage suite.
2. AveragePool with asymmetric pads and count_include_pad=0 (opsets 7, 10, 11, 19).
3. Pad before opset 11 pads with its `value` attribute.
4. Versions older than onnx2torch's lowest converter: converted with their own semantics, and
   the same as converting the graph up-converted by onnx's version converter.
5. Shrink, sequence and string ops in eval graphs; string ops refused in training graphs.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, version_converter

from ort_torch_compat.graph import UnsupportedOperatorError, build_graph_module
from ort_torch_compat.testing import op_replay

CASES = {case["id"]: case for case in op_replay.load_manifest()}
ARRAYS = op_replay.Arrays()

AVERAGE_POOL = [
    f"ai.onnx.AveragePool-{v}.{variant}"
    for v in (7, 10, 11, 19)
    for variant in ("pads_asym", "pads_asym_no_count_pad", "same_upper", "same_lower", "1d")
]
PAD_VALUE = ["ai.onnx.Pad-2.constant_value", "ai.onnx.Pad-2.constant0", "ai.onnx.Pad-2.reflect", "ai.onnx.Pad-2.edge"]
OLD_VERSIONS = [
    "ai.onnx.Flatten-1.default",
    "ai.onnx.Flatten-1.axis0",
    "ai.onnx.Flatten-1.axis2",
    "ai.onnx.Flatten-1.axis_rank",
    "ai.onnx.Max-6.two",
    "ai.onnx.Min-6.three",
    "ai.onnx.Sum-6.three",
    "ai.onnx.Mean-6.two",
    "ai.onnx.BatchNormalization-7.inference",
    "ai.onnx.BatchNormalization-7.spatial1",
    "ai.onnx.Constant-1.tensor",
    "ai.onnx.Reshape-1.default",
    "ai.onnx.TopK-1.k2",
    "ai.onnx.ArgMax-1.default",
    "ai.onnx.Selu-6.alpha_gamma",
    "ai.onnx.Clip-6.min_max",
    "ai.onnx.Upsample-7.linear",
    "ai.onnx.Dropout-7.ratio0.3",
]
EVAL_OPS = [
    "ai.onnx.Shrink-9.default",
    "ai.onnx.Shrink-9.lambd_bias",
    "ai.onnx.SequenceConstruct-11.concat",
    "ai.onnx.SequenceAt-11.at_neg1",
    "ai.onnx.SplitToSequence-11.keepdims",
    "ai.onnx.SplitToSequence-11.split_sizes",
    "ai.onnx.ConcatFromSequence-11.new_axis",
    "ai.onnx.SequenceInsert-11.insert_at_0",
    "ai.onnx.SequenceErase-11.erase_1",
    "ai.onnx.SequenceLength-11.length",
    "ai.onnx.SequenceEmpty-11.empty_insert",
    "ai.onnx.SequenceMap-17.square_rows",
    "ai.onnx.StringNormalizer-10.lower",
    "ai.onnx.StringNormalizer-10.upper_stopwords",
    "ai.onnx.StringNormalizer-10.2d_case_sensitive",
]


def _live_outputs(case: dict, arrays) -> list:
    """ORT's outputs for the case's model now (skipped without onnxruntime)."""
    onnxruntime = pytest.importorskip("onnxruntime")
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = np.asarray(arrays[f"{case['id']}/model"], dtype=np.uint8).tobytes()
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(None, {name: arrays[f"{case['id']}/in/{name}"] for name in case["graph_inputs"]})


def _check(case_id: str) -> None:
    case = CASES[case_id]
    assert case["ort_forward"] == "ok", f"{case_id}: {case['ort_forward']}"
    arrays = ARRAYS(case)
    outcome = op_replay.replay_forward(case, arrays)
    assert outcome.status == "pass", str(outcome)
    if case["ort_gradient"] == "ok":
        gradient = op_replay.gradient_outcome(case, arrays)
        assert gradient.status == "pass", str(gradient)


@pytest.mark.parametrize("case_id", AVERAGE_POOL + PAD_VALUE + OLD_VERSIONS + EVAL_OPS)
def test_matches_recorded_onnxruntime(case_id):
    _check(case_id)


@pytest.mark.parametrize("case_id", AVERAGE_POOL + PAD_VALUE + OLD_VERSIONS[:4] + ["ai.onnx.Shrink-9.lambd_bias"])
def test_fixture_matches_live_onnxruntime(case_id):
    case = CASES[case_id]
    arrays = ARRAYS(case)
    for name, value in zip(case["outputs"], _live_outputs(case, arrays)):
        problem = op_replay.compare(name, np.asarray(value), arrays[f"{case_id}/out/{name}"], 1e-6, 1e-7)
        assert problem is None, problem


def _module(model: onnx.ModelProto):
    graph = model.graph
    opsets = {entry.domain: entry.version for entry in model.opset_import}
    return build_graph_module(graph, opsets, [i.name for i in graph.input], [o.name for o in graph.output], "test")


@pytest.mark.parametrize(
    "case_id",
    [
        "ai.onnx.Flatten-1.axis2",
        "ai.onnx.Max-6.three",
        "ai.onnx.Sum-6.two",
        "ai.onnx.BatchNormalization-7.inference",
        "ai.onnx.Pad-2.constant_value",
        "ai.onnx.AveragePool-7.pads_asym_no_count_pad",
        "ai.onnx.Clip-6.min_max",
    ],
)
def test_old_version_equals_its_up_converted_graph(case_id):
    """Both ways for an old model: its own version's converter, or onnx's version converter to
    opset 13 first (exact for these), then today's converters; both equal ORT's recording."""
    case = CASES[case_id]
    arrays = ARRAYS(case)
    model = onnx.load_from_string(np.asarray(arrays[f"{case_id}/model"], dtype=np.uint8).tobytes())
    upgraded = version_converter.convert_version(model, 13)
    feeds = [torch.from_numpy(np.array(arrays[f"{case_id}/in/{name}"])) for name in case["graph_inputs"]]
    with torch.no_grad():
        direct = _module(model)(*feeds)
        converted = _module(upgraded)(*feeds)
    for name, left, right in zip(case["outputs"], direct, converted):
        expected = arrays[f"{case_id}/out/{name}"]
        assert op_replay.compare(name, left, expected, 1e-4, 1e-5) is None
        assert op_replay.compare(name, right, expected, 1e-4, 1e-5) is None


def test_string_ops_are_refused_in_training_graphs():
    """Strings cannot carry gradients: a training graph with StringNormalizer is refused when
    the Module is built, naming the op and why; the same graph converts for evaluation."""
    node = helper.make_node("StringNormalizer", ["words"], ["normalized"], case_change_action="LOWER")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("words", onnx.TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("normalized", onnx.TensorProto.STRING, None)],
    )
    with pytest.raises(UnsupportedOperatorError) as info:
        build_graph_module(graph, {"": 13}, ["words"], ["normalized"], "training model", training=True)
    assert ("", "StringNormalizer", 13) in info.value.missing
    assert "StringNormalizer" in str(info.value) and "training graph" in str(info.value)
    module = build_graph_module(graph, {"": 13}, ["words"], ["normalized"], "eval model")
    (out,) = module(np.array(["Hello", "World"]))
    assert out.tolist() == ["hello", "world"]
