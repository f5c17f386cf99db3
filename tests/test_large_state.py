"""A checkpoint state above protobuf/flatbuffers' 2 GiB limit (opt-in: ~8 GB of RAM, ~1 min).

    ORT_TORCH_COMPAT_LARGE_TESTS=1 python -m pytest tests/test_large_state.py

The layout logic itself is tested at small scale in tests/test_codec.py (lowered
thresholds); this runs the real size once.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from ort_torch_compat.api import CheckpointState
from ort_torch_compat.engine.state import ParameterSlot, TrainingState

pytestmark = pytest.mark.skipif(
    os.environ.get("ORT_TORCH_COMPAT_LARGE_TESTS") != "1", reason="opt-in: set ORT_TORCH_COMPAT_LARGE_TESTS=1"
)


def test_state_above_2_gib_round_trips_through_external_data(tmp_path):
    big = torch.arange(600 * 1024 * 1024, dtype=torch.float32)  # 2.34 GiB
    state = TrainingState(
        parameters={
            "big": ParameterSlot("big", 1, True, big),
            "small": ParameterSlot("small", 1, False, torch.ones(3)),
        },
        properties={"epoch": 1},
    )
    CheckpointState.save_checkpoint(CheckpointState(state), tmp_path / "ckpt")
    assert (tmp_path / "ckpt.data").stat().st_size >= big.numel() * 4
    assert (tmp_path / "ckpt").stat().st_size < 1024 * 1024
    loaded = CheckpointState.load_checkpoint(tmp_path / "ckpt")
    data = loaded.parameters["big"].data
    assert (
        data.shape == (big.numel(),)
        and data[-1] == big[-1].item()
        and np.array_equal(data[::4096], big.numpy()[::4096])
    )
    np.testing.assert_array_equal(loaded.parameters["small"].data, np.ones(3, np.float32))
    assert loaded.properties["epoch"] == 1
