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
ARTIFACTS = ROOT / "examples" / "artifacts" / "mlp_classifier"
STEPS, GLOBAL_BATCH, LR = 4, 8, 0.2


def _example():
    spec = importlib.util.spec_from_file_location("ddp_train_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_process_ddp_equals_single_process(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path / "ddp"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(EXAMPLE), "--out", str(out), "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH),
               "--lr", str(LR)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
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
