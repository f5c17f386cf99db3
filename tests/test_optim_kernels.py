"""The optimizer kernels of `optim/` on their own.

* AdamW: the fused single-pass kernel and the term-by-term reference of ORT's formula agree
  to float32 rounding (what optim/adamw.py promises), in both adam_modes, with weight decay;
  the prepared fused kernel (the engine's flat groups) is bit-identical to `adamw_step` and
  declines what the fused kernel cannot express.
* The bias correction 1 - coefficient**t is rounded as each ORT kernel rounds it (AdamW:
  power rounded to float32, then subtracted in float32; legacy Adam/Lamb: subtracted in
  float64, rounded once).
* The legacy optimizers are ordinary torch optimizers: they train a torch module, reject the
  attribute values ORT's kernels reject, and start their state as ORT's initializers do.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ort_torch_compat.optim import Lamb, LegacyAdam, LegacySGD, PreparedFusedAdamW, adamw_step
from ort_torch_compat.optim.adamw import fused_available
from ort_torch_compat.optim.common import bias_correction

needs_fused_cpu_kernel = pytest.mark.skipif(not fused_available("cpu"), reason="torch < 2.4 has no fused CPU AdamW")


@pytest.mark.parametrize("adam_mode", [0, 1])
def test_fused_adamw_matches_the_reference_formula(adam_mode):
    """A large epsilon and weight decay: the fused kernel's rewritten eps, lr and decay must matter."""
    torch.manual_seed(0)
    params = [torch.randn(257), torch.randn(4, 33)]
    runs = {
        fused: (
            [p.clone() for p in params],
            [torch.zeros_like(p) for p in params],
            [torch.zeros_like(p) for p in params],
        )
        for fused in (True, False)
    }
    for step in range(1, 6):
        grads = [torch.randn_like(p) for p in params]
        for fused, (ps, m, v) in runs.items():
            adamw_step(
                ps,
                grads,
                m,
                v,
                lr=0.01,
                step=step,
                alpha=0.9,
                beta=0.999,
                epsilon=1e-3,
                weight_decay=0.1,
                adam_mode=adam_mode,
                correct_bias=True,
                fused=fused,
            )
    for fused_t, reference_t in zip(
        runs[True][0] + runs[True][1] + runs[True][2], runs[False][0] + runs[False][1] + runs[False][2]
    ):
        torch.testing.assert_close(fused_t, reference_t, rtol=1e-5, atol=1e-7)
    assert not torch.equal(runs[True][0][0], params[0]), "the parameters must have moved"


@needs_fused_cpu_kernel
@pytest.mark.parametrize("adam_mode", [0, 1])
def test_prepared_fused_adamw_is_adamw_step(adam_mode):
    """Same bits as `adamw_step` over the steps (the step count it writes in place each step
    changes the bias correction), and a learning rate changed midway."""
    torch.manual_seed(0)
    start = torch.randn(300)
    tensors = {kind: [start.clone(), torch.zeros(300), torch.zeros(300)] for kind in ("prepared", "plain")}
    grad = torch.zeros(300)
    prepared = PreparedFusedAdamW([tensors["prepared"][0]], [grad], [tensors["prepared"][1]], [tensors["prepared"][2]])
    attributes = dict(alpha=0.9, beta=0.999, epsilon=1e-3, weight_decay=0.1, adam_mode=adam_mode, correct_bias=True)
    for step in range(1, 8):
        grad.copy_(torch.randn(300))
        lr = 0.01 if step < 4 else 0.003
        assert prepared(lr, step, attributes)
        w, m, v = tensors["plain"]
        adamw_step([w], [grad], [m], [v], lr=lr, step=step, **attributes)
        for ours, theirs in zip(tensors["prepared"], tensors["plain"]):
            assert torch.equal(ours, theirs), step
    assert not torch.equal(tensors["prepared"][0], start)


