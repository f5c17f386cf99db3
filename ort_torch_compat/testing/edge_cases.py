"""ONNX Runtime's own behaviour at the edges of its training API, as scenarios for either library.

Each scenario takes the training API module (`onnxruntime.training.api` or
`ort_torch_compat.api`) and returns plain JSON-able data: messages of the errors raised,
losses, parameter values.  `scripts/make_edge_fixtures.py` runs them with
onnxruntime-training 1.19.2 and records tests/fixtures/edges/expected.json;
`tests/test_edges.py` runs them with ort_torch_compat and compares, live against ORT too
where it is importable.

Messages are compared by their core: ORT prefixes its text with the C++ source location and
function signature, which `core_message` strips.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any, Callable, Dict, List

import numpy as np
import onnx

from . import REPO as ROOT

FIXTURES = ROOT / "tests" / "fixtures"
EDGES = FIXTURES / "edges"
EXPECTED = EDGES / "expected.json"
EXAMPLE = ROOT / "examples" / "artifacts" / "mlp_classifier"
NOMINAL = FIXTURES / "cnn_mse_sgd_nominal_op17"
STRINGS = EDGES / "string_inputs"

_ORT_STATUS = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : (?:\S+\.cc:\d+ \S+ )?")
_ORT_LOCATION = re.compile(r"^/\S+:\d+ .*?\)> ")
_BUILTINS = (KeyError, TypeError, ValueError, RuntimeError, Exception)


def core_message(text: str) -> str:
    """ORT's message without the source location and signature it starts with."""
    text = text.strip()
    status = _ORT_STATUS.search(text)
    if status:
        return text[status.end() :]
    located = _ORT_LOCATION.match(text)
    return text[located.end() :] if located else text


