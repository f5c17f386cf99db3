"""ORT's SGDOptimizerV2 kernel: w = w + (-lr * g); no momentum, no weight decay."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def sgd_step(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], *, lr: float) -> None:
    """w <- w + (-lr * g) for each parameter, in place (lr rounded to float32, as ORT holds it)."""
    with torch.no_grad():
        torch._foreach_add_(list(params), list(grads), alpha=float(-np.float32(lr)))
