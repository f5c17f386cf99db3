"""The optimizer step of ORT's training API over the engine's flat buffers.

Moments live in flat tensors aligned with the flat parameter groups; the state's
per-parameter moment tensors are views into them, so saving a checkpoint sees the live
moments and a step is a few whole-buffer kernels.  Moments are materialised lazily at the
first step, as ORT does (which is what lets an optimizer exist over a nominal state).
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

from ..errors import ModelMismatchError, NominalStateError
from ..optim import OptimizerSpec, adamw_step, linear_lr_factor, parse_optimizer_model, sgd_step
from .model_io import ModelSource, describe, load_model
from .state import OptimizerState
from .training_engine import TrainingEngine


class OptimizerEngine:
    def __init__(self, optimizer_model: ModelSource, engine: TrainingEngine):
        self.engine = engine
        name = describe(optimizer_model, "optimizer model")
        self.spec: OptimizerSpec = parse_optimizer_model(load_model(optimizer_model, "optimizer model"), name)
        state = engine.state
        if state.optimizer is None:
            state.optimizer = OptimizerState()
        self.group = state.optimizer
        self._flat_moments: Optional[Dict[torch.dtype, list]] = None

    # ---- moments ----------------------------------------------------------------------
    def _materialize_moments(self) -> Dict[torch.dtype, list]:
        """Flat moment buffers, filled from the loaded checkpoint or zeros (ORT rules)."""
        store = self.engine.store
        loaded = self.group.moments
        trainable = [n for group in store.groups.values() for n in group.names]
        if loaded:
            missing = [n for n in trainable if n not in loaded]
            if missing:
                raise ModelMismatchError(f"Parameter {missing[0]} not found in the source optimizer checkpoint states.")
        flats: Dict[torch.dtype, list] = {}
        moments: Dict[str, Dict[str, torch.Tensor]] = {}
        for dtype, group in store.groups.items():
            buffers = [torch.zeros_like(group.data) for _ in self.spec.moment_names]
            for index, name in enumerate(group.names):
                views = {}
                for key, flat in zip(self.spec.moment_names, buffers):
                    view = group.view(flat, index)
                    source = loaded.get(name, {}).get(key) if loaded else None
                    if source is not None:
                        view.copy_(source.reshape(view.shape))
                    views[key] = view
                moments[name] = views
            flats[dtype] = buffers
        self.group.moments = moments
        return flats

    # ---- step -------------------------------------------------------------------------
    def step(self) -> None:
        if self.engine.state.is_nominal:
            raise NominalStateError("Cannot perform an optimizer step with a nominal state. Load the parameters first.")
        if self._flat_moments is None:
            self._flat_moments = self._materialize_moments()
        store = self.engine.store
        lr = self.group.learning_rate
        fed_step = self.group.step + 1
        for dtype, group in store.groups.items():
            moments = self._flat_moments[dtype]
            if self.spec.kind == "SGD":
                sgd_step([group.data], [group.grad], lr=lr)
            else:
                a = self.spec.attributes
                adamw_step(
                    [group.data], [group.grad], [moments[0]], [moments[1]],
                    lr=lr, step=fed_step, alpha=a["alpha"], beta=a["beta"], epsilon=a["epsilon"],
                    weight_decay=a["weight_decay"], adam_mode=int(a["adam_mode"]), correct_bias=bool(a["correct_bias"]),
                )
        self.group.step = fed_step

    # ---- learning rate ------------------------------------------------------------------
    def set_learning_rate(self, lr: float) -> None:
        self.group.learning_rate = float(np.float32(lr))

    def get_learning_rate(self) -> float:
        return self.group.learning_rate

    def set_initial_learning_rate(self, lr: float) -> None:
        self.group.initial_learning_rate = float(np.float32(lr))
        self.group.learning_rate = float(np.float32(lr))

    def apply_linear_schedule(self, warmup_step_count: int, total_step_count: int) -> None:
        """lr = initial_lr * f(completed steps): the scheduler keeps no counter of its own."""
        factor = linear_lr_factor(self.group.step, warmup_step_count, total_step_count)
        self.group.learning_rate = float(np.float32(self.group.initial_learning_rate) * np.float32(factor))
