"""Saving while another thread trains the same state (issue 17): every checkpoint written is
one consistent step, its parameters and moments those of the step count it records.

The threading contract (docs/design.md, "Threading"): the engine holds the state's lock for
each call that changes the state and the save holds it while it copies the state.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import ort_torch_compat.api as api
from ort_torch_compat.testing.scenario import make_batch
from tests.conftest import FIXTURES, load_spec

ADAMW = FIXTURES / "mlp_mse_adamw_op17"
CNN = FIXTURES / "cnn_ce_adamw_op17"  # BatchNorm: running stats change in the forward pass


def snapshot(state):
    params = {name: p.data.copy() for name, p in state.parameters}
    optimizer = state._state.optimizer
    moments = (
        {}
        if optimizer is None
        else {
            (name, key): value.detach().cpu().numpy().copy()
            for name, kinds in optimizer.moments.items()
            for key, value in kinds.items()
        }
    )
    return params, moments


@pytest.fixture
def fast_thread_switches():
    """Switch threads every 10 microseconds, so a copy torn by a concurrent step would show."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.parametrize("directory", [ADAMW, CNN], ids=["mlp", "cnn-batchnorm"])
def test_save_during_training_in_another_thread_is_one_step(tmp_path, directory, fast_thread_switches):
    spec = load_spec(directory)
    batches = [[data[i["name"]] for i in spec["inputs"]] for data in (make_batch(spec, k, 1) for k in range(3))]
    state = api.CheckpointState.load_checkpoint(directory / "checkpoint")
    module = api.Module(directory / "training_model.onnx", state)
    optimizer = api.Optimizer(directory / "optimizer_model.onnx", module)
    module(*batches[0])
    optimizer.step()  # moments exist from here on
    after_step = {1: snapshot(state)}
    done = threading.Event()

    saved = []

    def train():
        try:
            for step in range(2, 3000):
                if step > 40 and len(saved) >= 15:
                    break
                module(*batches[step % 3])
                optimizer.step()
                module.lazy_reset_grad()
                after_step[step] = snapshot(state)
        finally:
            done.set()

    trainer = threading.Thread(target=train)
    trainer.start()
    while not done.is_set():
        path = tmp_path / f"ck{len(saved)}"
        api.CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
        saved.append(path)
    trainer.join()
    assert len(saved) >= 15
    for path in saved:
        loaded = api.CheckpointState.load_checkpoint(path)
        step = loaded._state.optimizer.step
        params, moments = snapshot(loaded)
        want_params, want_moments = after_step[step]
        stats = sorted(name for name in params if "running" in name)
        if stats:  # saved after this step, or after the next step's forward pass (its BatchNorm update)
            candidates = [after_step[s][0] for s in (step, step + 1) if s in after_step]
            assert any(all(np.array_equal(params[n], c[n]) for n in stats) for c in candidates), path.name
        for name, value in want_params.items():
            if name not in stats:
                np.testing.assert_array_equal(params[name], value, err_msg=f"{path.name} (step {step}): {name}")
        for key, value in want_moments.items():
            np.testing.assert_array_equal(moments[key], value, err_msg=f"{path.name} (step {step}): moment {key}")
