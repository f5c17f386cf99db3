"""The `ort-torch-compat` command: exit codes, messages, export, progress output."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from ort_torch_compat.cli import main
from ort_torch_compat.migrate import to_torch_module

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "examples" / "artifacts" / "mlp_classifier"
CODEC = ROOT / "tests" / "fixtures" / "codec"


def test_usage_errors_exit_2(capsys):
    assert main([]) == 2
    assert main(["frobnicate"]) == 2
    assert main(["to-torch", str(CODEC / "artifact_checkpoint")]) == 2
    assert main(["inspect", "--help"]) == 0
    assert "usage:" in capsys.readouterr().out


def test_errors_are_one_line_naming_the_file(tmp_path, capsys):
    garbage = tmp_path / "garbage_checkpoint"
    garbage.write_bytes(b"not a checkpoint at all")
    cases = [
        (["inspect", str(garbage)], str(garbage)),
        (["inspect", str(tmp_path / "absent")], str(tmp_path / "absent")),
        (["to-torch", str(CODEC / "artifact_checkpoint"), str(tmp_path / "out.txt")], "out.txt"),
        (["to-torch", str(CODEC / "artifact_checkpoint"), str(tmp_path / "no" / "dir.pt")], str(tmp_path / "no")),
        (
            ["to-torch", str(CODEC / "artifact_nominal_checkpoint"), str(tmp_path / "n.pt")],
            "artifact_nominal_checkpoint",
        ),
        (["export", str(tmp_path), str(tmp_path / "m.onnx")], str(tmp_path / "checkpoint")),
        (["export", str(ARTIFACTS), str(tmp_path / "m.onnx"), "--outputs", "nope"], "eval_model.onnx"),
    ]
    for argv, needle in cases:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err and err.startswith("ort-torch-compat"), (argv, err)


def test_export_matches_the_torch_module(tmp_path, capsys):
    out = tmp_path / "inference.onnx"
    assert main(["export", str(ARTIFACTS), str(out)]) == 0  # default outputs: what the loss consumes
    assert "outputs: logits" in capsys.readouterr().out
    model = onnx.load(out)
    assert [o.name for o in model.graph.output] == ["logits"]
    assert [i.name for i in model.graph.input] == ["features"]
    features = np.random.default_rng(0).standard_normal((5, 2)).astype(np.float32)
    with torch.no_grad():
        expected = (
            to_torch_module(ARTIFACTS / "training_model.onnx", ARTIFACTS / "checkpoint", with_loss=False)
            .eval()(torch.from_numpy(features))
            .numpy()
        )
    from ort_torch_compat.engine.model_io import opset_map
    from ort_torch_compat.graph import build_graph_module

    graph_module = build_graph_module(model.graph, opset_map(model), ["features"], ["logits"], "inference")
    actual = graph_module(torch.from_numpy(features))[0].detach().numpy()
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    assert main(["export", str(ARTIFACTS), str(tmp_path / "named.onnx"), "--outputs", "logits"]) == 0


def test_progress_only_on_a_terminal(tmp_path, capsys, monkeypatch):
    source = CODEC / "state_adamw_checkpoint"
    assert main(["to-torch", str(source), str(tmp_path / "a.safetensors"), "--optimizer"]) == 0
    assert capsys.readouterr().err == ""  # captured stderr is not a terminal: no progress bar
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["to-torch", str(source), str(tmp_path / "b.safetensors"), "--optimizer"]) == 0
    assert "parameters" in capsys.readouterr().err


def test_console_script_is_installed(tmp_path):
    command = shutil.which("ort-torch-compat") or str(pathlib.Path(sys.executable).parent / "ort-torch-compat")
    if not pathlib.Path(command).exists():
        pytest.skip("the console script is not installed (pip install -e .)")
    result = subprocess.run(
        [command, "inspect", str(CODEC / "state_sgd_checkpoint"), "--json"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and '"moments": [\n        "momentum0"' in result.stdout
    assert result.stderr == ""  # piped: no progress output
    result = subprocess.run([command, "from-torch"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2


@pytest.mark.parametrize(
    "entry", [["-m", "ort_torch_compat"], ["-c", "from ort_torch_compat.cli import main; raise SystemExit(main())"]]
)
def test_version_on_both_entry_points(entry):
    from ort_torch_compat import __version__

    done = subprocess.run([sys.executable, *entry, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"ort-torch-compat {__version__}"


def test_run_of_a_missing_module_is_one_line(capsys):
    assert main(["run", "-m", "nope.module"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no module named 'nope.module'" in error and "Traceback" not in error


def test_files_that_are_not_checkpoints_are_named_for_what_they_are(tmp_path, capsys):
    torch.save({"w": torch.zeros(2)}, tmp_path / "weights.pt")
    cases = {
        ROOT / "tests" / "fixtures" / "mlp_ce_adamw_op17" / "training_model.onnx": "looks like an ONNX model",
        tmp_path / "weights.pt": "zip archive (a PyTorch .pt file?)",
    }
    for path, guess in cases.items():
        assert main(["inspect", str(path)]) == 1
        assert guess in capsys.readouterr().err


def test_to_torch_says_when_it_writes_a_pickle(tmp_path, capsys):
    assert main(["to-torch", str(CODEC / "artifact_checkpoint"), str(tmp_path / "model.bin")]) == 0
    assert "a torch.save pickle" in capsys.readouterr().out
    assert main(["to-torch", str(CODEC / "artifact_checkpoint"), str(tmp_path / "model.safetensors")]) == 0
    assert "(safetensors)" in capsys.readouterr().out


def test_api_without_torch_says_what_to_install(tmp_path):
    blocker = tmp_path / "torch.py"
    blocker.write_text("raise ImportError(\"No module named 'torch'\")\n")
    done = subprocess.run(
        [sys.executable, "-c", "import ort_torch_compat.api"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 1 and "pip install torch" in done.stderr and "ort_torch_compat.artifacts" in done.stderr


def test_a_wrong_parameter_value_names_the_parameter():
    from ort_torch_compat.api import CheckpointState

    state = CheckpointState.load_checkpoint(ARTIFACTS / "checkpoint")
    with pytest.raises(
        RuntimeError,
        match=r"Parameter data shape mismatch\. Expected: \{16, 2\}, Got: \{3, 3\}\. "
        r"Parameter '0\.weight' takes a numpy array of shape \(16, 2\)",
    ):
        state.parameters["0.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(
        RuntimeError, match=r"type mismatch\. Expected: float32, Got: float64\. .*astype\(np\.float32\)"
    ):
        state.parameters["0.weight"] = np.zeros((16, 2), np.float64)
