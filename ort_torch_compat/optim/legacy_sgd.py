"""ORT's legacy `SGDOptimizer` as a torch optimizer.

The legacy kernel computes w <- w + (-lr * g), with no momentum, weight decay or
gradient clipping: the formula of the SGDOptimizerV2 kernel that `sgd.sgd_step`
reproduces, so this class runs that kernel.  (ORT's CPU kernel rounds -lr * g before the
addition, `sgd_step` fuses the two: the weights can differ in the last bit.)
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from .sgd import sgd_step


class LegacySGD(torch.optim.Optimizer):
    """w <- w + (-lr * g) for every parameter with a gradient; no state."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]  (gradients are computed beforehand: no closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            sgd_step(params, [p.grad for p in params], lr=group["lr"])
