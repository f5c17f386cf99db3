"""The C/C#/Objective-C training session surface (`ort_torch_compat.TrainingSession`, issue 6).

* A C-API-style run of the standard scenario (ort_torch_compat/testing/scenario.py) on committed fixtures gives
  exactly the numbers of the drop-in API (one engine) and ORT's recorded numbers within the
  tolerances of tests/test_training_parity.py.
* A full C-API loop from buffers: steps, scheduler, buffers, properties, parameters, save,
  reload (resume is bit-identical), export (checked with onnxruntime.InferenceSession).
* The linear scheduler's lr sequence equals the documented formula with the C API's
  register-then-SetInitialLearningRate order, and ORT's recorded Python traces after the
  (1.19 Python) argument swap.
* set_seed makes Dropout reproducible; release / context-manager lifecycle.
"""

from __future__ import annotations

import inspect
import pathlib

import numpy as np
import pytest
import torch

import ort_torch_compat
import ort_torch_compat.api as dropin
from ort_torch_compat import (
    TrainingSession,
    load_checkpoint,
    load_checkpoint_from_buffer,
    save_checkpoint,
    set_seed,
)
from ort_torch_compat.errors import InvalidInputError, ModelLoadError, NominalStateError, ReleasedError
from ort_torch_compat.testing.scenario import EVAL_SEED_KEY, compare, make_batch, run_scenario
from tests.conftest import FIXTURES, load_spec

PARITY_CONFIGS = ["mlp_ce_adamw_op17", "cnn_mse_sgd_op17"]
# tests/test_training_parity.py's tolerances (float32 rounding over 5 optimizer steps)
RTOL, ATOL = 1e-4, 1e-5
TOLERANCES = {"step*/param/*": (1e-4, 2e-5), "final/contiguous_all": (1e-4, 2e-5)}
NO_SCHEDULER = "No learning rate scheduler was registered. Please register a valid learning rate scheduler"


def _files(config: str) -> dict:
    d = FIXTURES / config
    return {
        name: (d / name).read_bytes()
        for name in ("checkpoint", "training_model.onnx", "eval_model.onnx", "optimizer_model.onnx")
    }


def _session_from_buffers(config: str, **kwargs) -> TrainingSession:
    """CreateTrainingSessionFromBuffer over LoadCheckpointFromBuffer."""
    f = _files(config)
    state = load_checkpoint_from_buffer(f["checkpoint"])
    return TrainingSession(state, f["training_model.onnx"], f["eval_model.onnx"], f["optimizer_model.onnx"], **kwargs)


def _session_from_paths(config: str, state=None) -> TrainingSession:
    d = FIXTURES / config
    state = load_checkpoint(d / "checkpoint") if state is None else state
    return TrainingSession(state, d / "training_model.onnx", d / "eval_model.onnx", d / "optimizer_model.onnx")


def _params(session: TrainingSession, names) -> dict:
    return {n: session.state.get_parameter(n) for n in names}


def _inputs(spec: dict, k: int, j: int, names) -> list:
    batch = make_batch(spec, k, j)
    return [batch[n] for n in names]


