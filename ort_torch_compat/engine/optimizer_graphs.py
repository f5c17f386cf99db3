"""The optimizer step as a CUDA graph (see cuda_graphs.py for why and when).

The graph applies ORT's update to whole flat buffers (one parameter, gradient and moment
tensor per dtype group): AdamW term by term as `optim.adamw`'s reference kernel computes it,
SGD as `optim.sgd`, and an optimizer model's gradient clipping first.  What changes from step
to step (the learning rate, the bias corrections of the step count) is computed on the host
in ORT's float32 roundings and copied into a small device tensor before each replay, through
pinned staging buffers that are reused only once their copy has run; so
`set_learning_rate`, the schedulers and loaded checkpoints take effect at the next step.

Only models of at most `MAX_GRAPHED_ELEMENTS` trainable elements use it: above that, the
memory passes of the term-by-term formula cost more than the launches a graph saves, and
the eager fused kernel (one pass) is faster.  The first step runs the graph's code eagerly
on the capture stream, the second captures it; where capture fails, the steps stay eager
(logged once).  The fused eager kernel and this formula agree to float32 rounding.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import numpy as np
import torch

from ..optim import OptimizerSpec, clip_grad_norm_
from ..optim.common import bias_corrections, f32, float32_scalars
from .cuda_graphs import DeviceStream, report_once
from .parameter_store import ParameterStore

MAX_GRAPHED_ELEMENTS = 1 << 22


class OptimizerStepGraph:
    """ORT's optimizer update of one engine's parameters, replayed as a CUDA graph.

    `moments[g]`: the flat moment tensors (first, second) of the store's dtype group `g`
    (empty for SGD)."""

    def __init__(
        self,
        spec: OptimizerSpec,
        store: ParameterStore,
        moments: Sequence[Sequence[torch.Tensor]],
        streams: DeviceStream,
        label: str,
    ):
        self.spec, self.store, self.streams, self.label = spec, store, streams, label
        store.flat_grad_views()
        self.buffers: List[Tuple[torch.Tensor, torch.Tensor, Sequence[torch.Tensor]]] = [
            (group.data, group.grad, flats) for group, flats in zip(store.groups.values(), moments)
        ]
        device = store.device
        self.scalars = torch.zeros(4, dtype=torch.float32, device=device)
        self.staging = streams.staging(self.scalars)
        self.refused = False
        self._warm = False
        self._recorder = None

    @staticmethod
    def suits(store: ParameterStore) -> bool:
        """Whether a model of this size gains from the graph (see the module docstring)."""
        return sum(group.data.numel() for group in store.groups.values()) <= MAX_GRAPHED_ELEMENTS

    # ---- scalars -------------------------------------------------------------------------
    def _values(self, lr: float, step: int) -> List[np.float32]:
        """The step's scalars, in the order `_update` reads them."""
        lr32 = f32(lr)
        if self.spec.kind == "SGD":
            return [-lr32, f32(0), f32(0), f32(0)]
        a = self.spec.attributes
        alpha, beta, _, wd = float32_scalars(a["alpha"], a["beta"], a["epsilon"], a["weight_decay"])
        correct_bias = bool(a["correct_bias"])
        ac, bc = bias_corrections(alpha, beta, step, correct_bias, legacy=False)
        if int(a["adam_mode"]) == 1:
            step_size = lr32 * f32(math.sqrt(bc)) / ac if correct_bias else lr32
            return [-step_size, -(lr32 * wd), f32(0), f32(0)]
        return [-(lr32 * wd), f32(1.0) / bc, ac, -lr32]

    # ---- the update --------------------------------------------------------------------------
    def _update(self) -> None:
        s = self.scalars
        if self.spec.clip_max_norm is not None:  # one norm over every gradient, as the eager step
            clip_grad_norm_([grad for _, grad, _ in self.buffers], self.spec.clip_max_norm)
        if self.spec.kind == "SGD":
            for w, g, _ in self.buffers:
                w.add_(g * s[0])
            return
        a = self.spec.attributes
        alpha, beta, eps, wd = (
            float(x) for x in float32_scalars(a["alpha"], a["beta"], a["epsilon"], a["weight_decay"])
        )
        mode = int(a["adam_mode"])
        for w, g, (m, v) in self.buffers:
            if mode == 0 and wd != 0:
                w.add_(w * s[0])
            m.mul_(alpha).add_(g, alpha=float(f32(1.0) - f32(alpha)))
            v.mul_(beta).addcmul_(g, g, value=float(f32(1.0) - f32(beta)))
            if mode == 1:
                w.add_(m.div(v.sqrt().add_(eps)).mul_(s[0]))
                if wd != 0:
                    w.add_(w * s[1])
            else:
                denom = v.mul(s[1]).sqrt_().add_(eps).mul_(s[2])
                w.add_(m.div(denom).mul_(s[3]))

    def step(self, lr: float, step: int) -> bool:
        """One update through the graph; False where the caller must run the eager step."""
        if self.refused:
            return False
        self.store.bind_flat_grads(copy=True)
        self.staging.send(self._values(lr, step))
        with torch.no_grad():
            if not self._warm:
                self.streams.run(self._update)
                self._warm = True
                return True
            if self._recorder is None:
                recorder = self.streams.recorder()
                try:
                    recorder.capture(self._update)
                except Exception as error:  # noqa: BLE001
                    self.refused = True
                    report_once(self.label, f"optimizer capture failed ({type(error).__name__}: {error})")
                    return False
                self._recorder = recorder
            self._recorder.replay()
        return True
