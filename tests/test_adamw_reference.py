"""The reference AdamW kernel (optim/adamw.py's `_reference`, used where torch has no fused
AdamW or for correct_bias=0) against ONNX Runtime's recorded AdamW steps, and against the
fused kernel it must agree with to float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest

import ort_torch_compat.api as ours
from ort_torch_compat.optim import adamw
from ort_torch_compat.testing.scenario import compare, run_scenario
from tests.conftest import FIXTURES, load_spec
from tests.test_training_parity import TOLERANCES, _settle_noise_elements

# both adam_modes, with and without weight decay, a frozen subset, a transformer
CONFIGS = [
    "mlp_mse_adamw_op17",
    "mlp_mse_adamw_wd_op17",
    "mlp_mse_adamw_mode0_op17",
    "mlp_mse_adamw_mode0_wd_op17",
    "frozen_mse_adamw_wd_op17",
    "transformer_ce_adamw_op17",
]


@pytest.mark.parametrize("name", CONFIGS)
def test_reference_kernel_matches_onnxruntime(name, monkeypatch):
    calls = []
    reference = adamw._reference

    def counting(*args, **kwargs):
        calls.append(1)
        return reference(*args, **kwargs)

    monkeypatch.setattr(adamw, "fused_available", lambda device_type: False)
    monkeypatch.setattr(adamw, "_reference", counting)
    config = FIXTURES / name
    spec = load_spec(config)
    expected = dict(np.load(config / "expected.npz", allow_pickle=False))
    actual = run_scenario(ours, config, spec)
    assert calls, "the reference kernel did not run"
    _settle_noise_elements(expected, actual, spec)
    problems = compare(expected, actual, rtol=1e-4, atol=1e-5, tolerances=TOLERANCES)
    assert not problems, "\n".join(problems[:40])