# ----------------------------------------------------------------------------------------
# The standard scenario through the C API surface
# ----------------------------------------------------------------------------------------
def run_capi_scenario(config: str) -> dict:
    """ort_torch_compat.testing.scenario.run_scenario's keys, produced with TrainingSession calls only (plus the
    shared CheckpointState's accessors for parameters and gradients)."""
    spec = load_spec(FIXTURES / config)
    trainable, frozen = list(spec["trainable_params"]), list(spec.get("frozen_params", []))
    out = {}
    session = _session_from_buffers(config)
    state = session.state
    session.set_learning_rate(float(spec["lr"]))
    out["lr/initial"] = np.array(session.get_learning_rate(), dtype=np.float64)
    out["names/train_inputs"] = np.array(session.training_model_input_names(), dtype=np.str_)
    out["names/train_outputs"] = np.array(session.training_model_output_names(), dtype=np.str_)
    out["names/eval_inputs"] = np.array(session.eval_model_input_names(), dtype=np.str_)
    out["names/eval_outputs"] = np.array(session.eval_model_output_names(), dtype=np.str_)
    out["sizes/trainable"] = np.array(session.get_parameters_size(True), dtype=np.int64)
    out["sizes/all"] = np.array(session.get_parameters_size(False), dtype=np.int64)
    out["init/contiguous_all"] = session.copy_parameters_to_buffer(False).numpy().copy()
    out["init/contiguous_trainable"] = session.copy_parameters_to_buffer(True).numpy().copy()
    for name in trainable + frozen:
        out[f"init/param/{name}"] = state.get_parameter(name)
    train_names = session.training_model_input_names()
    for k in range(1, int(spec.get("steps", 5)) + 1):
        for j in range(1, (2 if k == int(spec.get("accumulate_step", 2)) else 1) + 1):
            inputs = _inputs(spec, k, j, train_names)
            for name, value in zip(train_names, inputs):
                out[f"step{k}/call{j}/input/{name}"] = value
            outputs = session.train_step(inputs)
            out[f"step{k}/call{j}/loss"] = outputs[0]
            for i, value in enumerate(outputs[1:], start=1):
                out[f"step{k}/call{j}/out{i}"] = value
        for name in trainable:
            out[f"step{k}/grad/{name}"] = state.parameters[name].grad
        out[f"step{k}/frozen_grad_is_none"] = np.array([state.parameters[n].grad is None for n in frozen], dtype=bool)
        out[f"step{k}/lr"] = np.array(session.get_learning_rate(), dtype=np.float64)
        session.optimizer_step()
        for name in trainable + frozen:
            out[f"step{k}/param/{name}"] = state.get_parameter(name)
        session.lazy_reset_grad()
    out["final/contiguous_all"] = session.to_buffer(False).numpy().copy()
    eval_names = session.eval_model_input_names()
    inputs = _inputs(spec, EVAL_SEED_KEY, 0, eval_names)
    for name, value in zip(eval_names, inputs):
        out[f"eval/input/{name}"] = value
    for i, value in enumerate(session.eval_step(inputs)):
        out[f"eval/out{i}"] = value
    session.release()
    return out


@pytest.mark.parametrize("config", PARITY_CONFIGS)
def test_capi_scenario_equals_dropin_api_and_matches_onnxruntime(config):
    directory = FIXTURES / config
    capi = run_capi_scenario(config)
    # same engine: identical numbers, names and dtypes
    api = run_scenario(dropin, directory, load_spec(directory))
    assert sorted(capi) == sorted(api)
    for key in api:
        assert np.asarray(capi[key]).dtype == np.asarray(api[key]).dtype, key
        assert np.array_equal(capi[key], api[key]), key
    # ORT's recorded numbers (onnxruntime-training 1.19.2)
    expected = dict(np.load(directory / "expected.npz", allow_pickle=False))
    problems = compare(expected, capi, rtol=RTOL, atol=ATOL, tolerances=TOLERANCES)
    assert not problems, "\n".join(problems[:40])


# ----------------------------------------------------------------------------------------
# A full C-API-style loop
# ----------------------------------------------------------------------------------------
def _train(session: TrainingSession, spec: dict, steps, scheduler: bool = True) -> list:
    """TrainStep, OptimizerStep, SchedulerStep, LazyResetGrad per step; returns the losses."""
    names = session.training_model_input_names()
    losses = []
    for k in steps:
        losses.append(session.train_step(_inputs(spec, k, 1, names))[0])
        session.optimizer_step()
        if scheduler:
            session.scheduler_step()
        session.lazy_reset_grad()
    return losses


