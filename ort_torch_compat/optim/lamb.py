"""ORT's legacy `LambOptimizer`: a functional kernel and a torch optimizer over it.

The legacy `TrainingSession` appended one com.microsoft LambOptimizer node for all trained
weights, with per-weight `alpha`, `beta`, `lambda`, `epsilon`, `max_norm_clip`, node-wide
`ratio_min`, `ratio_max`, `do_bias_correction`, and one shared `Step` (1 before the first
update).  ORT had only a CUDA kernel for it; with t = Step, G the global L2 norm of all
gradients when gradient-norm clipping is on, and per weight:

    g   <- g / (G / max_norm_clip)   when G > max_norm_clip     (ORT's _ComputeGradScale)
    m1' = alpha * m1 + (1 - alpha) * g
    m2' = beta  * m2 + ((1 - beta) * g) * g
    d   = lambda * w + (m1' / ac) / (sqrt(m2' / bc) + epsilon)  (ac, bc = 1 - alpha^t, 1 - beta^t,
                                                                  or 1 without bias correction)
          where d is not finite: d = 0 and m1, m2 keep their old values; else m1, m2 <- m1', m2'
    r   = lr * max(ratio_min, min(ratio_max, sqrt(sum(w^2) / sum(d^2))))   (lr when a sum is 0)
    w   <- w + -r * d                                           (kept where that is not finite)
    t   <- t + 1                                                 (once per update, all weights)

in float32 with float32 scalars.  Source lines: docs/legacy.md.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Optional, Sequence

import torch

from .common import MomentOptimizer, bias_corrections, f32, float32_scalars


def global_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """sqrt(sum over all tensors of sum(g^2)) as a float32 scalar (ORT's ReduceAllL2)."""
    return torch.stack([g.float().square().sum() for g in grads]).sum().sqrt()


@torch.no_grad()
def lamb_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    moments_1: Sequence[torch.Tensor],
    moments_2: Sequence[torch.Tensor],
    *,
    lr: float,
    step: int,
    alpha: float = 0.9,
    beta: float = 0.999,
    lambda_: float = 0.0,
    epsilon: float = 1e-6,
    max_norm_clip: float = 1.0,
    grad_norm: Optional[torch.Tensor] = None,
    ratio_min: float = -math.inf,
    ratio_max: float = math.inf,
    do_bias_correction: bool = False,
) -> None:
    """Update params and moments in place; `step` is the shared Step before the update and
    `grad_norm` the global gradient norm when clipping (None: no clipping)."""
    eta, a, b, lam, eps = (float(x) for x in float32_scalars(lr, alpha, beta, lambda_, epsilon))
    one_minus_a, one_minus_b = float(f32(1.0) - f32(a)), float(f32(1.0) - f32(b))
    ac, bc = (float(c) for c in bias_corrections(a, b, step, do_bias_correction, legacy=True))
    low, high = float(f32(ratio_min)), float(f32(ratio_max))
    divisor = None
    if grad_norm is not None:
        max_norm = float(f32(max_norm_clip))
        divisor = torch.where(grad_norm > max_norm, grad_norm / max_norm, torch.ones_like(grad_norm))
    for w, grad, m1, m2 in zip(params, grads, moments_1, moments_2):
        g = grad if divisor is None else grad / divisor.to(grad.dtype)
        m1_new = m1 * a + g * one_minus_a
        m2_new = m2 * b + (g * one_minus_b) * g
        direction = w * lam + (m1_new / ac) / ((m2_new / bc).sqrt() + eps)
        finite = torch.isfinite(direction)
        direction = torch.where(finite, direction, torch.zeros_like(direction))
        m1.copy_(torch.where(finite, m1_new, m1))
        m2.copy_(torch.where(finite, m2_new, m2))

        w_sq, d_sq = w.square().sum(), direction.square().sum()
        trust = torch.clamp(torch.clamp(torch.sqrt(w_sq / d_sq), max=high), min=low)
        ratio = torch.where((w_sq != 0) & (d_sq != 0), trust * eta, torch.full_like(trust, eta))
        updated = w + (-ratio) * direction
        w.copy_(torch.where(torch.isfinite(updated), updated, w))


class Lamb(MomentOptimizer):
    """ORT's legacy LambOptimizer as a torch optimizer.

    Param groups carry the per-weight attributes under ORT's names (`alpha`, `beta`,
    `lambda`, `epsilon`, `max_norm_clip`, and `lr`); `ratio_min`, `ratio_max` and
    `do_bias_correction` are one value for the whole node, as in ORT.  `clip_grad_norm`
    is ORT's `enable_grad_norm_clip`: gradients are divided by max(1, G / max_norm_clip),
    G being the global norm over every parameter of the optimizer.  `step_count` is
    ORT's shared `Step` (1 before the first update); moments exist from construction on.
    """

    op_type = "LambOptimizer"

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        alpha: float = 0.9,
        beta: float = 0.999,
        lambda_: float = 0.0,
        epsilon: float = 1e-6,
        max_norm_clip: float = 1.0,
        *,
        ratio_min: float = -math.inf,
        ratio_max: float = math.inf,
        do_bias_correction: bool = False,
        clip_grad_norm: bool = True,
    ):
        self.ratio_min, self.ratio_max = ratio_min, ratio_max
        self.do_bias_correction = bool(do_bias_correction)
        self.clip_grad_norm = bool(clip_grad_norm)
        self.step_count = 1
        defaults = {
            "lr": lr,
            "alpha": alpha,
            "beta": beta,
            "lambda": lambda_,
            "epsilon": epsilon,
            "max_norm_clip": max_norm_clip,
        }
        super().__init__(params, defaults)

    def check_group(self, group: Dict[str, Any], owner: str) -> None:
        if group["max_norm_clip"] == 0:
            raise ValueError(f"LambOptimizer: max_norm_clip{owner} must not be 0")

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]  (gradients are computed beforehand: no closure)
        with_grads = self.params_with_grads()
        everything = [p.grad for _, params, _ in with_grads for p in params]
        norm = global_norm(everything) if self.clip_grad_norm and everything else None
        for group, params, states in with_grads:
            lamb_step(
                params,
                [p.grad for p in params],
                [s["moment_1"] for s in states],
                [s["moment_2"] for s in states],
                lr=group["lr"],
                step=self.step_count,
                alpha=group["alpha"],
                beta=group["beta"],
                lambda_=group["lambda"],
                epsilon=group["epsilon"],
                max_norm_clip=group["max_norm_clip"],
                grad_norm=norm,
                ratio_min=self.ratio_min,
                ratio_max=self.ratio_max,
                do_bias_correction=self.do_bias_correction,
            )
        self.step_count += 1
