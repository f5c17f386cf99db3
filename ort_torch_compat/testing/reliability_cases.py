"""Edge cases of issue 17 that ONNX Runtime defines, run unchanged on ORT or on this library.

`scripts/make_reliability_fixtures.py` runs them with onnxruntime-training 1.19.2 and
records the results in tests/fixtures/reliability/ort_semantics.json; test_reliability.py
runs them through ort_torch_compat and compares (and runs ORT live when it is importable).
Each function takes the training API module (``onnxruntime.training.api`` or
``ort_torch_compat.api``) where it needs one.
"""

from __future__ import annotations

import pathlib
from typing import Callable, Dict, List

import numpy as np
import onnx
from onnx import TensorProto, helper

from ort_torch_compat.codec import CheckpointRecord, ModuleStateRecord, encode_checkpoint, tensor_record_from_numpy

from . import REPO

CLASSIFIER = REPO / "examples" / "artifacts" / "mlp_classifier"  # dynamic batch, CrossEntropy (no ignore_index)
MLP_CE = REPO / "tests" / "fixtures" / "mlp_ce_adamw_op17"


# ---- checkpoints with duplicate names ----------------------------------------------------
def _t(name: str, values) -> "object":
    return tensor_record_from_numpy(name, np.asarray(values, np.float32))


def duplicate_checkpoints() -> Dict[str, bytes]:
    records = {
        "trainable twice": ModuleStateRecord([_t("w", [1, 1]), _t("w", [2, 2])], []),
        "trainable then frozen": ModuleStateRecord([_t("w", [1, 1])], [_t("w", [3, 3])]),
        "frozen twice": ModuleStateRecord([], [_t("w", [1, 1]), _t("w", [3, 3])]),
        "trainable twice, other shapes": ModuleStateRecord([_t("w", [1, 1]), _t("w", [2, 2, 2])], []),
    }
    return {name: encode_checkpoint(CheckpointRecord(module_state=ms))[0] for name, ms in records.items()}


def duplicate_property_checkpoints() -> Dict[str, bytes]:
    """Two properties of one name (the second renamed over the first in the bytes)."""
    out = {}
    for kind, props in {
        "int, int": {"aa": 1, "ab": 2},
        "int, float": {"aa": 1, "ab": 2.5},
        "float, str": {"aa": 1.5, "ab": "x"},
    }.items():
        rec = CheckpointRecord(
            module_state=ModuleStateRecord([_t("w", [1, 1])], []), optimizer_groups=[], properties=props
        )
        data = encode_checkpoint(rec)[0]
        at = data.find(b"ab\0")
        out[kind] = data[:at] + b"aa" + data[at + 2 :]
    return out


def loaded_parameters(api, path: pathlib.Path) -> Dict[str, list]:
    state = api.CheckpointState.load_checkpoint(str(path))
    return {name: [p.data.tolist(), bool(p.requires_grad)] for name, p in state.parameters}


def loaded_properties(api, path: pathlib.Path) -> Dict[str, object]:
    state = api.CheckpointState.load_checkpoint(str(path))
    return {name: value for name, value in state.properties}


# ---- SoftmaxCrossEntropyLoss without ignore_index ----------------------------------------
SCE_SCORES = [[1, 2, 3], [0.5, 0.1, -1], [2, 0, 1], [0, 0, 0]]
# label sets whose result ORT defines (out-of-range labels read out of bounds in ORT's kernel)
SCE_CASES = [
    ({"reduction": "mean"}, [0, 1, 2, 1]),
    ({"reduction": "mean"}, [0, -1, 2, 1]),
    ({"reduction": "sum"}, [0, -1, 2, 1]),
    ({"reduction": "none"}, [0, -1, 2, 1]),
    ({"reduction": "mean"}, [-1, -1, -1, -1]),
    ({"reduction": "mean", "ignore_index": -100}, [0, -100, 2, 1]),
    ({"reduction": "mean", "ignore_index": -100}, [-100, -100, -100, -100]),
    ({"reduction": "sum", "ignore_index": 2}, [0, 2, 2, 1]),
]