def test_full_capi_loop_from_buffers(tmp_path):
    config = "mlp_ce_adamw_op17"
    spec = load_spec(FIXTURES / config)
    order = spec["param_order"]
    session = _session_from_buffers(config)
    state = session.state
    assert isinstance(state, dropin.CheckpointState)

    # model IO information (names and counts; C# InputNames/OutputNames(training))
    assert session.training_model_input_names() == ["x", "labels"] == session.input_names(True)
    assert session.eval_model_input_names() == ["x", "labels"] == session.input_names(False)
    assert session.training_model_output_names() == [spec["train_graph_outputs"][0]] == session.output_names(True)
    assert session.eval_model_output_names() == spec["eval_graph_outputs"] == session.output_names(False)
    assert (session.training_model_input_count(), session.training_model_output_count()) == (2, 1)
    assert (session.eval_model_input_count(), session.eval_model_output_count()) == (2, 1)

    # checkpoint accessors: parameters and properties
    for name in order:
        dtype, shape = state.get_parameter_type_and_shape(name)
        assert dtype == np.float32 and shape == tuple(spec["param_shapes"][name])
    state.add_property("epoch", 3)
    state.add_property("best_loss", 0.25)
    state.add_property("run", "capi")
    assert (state.get_property("epoch"), state.get_property("best_loss"), state.get_property("run")) == (
        3,
        0.25,
        "capi",
    )
    with pytest.raises(KeyError):
        state.get_property("missing")

    # parameter buffers: GetParametersSize / CopyParametersToBuffer / CopyBufferToParameters
    size = sum(int(np.prod(spec["param_shapes"][n])) for n in order)
    assert session.get_parameters_size(True) == session.get_parameters_size(False) == size
    initial = session.to_buffer(False).numpy().copy()
    np.testing.assert_array_equal(initial, np.concatenate([state.get_parameter(n).ravel() for n in order]))
    preallocated = np.zeros((size,), dtype=np.float32)  # the C API fills a caller-owned buffer
    assert session.copy_parameters_to_buffer(False, buffer=preallocated) is preallocated
    np.testing.assert_array_equal(preallocated, initial)
    session.copy_buffer_to_parameters(np.zeros(size, dtype=np.float32), True)
    assert not state.get_parameter("fc1.weight").any()
    session.from_buffer(initial.reshape(5, 43))  # ObjC fromBuffer: size decides, any rank
    np.testing.assert_array_equal(session.to_buffer(True).numpy(), initial)
    with pytest.raises(InvalidInputError, match="size incorrect"):
        session.copy_buffer_to_parameters(np.zeros(size + 1, dtype=np.float32), True)
    with pytest.raises(InvalidInputError):
        session.copy_buffer_to_parameters(np.zeros(size, dtype=np.float64), True)
    with pytest.raises(InvalidInputError, match="Incorrect buffer size"):
        session.from_buffer(np.zeros(3, dtype=np.float32))

    # UpdateParameter goes straight into the trained values
    bias = state.get_parameter("fc3.bias")
    state.update_parameter("fc3.bias", bias + 1)
    np.testing.assert_array_equal(session.to_buffer(True).numpy()[-3:], bias + 1)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        state.update_parameter("fc3.bias", np.zeros(4, dtype=np.float32))
    with pytest.raises(KeyError):
        state.update_parameter("nope", bias)
    state.update_parameter("fc3.bias", bias)

    # the training loop with a registered scheduler
    session.register_linear_lr_scheduler(2, 6, 0.05)
    assert session.get_learning_rate() == pytest.approx(0.05)
    losses = _train(session, spec, range(1, 5))
    assert all(isinstance(loss, np.ndarray) and loss.shape == () for loss in losses)
    assert session.get_learning_rate() == pytest.approx(0.05 * (6 - 4) / 4)
    trained = session.to_buffer(False).numpy().copy()
    assert not np.array_equal(trained, initial)
    eval_inputs = _inputs(spec, EVAL_SEED_KEY, 0, session.eval_model_input_names())
    eval_loss = session.eval_step(eval_inputs)[0]

    # SaveCheckpoint / LoadCheckpoint: parameters, properties and the optimizer state survive
    path = tmp_path / "checkpoint"
    save_checkpoint(state, path, include_optimizer_state=True)
    reloaded = load_checkpoint(path)
    assert isinstance(reloaded, dropin.CheckpointState)
    assert (reloaded.get_property("epoch"), reloaded.get_property("run")) == (3, "capi")
    for name in order:
        np.testing.assert_array_equal(reloaded.get_parameter(name), state.get_parameter(name))
    assert load_checkpoint_from_buffer(path.read_bytes()).get_property("best_loss") == 0.25
    with _session_from_paths(config, reloaded) as resumed:
        np.testing.assert_array_equal(resumed.to_buffer(False).numpy(), trained)
        assert resumed.eval_step(eval_inputs)[0] == eval_loss
        assert resumed.get_learning_rate() == pytest.approx(0.001)  # the lr itself is not saved (as ORT)

    # ExportModelForInferencing from a session whose eval model came from a buffer
    exported = tmp_path / "inference.onnx"
    session.export_model_for_inferencing(exported, ["y"])
    assert exported.stat().st_size > 0
    session.release()


