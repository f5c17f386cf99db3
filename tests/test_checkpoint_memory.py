"""Saving and loading a checkpoint holds no extra copy of the state (issue 24, "cost at scale").

A fresh process builds a ~192 MB state (parameters and both AdamW moments), then measures
the peak resident memory (VmHWM, reset through /proc/self/clear_refs before each step)
that a save with optimizer state, and then a load, add on top of what it held before.  A
save streams the tensors from their own memory into the file: it may add metadata and
buffers, not a copy of the data (the old encoder held three).  A load reads the tensors
straight into their storage: it may add the loaded state itself, not a second copy of the
file (the old reader held up to four).  Both the inline layout and the pair with external
data are checked.  Peak RSS does not depend on machine load, so the bounds are tight.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import gc, json, os, sys
    import torch
    from ort_torch_compat.api import CheckpointState
    from ort_torch_compat.engine.state import OptimizerState, ParameterSlot, TrainingState

    def rss(field):
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(field)

    def reset_peak():
        with open("/proc/self/clear_refs", "w") as handle:  # VmHWM := VmRSS
            handle.write("5")

    def measured(step):
        gc.collect()
        reset_peak()
        before = rss("VmRSS")
        result = step()
        return result, rss("VmHWM") - before

    path, external = sys.argv[1], sys.argv[2] == "1"
    names = [f"layer{i}.weight" for i in range(4)]
    params = {n: torch.full((1 << 22,), float(i), dtype=torch.float32) for i, n in enumerate(names)}  # 4 x 16 MiB
    state = TrainingState(parameters={n: ParameterSlot(n, 1, True, t) for n, t in params.items()})
    state.has_external_data = external
    state.optimizer = OptimizerState(group_name="group0", step=3, initial_learning_rate=1e-3, moments={
        n: {"momentum0": torch.full_like(t, 0.5), "momentum1": torch.full_like(t, 0.25)} for n, t in params.items()})
    data_bytes = 3 * sum(t.numel() * t.element_size() for t in params.values())
    _, save_peak = measured(lambda: CheckpointState.save_checkpoint(CheckpointState(state), path, include_optimizer_state=True))
    del state, params
    loaded, load_peak = measured(lambda: CheckpointState.load_checkpoint(path))
    assert loaded.parameters["layer3.weight"].data[-1] == 3.0
    assert float(loaded._state.optimizer.moments["layer2.weight"]["momentum1"][-1]) == 0.25
    print(json.dumps({"data_bytes": data_bytes, "save_peak": save_peak, "load_peak": load_peak}))
    """
)


def _can_reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _can_reset_peak(),
    reason="needs Linux's /proc/self/clear_refs to reset the peak RSS",
)
@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
def test_save_and_load_hold_no_extra_copy_of_the_state(tmp_path, external):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "ckpt"), "1" if external else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    size = report["data_bytes"]  # 192 MiB
    assert (tmp_path / "ckpt").stat().st_size + ((tmp_path / "ckpt.data").stat().st_size if external else 0) > size
    # A save adds metadata and I/O buffers only: far below one copy of the data.
    assert report["save_peak"] < 0.25 * size, report
    # A load adds the loaded tensors (one copy) and little else: far below two copies.
    assert report["load_peak"] < 1.25 * size, report
