"""Drop-in API semantics that ORT 1.19.2 defines beyond plain numbers (spec §1.8-§4, §7)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ort_torch_compat.api as api
from ort_torch_compat.graph import UnsupportedOperatorError
from ort_torch_compat.testing.scenario import make_batch, run_scheduler_scenario
from tests.conftest import FIXTURES, load_spec

MLP = FIXTURES / "mlp_ce_adamw_op17"
FROZEN = FIXTURES / "frozen_ce_sgd_op17"


def build(directory, with_eval=True, checkpoint="checkpoint"):
    state = api.CheckpointState.load_checkpoint(directory / checkpoint)
    module = api.Module(directory / "training_model.onnx", state, directory / "eval_model.onnx" if with_eval else None)
    return state, module


def batch(directory, k=1, j=1):
    spec = load_spec(directory)
    data = make_batch(spec, k, j)
    return [data[i["name"]] for i in spec["inputs"]]


# ---- properties ---------------------------------------------------------------------------
def test_properties_follow_ort_types():
    state = api.CheckpointState.load_checkpoint(MLP / "checkpoint")
    props = state.properties
    props["i"], props["f"], props["s"], props["b"] = 7, 0.1, "text", True
    assert props["i"] == 7 and isinstance(props["i"], int)
    assert props["f"] == float(np.float32(0.1)) != 0.1  # stored as float32, like ORT
    assert props["s"] == "text" and props["b"] == 1
    props["i"] = "now a string"  # same name: value and type replaced
    assert props["i"] == "now a string"
    props["big"] = 2**70  # overflows int64: ORT stores a float32
    assert isinstance(props["big"], float)
    assert "f" in props and "zz" not in props and len(props) == 5
    assert [name for name, _ in props] == sorted(["i", "f", "s", "b", "big"])
    with pytest.raises(KeyError, match="Property zz not found."):
        props["zz"]
    with pytest.raises(TypeError, match="'bad'.*list"):
        props["bad"] = [1, 2]


# ---- parameters -------------------------------------------------------------------------------
def test_parameters_mapping_behaviour():
    state = api.CheckpointState.load_checkpoint(FROZEN / "checkpoint")
    params = state.parameters
    names = [name for name, _ in params]
    assert names == sorted(names) and len(params) == len(names)
    assert "fc1.weight" in params and "nope" not in params
    with pytest.raises(KeyError, match="Parameter nope not found."):
        params["nope"]
    with pytest.raises(KeyError):
        params["nope"] = np.zeros(1, np.float32)
    p = params["fc2.weight"]
    assert repr(p) == "Parameter(name=fc2.weight, requires_grad=False)"
    assert p.grad is None  # no Module yet
    with pytest.raises(RuntimeError, match="shape mismatch"):
        params["fc1.bias"] = np.zeros(1000, np.float32)
    with pytest.raises(RuntimeError, match="type mismatch"):
        params["fc1.bias"] = np.zeros(params["fc1.bias"].data.shape, np.float64)
    new = np.arange(params["fc1.bias"].data.size, dtype=np.float32)
    params["fc1.bias"] = new
    np.testing.assert_array_equal(params["fc1.bias"].data, new)


def test_parameter_data_is_a_copy_and_assignment_reaches_the_module():
    state, module = build(MLP)
    snapshot = state.parameters["fc3.bias"].data
    snapshot[:] = 123.0
    assert not np.any(state.parameters["fc3.bias"].data == 123.0)
    state.parameters["fc3.bias"].data = np.full_like(snapshot, 5.0)
    buffer = module.get_contiguous_parameters().numpy()
    assert np.all(buffer[-snapshot.size :] == 5.0)  # fc3.bias is last in graph order


# ---- gradients: InPlaceAccumulatorV2 ------------------------------------------------------------
def test_gradient_accumulation_and_lazy_reset():
    state, module = build(MLP)
    x1, x2 = batch(MLP, 1), batch(MLP, 2)
    assert np.all(state.parameters["fc1.weight"].grad == 0)  # zeroed buffers exist before training
    module(*x1)
    g1 = state.parameters["fc1.weight"].grad
    module(*x2)
    g12 = state.parameters["fc1.weight"].grad
    module.lazy_reset_grad()
    module(*x2)
    g2 = state.parameters["fc1.weight"].grad
    np.testing.assert_allclose(g12, g1 + g2, rtol=1e-6, atol=1e-7)
    module.lazy_reset_grad()  # lazy: nothing is cleared until the next train step
    np.testing.assert_array_equal(state.parameters["fc1.weight"].grad, g2)
    module.eval()
    module(*x1)  # eval never touches gradients
    np.testing.assert_array_equal(state.parameters["fc1.weight"].grad, g2)


def test_frozen_parameters_have_no_gradient_and_do_not_move():
    state, module = build(FROZEN)
    optimizer = api.Optimizer(FROZEN / "optimizer_model.onnx", module)
    before = state.parameters["fc2.weight"].data
    module(*batch(FROZEN))
    optimizer.step()
    assert state.parameters["fc2.weight"].grad is None
    np.testing.assert_array_equal(state.parameters["fc2.weight"].data, before)
    assert state.parameters["fc1.weight"].grad is not None


def test_optimizer_step_reuses_gradients_until_next_train_step():
    state, module = build(FIXTURES / "mlp_mse_sgd_op17")
    optimizer = api.Optimizer(FIXTURES / "mlp_mse_sgd_op17" / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.1)
    module(*batch(FIXTURES / "mlp_mse_sgd_op17"))
    w0 = state.parameters["fc1.weight"].data
    grad = state.parameters["fc1.weight"].grad
    optimizer.step()
    optimizer.step()  # SGD: w - 2*lr*g, the same gradient twice
    np.testing.assert_allclose(
        state.parameters["fc1.weight"].data, w0 - 2 * np.float32(0.1) * grad, rtol=1e-6, atol=1e-7
    )


# ---- buffers ------------------------------------------------------------------------------------
def test_contiguous_buffer_defaults_and_errors():
    state, module = build(FROZEN)
    everything = module.get_contiguous_parameters()  # default trainable_only=False
    assert everything.numpy().shape == (module.get_parameters_size(False),)
    assert module.get_parameters_size() < module.get_parameters_size(False)
    with pytest.raises(RuntimeError, match="Parameters buffer size incorrect"):
        module.copy_buffer_to_parameters(everything)  # the ORT pitfall: defaults differ
    module.copy_buffer_to_parameters(everything, trainable_only=False)
    trainable = module.get_contiguous_parameters(trainable_only=True).numpy()
    module.copy_buffer_to_parameters(trainable.reshape(1, -1) * 0)  # any rank with the right count
    assert not module.get_contiguous_parameters(trainable_only=True).numpy().any()
    with pytest.raises(RuntimeError, match="Tensor type mismatch"):
        module.copy_buffer_to_parameters(trainable.astype(np.float64))


# ---- names --------------------------------------------------------------------------------------
def test_names_follow_mode_and_missing_eval_model():
    _, module = build(MLP, with_eval=False)
    assert module.input_names() == ["x", "labels"]
    assert module.output_names() == ["onnx::loss::2"]
    module.eval()
    assert module.input_names() == [] and module.output_names() == []
    with pytest.raises(RuntimeError, match="Eval model was not provided"):
        module(*batch(MLP))  # ORT segfaults here


def test_train_step_without_eval_model_matches_with_eval_model():
    _, with_eval = build(MLP)
    _, without = build(MLP, with_eval=False)
    inputs = batch(MLP)
    np.testing.assert_array_equal(with_eval(*inputs), without(*inputs))


def test_models_from_bytes():
    state = api.CheckpointState.load_checkpoint((MLP / "checkpoint").read_bytes())
    module = api.Module((MLP / "training_model.onnx").read_bytes(), state, (MLP / "eval_model.onnx").read_bytes())
    api.Optimizer((MLP / "optimizer_model.onnx").read_bytes(), module).step()


def test_torch_and_ortvalue_inputs_return_the_same_kind():
    import torch

    _, module = build(MLP)
    inputs = batch(MLP)
    loss_np = module(*inputs)
    loss_t = module(*[torch.from_numpy(i) for i in inputs])
    loss_ov = module(*[api.OrtValue.ortvalue_from_numpy(i) for i in inputs])
    assert isinstance(loss_np, np.ndarray) and loss_np.shape == ()
    assert isinstance(loss_t, torch.Tensor) and isinstance(loss_ov, api.OrtValue)
    assert float(loss_t) == float(loss_np) == float(loss_ov.numpy())


# ---- unsupported operators ------------------------------------------------------------------
def test_every_unsupported_operator_is_listed_at_module_creation(tmp_path):
    model = onnx.load(str(MLP / "training_model.onnx"))
    for node in model.graph.node:
        if node.op_type == "Gemm" and node.input[1] == "fc1.weight":
            node.op_type, node.domain = "MysteryGemm", "com.example"
        if node.op_type == "Tanh":
            node.op_type = "Tanhh"
    model.opset_import.add(domain="com.example", version=3)
    onnx.save(model, str(tmp_path / "training_model.onnx"))
    state = api.CheckpointState.load_checkpoint(MLP / "checkpoint")
    with pytest.raises(UnsupportedOperatorError) as info:
        api.Module(tmp_path / "training_model.onnx", state)
    assert ("com.example", "MysteryGemm", 3) in info.value.missing
    assert any(op == "Tanhh" for _, op, _ in info.value.missing)
    assert "MysteryGemm" in str(info.value) and "Tanhh" in str(info.value)


# ---- scheduler ------------------------------------------------------------------------------
SCHEDULER = np.load(FIXTURES / "scheduler.npz") if (FIXTURES / "scheduler.npz").exists() else None


@pytest.mark.skipif(SCHEDULER is None, reason="scheduler fixture missing")
@pytest.mark.parametrize(
    "case", [] if SCHEDULER is None else [k[: -len("/lr")] for k in SCHEDULER.files if k.endswith("/lr")]
)
def test_linear_scheduler_reproduces_ort_quirk(case):
    warmup, total, initial_lr, steps = SCHEDULER[f"{case}/args"]
    directory = FIXTURES / str(SCHEDULER["meta/artifacts_config"])
    trace = run_scheduler_scenario(api, directory, int(warmup), int(total), float(initial_lr), int(steps))
    np.testing.assert_allclose(trace["lr"], SCHEDULER[f"{case}/lr"], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("warmup,total", [(2, 6), (0, 5), (3, 3), (5, 10), (20, 4)])
def test_corrected_scheduler_follows_the_documented_formula(warmup, total):
    directory = FIXTURES / "mlp_mse_sgd_op17"
    state, module = build(directory)
    optimizer = api.Optimizer(directory / "optimizer_model.onnx", module)
    scheduler = api.CorrectedLinearLRScheduler(optimizer, warmup, total, 0.1)
    for completed in range(12):
        factor = (
            completed / max(1, warmup) if completed < warmup else max(0.0, (total - completed) / max(1, total - warmup))
        )
        assert optimizer.get_learning_rate() == pytest.approx(0.1 * factor, rel=1e-6, abs=1e-9)
        optimizer.step()
        scheduler.step()