def outcome(call: Callable[[], Any]) -> Dict[str, Any]:
    """{"raised": False}, or the error: the builtin classes it is an instance of (most specific
    first) and its core message (first line only for TypeErrors, whose later lines show object
    addresses)."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - recording what happens is the point
        message = core_message(str(error))
        if isinstance(error, TypeError):
            message = message.splitlines()[0]
        return {"raised": True, "builtins": [b.__name__ for b in _BUILTINS if isinstance(error, b)], "message": message}
    return {"raised": False}


def load_expected() -> Dict[str, Any]:
    return json.loads(EXPECTED.read_text())


# ---- nominal checkpoint misuse ---------------------------------------------------------------
def nominal_misuse(api: Any, buffer_of: Callable[[np.ndarray], Any], tmp: pathlib.Path) -> Dict[str, Any]:
    """Every use of a nominal state before its parameters are loaded, then after."""
    spec = json.loads((NOMINAL / "spec.json").read_text())
    inputs = [np.zeros(i["shape"], dtype=i["dtype"]) for i in spec["inputs"]]
    name = spec["param_order"][0]
    state = api.CheckpointState.load_checkpoint(NOMINAL / "nominal_checkpoint")
    out = {
        "get_parameter_without_module": outcome(lambda: state.parameters[name]),
        "set_parameter_without_module": outcome(lambda: state.parameters.__setitem__(name, np.zeros(1, np.float32))),
    }
    module = api.Module(NOMINAL / "training_model.onnx", state, NOMINAL / "eval_model.onnx")
    optimizer = api.Optimizer(NOMINAL / "optimizer_model.onnx", module)
    out["get_parameter"] = outcome(lambda: state.parameters[name])
    out["iterate_parameters"] = outcome(lambda: list(state.parameters))
    out["set_parameter"] = outcome(lambda: state.parameters.__setitem__(name, np.zeros(1, np.float32)))
    out["get_contiguous_parameters"] = outcome(lambda: module.get_contiguous_parameters())
    out["copy_buffer_trainable_only"] = outcome(
        lambda: module.copy_buffer_to_parameters(
            buffer_of(np.zeros(module.get_parameters_size(True), np.float32)), True
        )
    )
    out["train_step"] = outcome(lambda: module(*inputs))
    out["eval_step"] = outcome(lambda: module.eval()(*inputs))
    module.train()
    out["optimizer_step"] = outcome(optimizer.step)
    out["export"] = outcome(lambda: module.export_model_for_inferencing(str(tmp / "nominal.onnx"), ["y"]))
    out["save_checkpoint"] = outcome(lambda: api.CheckpointState.save_checkpoint(state, str(tmp / "nominal_ckpt")))

    full_state = api.CheckpointState.load_checkpoint(NOMINAL / "checkpoint")
    full = api.Module(NOMINAL / "training_model.onnx", full_state)
    module.copy_buffer_to_parameters(buffer_of(np.asarray(full.get_contiguous_parameters(False).numpy())), False)
    out["set_parameter_after_fill"] = outcome(lambda: state.parameters.__setitem__(name, state.parameters[name].data))
    out["train_step_after_fill"] = outcome(lambda: module(*inputs))
    out["optimizer_step_after_fill"] = outcome(optimizer.step)
    return out


# ---- export_model_for_inferencing ---------------------------------------------------------------
def export_misuse(api: Any, tmp: pathlib.Path) -> Dict[str, Any]:
    state = api.CheckpointState.load_checkpoint(EXAMPLE / "checkpoint")
    module = api.Module(EXAMPLE / "training_model.onnx", state, EXAMPLE / "eval_model.onnx")
    without_eval = api.Module(
        EXAMPLE / "training_model.onnx", api.CheckpointState.load_checkpoint(EXAMPLE / "checkpoint")
    )
    path = str(tmp / "inference.onnx")
    return {
        "unknown_name": outcome(lambda: module.export_model_for_inferencing(path, ["output"])),
        "empty_list": outcome(lambda: module.export_model_for_inferencing(path, [])),
        "bare_string": outcome(lambda: module.export_model_for_inferencing(path, "logits")),
        "graph_input_name": outcome(lambda: module.export_model_for_inferencing(path, ["features"])),
        "parameter_name": outcome(lambda: module.export_model_for_inferencing(path, ["0.weight"])),
        "model_output": outcome(lambda: module.export_model_for_inferencing(path, ["logits"])),
        "no_eval_model": outcome(lambda: without_eval.export_model_for_inferencing(path, ["logits"])),
    }


# ---- device strings ------------------------------------------------------------------------------
DEVICES = ["gpu", "GPU", "cuda:x"]


def device_misuse(api: Any) -> Dict[str, Any]:
    out = {}
    for device in DEVICES:
        state = api.CheckpointState.load_checkpoint(EXAMPLE / "checkpoint")
        out[device] = outcome(lambda: api.Module(EXAMPLE / "training_model.onnx", state, device=device))
    return out


# ---- the kind of value returned --------------------------------------------------------------------
def example_batch(size: int = 4):
    rng = np.random.default_rng(15)
    return rng.normal(size=(size, 2)).astype(np.float32), rng.integers(0, 3, size=size).astype(np.int64)


def output_kinds(api: Any, ortvalue_class: Any) -> Dict[str, str]:
    """The class of what Module returns for OrtValue inputs and for mixed numpy/OrtValue inputs."""
    state = api.CheckpointState.load_checkpoint(EXAMPLE / "checkpoint")
    module = api.Module(EXAMPLE / "training_model.onnx", state, EXAMPLE / "eval_model.onnx")
    x, y = example_batch()
    as_ortvalues = module(ortvalue_class.ortvalue_from_numpy(x), ortvalue_class.ortvalue_from_numpy(y))
    mixed = module(x, ortvalue_class.ortvalue_from_numpy(y))
    module.eval()
    evaluated = module(ortvalue_class.ortvalue_from_numpy(x), ortvalue_class.ortvalue_from_numpy(y))
    qualified = lambda value: f"{type(value).__module__}.{type(value).__qualname__}"  # noqa: E731
    return {
        "ortvalues": qualified(as_ortvalues),
        "mixed": qualified(mixed),
        "eval_ortvalues": qualified(evaluated),
        "loss": float(np.asarray(as_ortvalues.numpy())),
    }


# ---- a forward pass that fails on a bad value -------------------------------------------------------
def label_out_of_range(api: Any) -> Dict[str, Any]:
    """Class 5 of a 3-class model: what ORT does, and whether its gradients change."""
    state = api.CheckpointState.load_checkpoint(EXAMPLE / "checkpoint")
    module = api.Module(EXAMPLE / "training_model.onnx", state, EXAMPLE / "eval_model.onnx")
    x, y = example_batch()
    module(x, y)
    before = {name: parameter.grad.copy() for name, parameter in state.parameters}
    module.lazy_reset_grad()
    bad = y.copy()
    bad[2] = 5
    result = outcome(lambda: module(x, bad))
    after = {name: parameter.grad for name, parameter in state.parameters}
    result["gradients_unchanged"] = all(np.array_equal(before[n], after[n]) for n in before)
    return result


# ---- string inputs -----------------------------------------------------------------------------------
STRING_FEATURES = [["1.5", "-2"], ["1e1", " 3"], ["0x1p-2", "7abc"], [".25", "+4"]]
STRING_LABELS = ["0", "2", "1e0", " 1"]


def string_inputs(api: Any, as_array: Callable[[List], np.ndarray]) -> Dict[str, Any]:
    """Train two steps and evaluate artifacts whose features and labels are strings cast by the graph."""
    state = api.CheckpointState.load_checkpoint(STRINGS / "checkpoint")
    module = api.Module(STRINGS / "training_model.onnx", state, STRINGS / "eval_model.onnx")
    optimizer = api.Optimizer(STRINGS / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.1)
    x, y = as_array(STRING_FEATURES), as_array(STRING_LABELS)
    losses = []
    for _ in range(2):
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    eval_loss = float(module(x, y))
    bad = as_array([["abc", "1"]] + STRING_FEATURES[1:])
    return {
        "input_names": module.input_names(),
        "losses": losses,
        "eval_loss": eval_loss,
        "parameters": {name: parameter.data.ravel().tolist() for name, parameter in state.parameters},
        "unparsable": outcome(lambda: module(bad, y)),
    }


def string_feed_variants() -> Dict[str, Callable[[List], np.ndarray]]:
    """The numpy forms of a string tensor ORT accepts: str, bytes and object (of str) arrays.

    The bytes array is wider than its longest element: ORT reads an element that fills the
    whole width on into the next one (b"0x1p-2" then b"7abc" parse as 0x1p-27), an
    over-read we do not reproduce.
    """
    return {
        "str": lambda values: np.array(values),
        "bytes": lambda values: np.array(values, dtype="S8"),
        "object": lambda values: np.array(values, dtype=object),
    }


# ---- ORT's Cast from string, value by value ----------------------------------------------------------
CAST_TEXTS = {
    "float": [
        "1.5",
        "-2",
        "1e3",
        " 3",
        "3 ",
        "\t\n5",
        "nan",
        "NaN",
        "inf",
        "-Infinity",
        "infinit",
        "0x1p3",
        "0x1P-2",
        "0x.8",
        "0x",
        "4abc",
        "1.5e",
        "1.5e+",
        ".5",
        "5.",
        "-0",
        "1e-40",
        "3.4028236e38",
        "1e50",
        "1e400",
        "1e-400",
        "2e-308",
        "0x1p-1074",
        "0e500",
        "1_000",
        "abc",
        "",
        "-.e1",
        "in",
        "\u00a05",
        "\u0661",
    ],
    "int": [
        "3",
        "-1",
        "3.7",
        " 4",
        "7abc",
        "0012",
        "+5",
        "0x10",
        "1e3",
        "255",
        "256",
        "3000000000",
        "-3000000000",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "18446744073709551615",
        "18446744073709551616",
        "true",
        "abc",
        "",
        "+",
        "+-1",
        "\u00a05",
    ],
}
CAST_TARGETS = {
    "float": ["FLOAT", "DOUBLE", "FLOAT16"],
    "int": ["INT64", "INT32", "INT16", "INT8", "UINT8", "UINT16", "UINT32", "UINT64", "BOOL"],
}


def cast_model(to: int) -> onnx.ModelProto:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Cast", ["s"], ["o"], to=to)],
        "cast",
        [onnx.helper.make_tensor_value_info("s", onnx.TensorProto.STRING, [None])],
        [onnx.helper.make_tensor_value_info("o", to, [None])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def json_value(value: Any) -> Any:
    """A Cast result as JSON: numbers as they are, NaN / infinities / -0.0 as strings."""
    if isinstance(value, float) and (
        value != value or value in (float("inf"), float("-inf")) or (value == 0.0 and str(value).startswith("-"))
    ):
        return repr(value)
    return value


# ---- AdamW when lr * weight_decay reaches 1 ----------------------------------------------------------
ADAMW_CASES = {
    "mode1_lr0.5_wd2": (0.5, 2.0, 1),
    "mode1_lr0.5_wd3": (0.5, 3.0, 1),
    "mode0_lr0.5_wd2": (0.5, 2.0, 0),
    "mode1_lr0.1_wd2": (0.1, 2.0, 1),
}


def optimizer_model(weight_decay: float, adam_mode: int) -> onnx.ModelProto:
    """The example's AdamW optimizer model with other weight_decay / adam_mode attributes."""
    model = onnx.load(str(EXAMPLE / "optimizer_model.onnx"))
    node = next(n for n in model.graph.node if n.op_type == "AdamWOptimizer")
    kept = [a for a in node.attribute if a.name not in ("weight_decay", "adam_mode")]
    del node.attribute[:]
    node.attribute.extend(
        kept
        + [
            onnx.helper.make_attribute("weight_decay", float(weight_decay)),
            onnx.helper.make_attribute("adam_mode", int(adam_mode)),
        ]
    )
    return model


