"""State conversion (to-torch / from-torch) and to_torch_module."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch

from ort_torch_compat.api import CheckpointState, Module
from ort_torch_compat.cli import main
from ort_torch_compat.engine import TrainingState, load_state
from ort_torch_compat.engine.state import ParameterSlot
from ort_torch_compat.migrate import (
    MigrationError,
    OrtTorchModule,
    describe_checkpoint,
    load_tensor_file,
    model_outputs,
    state_to_tensors,
    tensors_to_state,
    to_torch_module,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
CODEC = ROOT / "tests" / "fixtures" / "codec"
FIXTURES = ROOT / "tests" / "fixtures"
ROUND_TRIP = [
    "state_adamw_checkpoint",
    "state_sgd_checkpoint",
    "state_properties_checkpoint",
    "state_dtypes_checkpoint",
    "state_external_checkpoint",
    "artifact_checkpoint",
]


def _reference_save(source: pathlib.Path, target: pathlib.Path) -> None:
    """What ORT's CheckpointState.save_checkpoint writes for the loaded state."""
    CheckpointState.save_checkpoint(CheckpointState.load_checkpoint(source), target, include_optimizer_state=True)


def _same_files(a: pathlib.Path, b: pathlib.Path) -> None:
    assert a.read_bytes() == b.read_bytes()
    a_data, b_data = pathlib.Path(f"{a}.data"), pathlib.Path(f"{b}.data")
    assert a_data.exists() == b_data.exists()
    if a_data.exists():
        assert a_data.read_bytes() == b_data.read_bytes()


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
@pytest.mark.parametrize("name", ROUND_TRIP)
def test_round_trip_is_byte_identical(tmp_path, name, suffix):
    source = CODEC / name
    state_file = tmp_path / f"state{suffix}"
    assert main(["to-torch", str(source), str(state_file), "--optimizer"]) == 0
    args = ["from-torch", str(state_file), str(source), str(tmp_path / "checkpoint")]
    assert main(args + (["--allow-pickle"] if suffix == ".pt" else [])) == 0
    _reference_save(source, tmp_path / "reference")
    _same_files(tmp_path / "checkpoint", tmp_path / "reference")

    before, after = load_state(source), load_state(tmp_path / "checkpoint")
    assert after.properties == before.properties
    assert {n: s.requires_grad for n, s in after.parameters.items()} == {
        n: s.requires_grad for n, s in before.parameters.items()
    }
    for n, slot in before.parameters.items():
        assert torch.equal(after.parameters[n].tensor, slot.tensor), n


def test_state_dict_layout_and_values():
    tensors = state_to_tensors(CODEC / "state_adamw_checkpoint", include_optimizer=True)
    state = load_state(CODEC / "state_adamw_checkpoint")
    params = set(state.parameters)
    assert params <= set(tensors)
    assert tensors["optimizer/step"].item() == state.optimizer.step
    assert tensors["optimizer/initial_learning_rate"].item() == pytest.approx(state.optimizer.initial_learning_rate)
    for param, moments in state.optimizer.moments.items():
        for moment, value in moments.items():
            assert torch.equal(tensors[f"optimizer/{param}/{moment}"], value)
    assert set(state_to_tensors(state)) == params


def test_round_trip_keeps_template_optimizer_without_optimizer_keys(tmp_path):
    source = CODEC / "state_adamw_checkpoint"
    assert main(["to-torch", str(source), str(tmp_path / "p.safetensors")]) == 0
    assert main(["from-torch", str(tmp_path / "p.safetensors"), str(source), str(tmp_path / "ck")]) == 0
    _reference_save(source, tmp_path / "reference")
    _same_files(tmp_path / "ck", tmp_path / "reference")
    assert (
        main(["from-torch", str(tmp_path / "p.safetensors"), str(source), str(tmp_path / "noopt"), "--drop-optimizer"])
        == 0
    )
    assert load_state(tmp_path / "noopt").optimizer is None


def test_ort_loads_converted_checkpoint(tmp_path):
    ort_api = pytest.importorskip("onnxruntime.training.api")
    from ort_torch_compat import switch

    if switch.is_installed() or "ort_torch_compat" in ort_api.__name__ or ort_api.__dict__.get("_target"):
        pytest.skip("onnxruntime.training.api is the switch's proxy here")
    for name in ("state_adamw_checkpoint", "state_properties_checkpoint", "artifact_checkpoint"):
        source = CODEC / name
        assert main(["to-torch", str(source), str(tmp_path / f"{name}.safetensors"), "--optimizer"]) == 0
        out = tmp_path / f"{name}_out"
        assert main(["from-torch", str(tmp_path / f"{name}.safetensors"), str(source), str(out)]) == 0
        ours = load_state(source)
        theirs = ort_api.CheckpointState.load_checkpoint(str(out))
        assert dict(theirs.properties) == ours.properties
        for pname, slot in ours.parameters.items():
            assert np.array_equal(theirs.parameters[pname].data, slot.tensor.numpy()), pname
            assert theirs.parameters[pname].requires_grad == slot.requires_grad