def sce_model(attributes: dict) -> onnx.ModelProto:
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "y"], ["loss"], **attributes)
    graph = helper.make_graph(
        [node],
        "sce",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3]),
            helper.make_tensor_value_info("y", TensorProto.INT64, [None]),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def sce_results(run: Callable[[onnx.ModelProto, np.ndarray, np.ndarray], np.ndarray]) -> List[list]:
    """``run(model, scores, labels) -> loss`` for each case."""
    scores = np.asarray(SCE_SCORES, np.float32)
    return [
        np.asarray(run(sce_model(attrs), scores, np.asarray(labels, np.int64))).tolist() for attrs, labels in SCE_CASES
    ]


CE_LABELS = {"in range": [0, 1, 2, 1], "one label -1": [0, -1, 2, 1], "all -1": [-1, -1, -1, -1]}


def ce_training_step(api) -> Dict[str, dict]:
    """The classifier artifacts (no ignore_index in the graph): loss and a gradient per label set."""
    features = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
    out = {}
    for name, labels in CE_LABELS.items():
        state = api.CheckpointState.load_checkpoint(str(CLASSIFIER / "checkpoint"))
        module = api.Module(str(CLASSIFIER / "training_model.onnx"), state)
        loss = module(features, np.asarray(labels, np.int64))
        out[name] = {"loss": float(loss), "grad 0.bias": state.parameters["0.bias"].grad.tolist()}
    return out


# ---- models ORT refuses or accepts -------------------------------------------------------
def _opset_999(model):
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = 999


def _ir_99(model):
    model.ir_version = 99


def _duplicate_output(model):
    model.graph.output.append(model.graph.output[0])


def _initializer_dims(model):
    initializer = next(i for i in model.graph.initializer if i.dims)
    initializer.dims[0] += 1


MODEL_EDITS = {
    "opset 999": _opset_999,
    "IR version 99": _ir_99,
    "duplicate graph output": _duplicate_output,
    "initializer dims do not match its data": _initializer_dims,
}


def edited_training_model(edit: str, directory: pathlib.Path) -> pathlib.Path:
    model = onnx.load(str(MLP_CE / "training_model.onnx"))
    MODEL_EDITS[edit](model)
    path = directory / "training_model.onnx"
    onnx.save(model, str(path))
    return path


def train_with_edited_model(api, edit: str, directory: pathlib.Path) -> dict:
    """{"error": type} when building the Module or the step fails, else the step's outputs."""
    path = edited_training_model(edit, directory)
    state = api.CheckpointState.load_checkpoint(str(MLP_CE / "checkpoint"))
    features = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    try:
        module = api.Module(str(path), state)
        outputs = module(features, np.array([0, 1, 2, 1], np.int64))
    except Exception as error:  # noqa: BLE001 - what matters is that both refuse
        return {"error": type(error).__name__, "message": str(error)[-300:]}
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return {"outputs": [float(value) for value in outputs], "output_names": list(module.output_names())}


# ---- step inputs -------------------------------------------------------------------------
def bad_inputs() -> Dict[str, list]:
    """Inputs of the classifier ORT crashes on or misreads (run each in its own process)."""
    features = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
    labels = np.array([0, 1, 2, 1], np.int64)
    return {
        "0-row batch": [np.zeros((0, 2), np.float32), np.zeros((0,), np.int64)],
        "big-endian float32 features": [features.astype(">f4"), labels],
        "big-endian int64 labels": [features, labels.astype(">i8")],
        "object-array features": [features.astype(object), labels],
        "batch sizes 4 and 3": [features, labels[:3]],
        "reference": [features, labels],
    }


def train_on(api, name: str, train: bool = True) -> dict:
    state = api.CheckpointState.load_checkpoint(str(CLASSIFIER / "checkpoint"))
    module = api.Module(str(CLASSIFIER / "training_model.onnx"), state, str(CLASSIFIER / "eval_model.onnx"))
    module.train(train)
    try:
        loss = module(*bad_inputs()[name])
    except Exception as error:  # noqa: BLE001
        return {"error": type(error).__name__, "message": str(error)[-300:]}
    return {"loss": float(loss)}