def adamw_decay(api: Any, tmp: pathlib.Path) -> Dict[str, Any]:
    """Parameters after one AdamW step for each (lr, weight_decay, adam_mode) case."""
    out = {}
    x, y = example_batch()
    for key, (lr, weight_decay, adam_mode) in ADAMW_CASES.items():
        path = tmp / f"optimizer_{key}.onnx"
        onnx.save(optimizer_model(weight_decay, adam_mode), str(path))
        state = api.CheckpointState.load_checkpoint(EXAMPLE / "checkpoint")
        module = api.Module(EXAMPLE / "training_model.onnx", state)
        optimizer = api.Optimizer(str(path), module)
        optimizer.set_learning_rate(lr)
        module(x, y)
        result = outcome(optimizer.step)
        result["parameters"] = {name: parameter.data.ravel().tolist() for name, parameter in state.parameters}
        out[key] = result
    return out


# ---- parameter buffers ----------------------------------------------------------------------------------
def buffer_kinds(api: Any, ortvalue_class: Any) -> Dict[str, Any]:
    """What get_contiguous_parameters returns, and whether copy_buffer_to_parameters takes an OrtValue."""
    state = api.CheckpointState.load_checkpoint(EXAMPLE / "checkpoint")
    module = api.Module(EXAMPLE / "training_model.onnx", state)
    buffer = module.get_contiguous_parameters(True)
    values = np.asarray(buffer.numpy())
    return {
        "contiguous_class": type(buffer).__name__,
        "copy_from_ortvalue": outcome(
            lambda: module.copy_buffer_to_parameters(ortvalue_class.ortvalue_from_numpy(values), True)
        ),
    }


# ---- what a failed step leaves behind ---------------------------------------------------------------------
def failed_step(api: Any) -> Dict[str, Any]:
    """After lazy_reset_grad and a step that fails (an unparsable string): are the gradients
    untouched, and does the next good step still overwrite them?"""
    state = api.CheckpointState.load_checkpoint(STRINGS / "checkpoint")
    module = api.Module(STRINGS / "training_model.onnx", state)
    x, y = np.array(STRING_FEATURES), np.array(STRING_LABELS)
    module(x, y)
    before = {name: parameter.grad.copy() for name, parameter in state.parameters}
    module.lazy_reset_grad()
    result = outcome(lambda: module(np.array([["abc", "1"]] + STRING_FEATURES[1:]), y))
    result["message"] = "(not compared)"
    result["gradients_unchanged"] = all(np.array_equal(before[n], p.grad) for n, p in state.parameters)
    module(x, y)
    result["next_step_overwrites"] = all(np.allclose(before[n], p.grad) for n, p in state.parameters)
    return result
