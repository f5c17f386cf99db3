"""scripts/paired_steps.py: ORT and ours alternating in one process on a committed fixture (needs
onnxruntime-training; skipped without it)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "mlp_mse_adamw_op17"


def _script():
    spec = importlib.util.spec_from_file_location("paired_steps", ROOT / "scripts" / "paired_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def artifacts(tmp_path):
    pytest.importorskip("onnxruntime.training.api")
    directory = tmp_path / "mlp"
    shutil.copytree(FIXTURE, directory)
    generator = np.random.default_rng(0)
    spec = json.loads((FIXTURE / "spec.json").read_text())
    np.savez(
        directory / "inputs.npz",
        **{item["name"]: generator.standard_normal(item["shape"]).astype(item["dtype"]) for item in spec["inputs"]},
    )
    return directory


def test_both_libraries_alternate_in_blocks_and_the_ratios_are_of_those_blocks(artifacts, monkeypatch, tmp_path):
    monkeypatch.setenv("ORT_TORCH_COMPAT_COMPILE", "off")
    out = tmp_path / "paired.json"
    report = _script().main([str(artifacts), "--rounds", "3", "--steps", "4", "--warmup", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == report
    assert report["form"] in ("traced", "eager")  # never compiled with the setting off
    blocks = report["blocks_ms"]
    assert len(blocks["ort"]) == len(blocks["ours"]) == 3 and min(blocks["ort"] + blocks["ours"]) > 0
    ratios = sorted(ours / ort for ours, ort in zip(blocks["ours"], blocks["ort"]))
    assert report["ratio_range"] == pytest.approx([ratios[0], ratios[-1]], abs=2e-3)
    assert report["ratio_median"] == pytest.approx(ratios[1], abs=2e-3)


def test_an_inputs_file_without_a_training_input_names_it(artifacts):
    np.savez(artifacts / "partial.npz", x=np.zeros((4, 6), np.float32))
    with pytest.raises(SystemExit, match="target"):
        _script().main([str(artifacts), "--inputs", str(artifacts / "partial.npz"), "--rounds", "1", "--steps", "1"])
