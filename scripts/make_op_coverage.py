"""Generate the op coverage fixtures (tests/fixtures/ops/) and docs/op-coverage.md.

    python scripts/make_op_coverage.py            # record with onnxruntime-training 1.19.2, replay, write the doc
    python scripts/make_op_coverage.py --only 'Pool|Pad'   # re-record the ops matching a regex
    python scripts/make_op_coverage.py --doc-only # replay the committed fixtures, rewrite the doc

What is covered is enumerated, not chosen: every ai.onnx schema version up to opset 21 that
onnx.defs knows (ORT's own ai.onnx schemas below opset 17 and its com.microsoft ops come from
ort_torch_compat/testing/op_coverage_cases.py's CONTRIB_CASES), one small model per (op, schema version,
attribute variant) from ort_torch_compat/testing/op_coverage_cases.py.  For each case:

1. forward: ``onnxruntime.InferenceSession`` (CPU, graph optimizations off) runs the one-op
   model.  "Could not find an implementation" means ORT 1.19.2 does not run that version; any
   other ORT error is recorded as such.
2. gradient: the float graph inputs become trainable initializers, a loss
   ``sum_i ReduceSum(output_i * W_i)`` with random constants W_i is appended, and ORT builds the
   training model: with ``generate_artifacts`` (loss=None), or, where its onnx.checker step
   rejects ORT's own schemas, with the functions generate_artifacts calls
   (``build_gradient_graph``, ``build_gradient_accumulation_graph``, ``save_checkpoint``).  If ORT
   cannot differentiate some inputs, each input is tried alone and the ones it can train are
   kept.  One ``onnxruntime.training.api.Module`` train step gives the loss and the gradients.
   The forward+loss part of the training model is stored, cut the way the engine cuts it.
3. replay: ort_torch_compat/testing/op_replay.py runs every case through ort_torch_compat's converters; the
   results are the forward/gradient columns of docs/op-coverage.md.

Model opset: a schema version valid over opsets [v, next) is tested at the first opset >= 9 in
that range (>= 8 otherwise, else v): ORT 1.19.2's gradient builder emits nodes that are
invalid below opset 8 (Expand), so nothing below 8 trains in ORT (measured).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import pickle
import re
import sys
import tempfile
import zlib
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np
import onnx
from onnx import TensorProto, defs, helper, numpy_helper

from ort_torch_compat.testing import REPO, op_replay
from ort_torch_compat.testing.op_coverage_cases import CONTRIB_CASES, MS, Case, cases

FIXTURES = REPO / "tests" / "fixtures" / "ops"
DOC = REPO / "docs" / "op-coverage.md"
#: hand-written: which com.microsoft ops generate_artifacts writes, and our handling of each
INVENTORY = REPO / "scripts" / "contrib_ops_inventory.md"
MAX_OPSET = 21
MAX_IR_VERSION = 10  # ORT 1.19 refuses newer IR versions, which onnx >= 1.17 writes
NO_KERNEL = "Could not find an implementation"


# ---- enumeration --------------------------------------------------------------------------


def schema_versions() -> Dict[str, List[int]]:
    """ai.onnx op -> its schema since-versions up to MAX_OPSET."""
    versions: Dict[str, List[int]] = defaultdict(list)
    for schema in defs.get_all_schemas_with_history():
        if schema.domain == "" and schema.since_version <= MAX_OPSET:
            versions[schema.name].append(schema.since_version)
    return {op: sorted(v) for op, v in sorted(versions.items())}


def model_opset(version: int, following: Optional[int]) -> int:
    last = (following - 1) if following else MAX_OPSET
    for floor in (9, 8):
        if max(version, floor) <= last:
            return max(version, floor)
    return version


def enumerate_cases(only: Optional[str]) -> List[Tuple[str, Case, Dict[str, int], int]]:
    """(case id, case, opsets, schema version) for every case, in table order."""
    out = []
    for op, versions in schema_versions().items():
        for index, version in enumerate(versions):
            following = versions[index + 1] if index + 1 < len(versions) else None
            opset = model_opset(version, following)
            for case in cases(op, version):
                opsets = {"": case.opset or opset}
                case_id = f"ai.onnx.{op}-{version}.{case.variant}"
                out.append((case_id, case, opsets, version))
    for case in CONTRIB_CASES:
        if case.domain == MS:
            opsets = {"": 17, MS: 1}
            case_id = f"{MS}.{case.op}-1.{case.variant}"
        else:  # ORT's own ai.onnx schema (version 1), below opset 17
            opsets = {"": case.opset}
            case_id = f"ai.onnx.{case.op}-ort.{case.variant}"
        out.append((case_id, case, opsets, 1))
    if only:
        pattern = re.compile(only)
        out = [item for item in out if pattern.search(item[0])]
    return out


# ---- models -------------------------------------------------------------------------------


def _ir_version(opset: int) -> int:
    return 7 if opset <= 12 else 8 if opset <= 15 else 9 if opset <= 18 else MAX_IR_VERSION


def _value_info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    if value.dtype.kind in "US":
        return helper.make_tensor_value_info(name, TensorProto.STRING, value.shape)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)


def _initializer(name: str, value: np.ndarray) -> onnx.TensorProto:
    if value.dtype.kind in "US":
        return numpy_helper.from_array(value.astype(object), name)
    return numpy_helper.from_array(value, name)


def build_model(
    case: Case,
    opsets: Dict[str, int],
    values: List[Optional[np.ndarray]],
    chain_values: List[np.ndarray],
    captured_values: List[np.ndarray],
) -> Tuple[onnx.ModelProto, List[str], Dict[str, np.ndarray]]:
    """The one-op model; returns it, the graph input names and every named input value."""
    names, inputs, initializers, named = [], [], [], {}
    for index, (spec, value) in enumerate(zip(case.inputs, values)):
        if value is None:
            names.append("")
            continue
        name = f"x{index}"
        names.append(name)
        named[name] = value
        if spec.role == "data":
            inputs.append(_value_info(name, value))
        else:
            initializers.append(_initializer(name, value))
    for index, spec in enumerate(case.captured):
        name = f"cap{index}"
        named[name] = captured_values[index]
        inputs.append(_value_info(name, named[name]))
    node_outputs = [f"y{k}" for k in range(case.outputs)]
    nodes = [helper.make_node(case.op, names, node_outputs, domain=case.domain, **case.attrs)]
    outputs = [node_outputs[k] for k in (case.graph_outputs or range(case.outputs))]
    if case.chain:
        extra = []
        for index, value in enumerate(chain_values):
            name = f"c{index}"
            extra.append(name)
            named[name] = value
            initializers.append(_initializer(name, value))
        nodes.append(helper.make_node(case.chain["op"], [outputs[0]] + extra, ["z0"], **case.chain["attrs"]))
        outputs = ["z0"]
        if case.chain["then"]:
            op, attrs = case.chain["then"]
            nodes.append(helper.make_node(op, ["z0"], ["z1"], **attrs))
            outputs = ["z1"]
    graph = helper.make_graph(
        nodes, case.op, inputs, [helper.make_empty_tensor_value_info(o) for o in outputs], initializer=initializers
    )
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    model = helper.make_model(graph, opset_imports=imports, producer_name="make_op_coverage")
    model.ir_version = _ir_version(opsets[""])
    return model, [info.name for info in inputs], named


def set_output_types(model: onnx.ModelProto, results: List[np.ndarray]) -> None:
    for info, value in zip(model.graph.output, results):
        info.CopyFrom(_value_info(info.name, np.asarray(value)))


# ---- ONNX Runtime -------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_stderr():
    """ORT's gradient builder logs every graph transformer to fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def ort_forward(model: onnx.ModelProto, feeds: Dict[str, np.ndarray]):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _strip_location(text: str) -> str:
    """ORT prefixes messages with 'file:line signature(args) [const]'; keep the message."""
    match = re.match(r"/onnxruntime_src/\S+:\d+ ", text)
    if not match:
        return text
    position = match.end()
    while True:
        start = text.find("(", position)
        if start < 0:
            return text
        depth, index = 0, start
        while index < len(text):
            depth += {"(": 1, ")": -1}.get(text[index], 0)
            if depth == 0:
                break
            index += 1
        position = index + 1
        rest = text[position:]
        if rest.startswith("::"):
            continue
        return rest.removeprefix(">").removeprefix(" const").strip()