def _write(tmp_path, tensors) -> str:
    from safetensors.torch import save_file

    path = tmp_path / "bad.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return str(path)


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda t: t.pop("fc1.bias"), "'fc1.bias' is missing"),
        (lambda t: t.__setitem__("extra.weight", torch.zeros(2)), "'extra.weight' is extra"),
        (lambda t: t.__setitem__("fc1.weight", torch.zeros(4, 3)), "'fc1.weight' has shape [4, 3]"),
        (lambda t: t.__setitem__("fc2.bias", torch.zeros(2, dtype=torch.float64)), "'fc2.bias' has dtype float64"),
        (
            lambda t: t.__setitem__("optimizer/fc1.bias/momentum7", torch.zeros(3)),
            "'optimizer/fc1.bias/momentum7' is extra",
        ),
    ],
)
def test_from_torch_rejects_mismatches(tmp_path, capsys, change, needle):
    source = CODEC / "state_adamw_checkpoint"
    tensors = state_to_tensors(source, include_optimizer=True)
    change(tensors)
    state_file = _write(tmp_path, tensors)
    assert main(["from-torch", state_file, str(source), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert needle in err and state_file in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_pickle_needs_opt_in(tmp_path, capsys):
    source = CODEC / "artifact_checkpoint"
    assert main(["to-torch", str(source), str(tmp_path / "s.pt")]) == 0
    assert main(["from-torch", str(tmp_path / "s.pt"), str(source), str(tmp_path / "out")]) == 1
    assert "--allow-pickle" in capsys.readouterr().err
    with pytest.raises(MigrationError):
        load_tensor_file(tmp_path / "s.pt")
    assert set(load_tensor_file(tmp_path / "s.pt", allow_pickle=True)) == set(load_state(source).parameters)


def test_inspect_json(capsys):
    assert main(["inspect", str(CODEC / "state_adamw_checkpoint"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in info["parameters"] if not p["trainable"]] == ["fc2.bias"]
    assert info["parameters"][0]["dtype"] == "float" and info["nominal"] is False
    group = info["optimizer_groups"][0]
    assert group["step"] == 2 and group["moments"] == ["momentum0", "momentum1"]
    assert info["properties"] == {"epoch": 1}
    nominal = describe_checkpoint(CODEC / "artifact_nominal_checkpoint")
    assert nominal["nominal"] and nominal["parameters"][0]["shape"] is None
    assert describe_checkpoint(CODEC / "state_external_checkpoint")["external_data"]
    assert main(["inspect", str(CODEC / "state_properties_checkpoint")]) == 0
    text = capsys.readouterr().out
    assert "tag = 'run-é'" in text and "optimizer state: none" in text


# ---- to_torch_module ------------------------------------------------------------------------
def test_torch_module_matches_ort_reference():
    """Loss, gradients and one SGD step equal onnxruntime-training's recorded values."""
    d = FIXTURES / "frozen_ce_sgd_op17"
    spec = json.loads((d / "spec.json").read_text())
    expected = np.load(d / "expected.npz")
    model = to_torch_module(d / "training_model.onnx", d / "checkpoint")
    assert list(model.state_dict()) == spec["param_order"]
    assert {n for n, p in model.named_parameters() if not p.requires_grad} == set(spec["frozen_params"])
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=spec["lr"])
    inputs = [torch.from_numpy(expected[f"step1/call1/input/{i['name']}"]) for i in spec["inputs"]]
    loss = model(*inputs)
    np.testing.assert_allclose(loss.detach().numpy(), expected["step1/call1/loss"], rtol=1e-5, atol=1e-6)
    loss.backward()
    params = dict(model.named_parameters())
    for name in spec["trainable_params"]:
        np.testing.assert_allclose(params[name].grad.numpy(), expected[f"step1/grad/{name}"], rtol=1e-5, atol=1e-6)
    assert all(params[n].grad is None for n in spec["frozen_params"])
    optimizer.step()
    for name in spec["trainable_params"] + spec["frozen_params"]:
        np.testing.assert_allclose(params[name].detach().numpy(), expected[f"step1/param/{name}"], rtol=1e-5, atol=1e-6)


def test_torch_module_batchnorm_and_eval_match_engine():
    d = FIXTURES / "cnn_ce_sgd_op17"
    model = to_torch_module(d / "training_model.onnx", d / "checkpoint")
    state = CheckpointState.load_checkpoint(d / "checkpoint")
    engine = Module(d / "training_model.onnx", state, d / "eval_model.onnx")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 2, 6, 6)).astype(np.float32), rng.integers(0, 3, 4)
    loss = model(torch.from_numpy(x), torch.from_numpy(y))
    np.testing.assert_allclose(loss.item(), engine(x, y), rtol=1e-5)
    loss.backward()
    params = dict(model.named_parameters())
    for name, parameter in state.parameters:  # gradients and BN running statistics (updated in place)
        np.testing.assert_allclose(params[name].detach().numpy(), parameter.data, rtol=1e-5, atol=1e-6)
        if parameter.requires_grad:
            np.testing.assert_allclose(params[name].grad.numpy(), parameter.grad, rtol=1e-5, atol=1e-6)
    model.eval()
    engine.eval()
    with torch.no_grad():
        np.testing.assert_allclose(model(torch.from_numpy(x), torch.from_numpy(y)).item(), engine(x, y), rtol=1e-5)

    logits_model = to_torch_module(d / "training_model.onnx", d / "checkpoint", with_loss=False).eval()
    assert logits_model.input_names == ["x"] and logits_model.output_names == ["y"]
    logits_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        logits = logits_model(x=torch.from_numpy(x))
    expected = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
    np.testing.assert_allclose(expected.item(), engine(x, y), rtol=1e-5)


@pytest.mark.parametrize("fixture", ["mlp_bce_sgd_op17", "mlp_mse_adamw_op17", "mlp_ce_adamw_addout_op17"])
def test_model_outputs_are_what_the_loss_consumes(fixture):
    import onnx

    model = onnx.load(FIXTURES / fixture / "eval_model.onnx")
    assert model_outputs(model, [o.name for o in model.graph.output]) == ["y"]


def test_save_checkpoint_and_escaped_names(tmp_path):
    module = to_torch_module(
        FIXTURES / "frozen_ce_sgd_op17" / "training_model.onnx",
        FIXTURES / "frozen_ce_sgd_op17" / "checkpoint",
        eval_model=False,
    )
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)
    module.save_checkpoint(tmp_path / "ck")
    saved = load_state(tmp_path / "ck")
    for name, p in module.checkpoint_parameters().items():
        assert torch.equal(saved.parameters[name].tensor, p.detach())
        assert saved.parameters[name].requires_grad == p.requires_grad

    # Names that cannot be module paths still round-trip through state_dict().
    names = ["a", "a.b", "training.x", "x..y", "0.weight", "_flat.z"]
    state = TrainingState(
        parameters={n: ParameterSlot(n, 1, True, torch.full((2,), float(i))) for i, n in enumerate(names)}
    )
    odd = OrtTorchModule(state, {"train": None, "eval": None}, with_loss=True, order=names)
    assert list(odd.state_dict()) == names
    assert set(odd.checkpoint_names.values()) == set(names)
    assert {odd.checkpoint_names[k] for k, _ in odd.named_parameters()} == set(names)
    assert odd.checkpoint_names["0.weight"] == "0.weight" and odd.checkpoint_names["a"] == "a"
    new = {n: torch.full((2,), 10.0 + i) for i, n in enumerate(names)}
    odd.load_state_dict(new)
    assert all(torch.equal(odd.checkpoint_state_dict()[n], new[n]) for n in names)


