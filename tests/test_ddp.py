"""examples/ddp_train.py: 2-process DDP (gloo, CPU) equals one process on the whole batch."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from ort_torch_compat.engine import load_state

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ddp_train.py"
DRIVER = ROOT / "tests" / "ddp_teardown_driver.py"  # runs the example's main(), then checks teardown
ARTIFACTS = ROOT / "examples" / "artifacts" / "mlp_classifier"
STEPS, GLOBAL_BATCH, LR = 4, 8, 0.2


def _example():
    spec = importlib.util.spec_from_file_location("ddp_train_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One torchrun launch of the example on 2 CPU processes: (completed process, output dir)."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    cwd = tmp_path_factory.mktemp("ddp")
    out = cwd / "out"
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(DRIVER),
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--lr",
        str(LR),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, cwd=cwd)
    return result, out


def test_teardown_leaves_no_gloo_thread(ddp_run):
    """Issue 19: a gloo thread alive at interpreter shutdown aborted rank 1 about once in 40 runs."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the driver lists threads in /proc/self/task")
    result, _ = ddp_run
    assert result.stdout.count("after main(): []") == 2, result.stdout[-2000:] + result.stderr[-4000:]


def test_two_process_ddp_equals_single_process(ddp_run):
    result, out = ddp_run
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "world size 2" in result.stdout

    # The reference: one process, the concatenated (global) batch, same SGD.
    module, losses = _example().train(ARTIFACTS, steps=STEPS, global_batch_size=GLOBAL_BATCH, lr=LR)
    np.testing.assert_allclose(np.load(out / "losses.npy"), losses, rtol=1e-5, atol=1e-5)
    trained = load_state(out / "checkpoint")
    initial = load_state(ARTIFACTS / "checkpoint")
    reference = module.checkpoint_state_dict()
    assert set(trained.parameters) == set(reference)
    for name, slot in trained.parameters.items():
        torch.testing.assert_close(slot.tensor, reference[name], rtol=1e-5, atol=1e-5)
        assert slot.requires_grad == initial.parameters[name].requires_grad
        assert not torch.equal(slot.tensor, initial.parameters[name].tensor), f"{name} did not train"