def _short(error: BaseException) -> str:
    """ORT's message without the source locations and C++ signatures it nests."""
    text = re.sub(r"\s+", " ", str(error)).strip()
    while "/onnxruntime_src/" in text:
        index = text.index("/onnxruntime_src/")
        stripped = _strip_location(text[index:])
        if stripped == text[index:]:
            break
        text = text[:index] + stripped
    return text[:300]


def training_base(
    model: onnx.ModelProto,
    named: Dict[str, np.ndarray],
    trainable: List[str],
    float_outputs: List[Tuple[str, np.ndarray]],
    rng: np.random.Generator,
    feeders: bool = False,
) -> onnx.ModelProto:
    """The one-op model with `trainable` inputs as initializers and the weighted-sum loss.

    `feeders` puts `Mul(p, 1)` between each parameter and the op: ORT 1.19.2 segfaults building
    the Module when a pool's input is a parameter itself (measured: MaxPool, AveragePool)."""
    base = copy.deepcopy(model)
    if feeders:
        for node in base.graph.node:
            node.input[:] = [f"{name}_fed" if name in trainable else name for name in node.input]
        base.graph.initializer.append(numpy_helper.from_array(np.ones((1,), np.float32), "feeder_one"))
        for name in reversed(trainable):
            base.graph.node.insert(0, helper.make_node("Mul", [name, "feeder_one"], [f"{name}_fed"]))
    keep = [info for info in base.graph.input if info.name not in trainable]
    del base.graph.input[:]
    base.graph.input.extend(keep)
    base.graph.initializer.extend(numpy_helper.from_array(named[name], name) for name in trainable)
    sums = []
    for index, (name, value) in enumerate(float_outputs):
        weight = rng.standard_normal(value.shape).astype(value.dtype)
        base.graph.initializer.append(numpy_helper.from_array(weight, f"loss_w{index}"))
        base.graph.node.append(helper.make_node("Mul", [name, f"loss_w{index}"], [f"loss_p{index}"]))
        base.graph.node.append(helper.make_node("ReduceSum", [f"loss_p{index}"], [f"loss_s{index}"], keepdims=0))
        sums.append(f"loss_s{index}")
    total = sums[0]
    for index, name in enumerate(sums[1:], 1):  # Add, not Sum: ORT has no gradient builder for Sum
        base.graph.node.append(helper.make_node("Add", [total, name], [f"loss_t{index}"]))
        total = f"loss_t{index}"
    base.graph.node[-1].output[0] = "loss"
    del base.graph.output[:]
    base.graph.output.append(
        helper.make_tensor_value_info(
            "loss", float_outputs[0][1].dtype == np.float64 and TensorProto.DOUBLE or TensorProto.FLOAT, []
        )
    )
    return base


