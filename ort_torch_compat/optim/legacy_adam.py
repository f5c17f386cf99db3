"""ORT's legacy `AdamOptimizer` CPU kernel: a functional kernel and a torch optimizer over it.

The legacy `TrainingSession` appended one com.microsoft AdamOptimizer node per trained
weight, each with its own attributes and its own `Update_Count` (1 before the first
update).  With t that count and g the weight's gradient:

    m1 <- alpha * m1 + (1 - alpha) * g
    m2 <- beta  * m2 + ((1 - beta) * g) * g
    ac, bc = 1 - alpha^t, 1 - beta^t            (both 1 when do_bias_correction is 0)
    weight_decay_mode 0:  w <- w + -lr * ((m1 / ac) / (sqrt(m2 / bc) + epsilon) + lambda * w)
    weight_decay_mode 1:  s = lr * sqrt(bc) / ac;  u = s * m1 / (sqrt(m2) + epsilon)
                          w <- w + (-u - (lr * lambda) * (w - u))
    t <- t + 1

in float32, scalars rounded to float32 and each operation in the kernel's order, so the
numbers are ORT's to the last bit where torch rounds like Eigen.  The CPU kernel reads no
gradient norm: unlike ORT's CUDA kernel it never clips (`max_norm_clip` has no effect),
and it applies no loss scale.  Source lines: docs/legacy.md.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Sequence

import torch

from .common import MomentOptimizer, bias_corrections, f32, float32_scalars


@torch.no_grad()
def legacy_adam_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    moments_1: Sequence[torch.Tensor],
    moments_2: Sequence[torch.Tensor],
    update_counts: Sequence[int],
    *,
    lr: float,
    alpha: float = 0.9,
    beta: float = 0.999,
    lambda_: float = 0.0,
    epsilon: float = 1e-8,
    do_bias_correction: bool = True,
    weight_decay_mode: int = 0,
) -> None:
    """Update params and moments in place; `update_counts[i]` is param i's Update_Count before the update."""
    if weight_decay_mode not in (0, 1):
        raise ValueError(f"AdamOptimizer: weight_decay_mode must be 0 or 1, got {weight_decay_mode}")
    eta, a, b, lam, eps = float32_scalars(lr, alpha, beta, lambda_, epsilon)
    one_minus_a, one_minus_b = float(f32(1.0) - a), float(f32(1.0) - b)
    for w, g, m1, m2, count in zip(params, grads, moments_1, moments_2, update_counts):
        ac, bc = (float(c) for c in bias_corrections(a, b, count, do_bias_correction, legacy=True))
        m1.mul_(float(a)).add_(g * one_minus_a)
        m2.mul_(float(b)).add_(g.mul(one_minus_b).mul_(g))
        if weight_decay_mode == 0:
            denom = m2.div(bc).sqrt_().add_(float(eps))
            update = m1.div(ac).div_(denom).add_(w * float(lam))
            w.add_(update.mul_(-float(eta)))
        else:
            step_size = f32(eta * f32(math.sqrt(bc))) / f32(ac)
            u = m1.mul(float(step_size)).div_(m2.sqrt().add_(float(eps)))
            decay = (w - u).mul_(float(eta * lam))
            w.add_(u.neg_().sub_(decay))


class LegacyAdam(MomentOptimizer):
    """ORT's legacy AdamOptimizer as a torch optimizer (one param group per ORT node's attributes).

    Group keys carry ORT's attribute names: `alpha`, `beta`, `lambda`, `epsilon`,
    `do_bias_correction`, `weight_decay_mode` (and `lr`).  The state of each parameter
    (`moment_1`, `moment_2`, `update_count`) exists from construction on, as ORT's
    initializers do, with `update_count` 1.
    """

    op_type = "AdamOptimizer"

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        alpha: float = 0.9,
        beta: float = 0.999,
        lambda_: float = 0.0,
        epsilon: float = 1e-8,
        do_bias_correction: bool = True,
        weight_decay_mode: int = 0,
    ):
        defaults = {
            "lr": lr,
            "alpha": alpha,
            "beta": beta,
            "lambda": lambda_,
            "epsilon": epsilon,
            "do_bias_correction": int(do_bias_correction),
            "weight_decay_mode": weight_decay_mode,
        }
        super().__init__(params, defaults)

    def check_group(self, group: Dict[str, Any], owner: str) -> None:
        for key in ("do_bias_correction", "weight_decay_mode"):
            if group[key] not in (0, 1):
                raise ValueError(f"AdamOptimizer: {key}{owner} must be 0 or 1, got {group[key]}")

    def initial_state(self, param: torch.Tensor) -> Dict[str, Any]:
        return {**super().initial_state(param), "update_count": 1}

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]  (gradients are computed beforehand: no closure)
        for group, params, states in self.params_with_grads():
            legacy_adam_step(
                params,
                [p.grad for p in params],
                [s["moment_1"] for s in states],
                [s["moment_2"] for s in states],
                [s["update_count"] for s in states],
                lr=group["lr"],
                alpha=group["alpha"],
                beta=group["beta"],
                lambda_=group["lambda"],
                epsilon=group["epsilon"],
                do_bias_correction=bool(group["do_bias_correction"]),
                weight_decay_mode=group["weight_decay_mode"],
            )
            for state in states:
                state["update_count"] += 1