def test_resume_from_saved_optimizer_state_is_bit_identical(tmp_path):
    """Train 4 steps straight, or 2 + save(include_optimizer_state) + reload + 2: same numbers.

    With the C API's order, a re-registered scheduler holds lr = initial_lr until the first
    SchedulerStep, which then reads the restored optimizer step count."""
    config = "mlp_ce_adamw_op17"
    spec = load_spec(FIXTURES / config)
    straight = _session_from_buffers(config)
    straight.register_linear_lr_scheduler(0, 8, 0.05)
    straight.scheduler_step()
    losses_straight = _train(straight, spec, range(1, 5))

    first = _session_from_buffers(config)
    first.register_linear_lr_scheduler(0, 8, 0.05)
    first.scheduler_step()
    losses = _train(first, spec, range(1, 3))
    save_checkpoint(first.state, tmp_path / "ckpt", include_optimizer_state=True)
    first.release()
    resumed = _session_from_paths(config, load_checkpoint(tmp_path / "ckpt"))
    resumed.register_linear_lr_scheduler(0, 8, 0.05)
    assert resumed.get_learning_rate() == pytest.approx(0.05)
    resumed.scheduler_step()
    assert resumed.get_learning_rate() == straight_lr_at(2, 0, 8, 0.05)
    losses += _train(resumed, spec, range(3, 5))
    np.testing.assert_array_equal(np.array(losses), np.array(losses_straight))
    np.testing.assert_array_equal(resumed.to_buffer(False).numpy(), straight.to_buffer(False).numpy())


def test_export_model_for_inferencing_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    config = "mlp_ce_adamw_op17"
    spec = load_spec(FIXTURES / config)
    loss_name = spec["eval_graph_outputs"][0]
    session = _session_from_buffers(config)
    session.set_learning_rate(0.05)
    _train(session, spec, range(1, 3), scheduler=False)
    x, labels = _inputs(spec, EVAL_SEED_KEY, 0, ["x", "labels"])
    eval_loss = session.eval_step([x, labels])[0]

    both = tmp_path / "with_loss.onnx"
    session.export_model_for_inferencing(both, ["y", loss_name])
    inference = ort.InferenceSession(str(both), providers=["CPUExecutionProvider"])
    assert [i.name for i in inference.get_inputs()] == ["x", "labels"]
    y, loss = inference.run(["y", loss_name], {"x": x, "labels": labels})
    np.testing.assert_allclose(loss, eval_loss, rtol=1e-5, atol=1e-6)

    only_y = tmp_path / "logits.onnx"
    session.export_model_for_inferencing(str(only_y), ["y"])
    inference = ort.InferenceSession(str(only_y), providers=["CPUExecutionProvider"])
    assert [i.name for i in inference.get_inputs()] == ["x"]  # the labels input is pruned
    np.testing.assert_allclose(inference.run(None, {"x": x})[0], y, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="could not be found"):
        session.export_model_for_inferencing(tmp_path / "bad.onnx", ["no_such_output"])


# ----------------------------------------------------------------------------------------
# Learning rate scheduler
# ----------------------------------------------------------------------------------------
def straight_lr_at(s: int, warmup: int, total: int, initial_lr: float) -> float:
    """The documented formula (spec §4), float32 like the C++ scheduler."""
    if s < warmup:
        factor = np.float32(s) / np.float32(max(1, warmup))
    else:
        factor = max(np.float32(0.0), np.float32(total - s) / np.float32(max(1, total - warmup)))
    return float(np.float32(initial_lr) * np.float32(factor))


SCHEDULER_PAIRS = [(2, 6), (0, 5), (3, 3), (4, 2), (5, 10), (0, 0), (1, 1), (20, 4)]


def test_scheduler_lr_sequence_equals_documented_formula():
    """RegisterLinearLRScheduler(W, T, lr): lr == initial_lr right after registering (the C API
    sets the initial lr after creating the scheduler), then after each OptimizerStep +
    SchedulerStep lr == initial_lr * f(s), s = completed optimizer steps."""
    config = "mlp_mse_sgd_op17"
    initial_lr = 0.1
    for warmup, total in SCHEDULER_PAIRS:
        session = _session_from_buffers(config)
        session.set_learning_rate(0.7)
        session.register_linear_lr_scheduler(warmup, total, initial_lr)
        trace = [session.get_learning_rate()]
        for _ in range(max(total, warmup) + 3):
            session.optimizer_step()  # steps on the zero gradients: only the count matters
            session.scheduler_step()
            trace.append(session.get_learning_rate())
        expected = [float(np.float32(initial_lr))] + [
            straight_lr_at(s, warmup, total, initial_lr) for s in range(1, len(trace))
        ]
        np.testing.assert_allclose(trace, expected, rtol=1e-7, atol=0, err_msg=f"W={warmup} T={total}")
        session.release()


