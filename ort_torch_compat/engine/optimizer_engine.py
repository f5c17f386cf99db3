"""The optimizer step of ORT's training API.

Moments live in flat tensors aligned with the flat parameter groups; the state's
per-parameter moment tensors are views into them, so saving a checkpoint sees the live
moments, and a step is one fused multi-tensor kernel call per dtype group.  Moments are materialised lazily at the
first step, as ORT does (which is what lets an optimizer exist over a nominal state).
"""

from __future__ import annotations

import operator
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ..errors import ModelMismatchError, NominalStateError
from ..optim import (
    OptimizerSpec,
    PreparedFusedAdamW,
    adamw_step,
    clip_grad_norm_,
    linear_lr_factor,
    parse_optimizer_model,
    sgd_step,
)
from .checkpoint_io import moment_mismatch
from .model_io import ModelSource, describe, load_model
from .optimizer_graphs import OptimizerStepGraph
from .precision import with_precision
from .state import OptimizerState
from .threads import threaded
from .training_engine import LOAD_HINT, NOMINAL_OPTIMIZER, TrainingEngine


def learning_rate_value(lr: object, what: str) -> float:
    """`lr` as a float32-rounded float; TypeError for what ORT's float binding refuses (str, None, arrays)."""
    if isinstance(lr, (str, bytes)) or not hasattr(type(lr), "__float__") or getattr(lr, "ndim", 0):
        raise TypeError(f"{what} must be a number, got {type(lr).__name__} {lr!r}")
    return float(np.float32(float(lr)))


