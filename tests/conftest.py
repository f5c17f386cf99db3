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


def train_record(engine, feeds_of, steps: int, accumulate_after_first: bool = False, buffers: bool = False) -> list:
    """Per step of a TrainingEngine fed `feeds_of(step)` (steps 1..`steps`): its outputs, the
    gradients and every parameter (and the train module's buffers, with `buffers`).  Each
    step overwrites the gradients, but with `accumulate_after_first` step 2 adds to step 1's."""
    record = []
    for step in range(1, steps + 1):
        outputs = engine.train_step(feeds_of(step))
        if not (accumulate_after_first and step == 1):
            engine.lazy_reset_grad()
        params = [engine.state.parameters[name].tensor for name in engine.train_io.param_names()]
        record.append(
            [o.clone() for o in outputs]
            + [p.grad.clone() for p in params if p.grad is not None]
            + [p.detach().clone() for p in params]
            + ([b.clone() for b in engine.train_module.buffers()] if buffers else [])
        )
    return record


@pytest.fixture(scope="session")
def ort_api():
    """onnxruntime.training.api when installed (CI on Python 3.11), else the test is skipped."""
    return pytest.importorskip("onnxruntime.training.api")


def assert_bad_labels_change_nothing(engine, feeds_of) -> None:
    """Labels out of range (input 1 of cnn_ce_adamw_op17's feeds `feeds_of()`: 3 classes; -7
    is not the ignored label) raise ORT's explained error and leave the gradients, the
    parameters and the train module's buffers as they were."""
    import torch

    from ort_torch_compat.errors import InvalidInputError

    before = {name: grad.clone() for name, grad in engine.gradients().items()}
    parameters = [p.detach().clone() for p in engine.store.trainable]
    buffers = [b.clone() for b in engine.train_module.buffers()]
    for label in (3, 1000, -7):
        feeds = feeds_of()
        feeds[1] = feeds[1].clone()
        feeds[1][0] = label
        with pytest.raises(InvalidInputError, match="labels"):
            engine.train_step(feeds)
        assert all(torch.equal(grad, before[name]) for name, grad in engine.gradients().items())
        assert all(torch.equal(p, q) for p, q in zip(engine.store.trainable, parameters))
        assert all(torch.equal(a, b) for a, b in zip(engine.train_module.buffers(), buffers))
