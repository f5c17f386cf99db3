"""ORT's LinearLRScheduler factor, a pure function of the optimizer's completed steps."""

from __future__ import annotations

import numpy as np


def linear_lr_factor(step: int, warmup_step_count: int, total_step_count: int) -> float:
    """Warm up linearly from 0 over `warmup` steps, then decay linearly to 0 at `total`."""
    if step < warmup_step_count:
        return float(np.float32(step) / np.float32(max(1, warmup_step_count)))
    return float(
        max(
            np.float32(0.0),
            np.float32(total_step_count - step) / np.float32(max(1, total_step_count - warmup_step_count)),
        )
    )
