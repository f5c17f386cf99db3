"""ORT 1.19.2's Dropout gradient quirk through the drop-in API (issue 18, item 1).

Artifacts of ``y = Dropout(x @ W, ratio=0.5)`` at opset 13 without a training_mode input
(scripts/make_dropout_grad_fixture.py): the forward is the identity, yet ORT's gradient of W is
2x the derivative (its DropoutGrad divides by 1 - ratio).  The drop-in Module reproduces it by
default; ``gradients="exact"`` gives the derivative, checked here against a float64 formula."""

from __future__ import annotations

import numpy as np
import pytest

from ort_torch_compat.api import CheckpointState, Module
from tests.conftest import FIXTURES

ARTIFACTS = FIXTURES / "dropout_grad"
EXPECTED = dict(np.load(ARTIFACTS / "expected.npz"))


def _step(**options):
    state = CheckpointState.load_checkpoint(ARTIFACTS / "checkpoint")
    module = Module(ARTIFACTS / "training_model.onnx", state, ARTIFACTS / "eval_model.onnx", **options)
    loss = module(EXPECTED["x"], EXPECTED["target"])
    return np.asarray(loss), state.parameters["W"].grad, state.parameters["W"].data


def _exact_gradient(weight: np.ndarray) -> np.ndarray:
    """d/dW mean((x @ W - target)^2) in float64."""
    x, target = EXPECTED["x"].astype(np.float64), EXPECTED["target"].astype(np.float64)
    return 2.0 * x.T @ (x @ weight.astype(np.float64) - target) / target.size


def test_default_reproduces_onnxruntime():
    loss, grad, _ = _step()
    np.testing.assert_allclose(loss, EXPECTED["loss"], rtol=1e-6)
    np.testing.assert_allclose(grad, EXPECTED["grad_W"], rtol=1e-5, atol=1e-6)


def test_exact_gradient_is_the_derivative():
    loss, grad, weight = _step(gradients="exact")
    np.testing.assert_allclose(loss, EXPECTED["loss"], rtol=1e-6)
    np.testing.assert_allclose(grad, _exact_gradient(weight), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(EXPECTED["grad_W"], 2 * grad, rtol=1e-5, atol=1e-6)  # ORT's: scaled by 1/(1 - 0.5)


def test_unknown_gradients_value_is_refused():
    state = CheckpointState.load_checkpoint(ARTIFACTS / "checkpoint")
    with pytest.raises(ValueError, match="gradients"):
        Module(ARTIFACTS / "training_model.onnx", state, gradients="approximate")


def test_fixture_matches_live_onnxruntime():
    pytest.importorskip("onnxruntime.training.api")
    from scripts.make_dropout_grad_fixture import ort_step

    loss, grad = ort_step(ARTIFACTS)
    np.testing.assert_allclose(loss, EXPECTED["loss"], rtol=1e-7)
    np.testing.assert_allclose(grad, EXPECTED["grad_W"], rtol=1e-7)
