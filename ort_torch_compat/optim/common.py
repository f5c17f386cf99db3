"""What ORT's optimizer kernels share, shared here the way torch.optim's functional kernels
share theirs: float32 scalars, the bias-correction coefficients, and (for the legacy
optimizers with two moments per weight) the torch optimizer's parameter groups, attribute
checks and state.

ORT rounds 1 - coefficient**t two ways (both take the power in float64 from the float32
coefficient):
- the training-API `AdamWOptimizer` kernel (adamw.cc, CPU and CUDA):
  ``1.f - static_cast<float>(std::pow(alpha_, step))``: the power is rounded to float32 and
  subtracted in float32;
- the legacy `AdamOptimizer` and `LambOptimizer` kernels (``compute_bias_correction_coefficient``,
  training_ops/cpu/optimizer/common.h): ``TC(1.0 - std::pow(double(coefficient), double(step)))``,
  subtracted in float64 and rounded once, and 1 for a step <= 0.
The two differ in float32's last bits as soon as coefficient**t is not a float32 (t >= 2),
which is why `bias_correction` takes the kernel's rule as an argument.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

f32 = np.float32


def bias_correction(coefficient: float, step: int, *, legacy: bool) -> np.float32:
    """1 - coefficient**step in float32, rounded as ORT's AdamWOptimizer (`legacy` False) or
    its legacy Adam/Lamb kernels (`legacy` True) round it; see the module docstring."""
    power = math.pow(float(f32(coefficient)), step)
    if legacy:
        return f32(1.0 - power) if step > 0 else f32(1.0)
    return f32(1.0) - f32(power)


def bias_corrections(
    alpha: float, beta: float, step: int, enabled: bool, *, legacy: bool
) -> Tuple[np.float32, np.float32]:
    """(1 - alpha**step, 1 - beta**step) as `bias_correction` rounds them; (1, 1) when not `enabled`."""
    if not enabled:
        return f32(1.0), f32(1.0)
    return bias_correction(alpha, step, legacy=legacy), bias_correction(beta, step, legacy=legacy)


def float32_scalars(*values: float) -> Tuple[np.float32, ...]:
    """Each value rounded to float32, as ORT holds its attributes and learning rate."""
    return tuple(f32(v) for v in values)


class MomentOptimizer(torch.optim.Optimizer):
    """The torch-optimizer side of a legacy ORT optimizer node with two moments per weight.

    Param groups carry the node's per-weight attributes under ORT's names; `alpha`, `beta`,
    `lambda` and `epsilon` must be >= 0 (ORT's constructor checks, the error naming the op
    and the group's `name` when it has one).  Every parameter's `moment_1` and `moment_2`
    exist from construction on, as ORT's initializers do.  Subclasses name their op in
    `op_type` and may add checks (`check_group`) and state (`initial_state`).
    """

    op_type = ""

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        owner = f" of '{group['name']}'" if "name" in group else ""
        for key in ("alpha", "beta", "lambda", "epsilon"):
            if group[key] < 0:
                raise ValueError(f"{self.op_type}: attribute '{key}'{owner} must be >= 0, got {group[key]}")
        self.check_group(group, owner)
        for p in group["params"]:
            self.state[p] = self.initial_state(p)

    def check_group(self, group: Dict[str, Any], owner: str) -> None:
        """The op's own checks of a new group's attributes (`owner`: " of '<name>'" or "")."""

    def initial_state(self, param: torch.Tensor) -> Dict[str, Any]:
        """A parameter's state before the first update."""
        return {"moment_1": torch.zeros_like(param), "moment_2": torch.zeros_like(param)}

    def params_with_grads(self) -> List[Tuple[Dict[str, Any], List[torch.Tensor], List[Dict[str, Any]]]]:
        """Per group: the group, its parameters that have a gradient, and their states."""
        result = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            result.append((group, params, [self.state[p] for p in params]))
        return result