def test_prepared_fused_adamw_declines_what_the_fused_kernel_cannot_do():
    w, g, m, v = (torch.ones(4) for _ in range(4))
    prepared = PreparedFusedAdamW([w], [g], [m], [v])
    common = dict(alpha=0.9, beta=0.999, epsilon=1e-8, adam_mode=1)
    assert not prepared(0.5, 1, dict(common, weight_decay=2.0, correct_bias=True))  # lr*wd >= 1
    assert not prepared(0.1, 1, dict(common, weight_decay=0.0, correct_bias=False))
    assert torch.equal(w, torch.ones(4)) and torch.equal(m, torch.ones(4))
    assert PreparedFusedAdamW.suits([w], [g]) == fused_available("cpu")
    assert not PreparedFusedAdamW.suits([torch.ones(2, requires_grad=True)], [g])
    assert not PreparedFusedAdamW.suits([], [])


@pytest.mark.parametrize("coefficient", [0.9, 0.999])
@pytest.mark.parametrize("step", [1, 2, 7, 1000])
def test_bias_correction_rounds_as_each_ort_kernel(coefficient, step):
    """AdamWOptimizer (adamw.cc): `1.f - static_cast<float>(std::pow(alpha_, step))`; legacy Adam/Lamb
    (common.h, compute_bias_correction_coefficient): `TC(1.0 - std::pow(double(c), double(step)))`.
    Kills swapping the two roundings (the parity tests' tolerances let the legacy one through)."""
    c64 = float(np.float32(coefficient))
    assert bias_correction(coefficient, step, legacy=False) == np.float32(1.0) - np.float32(c64**step)
    assert bias_correction(coefficient, step, legacy=True) == np.float32(1.0 - c64**step)
    assert bias_correction(coefficient, 0, legacy=True) == 1.0


def test_the_two_bias_correction_roundings_differ():
    """Where coefficient**t is not a float32 the two rules give different float32s, so the choice matters."""
    assert bias_correction(0.999, 2, legacy=False) != bias_correction(0.999, 2, legacy=True)


@pytest.mark.parametrize(
    "make",
    [lambda p: LegacySGD(p, lr=0.1), lambda p: LegacyAdam(p, lr=0.05), lambda p: Lamb(p, lr=0.05)],
    ids=["sgd", "adam", "lamb"],
)
def test_legacy_optimizers_train_a_torch_module(make):
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 1)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3
    optimizer = make(model.parameters())
    losses = []
    for _ in range(60):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_legacy_state_starts_as_orts_initializers():
    weight = torch.nn.Parameter(torch.ones(3))
    adam = LegacyAdam([weight])
    assert adam.state[weight]["update_count"] == 1 and not adam.state[weight]["moment_1"].any()
    lamb = Lamb([torch.nn.Parameter(torch.ones(2))])
    assert lamb.step_count == 1


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: LegacyAdam([{"params": p, "name": "w", "alpha": -0.1}]), "'alpha' of 'w' must be >= 0"),
        (lambda p: LegacyAdam(p, weight_decay_mode=2), "weight_decay_mode must be 0 or 1"),
        (lambda p: LegacyAdam(p, do_bias_correction=3), "do_bias_correction must be 0 or 1"),
        (lambda p: Lamb(p, epsilon=-1.0), "'epsilon' must be >= 0"),
        (lambda p: Lamb([{"params": p, "name": "w", "max_norm_clip": 0.0}]), "max_norm_clip of 'w' must not be 0"),
    ],
)
def test_legacy_optimizers_reject_what_orts_kernels_reject(make, message):
    with pytest.raises(ValueError, match=message):
        make([torch.nn.Parameter(torch.ones(2))])


def test_lamb_clips_by_the_global_norm_of_all_groups():
    """Two groups whose joint gradient norm is 5: max_norm_clip 1 divides every gradient by 5."""
    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    a.grad, b.grad = torch.tensor([3.0]), torch.tensor([4.0])
    clipped = Lamb([{"params": [a]}, {"params": [b]}], lr=0.1, max_norm_clip=1.0)
    clipped.step()
    assert clipped.state[a]["moment_1"].item() == pytest.approx(0.1 * 3.0 / 5.0)
    assert clipped.state[b]["moment_1"].item() == pytest.approx(0.1 * 4.0 / 5.0)
    assert clipped.step_count == 2 and not math.isnan(a.item())