def _artifacts(base: onnx.ModelProto, trainable: List[str], directory: str) -> str:
    """Training model + checkpoint in `directory`; returns how they were made."""
    from onnxruntime.training import artifacts
    from onnxruntime.training.onnxblock import _training_graph_utils as graph_utils
    from onnxruntime.training.onnxblock import checkpoint_utils

    try:
        with quiet_stderr():
            artifacts.generate_artifacts(
                base,
                requires_grad=trainable,
                frozen_params=[],
                loss=None,
                optimizer=artifacts.OptimType.SGD,
                artifact_directory=directory,
            )
        how = "generate_artifacts"
    except onnx.checker.ValidationError:
        # onnx.checker does not know ORT's own ai.onnx schemas (LayerNormalization below 17,
        # SimplifiedLayerNormalization): call what generate_artifacts calls after the check.
        model = copy.deepcopy(base)
        with quiet_stderr():
            training, _ = graph_utils.build_gradient_graph(model, set(trainable), set(), ["loss"])
            graph_utils.build_gradient_accumulation_graph(training, set(trainable))
        onnx.save(training, os.path.join(directory, "training_model.onnx"))
        params = graph_utils.get_model_parameters(base, set(trainable), set())
        checkpoint_utils.save_checkpoint(params, os.path.join(directory, "checkpoint"))
        how = "build_gradient_graph"  # generate_artifacts' onnx.checker rejects ORT's own schemas
    path = os.path.join(directory, "training_model.onnx")
    training = onnx.load(path)
    training.ir_version = min(training.ir_version, MAX_IR_VERSION)
    onnx.save(training, path)
    return how


