"""The reference AdamW kernel (optim/adamw.py's `_reference`, used where torch has no fused
AdamW or for correct_bias=0) against ONNX Runtime's recorded AdamW steps, and against the
fused kernel it must agree with to float32 rounding."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import ort_torch_compat.api as ours
from ort_torch_compat.optim import adamw
from tests.conftest import FIXTURES, load_spec
from tests.scenario import compare, run_scenario
from tests.test_training_parity import TOLERANCES, _settle_noise_elements

# both adam_modes, with and without weight decay, a frozen subset, a transformer
CONFIGS = ["mlp_mse_adamw_op17", "mlp_mse_adamw_wd_op17", "mlp_mse_adamw_mode0_op17", "mlp_mse_adamw_mode0_wd_op17",
           "frozen_mse_adamw_wd_op17", "transformer_ce_adamw_op17"]


@pytest.mark.parametrize("name", CONFIGS)
def test_reference_kernel_matches_onnxruntime(name, monkeypatch):
    calls = []
    reference = adamw._reference

    def counting(*args, **kwargs):
        calls.append(1)
        return reference(*args, **kwargs)

    monkeypatch.setattr(adamw, "_HAS_FUSED", False)
    monkeypatch.setattr(adamw, "_reference", counting)
    config = FIXTURES / name
    spec = load_spec(config)
    expected = dict(np.load(config / "expected.npz", allow_pickle=False))
    actual = run_scenario(ours, config, spec)
    assert calls, "the reference kernel did not run"
    _settle_noise_elements(expected, actual, spec)
    problems = compare(expected, actual, rtol=1e-4, atol=1e-5, tolerances=TOLERANCES)
    assert not problems, "\n".join(problems[:40])


@pytest.mark.skipif(not adamw._HAS_FUSED, reason="torch has no fused AdamW here")
@pytest.mark.parametrize("adam_mode", [0, 1])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_reference_and_fused_kernels_agree(adam_mode, weight_decay):
    generator = torch.Generator().manual_seed(adam_mode * 10 + int(weight_decay * 100))
    shapes = [(7, 5), (5,), (3, 4, 2)]
    states = {}
    for kind in ("reference", "fused"):
        torch.manual_seed(0)
        params = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(shapes)]
        moments = [[torch.zeros(s) for s in shapes] for _ in range(2)]
        states[kind] = (params, moments)
    for step in range(1, 6):
        grads = [torch.randn(s, generator=generator) for s in shapes]
        for kind, (params, (m, v)) in states.items():
            adamw.adamw_step(params, grads, m, v, lr=1e-2, step=step, alpha=0.9, beta=0.999, epsilon=1e-6,
                             weight_decay=weight_decay, adam_mode=adam_mode, correct_bias=True, fused=kind == "fused")
    for left, right in zip(states["reference"][0], states["fused"][0]):
        torch.testing.assert_close(left, right, rtol=1e-5, atol=1e-6)