def test_scheduler_matches_onnxruntime_traces_and_dropin_scheduler():
    """ORT 1.19's Python LinearLRScheduler(opt, w, t) runs the C++ scheduler with W=t, T=w
    (tests/fixtures/scheduler.npz, recorded with ORT).  The C API passes them correctly, so
    register_linear_lr_scheduler(t, w, lr) must give ORT's trace after the first scheduler
    step; before it, the C API's lr is initial_lr (the Python wrapper's is initial_lr * f(0))."""
    recorded = np.load(FIXTURES / "scheduler.npz")
    config = str(recorded["meta/artifacts_config"])
    for py_warmup, py_total, initial_lr, steps in recorded["meta/cases"]:
        py_warmup, py_total, steps = int(py_warmup), int(py_total), int(steps)
        ort_trace = recorded[f"w{py_warmup}_t{py_total}/lr"]
        session = _session_from_buffers(config)
        session.register_linear_lr_scheduler(py_total, py_warmup, float(initial_lr))
        trace = [session.get_learning_rate()]
        for _ in range(steps):
            session.optimizer_step()
            session.scheduler_step()
            trace.append(session.get_learning_rate())
        assert trace[0] == pytest.approx(initial_lr)
        np.testing.assert_allclose(trace[1:], ort_trace[1:], rtol=1e-6, atol=1e-9)

        # the drop-in API's corrected scheduler uses the same engine call
        state = dropin.CheckpointState.load_checkpoint(FIXTURES / config / "checkpoint")
        module = dropin.Module(FIXTURES / config / "training_model.onnx", state)
        optimizer = dropin.Optimizer(FIXTURES / config / "optimizer_model.onnx", module)
        scheduler = dropin.CorrectedLinearLRScheduler(optimizer, py_total, py_warmup, float(initial_lr))
        dropin_trace = [optimizer.get_learning_rate()]
        for _ in range(steps):
            optimizer.step()
            scheduler.step()
            dropin_trace.append(optimizer.get_learning_rate())
        assert dropin_trace[1:] == trace[1:]


def test_scheduler_rules():
    config = "mlp_mse_sgd_op17"
    session = _session_from_buffers(config)
    with pytest.raises(RuntimeError) as info:
        session.scheduler_step()
    assert str(info.value) == NO_SCHEDULER
    for _ in range(3):
        session.optimizer_step()
    session.register_linear_lr_scheduler(2, 10, 0.5)  # registered late: s = 3 already
    assert session.get_learning_rate() == pytest.approx(0.5)
    session.scheduler_step()
    assert session.get_learning_rate() == straight_lr_at(3, 2, 10, 0.5)
    session.scheduler_step()  # no optimizer step in between: same lr
    assert session.get_learning_rate() == straight_lr_at(3, 2, 10, 0.5)
    session.set_learning_rate(0.9)  # SetLearningRate is overwritten by the next SchedulerStep
    assert session.get_learning_rate() == pytest.approx(0.9)
    session.scheduler_step()
    assert session.get_learning_rate() == straight_lr_at(3, 2, 10, 0.5)
    with pytest.raises(TypeError):
        session.register_linear_lr_scheduler(1.5, 10, 0.5)
    # A negative count is accepted, as by ORT's C API (its C++ scheduler has no check; measured on
    # onnxruntime-training 1.19.2: warmup -1, total 10, lr 0.5 gives 0.5 * 10 / 11 at step 0).
    session.register_linear_lr_scheduler(-1, 10, 0.5)
    session.scheduler_step()
    assert session.get_learning_rate() == straight_lr_at(3, -1, 10, 0.5) == pytest.approx(0.5 * 7 / 11)