def ort_train_step(base: onnx.ModelProto, trainable: List[str], feeds: Dict[str, np.ndarray]):
    """(how, training model, user input names, loss, grads) from one ORT train step."""
    from onnxruntime.training import api

    with tempfile.TemporaryDirectory() as directory:
        how = _artifacts(base, trainable, directory)
        state = api.CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
        with quiet_stderr():
            module = api.Module(os.path.join(directory, "training_model.onnx"), state, None)
        user = list(module.input_names())
        loss = module(*[feeds[name] for name in user])
        loss = loss[0] if isinstance(loss, list) else loss
        loss = np.array(loss.numpy() if hasattr(loss, "numpy") else loss)
        grads = {name: np.array(state.parameters[name].grad) for name in trainable}
        training = onnx.load(os.path.join(directory, "training_model.onnx"))
    return how, training, user, loss, grads


def cut_training_forward(training: onnx.ModelProto, user: List[str], trainable: List[str]) -> onnx.ModelProto:
    from ort_torch_compat.graph import forward_graph

    graph = forward_graph(training, ["loss"], user + trainable, "training model")
    model = helper.make_model(graph, opset_imports=list(training.opset_import), producer_name="make_op_coverage")
    model.ir_version = min(training.ir_version, MAX_IR_VERSION)
    return model


def record_gradient(
    case: Case,
    model: onnx.ModelProto,
    named: Dict[str, np.ndarray],
    graph_inputs: List[str],
    outputs: Dict[str, np.ndarray],
    rng: np.random.Generator,
    entry: dict,
    store: dict,
    feeders: bool = False,
) -> None:
    candidates = [n for n in graph_inputs if named[n].dtype.kind == "f"]
    float_outputs = [(n, v) for n, v in outputs.items() if np.asarray(v).dtype.kind == "f"]
    if not candidates or not float_outputs:
        entry["ort_gradient"] = "n/a: no float input" if not candidates else "n/a: no float output"
        return
    feeds = {n: named[n] for n in graph_inputs}
    base_rng_state = rng.bit_generator.state

    def attempt(trainable):
        rng.bit_generator.state = base_rng_state  # same loss weights for every attempt
        base = training_base(model, named, trainable, float_outputs, rng, feeders)
        return ort_train_step(base, trainable, feeds)

    try:
        how, training, user, loss, grads = attempt(candidates)
        trainable = candidates
    except Exception as error:  # noqa: BLE001 - ORT's errors are data here
        first_error = _short(error)
        trainable = []
        for name in candidates if len(candidates) > 1 else []:
            try:
                attempt([name])
                trainable.append(name)
            except Exception:  # noqa: BLE001
                pass
        if not trainable:
            entry["ort_gradient"] = f"ORT cannot train it: {first_error[:200]}"
            return
        how, training, user, loss, grads = attempt(trainable)
    forward = cut_training_forward(training, user, trainable)
    key = entry["id"]
    store[f"{key}/train_model"] = np.frombuffer(forward.SerializeToString(), dtype=np.uint8)
    store[f"{key}/loss"] = loss
    for name, grad in grads.items():
        store[f"{key}/grad/{name}"] = grad
    if feeders:  # Mul(p, 1) feeds each parameter: ORT segfaults when it is a pool's input itself
        how += "+feeders"
    entry.update(
        ort_gradient="ok",
        trainable=trainable,
        train_inputs=user,
        gradient_builder=how,
        training_ops=sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in forward.graph.node}),
    )


