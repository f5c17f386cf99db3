"""Drop-in `onnxruntime.training.api.LinearLRScheduler`, ORT 1.19.2 quirk included.

ORT 1.19.2's Python wrapper passes (warmup, total) to a binding declared as (total, warmup),
so the warmup really lasts `total_step_count` steps and the decay ends at
`warmup_step_count`.  Scripts tuned against ORT depend on that, so the drop-in class
reproduces it; `corrected=True` (or `CorrectedLinearLRScheduler`) gives the documented
behaviour, the one ORT's C API has.
"""

from __future__ import annotations

from ..engine.optimizer_engine import step_count_value
from .optimizer import Optimizer


class LinearLRScheduler:
    def __init__(
        self,
        optimizer: Optimizer,
        warmup_step_count: int,
        total_step_count: int,
        initial_lr: float,
        *,
        corrected: bool = False,
    ):
        self._optimizer = optimizer._optimizer
        # Counts must be ints (ORT's binding raises TypeError otherwise); negatives are allowed, as in ORT.
        warmup_step_count = step_count_value(warmup_step_count, "warmup_step_count")
        total_step_count = step_count_value(total_step_count, "total_step_count")
        if corrected:
            self._warmup, self._total = warmup_step_count, total_step_count
        else:
            self._warmup, self._total = total_step_count, warmup_step_count
        self._optimizer.set_initial_learning_rate(initial_lr)
        self.step()

    def step(self) -> None:
        """Recompute the lr from the optimizer's completed steps (no counter of its own)."""
        self._optimizer.apply_linear_schedule(self._warmup, self._total)


class CorrectedLinearLRScheduler(LinearLRScheduler):
    """LinearLRScheduler with warmup and total in the documented roles."""

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int, initial_lr: float):
        super().__init__(optimizer, warmup_step_count, total_step_count, initial_lr, corrected=True)
