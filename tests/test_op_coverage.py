"""The op coverage suite: every recorded one-op case (scripts/make_op_coverage.py,
tests/fixtures/ops/) replayed through our converters and compared with ONNX Runtime 1.19.2's
forward outputs and training gradients (ort_torch_compat/testing/op_replay.py says how values compare).

The only exceptions are op_replay's two lists (ORT_GRADIENT_QUIRKS reproduced by default
and checked for their exact alternative here, ORT_GRADIENT_WRONG checked against central
differences).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Dict, List

import pytest

from ort_torch_compat.testing import op_replay
from ort_torch_compat.testing.op_replay import ORT_GRADIENT_QUIRKS, matching

CASES = [case for case in op_replay.load_manifest() if case["ort_forward"] == "ok"]
ARRAYS = op_replay.Arrays()


BY_OP: Dict[str, List[dict]] = defaultdict(list)
for _case in CASES:
    BY_OP[op_replay.op_key(_case)].append(_case)


@pytest.mark.parametrize("op", sorted(BY_OP))
def test_forward_matches_onnxruntime(op):
    problems = []
    for case in BY_OP[op]:
        outcome = op_replay.replay_forward(case, ARRAYS(case))
        if outcome.status == "pass":
            continue
        problems.append(f"{case['id']}: {outcome}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "op", sorted(op for op, cases in BY_OP.items() if any(c["ort_gradient"] == "ok" for c in cases))
)
def test_gradient_matches_onnxruntime(op):
    problems = []
    for case in BY_OP[op]:
        if case["ort_gradient"] != "ok":
            continue
        outcome = op_replay.gradient_outcome(case, ARRAYS(case))
        if outcome.status == "pass":
            continue
        problems.append(f"{case['id']}: {outcome}")
    assert not problems, "\n".join(problems)


QUIRK_CASES = [case for case in CASES if case["ort_gradient"] == "ok" and matching(ORT_GRADIENT_QUIRKS, case["id"])]


@pytest.mark.parametrize("case", QUIRK_CASES, ids=[case["id"] for case in QUIRK_CASES])
def test_exact_gradients_where_ort_deviates(case):
    """gradients="exact" gives the derivative of the forward, and ORT's gradient really is
    something else there (so the quirk list holds only real quirks)."""
    arrays = ARRAYS(case)
    exact = op_replay.replay_gradient_numerically(case, arrays, gradients="exact")
    assert exact.status == "pass", str(exact)
    assert op_replay.replay_gradient(case, arrays, gradients="exact").status == "fail", (
        f"{case['id']}: ORT's gradient equals the exact one; drop it from ORT_GRADIENT_QUIRKS"
    )


def test_every_listed_case_exists():
    """The exception lists name cases that are recorded (a stale entry hides nothing)."""
    ids = [case["id"] for case in CASES]
    for table in (ORT_GRADIENT_QUIRKS, op_replay.ORT_GRADIENT_WRONG):
        for pattern in table:
            assert any(re.search(pattern, case_id) for case_id in ids), pattern
