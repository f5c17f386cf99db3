"""CUDA runs of the drop-in API; skipped cleanly where no GPU is present.

CUDA runs are held to the CPU parity tolerance (ort_torch_compat/testing/parity_rule.py: rtol 1e-4, atol 1e-5;
parameters after updates atol 2e-5), not a looser GPU one: float32 on the GPU differs from
float32 on the CPU by rounding only, while TF32 (torch's default for cuDNN convolutions,
switched off inside the engine's steps: engine/precision.py) misses it by orders of
magnitude, which this comparison is there to catch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ort_torch_compat.api as ours
from ort_torch_compat.testing.parity_rule import ADAMW_PARAM_ATOL, ATOL, RTOL
from ort_torch_compat.testing.scenario import compare, make_batch
from tests.conftest import FIXTURES, load_spec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
CONFIGS = ["mlp_ce_adamw_op17", "cnn_mse_sgd_op17", "transformer_ce_adamw_op17", "gru_mse_adamw_op17"]


def train(directory, device, use_torch_inputs):
    spec = load_spec(directory)
    state = ours.CheckpointState.load_checkpoint(directory / "checkpoint")
    module = ours.Module(directory / "training_model.onnx", state, directory / "eval_model.onnx", device=device)
    optimizer = ours.Optimizer(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(float(spec["lr"]))
    record = {}
    for k in range(1, 4):
        batch = make_batch(spec, k, 1)
        inputs = [batch[i["name"]] for i in spec["inputs"]]
        if use_torch_inputs:
            inputs = [torch.from_numpy(x).to(device) for x in inputs]
        loss = module(*inputs)
        record[f"step{k}/loss"] = np.asarray(loss.cpu() if isinstance(loss, torch.Tensor) else loss)
        optimizer.step()
        module.lazy_reset_grad()
    for name, param in state.parameters:
        record[f"param/{name}"] = param.data
    return record


@pytest.mark.parametrize("config", CONFIGS)
def test_cuda_matches_cpu(config):
    directory = FIXTURES / config
    cpu = train(directory, "cpu", False)
    users = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    for use_torch_inputs in (False, True):
        problems = compare(
            cpu,
            train(directory, "cuda", use_torch_inputs),
            rtol=RTOL,
            atol=ATOL,
            tolerances={"param/*": (RTOL, ADAMW_PARAM_ATOL)},
        )
        assert not problems, "\n".join(problems)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == users  # restored after each step