def test_nominal_checkpoint_is_refused():
    d = FIXTURES / "mlp_mse_adamw_nominal_op17"
    with pytest.raises(MigrationError, match="nominal"):
        to_torch_module(d / "training_model.onnx", d / "nominal_checkpoint")
    with pytest.raises(MigrationError, match="nominal"):
        state_to_tensors(d / "nominal_checkpoint")
    # A nominal template takes the values' shapes (its own are unknown).
    full = state_to_tensors(d / "checkpoint")
    state = tensors_to_state(full, d / "nominal_checkpoint")
    assert not state.is_nominal and all(torch.equal(state.parameters[n].tensor, full[n]) for n in full)


def _reference_dirs():
    return sorted(p for p in FIXTURES.iterdir() if (p / "expected.npz").exists() and (p / "spec.json").exists())


@pytest.mark.parametrize("directory", _reference_dirs(), ids=lambda p: p.name)
def test_torch_module_first_step_matches_ort_on_every_fixture(directory):
    """Loss and gradients of ORT's first recorded train step, for every recorded artifact set."""
    spec = json.loads((directory / "spec.json").read_text())
    expected = np.load(directory / "expected.npz")
    model = to_torch_module(directory / "training_model.onnx", directory / "checkpoint", eval_model=False)
    out = model(*[torch.from_numpy(expected[f"step1/call1/input/{i['name']}"]) for i in spec["inputs"]])
    loss = out[0] if isinstance(out, tuple) else out
    np.testing.assert_allclose(loss.detach().numpy(), expected["step1/call1/loss"], rtol=1e-4, atol=1e-5)
    loss.backward()
    params = dict(model.named_parameters())
    for name in spec["trainable_params"]:
        np.testing.assert_allclose(
            params[name].grad.numpy(), expected[f"step1/grad/{name}"], rtol=1e-4, atol=1e-5, err_msg=name
        )
    assert {n for n, p in params.items() if not p.requires_grad} == set(spec.get("frozen_params", []))
