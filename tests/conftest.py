"""Shared test helpers: fixture discovery and the optional live ONNX Runtime reference."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
# Train steps run eagerly (the converted module with autograd) unless the run asks otherwise:
# `ORT_TORCH_COMPAT_COMPILE=off python -m pytest` runs every suite with traced train steps,
# `=on` with compiled ones (tests/test_traced_step.py and tests/test_compiled.py cover both).
os.environ.setdefault("ORT_TORCH_COMPAT_COMPILE", "eager")


def reference_configs():
    """Every fixture directory that carries ORT's recorded scenario."""
    return sorted(p for p in FIXTURES.iterdir() if (p / "expected.npz").exists() and (p / "spec.json").exists())


def load_spec(directory: pathlib.Path) -> dict:
    return json.loads((directory / "spec.json").read_text())


@pytest.fixture(scope="session")
def ort_api():
    """onnxruntime.training.api when installed (CI on Python 3.11), else the test is skipped."""
    return pytest.importorskip("onnxruntime.training.api")