# ----------------------------------------------------------------------------------------
# Inputs, outputs, optional models, nominal checkpoints
# ----------------------------------------------------------------------------------------
def test_input_and_output_kinds():
    config = "mlp_ce_adamw_op17"
    spec = load_spec(FIXTURES / config)
    session = _session_from_buffers(config)
    x, labels = _inputs(spec, 1, 1, ["x", "labels"])
    as_numpy = session.eval_step([x, labels])
    assert isinstance(as_numpy, list) and isinstance(as_numpy[0], np.ndarray)
    as_ortvalue = session.eval_step(
        [dropin.OrtValue.ortvalue_from_numpy(x), dropin.OrtValue.ortvalue_from_numpy(labels)]
    )
    assert isinstance(as_ortvalue[0], dropin.OrtValue)
    as_torch = session.eval_step((torch.from_numpy(x), torch.from_numpy(labels)))
    assert isinstance(as_torch[0], torch.Tensor)
    by_name = session.eval_step({"labels": labels, "x": x})
    assert as_numpy[0] == as_ortvalue[0].numpy() == as_torch[0].item() == by_name[0]
    outputs = session.train_step([x, labels])
    assert isinstance(outputs, list) and len(outputs) == session.training_model_output_count()
    with pytest.raises(InvalidInputError):
        session.train_step([x])
    with pytest.raises(InvalidInputError):
        session.train_step([x.astype(np.float64), labels])
    with pytest.raises(InvalidInputError, match="missing"):
        session.train_step({"x": x})
    assert session.eval_step(v for v in (x, labels))[0] == as_numpy[0]  # any iterable of inputs
    with pytest.raises(InvalidInputError):
        session.eval_step(x)  # a single value is one input; this model needs two
    with pytest.raises(TypeError):
        session.eval_step(42)
    # CopyParametersToBuffer into caller-owned OrtValue / torch buffers, in place
    size = session.get_parameters_size(False)
    expected = session.to_buffer(False).numpy()
    ortvalue = dropin.OrtValue.ortvalue_from_shape_and_type([size], np.float32)
    assert session.copy_parameters_to_buffer(False, buffer=ortvalue) is ortvalue
    np.testing.assert_array_equal(ortvalue.numpy(), expected)
    tensor = torch.empty(size // 5, 5)
    session.copy_parameters_to_buffer(False, tensor)
    np.testing.assert_array_equal(tensor.reshape(-1).numpy(), expected)
    with pytest.raises(TypeError, match="trainable_only must be a bool"):
        session.copy_parameters_to_buffer(np.zeros(size, np.float32), False)  # the C argument order
    with pytest.raises(InvalidInputError):
        session.copy_parameters_to_buffer(False, buffer=np.zeros(size, np.float64))
    with pytest.raises(InvalidInputError, match="size incorrect"):
        session.copy_parameters_to_buffer(False, buffer=np.zeros(size - 1, np.float32))


def test_optional_eval_and_optimizer_models(tmp_path):
    config = "mlp_ce_adamw_op17"
    spec = load_spec(FIXTURES / config)
    f = _files(config)
    session = TrainingSession(load_checkpoint_from_buffer(f["checkpoint"]), f["training_model.onnx"])
    inputs = _inputs(spec, 1, 1, ["x", "labels"])
    assert session.train_step(inputs)[0].shape == ()
    assert session.eval_model_input_names() == [] == session.eval_model_output_names()
    assert session.eval_model_input_count() == 0 == session.eval_model_output_count()
    with pytest.raises(ModelLoadError, match="Eval model was not provided"):
        session.eval_step(inputs)
    with pytest.raises(ModelLoadError, match="Eval model was not provided"):
        session.export_model_for_inferencing(tmp_path / "m.onnx", ["y"])
    for call, args in [
        ("optimizer_step", ()),
        ("set_learning_rate", (0.1,)),
        ("get_learning_rate", ()),
        ("register_linear_lr_scheduler", (1, 2, 0.1)),
    ]:
        with pytest.raises(ModelLoadError, match="No optimizer model"):
            getattr(session, call)(*args)
    with pytest.raises(TypeError):
        TrainingSession(session.state, 42)
    with pytest.raises(TypeError):
        TrainingSession("not a state", f["training_model.onnx"])


def test_nominal_checkpoint_completed_from_buffer():
    config = "cnn_mse_sgd_nominal_op17"
    spec = load_spec(FIXTURES / config)
    d = FIXTURES / config
    full = _session_from_paths(config)
    buffer = full.to_buffer(False)
    nominal = TrainingSession(
        load_checkpoint(d / "nominal_checkpoint"),
        d / "training_model.onnx",
        d / "eval_model.onnx",
        d / "optimizer_model.onnx",
    )
    assert nominal.get_parameters_size(False) == full.get_parameters_size(False)
    inputs = _inputs(spec, 1, 1, nominal.training_model_input_names())
    with pytest.raises(NominalStateError):
        nominal.train_step(inputs)
    with pytest.raises(NominalStateError):
        nominal.copy_buffer_to_parameters(full.to_buffer(True), trainable_only=True)
    nominal.from_buffer(buffer)  # all-parameters size: trainable_only=False, completes the state
    np.testing.assert_array_equal(nominal.train_step(inputs)[0], full.train_step(inputs)[0])


# ----------------------------------------------------------------------------------------
# set_seed
# ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dropout_artifacts(tmp_path_factory) -> pathlib.Path:
    committed = FIXTURES / "dropout"
    if (committed / "training_model.onnx").exists():
        return committed
    pytest.importorskip("onnxruntime.training")
    import importlib.util

    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "make_dropout_fixture.py"
    module_spec = importlib.util.spec_from_file_location("make_dropout_fixture", script)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.generate(tmp_path_factory.mktemp("dropout"))


def _dropout_run(directory: pathlib.Path, seed: int) -> tuple:
    set_seed(seed)
    state = load_checkpoint(directory / "checkpoint")
    session = TrainingSession(
        state, directory / "training_model.onnx", directory / "eval_model.onnx", directory / "optimizer_model.onnx"
    )
    rng = np.random.default_rng(0)  # the data is fixed; only the dropout masks depend on the seed
    x = rng.standard_normal((4, 6)).astype(np.float32)
    target = rng.standard_normal((4, 3)).astype(np.float32)
    session.set_learning_rate(0.01)
    losses = []
    for _ in range(3):
        losses.append(float(session.train_step([x, target])[0]))
        session.optimizer_step()
        session.lazy_reset_grad()
    evals = [float(session.eval_step([x, target])[0]) for _ in range(2)]
    return losses, session.to_buffer(False).numpy().copy(), evals


def test_set_seed_makes_dropout_reproducible(dropout_artifacts):
    losses_a, params_a, evals_a = _dropout_run(dropout_artifacts, 1234)
    losses_b, params_b, evals_b = _dropout_run(dropout_artifacts, 1234)
    assert losses_a == losses_b
    np.testing.assert_array_equal(params_a, params_b)
    assert evals_a[0] == evals_a[1]  # eval runs the graph with dropout off
    losses_c, params_c, _ = _dropout_run(dropout_artifacts, 4321)
    assert losses_c != losses_a  # different masks
    assert not np.array_equal(params_c, params_a)


def test_set_seed_seeds_numpy_and_validates():
    set_seed(7)
    first = (np.random.rand(3), torch.rand(3))
    set_seed(7)
    second = (np.random.rand(3), torch.rand(3))
    np.testing.assert_array_equal(first[0], second[0])
    assert torch.equal(first[1], second[1])
    set_seed(-5)  # any int64, as the C API's int64_t
    set_seed(2**63 - 1)
    with pytest.raises(ValueError):
        set_seed(2**63)
    with pytest.raises(TypeError):
        set_seed(1.5)


# ----------------------------------------------------------------------------------------
# Lifecycle
# ----------------------------------------------------------------------------------------
def test_release_and_context_manager(tmp_path):
    config = "mlp_ce_adamw_op17"
    spec = load_spec(FIXTURES / config)
    inputs = _inputs(spec, 1, 1, ["x", "labels"])
    with _session_from_buffers(config) as session:
        session.train_step(inputs)
        state = session.state
    assert session.released
    calls = {
        "train_step": (inputs,),
        "eval_step": (inputs,),
        "lazy_reset_grad": (),
        "optimizer_step": (),
        "set_learning_rate": (0.1,),
        "get_learning_rate": (),
        "register_linear_lr_scheduler": (1, 2, 0.1),
        "scheduler_step": (),
        "get_parameters_size": (True,),
        "copy_parameters_to_buffer": (True,),
        "to_buffer": (True,),
        "copy_buffer_to_parameters": (np.zeros(215, np.float32), True),
        "from_buffer": (np.zeros(215, np.float32),),
        "export_model_for_inferencing": (str(tmp_path / "m.onnx"), ["y"]),
        "training_model_input_names": (),
        "training_model_output_names": (),
        "eval_model_input_names": (),
        "eval_model_output_names": (),
        "training_model_input_count": (),
        "training_model_output_count": (),
        "eval_model_input_count": (),
        "eval_model_output_count": (),
        "input_names": (True,),
        "output_names": (False,),
    }
    for name, args in calls.items():
        with pytest.raises(ReleasedError) as info:
            getattr(session, name)(*args)
        message = str(info.value)
        assert "TrainingSession" in message and "released" in message and f"{name}()" in message, message
    with pytest.raises(ReleasedError):
        session.state
    with pytest.raises(ReleasedError):
        with session:
            pass
    session.release()  # idempotent, like Dispose()
    assert "released" in repr(session)
    # the state outlives its session (ReleaseTrainingSession does not release the checkpoint)
    save_checkpoint(state, tmp_path / "after_release")
    again = _session_from_paths(config, load_checkpoint(tmp_path / "after_release"))
    assert again.train_step(inputs)[0].shape == ()
    again.release()


# ----------------------------------------------------------------------------------------
# Module-level functions and documentation
# ----------------------------------------------------------------------------------------
def test_checkpoint_functions(tmp_path):
    data = (FIXTURES / "mlp_ce_adamw_op17" / "checkpoint").read_bytes()
    state = load_checkpoint_from_buffer(bytearray(data))
    assert (
        isinstance(state, ort_torch_compat.CheckpointState)
        and ort_torch_compat.CheckpointState is dropin.CheckpointState
    )
    assert isinstance(load_checkpoint_from_buffer(memoryview(data)), dropin.CheckpointState)
    with pytest.raises(TypeError, match="load_checkpoint_from_buffer"):
        load_checkpoint(data)
    with pytest.raises(TypeError):
        load_checkpoint_from_buffer(str(FIXTURES / "mlp_ce_adamw_op17" / "checkpoint"))
    with pytest.raises(TypeError):
        save_checkpoint(object(), tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing")
    save_checkpoint(state, tmp_path / "a")
    dropin.CheckpointState.save_checkpoint(load_checkpoint(tmp_path / "a"), tmp_path / "b")
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


C_API_NAMES = {
    "train_step": "TrainStep",
    "eval_step": "EvalStep",
    "lazy_reset_grad": "LazyResetGrad",
    "optimizer_step": "OptimizerStep",
    "set_learning_rate": "SetLearningRate",
    "get_learning_rate": "GetLearningRate",
    "register_linear_lr_scheduler": "RegisterLinearLRScheduler",
    "scheduler_step": "SchedulerStep",
    "get_parameters_size": "GetParametersSize",
    "copy_parameters_to_buffer": "CopyParametersToBuffer",
    "copy_buffer_to_parameters": "CopyBufferToParameters",
    "to_buffer": "ToBuffer",
    "from_buffer": "FromBuffer",
    "export_model_for_inferencing": "ExportModelForInferencing",
    "training_model_input_names": "TrainingSessionGetTrainingModelInputName",
    "training_model_output_names": "TrainingSessionGetTrainingModelOutputName",
    "eval_model_input_names": "TrainingSessionGetEvalModelInputName",
    "eval_model_output_names": "TrainingSessionGetEvalModelOutputName",
    "training_model_input_count": "TrainingSessionGetTrainingModelInputCount",
    "training_model_output_count": "TrainingSessionGetTrainingModelOutputCount",
    "eval_model_input_count": "TrainingSessionGetEvalModelInputCount",
    "eval_model_output_count": "TrainingSessionGetEvalModelOutputCount",
    "input_names": "InputNames",
    "output_names": "OutputNames",
    "release": "ReleaseTrainingSession",
}


def test_docstrings_and_docs_name_the_c_api_functions():
    for method, c_name in C_API_NAMES.items():
        assert c_name in inspect.getdoc(getattr(TrainingSession, method)), method
    for function, c_name in [
        (load_checkpoint, "LoadCheckpoint"),
        (load_checkpoint_from_buffer, "LoadCheckpointFromBuffer"),
        (save_checkpoint, "SaveCheckpoint"),
        (set_seed, "SetSeed"),
    ]:
        assert c_name in inspect.getdoc(function)
    assert "CreateTrainingSessionFromBuffer" in inspect.getdoc(TrainingSession)
    doc = pathlib.Path(__file__).resolve().parents[1] / "docs" / "c_api.md"
    if doc.exists():
        text = doc.read_text()
        for name in C_API_NAMES.values():  # C API, C# and Objective-C names
            assert name in text, name
        c_api = [n for n in C_API_NAMES.values() if n not in ("ToBuffer", "FromBuffer", "InputNames", "OutputNames")]
        for c_name in c_api + [
            "LoadCheckpoint",
            "LoadCheckpointFromBuffer",
            "SaveCheckpoint",
            "SetSeed",
            "AddProperty",
            "GetProperty",
            "UpdateParameter",
            "GetParameter",
            "GetParameterTypeAndShape",
            "CreateTrainingSession",
            "CreateTrainingSessionFromBuffer",
            "ReleaseCheckpointState",
        ]:
            assert f"`{c_name}`" in text, c_name  # a row (or the index-name paragraph) of the mapping