def step_count_value(value: object, what: str) -> int:
    """An int step count (negative allowed, as ORT); TypeError for floats, str, None."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}") from None


class OptimizerEngine:
    def __init__(self, optimizer_model: ModelSource, engine: TrainingEngine):
        self.engine = engine
        name = describe(optimizer_model, "optimizer model")
        self.spec: OptimizerSpec = parse_optimizer_model(load_model(optimizer_model, "optimizer model"), name)
        state = engine.state
        if state.optimizer is None:
            state.optimizer = OptimizerState()
        self.group = state.optimizer
        problem = moment_mismatch(state)
        if problem:
            raise ModelMismatchError(f"checkpoint state cannot be used with {name}: {problem}")
        self._groups: Optional[List[Tuple[List[torch.Tensor], List[List[torch.Tensor]]]]] = None
        self._flat_moments: List[List[torch.Tensor]] = []  # per dtype group, per moment kind
        # per dtype group: ([flat parameters], [[flat moment] per kind], [flat gradient]), made
        # at the first step with bound gradients (the flat tensors never change after)
        self._flat_args: Optional[List[Tuple[List[torch.Tensor], List[List[torch.Tensor]], List[torch.Tensor]]]] = None
        self._graph: Optional[OptimizerStepGraph] = None  # CUDA graphs (optimizer_graphs.py), once materialized
        # per flat group: the fused AdamW kernel prepared over its tensors (CPU), or None
        self._prepared: List[Optional[PreparedFusedAdamW]] = []
        a = self.spec.attributes
        self._adamw_attributes = (
            {}
            if self.spec.kind == "SGD"
            else dict(
                alpha=a["alpha"],
                beta=a["beta"],
                epsilon=a["epsilon"],
                weight_decay=a["weight_decay"],
                adam_mode=int(a["adam_mode"]),
                correct_bias=bool(a["correct_bias"]),
            )
        )
        if engine.tf32 is not None:  # CUDA: the engine's TF32 setting (precision.py); CPU: unwrapped
            self.step = with_precision(self.step, engine.tf32)

    # ---- moments ----------------------------------------------------------------------
    def _materialize(self) -> List[Tuple[List[torch.Tensor], List[List[torch.Tensor]]]]:
        """Per dtype group: the parameter views and, per moment kind, flat-backed moment views,
        filled from the loaded checkpoint or with zeros (ORT's rules)."""
        store = self.engine.store
        loaded = self.group.moments
        trainable = [n for group in store.groups.values() for n in group.names]
        if loaded:
            missing = [n for n in trainable if n not in loaded]
            if missing:
                raise ModelMismatchError(f"Parameter {missing[0]} not found in the source optimizer checkpoint states.")
        moments: Dict[str, Dict[str, torch.Tensor]] = {name: {} for name in trainable}
        groups = []
        self._flat_moments = []
        for group in store.groups.values():
            per_kind, flats = [], []
            self._flat_moments.append(flats)
            for key in self.spec.moment_names:
                flat = torch.zeros_like(group.data)
                flats.append(flat)
                views = [group.view(flat, index) for index in range(len(group.names))]
                for name, view in zip(group.names, views):
                    source = loaded.get(name, {}).get(key) if loaded else None
                    if source is not None:
                        view.copy_(source.reshape(view.shape))
                    moments[name][key] = view
                per_kind.append(views)
            params = [self.engine.state.parameters[name].tensor for name in group.names]
            groups.append((params, per_kind))
        self.group.moments = moments
        return groups

    # ---- step -------------------------------------------------------------------------
    @threaded(lambda optimizer: optimizer.engine.threads)
    def step(self) -> None:
        """One update of every trainable parameter (ORT updates all, with or without grads).

        Holds the state's lock, so a concurrent save sees the parameters, moments and step
        count of one step (see `TrainingState`)."""
        if self.engine.state.is_nominal:
            raise NominalStateError(f"{NOMINAL_OPTIMIZER} {LOAD_HINT}")
        with self.engine.state.lock:
            if self._groups is None:
                self._groups = self._materialize()
                streams = self.engine.graph_streams
                if streams is not None and OptimizerStepGraph.suits(self.engine.store):
                    self._graph = OptimizerStepGraph(
                        self.spec, self.engine.store, self._flat_moments, streams, self.engine.train_label
                    )
            lr = self.group.learning_rate
            fed_step = self.group.step + 1
            if self._graph is not None and self._graph.step(lr, fed_step):
                self.group.step = fed_step
                return
            if self.spec.clip_max_norm is not None:  # one norm over every trainable gradient, as ORT
                clip_grad_norm_([param.grad for params, _ in self._groups for param in params], self.spec.clip_max_norm)
            store = self.engine.store
            if store.grads_bound:  # gradients in the flat buffer (compiled steps): one tensor per group
                if self._flat_args is None:
                    self._flat_args = [
                        ([group.data], [[flat] for flat in flat_moments], [group.grad])
                        for group, flat_moments in zip(store.groups.values(), self._flat_moments)
                    ]
                    self._prepared = [self._prepare(*arguments) for arguments in self._flat_args]
                arguments, prepared = self._flat_args, self._prepared
            else:
                arguments = [(params, moments, [param.grad for param in params]) for params, moments in self._groups]
                prepared = [None] * len(arguments)
            for (params, moments, grads), kernel in zip(arguments, prepared):
                if self.spec.kind == "SGD":
                    sgd_step(params, grads, lr=lr)
                elif kernel is None or not kernel(lr, fed_step, self._adamw_attributes):
                    adamw_step(params, grads, moments[0], moments[1], lr=lr, step=fed_step, **self._adamw_attributes)
            self.group.step = fed_step

    def _prepare(
        self, params: List[torch.Tensor], moments: List[List[torch.Tensor]], grads: List[torch.Tensor]
    ) -> Optional[PreparedFusedAdamW]:
        """The fused AdamW kernel prepared over one flat group's tensors, where it applies."""
        if self.spec.kind == "SGD" or not PreparedFusedAdamW.suits(params, grads, *moments):
            return None
        return PreparedFusedAdamW(params, grads, moments[0], moments[1])

    # ---- learning rate ------------------------------------------------------------------
    def set_learning_rate(self, lr: float) -> None:
        self.group.learning_rate = learning_rate_value(lr, "learning rate")

    def get_learning_rate(self) -> float:
        return self.group.learning_rate

    def set_initial_learning_rate(self, lr: float) -> None:
        self.group.initial_learning_rate = learning_rate_value(lr, "initial learning rate")
        self.group.learning_rate = self.group.initial_learning_rate

    def apply_linear_schedule(self, warmup_step_count: int, total_step_count: int) -> None:
        """lr = initial_lr * f(completed steps): the scheduler keeps no counter of its own."""
        factor = linear_lr_factor(self.group.step, warmup_step_count, total_step_count)
        self.group.learning_rate = float(np.float32(self.group.initial_learning_rate) * np.float32(factor))
