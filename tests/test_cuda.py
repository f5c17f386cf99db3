"""CUDA runs of the drop-in API; skipped cleanly where no GPU is present."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import ort_torch_compat.api as ours
from tests.conftest import FIXTURES, load_spec
from tests.scenario import compare, make_batch

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
    for use_torch_inputs in (False, True):
        problems = compare(cpu, train(directory, "cuda", use_torch_inputs), rtol=1e-3, atol=1e-4)
        assert not problems, "\n".join(problems)
