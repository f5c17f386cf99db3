"""The real-architecture rule's last resort for step 1 (ort_torch_compat/testing/parity_rule.py,
`step1_chaos`): a step 1 off the anchor and the float64 replay passes only where perturbed
float64 replays of step 1 spread at least a quarter as far, and only in a case that is not well
conditioned."""

from __future__ import annotations

import numpy as np
import pytest

from ort_torch_compat.testing.parity_rule import TRAJECTORY_FACTOR, judge

EXACT = np.array([1.0, -2.0, 3.0, 4.0])
SPEC = {"well_conditioned": False, "optimizer": "sgd", "lr": 0.1}


def _record(gradient: np.ndarray) -> dict:
    return {"step1/grad/w": np.asarray(gradient, dtype=np.float64), "step1/call1/loss": np.array(0.5)}


def _off_by(ratio: float) -> np.ndarray:
    """EXACT with its last element `ratio` times the tolerance away (rtol 1e-4 of the tensor's
    largest of |value| and RMS, atol 1e-5)."""
    allowance = 1e-5 + 1e-4 * max(4.0, float(np.sqrt(np.mean(EXACT**2))))
    return EXACT + np.array([0.0, 0.0, 0.0, ratio * allowance])


@pytest.mark.parametrize(
    "ours, probes, well_conditioned, passes",
    [
        (50.0, [0.0, 20.0, 3.0], False, True),  # within 4x of the farthest probe
        (50.0, [0.0, 10.0, 3.0], False, False),  # beyond it
        (50.0, [0.0, 20.0, 3.0], True, False),  # a well-conditioned case has no last resort
        (50.0, [], False, False),  # no probes, no last resort
    ],
)
def test_step_one_off_the_anchor_passes_only_within_its_probes_spread(ours, probes, well_conditioned, passes):
    anchor = replay = _record(EXACT)
    spec = dict(SPEC, well_conditioned=well_conditioned)
    actual = _record(_off_by(ours))
    assert judge(actual, anchor, {}, spec)["parity"] == "FAIL"
    verdict = judge(actual, anchor, {}, spec, step1_probes=(replay, [_record(_off_by(p)) for p in probes]))
    assert (verdict["parity"] == "pass") is passes, verdict
    if probes and not well_conditioned:
        assert verdict["step1_spread"] == pytest.approx(max(probes))
        assert verdict["step1_bound"] == pytest.approx(TRAJECTORY_FACTOR * max(probes))


def test_a_probe_lacking_a_step_one_value_gives_no_last_resort():
    anchor = replay = _record(EXACT)
    partial = {"step1/call1/loss": np.array(0.5)}
    verdict = judge(_record(_off_by(2.0)), anchor, {}, SPEC, step1_probes=(replay, [partial]))
    assert verdict["parity"] == "FAIL" and "step1_spread" not in verdict