def in_child(function, *args):
    """Run `function(*args)` in a forked child: ORT segfaults on some cases (e.g. building the
    Module of an AveragePool-7 training model), which must not end the recording.  Returns the
    result, or raises OrtCrash naming the signal."""
    with tempfile.TemporaryFile() as channel:
        pid = os.fork()
        if pid == 0:  # child
            code = 0
            try:
                pickle.dump(function(*args), channel)
                channel.flush()
            except BaseException:  # noqa: BLE001 - report and leave without running the parent's cleanup
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            raise OrtCrash(f"ORT crashed (signal {os.WTERMSIG(status)})")
        if os.WEXITSTATUS(status) != 0:
            raise RuntimeError(f"recording failed in the child process (exit {os.WEXITSTATUS(status)})")
        channel.seek(0)
        return pickle.load(channel)


class OrtCrash(RuntimeError):
    pass


def record_case_isolated(case_id: str, case: Case, opsets: Dict[str, int], version: int) -> Tuple[dict, dict]:
    """record_case in a child; when ORT crashes, again with feeder nodes, then forward only."""

    def run(gradient: Optional[str]):
        store: dict = {}
        return record_case(case_id, case, opsets, version, store, gradient), store

    try:
        return in_child(run, "direct")
    except OrtCrash as crash:
        try:
            return in_child(run, "feeders")
        except OrtCrash:
            pass
        try:
            entry, store = in_child(run, None)
        except OrtCrash as again:
            entry = {
                "id": case_id,
                "op": case.op,
                "domain": case.domain or "ai.onnx",
                "version": version,
                "opsets": opsets,
                "variant": case.variant,
                "ort_forward": str(again),
                "ort_gradient": "n/a",
            }
            return entry, {}
        entry["ort_gradient"] = f"ORT cannot train it: {crash} when building the training Module"
        return entry, store


def record_case(
    case_id: str, case: Case, opsets: Dict[str, int], version: int, store: dict, gradient: Optional[str] = "direct"
) -> dict:
    rng = np.random.default_rng(zlib.crc32(case_id.encode()))
    values = [spec.make(rng) for spec in case.inputs]
    chain_values = [spec.make(rng) for spec in (case.chain or {}).get("extra", [])]
    captured_values = [spec.make(rng) for spec in case.captured]
    model, graph_inputs, named = build_model(case, opsets, values, chain_values, captured_values)
    entry = {
        "id": case_id,
        "op": case.op,
        "domain": case.domain or "ai.onnx",
        "version": version,
        "opsets": opsets,
        "variant": case.variant,
        "inputs": [f"x{i}" if v is not None else "" for i, v in enumerate(values)],
        "graph_inputs": graph_inputs,
        "stochastic": case.stochastic,
        "rtol": case.rtol,
        "atol": case.atol,
    }
    feeds = {name: named[name] for name in graph_inputs}
    try:
        results = ort_forward(model, feeds)
    except Exception as error:  # noqa: BLE001
        message = _short(error)
        entry["ort_forward"] = "no kernel" if NO_KERNEL in message else f"ORT error: {message[:200]}"
        entry["ort_gradient"] = "n/a: ORT does not run the forward"
        return entry
    set_output_types(model, results)
    entry["ort_forward"] = "ok"
    entry["outputs"] = [info.name for info in model.graph.output]
    key = case_id
    store[f"{key}/model"] = np.frombuffer(model.SerializeToString(), dtype=np.uint8)
    for name, value in named.items():
        store[f"{key}/in/{name}"] = value
    outputs = {}
    for name, value in zip(entry["outputs"], results):
        value = np.asarray(value)
        if value.dtype == object:
            value = value.astype(np.str_)
        outputs[name] = value
        store[f"{key}/out/{name}"] = value
    if case.stochastic and case.op not in ("Dropout", "BiasDropout"):
        entry["ort_gradient"] = "n/a: random output"
        return entry
    if not gradient:
        return entry
    record_gradient(case, model, named, graph_inputs, outputs, rng, entry, store, feeders=gradient == "feeders")
    return entry


