"""The legacy TrainingSession's SGD, Adam and Lamb updates against ORT's legacy kernels.

The reference trajectories (`tests/fixtures/legacy_optimizers/`) come from
`scripts/make_legacy_optimizer_fixtures.py`: a numpy transcription of ORT's legacy kernel
source with the defaults the CPU build used (docs/legacy.md gives the files and lines),
checked against ORT's own CPU SGD/Adam kernels when it was recorded.  When
onnxruntime-training is installed (its CPU build has the kernels; the plain onnxruntime package
does not), the session is also compared with those kernels live.
Lamb had only a CUDA kernel in ORT, so only the transcription covers it.

Tolerance: |ours - reference| <= 1e-7 + 1e-6 * |reference|, float32 rounding over a few
steps: torch, numpy and ORT's Eigen round a few operations differently (fused SGD add,
Eigen's sqrt, the order of the norm reductions); step counts must be equal.
"""

from __future__ import annotations

import numpy as np
import pytest

from ort_torch_compat.testing.legacy_optimizer_scenarios import (
    SCENARIOS,
    ort_kernel_missing,
    run_ort_cpu_kernels,
    run_session,
)
from tests.conftest import FIXTURES

RTOL, ATOL = 1e-6, 1e-7
REFERENCE = FIXTURES / "legacy_optimizers" / "trajectories.npz"


@pytest.fixture(scope="module")
def reference():
    with np.load(REFERENCE) as data:
        return {key: data[key] for key in data.files}


def assert_same_trajectory(ours, expected, what):
    assert sorted(ours) == sorted(expected), f"{what}: state names or update counts differ"
    for key, value in expected.items():
        if value.dtype == np.int64:
            np.testing.assert_array_equal(ours[key], value, err_msg=f"{what}: {key}")
        else:
            np.testing.assert_allclose(ours[key], value, rtol=RTOL, atol=ATOL, err_msg=f"{what}: {key}")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_session_follows_orts_legacy_kernels(scenario, reference):
    prefix = scenario["name"] + "/"
    expected = {key[len(prefix) :]: value for key, value in reference.items() if key.startswith(prefix)}
    assert expected, f"no recorded trajectory for {scenario['name']}: run scripts/make_legacy_optimizer_fixtures.py"
    assert_same_trajectory(run_session(scenario), expected, "transcription of ORT's source")


CPU_KERNELS = [s for s in SCENARIOS if s["optimizer"] != "LambOptimizer"]


@pytest.mark.parametrize("scenario", CPU_KERNELS, ids=[s["name"] for s in CPU_KERNELS])
def test_session_matches_orts_cpu_kernels_live(scenario):
    missing = ort_kernel_missing(scenario["optimizer"])  # the plain onnxruntime package has no training kernels
    if missing:
        pytest.skip(missing)
    assert_same_trajectory(run_session(scenario), run_ort_cpu_kernels(scenario), "ORT's CPU kernel")
