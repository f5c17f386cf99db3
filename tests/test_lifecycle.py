"""Checkpoint lifecycle and hand-off between ONNX Runtime and ort_torch_compat (issue 4).

Each resume test splits the standard scenario at step 2 with a checkpoint and compares the
resumed steps 3-5 with ORT's uninterrupted run (tests/fixtures/<config>/expected.npz).
Tests marked `live` also drive onnxruntime-training itself and skip where it is absent.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ort_torch_compat.api as ours
from ort_torch_compat.errors import ModelLoadError, NominalStateError
from ort_torch_compat.testing.lifecycle import train_steps
from ort_torch_compat.testing.scenario import compare, make_batch
from tests.conftest import FIXTURES, load_spec

RESUME_CONFIGS = ["mlp_ce_adamw_op17", "cnn_mse_sgd_op17", "transformer_ce_adamw_op17"]
PROPERTIES = {"epoch": 2, "best_loss": float(np.float32(0.25)), "run": "ort-1.19.2"}
TOL = dict(rtol=1e-4, atol=2e-5)


def open_run(api, directory, checkpoint):
    spec = load_spec(directory)
    state = api.CheckpointState.load_checkpoint(str(checkpoint))
    module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(float(spec["lr"]))  # ORT does not persist the lr
    return spec, state, module, optimizer


def expected_steps(directory, first, last):
    expected = np.load(directory / "expected.npz")
    keep = tuple(f"step{k}/" for k in range(first, last + 1))
    return {k: expected[k] for k in expected.files if k.startswith(keep) and ("/loss" in k or "/param/" in k)}


def train_here_and_save(directory, path):
    spec, state, module, optimizer = open_run(ours, directory, directory / "checkpoint")
    train_steps(state, module, optimizer, spec, 1, 2)
    for name, value in PROPERTIES.items():
        state.properties[name] = value
    ours.CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)


@pytest.mark.parametrize("config", RESUME_CONFIGS)
def test_resume_here_from_ort_checkpoint(config):
    directory = FIXTURES / config
    spec, state, module, optimizer = open_run(ours, directory, directory / "ort_after_step2.ckpt")
    assert dict(state.properties) == PROPERTIES
    problems = compare(expected_steps(directory, 3, 5), train_steps(state, module, optimizer, spec, 3, 5), **TOL)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("config", RESUME_CONFIGS)
def test_save_here_resume_here_equals_uninterrupted_ort(config, tmp_path):
    directory = FIXTURES / config
    train_here_and_save(directory, tmp_path / "ckpt")
    spec, state, module, optimizer = open_run(ours, directory, tmp_path / "ckpt")
    assert dict(state.properties) == PROPERTIES
    problems = compare(expected_steps(directory, 3, 5), train_steps(state, module, optimizer, spec, 3, 5), **TOL)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("config", RESUME_CONFIGS)
def test_ort_resumes_from_our_checkpoint(config, tmp_path, ort_api):
    directory = FIXTURES / config
    train_here_and_save(directory, tmp_path / "ckpt")
    spec, state, module, optimizer = open_run(ort_api, directory, tmp_path / "ckpt")
    assert dict(state.properties) == PROPERTIES
    problems = compare(expected_steps(directory, 3, 5), train_steps(state, module, optimizer, spec, 3, 5), **TOL)
    assert not problems, "\n".join(problems)


def test_checkpoint_without_optimizer_state_restarts_moments(tmp_path):
    directory = FIXTURES / "mlp_ce_adamw_op17"
    spec, state, module, optimizer = open_run(ours, directory, directory / "checkpoint")
    train_steps(state, module, optimizer, spec, 1, 2)
    ours.CheckpointState.save_checkpoint(state, tmp_path / "ckpt")  # include_optimizer_state=False
    spec, state, module, optimizer = open_run(ours, directory, tmp_path / "ckpt")
    resumed = train_steps(state, module, optimizer, spec, 3, 3)
    assert compare(expected_steps(directory, 3, 3), resumed, **TOL)  # differs: moments restarted


def test_learning_rate_is_not_persisted(tmp_path):
    directory = FIXTURES / "mlp_ce_adamw_op17"
    _, state, _, optimizer = open_run(ours, directory, directory / "checkpoint")
    optimizer.set_learning_rate(0.5)
    ours.CheckpointState.save_checkpoint(state, tmp_path / "ckpt", include_optimizer_state=True)
    _, _, _, reloaded = open_run(ours, directory, tmp_path / "ckpt")
    reloaded_state = ours.CheckpointState.load_checkpoint(tmp_path / "ckpt")
    module = ours.Module(directory / "training_model.onnx", reloaded_state)
    assert ours.Optimizer(directory / "optimizer_model.onnx", module).get_learning_rate() == pytest.approx(0.001)


# ---- nominal checkpoints ----------------------------------------------------------------------
NOMINAL = FIXTURES / "mlp_mse_adamw_nominal_op17"


def test_nominal_state_needs_parameters_first():
    state = ours.CheckpointState.load_checkpoint(NOMINAL / "nominal_checkpoint")
    assert len(state.parameters) == len(load_spec(NOMINAL)["param_order"]) and "fc1.weight" in state.parameters
    with pytest.raises(NominalStateError, match="nominal state"):
        state.parameters["fc1.weight"]
    module = ours.Module(NOMINAL / "training_model.onnx", state, NOMINAL / "eval_model.onnx")
    optimizer = ours.Optimizer(NOMINAL / "optimizer_model.onnx", module)  # constructs, as in ORT
    spec = load_spec(NOMINAL)
    inputs = [make_batch(spec, 1, 1)[i["name"]] for i in spec["inputs"]]
    with pytest.raises(NominalStateError, match="TrainStep with a nominal state"):
        module(*inputs)
    with pytest.raises(NominalStateError, match="nominal checkpoint state"):
        module.get_contiguous_parameters()
    size = module.get_parameters_size(False)
    with pytest.raises(NominalStateError, match="trainable_only = false"):
        module.copy_buffer_to_parameters(np.zeros(size, np.float32), trainable_only=True)
    real = ours.CheckpointState.load_checkpoint(NOMINAL / "checkpoint")
    buffer = ours.Module(NOMINAL / "training_model.onnx", real).get_contiguous_parameters(trainable_only=False)
    module.copy_buffer_to_parameters(buffer, trainable_only=False)
    module(*inputs)
    optimizer.step()
    np.testing.assert_array_equal(state.parameters["fc1.bias"].grad.shape, real.parameters["fc1.bias"].data.shape)


# ---- export ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "config,outputs", [("mlp_ce_adamw_op17", None), ("cnn_mse_sgd_op17", None), ("transformer_ce_adamw_op17", None)]
)
def test_exported_model_runs_in_inference_session(config, outputs, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    directory = FIXTURES / config
    spec, state, module, optimizer = open_run(ours, directory, directory / "checkpoint")
    train_steps(state, module, optimizer, spec, 1, 2)
    model_outputs = spec["export"]["output_names"]
    path = tmp_path / "inference.onnx"
    module.export_model_for_inferencing(path, model_outputs)
    exported = onnx.load(str(path))
    assert [o.name for o in exported.graph.output] == model_outputs
    param_names = set(spec["param_order"])
    assert not param_names & {i.name for i in exported.graph.input}  # weights embedded
    assert param_names <= {i.name for i in exported.graph.initializer}
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    batch = make_batch(spec, 1000, 0)
    feeds = {i.name: batch[i.name] for i in session.get_inputs()}
    ours_out = session.run(None, feeds)[0]
    # the same weights through our eval path, cut to the model output
    module.export_model_for_inferencing(tmp_path / "again.onnx", model_outputs)
    again = onnxruntime.InferenceSession(str(tmp_path / "again.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(ours_out, again.run(None, feeds)[0])
    module.eval()
    loss_here = module(*[batch[n] for n in spec.get("eval_inputs", [i["name"] for i in spec["inputs"]])])
    assert np.isfinite(loss_here).all()


def test_export_inputs_outputs_match_ort(tmp_path, ort_api):
    directory = FIXTURES / "mlp_ce_adamw_op17"
    spec = load_spec(directory)
    outputs = spec["export"]["output_names"]
    for api, name in ((ours, "ours.onnx"), (ort_api, "ort.onnx")):
        _, state, module, _ = open_run(api, directory, directory / "checkpoint")
        module.export_model_for_inferencing(str(tmp_path / name), outputs)
    mine, theirs = onnx.load(str(tmp_path / "ours.onnx")), onnx.load(str(tmp_path / "ort.onnx"))
    assert [i.name for i in mine.graph.input] == [i.name for i in theirs.graph.input]
    assert [o.name for o in mine.graph.output] == [o.name for o in theirs.graph.output]
    params = set(spec["param_order"])  # ORT also turns Constant nodes into initializers
    assert params <= {i.name for i in mine.graph.initializer} and params <= {i.name for i in theirs.graph.initializer}
    import onnxruntime

    batch = make_batch(spec, 1000, 0)
    results = []
    for name in ("ours.onnx", "ort.onnx"):
        session = onnxruntime.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"])
        results.append(session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})[0])
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-7)


def test_export_without_eval_model_is_a_clear_error(tmp_path):
    directory = FIXTURES / "mlp_ce_adamw_op17"
    state = ours.CheckpointState.load_checkpoint(directory / "checkpoint")
    module = ours.Module(directory / "training_model.onnx", state)
    with pytest.raises(ModelLoadError, match="Eval model was not provided"):
        module.export_model_for_inferencing(tmp_path / "x.onnx", ["y"])
    module = ours.Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")
    with pytest.raises(ValueError, match="non empty"):
        module.export_model_for_inferencing(tmp_path / "x.onnx", [])
    with pytest.raises(ValueError, match="nope could not be found"):
        module.export_model_for_inferencing(tmp_path / "x.onnx", ["nope"])


# ---- external data -------------------------------------------------------------------------------
def test_external_data_sticks_to_the_state(tmp_path, monkeypatch):
    """A state loaded from an external-data checkpoint is saved with external data (ORT rule)."""
    from ort_torch_compat.codec import read_checkpoint, write_checkpoint

    directory = FIXTURES / "mlp_ce_adamw_op17"
    record = read_checkpoint(str(directory / "checkpoint"))
    write_checkpoint(record, str(tmp_path / "external"), external_min_bytes=64)  # ORT's artifact-writer layout
    assert (tmp_path / "external.data").exists()
    spec, state, module, optimizer = open_run(ours, directory, tmp_path / "external")
    train_steps(state, module, optimizer, spec, 1, 2)
    ours.CheckpointState.save_checkpoint(state, tmp_path / "resaved", include_optimizer_state=True)
    assert (tmp_path / "resaved.data").stat().st_size > 0
    spec, state, module, optimizer = open_run(ours, directory, tmp_path / "resaved")
    problems = compare(expected_steps(directory, 3, 5), train_steps(state, module, optimizer, spec, 3, 5), **TOL)
    assert not problems, "\n".join(problems)


def test_ort_loads_our_external_data_checkpoint(tmp_path, ort_api):
    from ort_torch_compat.codec import read_checkpoint, write_checkpoint

    directory = FIXTURES / "mlp_ce_adamw_op17"
    write_checkpoint(read_checkpoint(str(directory / "checkpoint")), str(tmp_path / "external"), external_min_bytes=64)
    theirs = ort_api.CheckpointState.load_checkpoint(str(tmp_path / "external"))
    mine = ours.CheckpointState.load_checkpoint(directory / "checkpoint")
    for name, param in mine.parameters:
        np.testing.assert_array_equal(theirs.parameters[name].data, param.data)