# ---- recording ----------------------------------------------------------------------------


def record(only: Optional[str]) -> None:
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    selected = enumerate_cases(only)
    current = {case_id for case_id, *_rest in enumerate_cases(None)}
    pattern = re.compile(only) if only else None

    def replaced(case_id: str) -> bool:
        """Re-recorded now, or no longer a case."""
        return pattern is None or bool(pattern.search(case_id)) or case_id not in current

    kept = (
        [case for case in op_replay.load_manifest() if not replaced(case["id"])]
        if only and op_replay.MANIFEST.exists()
        else []
    )
    entries, stores = [], defaultdict(dict)
    for count, (case_id, case, opsets, version) in enumerate(selected, 1):
        entry, store = record_case_isolated(case_id, case, opsets, version)
        entries.append(entry)
        stores[op_replay.fixture_file(entry)].update(store)
        print(
            f"[{count}/{len(selected)}] {case_id}: forward {entry['ort_forward']}; gradient {entry['ort_gradient'][:80]}",
            flush=True,
        )
    for name in {op_replay.fixture_file(entry) for entry in entries}:
        path = FIXTURES / name
        merged = {}
        if only and path.exists():
            merged = {k: v for k, v in np.load(path, allow_pickle=False).items() if not replaced(k.split("/")[0])}
        merged.update(stores[name])
        if merged:
            np.savez_compressed(path, **merged)
        elif path.exists():
            path.unlink()
    order = {case_id: index for index, (case_id, *_rest) in enumerate(enumerate_cases(None))}
    ordered = sorted(kept + entries, key=lambda e: order.get(e["id"], len(order)))
    lines = ",\n".join(json.dumps(entry, separators=(",", ":")) for entry in ordered)
    op_replay.MANIFEST.write_text('{"cases": [\n' + lines + "\n]}\n")  # one case per line: readable diffs


# ---- the coverage table -------------------------------------------------------------------


def replay_all() -> List[Tuple[dict, op_replay.Outcome, op_replay.Outcome]]:
    """Every recorded case through our converters, as tests/test_op_coverage.py does."""
    arrays = op_replay.Arrays()
    results = []
    for case in op_replay.load_manifest():
        if case["ort_forward"] != "ok":
            results.append((case, op_replay.Outcome("none"), op_replay.Outcome("none")))
            continue
        data = arrays(case)
        results.append((case, op_replay.replay_forward(case, data), op_replay.gradient_outcome(case, data)))
    return results


def _ort_gradient_reason(status: str) -> str:
    """ORT's reason for not training a case, in a few words."""
    rules = [
        ("has not been registered", "no gradient builder in ORT"),
        ("no float input", "no float input"),
        ("no float output", "no float output"),
        ("random output", "random output"),
        ("ORT crashed", "ORT crashes building the Module"),
        ("Sequence lengths input tensor", "no sequence_lens in ORT's training kernels"),
        ("kForward", "only the forward direction in ORT's training kernels"),
        ("domain_version of 7", "ORT's gradient graph is invalid below opset 8"),
    ]
    for needle, short in rules:
        if needle in status:
            return short
    return "ORT fails: " + status.replace("ORT cannot train it: ", "")[:90].replace("|", "/")


def _count(outcomes: List[op_replay.Outcome]) -> str:
    tested = [o for o in outcomes if o.status != "none"]
    if not tested:
        return ""
    parts = [f"pass {sum(o.status == 'pass' for o in tested)}/{len(tested)}"]
    for status, label in (("fail", "FAIL"), ("unsupported", "clear error")):
        count = sum(o.status == status for o in tested)
        if count:
            parts.append(f"{label} {count}/{len(tested)}")
    return ", ".join(parts)


def write_doc(results) -> None:
    by_op: Dict[str, list] = defaultdict(list)
    for item in results:
        by_op[op_replay.op_key(item[0])].append(item)
    rows, details, not_run = [], [], []
    totals = defaultdict(int)
    for key, items in by_op.items():
        domain = items[0][0]["domain"]
        name = key.split(".")[-1].replace("-ort", " (ORT's ai.onnx schema)")
        run = [(c, f, g) for c, f, g in items if c["ort_forward"] == "ok"]
        if not run:
            reasons = sorted({c["ort_forward"].replace("|", "/")[:110] for c, _, _ in items})
            versions = sorted({c["version"] for c, _, _ in items})
            not_run.append(f"| {domain} | {name} | {', '.join(map(str, versions))} | {'; '.join(reasons)} |")
            continue
        versions = sorted({c["version"] for c, _, _ in run})
        skipped = sorted({c["version"] for c, _, _ in items} - set(versions))
        opsets = sorted({c["opsets"].get("", 0) for c, _, _ in run})
        forward = _count([f for _, f, _ in run])
        gradient = _count([g for _, _, g in run])
        not_trained = sorted({_ort_gradient_reason(c["ort_gradient"]) for c, _, g in run if g.status == "none"})
        if not gradient:
            gradient = "ORT: " + "; ".join(not_trained)
        notes = []
        if skipped:
            notes.append(f"ORT 1.19.2 does not run version {', '.join(map(str, skipped))}")
        if gradient and not gradient.startswith("ORT:") and not_trained:
            variants = sorted({c["variant"] for c, _, g in run if g.status == "none"})
            listed = (
                ", ".join(variants)
                if len(variants) <= 6
                else ", ".join(variants[:6]) + f" and {len(variants) - 6} more"
            )
            notes.append(f"ORT cannot train {listed} ({'; '.join(not_trained)[:120]})")
        for table, label in (
            (op_replay.ORT_GRADIENT_QUIRKS, "ORT gradient quirk, reproduced"),
            (op_replay.ORT_GRADIENT_WRONG, "ORT's gradient is wrong, ours checked against finite differences"),
        ):
            reasons = sorted({op_replay.matching(table, c["id"]) for c, _, _ in run} - {""})
            notes += [f"{label}: {reason}" for reason in reasons]
        label = ", ".join(map(str, versions)) if domain == "ai.onnx" else "1"
        rows.append(
            f"| {domain} | {name} | {label} | {', '.join(map(str, opsets))} | {len(run)} | {forward} | {gradient} | "
            f"{'; '.join(notes)} |"
        )
        for case, forward_outcome, gradient_outcome in run:
            for kind, outcome in (("forward", forward_outcome), ("gradient", gradient_outcome)):
                if outcome.status in ("fail", "unsupported"):
                    details.append(
                        f"- `{case['id']}` {kind}: {'FAIL' if outcome.status == 'fail' else 'clear error'}: "
                        f"{outcome.detail[:220]}"
                    )
        totals["ops"] += 1
        totals["cases"] += len(run)
        totals["forward_pass"] += sum(f.status == "pass" for _, f, _ in run)
        totals["gradient_cases"] += sum(g.status != "none" for _, _, g in run)
        totals["gradient_pass"] += sum(g.status == "pass" for _, _, g in run)
    quirks = "\n".join(f"- `{pattern}`: {reason}" for pattern, reason in op_replay.ORT_GRADIENT_QUIRKS.items())
    wrong = "\n".join(f"- `{pattern}`: {reason}" for pattern, reason in op_replay.ORT_GRADIENT_WRONG.items())
    text = f"""# Op coverage: ONNX Runtime 1.19.2 versus ort_torch_compat

<!-- generated by scripts/make_op_coverage.py from tests/fixtures/ops/; do not edit by hand -->

**{totals["ops"]} ops that ORT 1.19.2 runs, {totals["cases"]} cases: forward
{totals["forward_pass"]}/{totals["cases"]} pass, gradients {totals["gradient_pass"]}/{totals["gradient_cases"]} pass (of the
cases ORT itself can train).**

## What is tested

Every ai.onnx operator schema up to opset 21 (`onnx.defs`), at every schema version, and the
ORT-schema ops its training transformers and optimizers write into training, eval and
inference graphs (ORT's own LayerNormalization below opset 17 and SimplifiedLayerNormalization
in the ai.onnx domain; the com.microsoft fusions).  One small model per (op, schema version,
attribute variant), from `ort_torch_compat/testing/op_coverage_cases.py`; a version valid over opsets
[v, next) is tested at the first opset >= 9 of that range (>= 8 otherwise, else v).

ONNX Runtime 1.19.2 recorded each case (`tests/fixtures/ops/`): the forward with
`InferenceSession` (graph optimizations off); for the gradient, the float inputs become
trainable parameters, the loss is `sum_i sum(output_i * W_i)` with random constant `W_i`, ORT's
gradient builder makes the training model (`generate_artifacts`, or the functions it calls
where its onnx.checker step rejects ORT's own schemas), and one `onnxruntime.training.api`
train step gives the loss and the gradients.  `tests/test_op_coverage.py` replays every case
through this library (the engine's graph cut and converters); **the forward and gradient
columns below are those test results**, written by the same replay code
(`ort_torch_compat/testing/op_replay.py`).

Values compare to float32 rounding, `|ours - ort| <= rtol*|ort| + atol*max(1, max|ort|)` with
rtol 1e-4 and atol 1e-5; integers, booleans and strings exactly; shapes and dtypes always
exactly; random ops by shape, dtype and their invariants (a dropout output is 0 or
x/(1-ratio)).  Tolerances are never widened for a case: where float32 results of a deep
network drift apart chaotically (deep BatchNorm nets, whose outputs move as much when ORT's own
input moves by one ulp), the comparison is against a float64 replay of the same model instead,
and where ORT's gradient is wrong (below), against float64 central differences of the forward.

## ORT's gradients that are not the derivative of its forward

Found by this suite and checked against float64 central differences.  Reproduced by default
(`Module(..., gradients="ort")`, see `ort_torch_compat/graph/gradient_quirks.py`);
`gradients="exact"` gives the derivative (tested for every case listed):

{quirks}

Not reproduced (no formula we could match; our gradient is the derivative in both modes,
tested against central differences):

{wrong}

## Coverage

Columns: *versions*: the schema versions ORT 1.19.2 runs; *opsets*: the model opsets they
were tested at; *forward* / *gradient*: passing cases out of those compared; "clear error":
the Module refuses the graph when it is created, naming the op; "ORT: ...": ORT itself cannot
train any case of the op, so there is no gradient to compare.

| domain | op | versions | opsets | cases | forward | gradient | notes |
| --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}

## Failing and refused cases

{chr(10).join(details) or "None."}

## Ops and versions ORT 1.19.2 does not run (CPU)

| domain | op | versions | what ORT says |
| --- | --- | --- | --- |
{chr(10).join(not_run)}

{INVENTORY.read_text().strip()}
"""
    DOC.write_text(text)


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="regex over case ids (e.g. 'AveragePool|Pad-'): re-record only these")
    parser.add_argument("--doc-only", action="store_true", help="replay the committed fixtures and rewrite the doc")
    args = parser.parse_args(argv)
    if not args.doc_only:
        record(args.only)
    results = replay_all()
    write_doc(results)
    failing = [(c["id"], f, g) for c, f, g in results if "fail" in (f.status, g.status)]
    print(f"wrote {DOC.relative_to(REPO)}; {len(failing)} case(s) failing")
    for case_id, forward, gradient in failing[:80]:
        print(f"  {case_id}: forward {forward}; gradient {gradient}"[:300])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
