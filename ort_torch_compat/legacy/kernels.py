"""ORT's legacy optimizer kernels as functional torch code (formulas and sources: docs/legacy.md).

The legacy `TrainingSession` appended one of three com.microsoft optimizer ops to the
training graph: `SGDOptimizer`, `AdamOptimizer` (one node per weight, with a per-weight
`Update_Count`) and `LambOptimizer` (one node for all weights, with a shared `Step`).
Before the optimizer, ORT optionally divided accumulated gradients by the number of
accumulation steps and computed one global L2 norm over all trained gradients
(`ReduceAllL2`), which Adam and Lamb use for clipping (`max_norm_clip`).

Everything here runs in float32 with scalars rounded to float32 as ORT's kernels hold
them; bias corrections are computed from a float64 power, as ORT does.  All functions
update their tensors in place under `torch.no_grad()`.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import numpy as np
import torch

f32 = np.float32
Scalar = Union[float, torch.Tensor]


def bias_correction(coefficient: float, step: int) -> float:
    """1 - coefficient^step (float64 power rounded to float32); 1 for step <= 0."""
    if step <= 0:
        return 1.0
    return float(f32(1.0 - math.pow(float(f32(coefficient)), float(step))))


def global_norm(grads: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """sqrt(sum over all tensors of sum(g^2)), as a float32 scalar tensor (ReduceAllL2)."""
    if not grads:
        return None
    total = torch.stack([g.detach().float().square().sum() for g in grads]).sum()
    return total.sqrt()


def clip_divisor(grad_norm: Optional[torch.Tensor], max_norm: float) -> Scalar:
    """What the kernels divide a gradient by: ||g|| / max_norm when ||g|| > max_norm, else 1.

    This is ORT's `_ComputeGradScale` with no loss scale (full precision): gradients whose
    global norm exceeds `max_norm` are scaled down to norm `max_norm`.
    """
    if grad_norm is None:
        return 1.0
    max_norm = float(f32(max_norm))
    return torch.where(grad_norm > max_norm, grad_norm / max_norm, torch.ones_like(grad_norm))


@torch.no_grad()
def sgd_update(weights: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], *, lr: float) -> None:
    """SGDOptimizer: w <- w + (-lr * g).  No clipping, momentum or weight decay."""
    eta = float(f32(lr))
    for w, g in zip(weights, grads):
        w.add_(g.to(w.dtype) * (-eta))


@torch.no_grad()
def adam_update(
    weight: torch.Tensor,
    grad: torch.Tensor,
    moment_1: torch.Tensor,
    moment_2: torch.Tensor,
    *,
    lr: float,
    step: int,
    alpha: float = 0.9,
    beta: float = 0.999,
    lambda_: float = 0.0,
    epsilon: float = 1e-8,
    do_bias_correction: int = 1,
    weight_decay_mode: int = 0,
    divisor: Scalar = 1.0,
) -> None:
    """AdamOptimizer for one weight; `step` is its Update_Count before the call (1 at first).

    mode 0: w <- w - lr * ( (m1/ac) / (sqrt(m2/bc) + eps) + lambda*w )
    mode 1: u = (lr*sqrt(bc)/ac) * m1 / (sqrt(m2) + eps);  w <- w - u - lr*lambda*(w - u)
    with m1, m2 the updated moments of g/divisor, ac = 1-alpha^t, bc = 1-beta^t (1 when
    bias correction is off).
    """
    if weight_decay_mode not in (0, 1):
        raise ValueError(f"AdamOptimizer: unsupported weight_decay_mode {weight_decay_mode} (ORT supports 0 and 1)")
    a, b, lam, eps, eta = (float(f32(x)) for x in (alpha, beta, lambda_, epsilon, lr))
    ac = bias_correction(a, step) if do_bias_correction else 1.0
    bc = bias_correction(b, step) if do_bias_correction else 1.0
    g = grad.to(moment_1.dtype) / divisor
    moment_1.mul_(a).add_(g, alpha=float(f32(1.0) - f32(a)))
    moment_2.mul_(b).addcmul_(g, g, value=float(f32(1.0) - f32(b)))
    if weight_decay_mode == 0:
        denom = (moment_2 / bc).sqrt_().add_(eps)
        update = (moment_1 / ac).div_(denom).add_(weight, alpha=lam)
        weight.add_(update, alpha=-eta)
    else:
        step_size = float(f32(eta) * f32(math.sqrt(bc)) / f32(ac))
        denom = moment_2.sqrt().add_(eps)
        scaled = moment_1.mul(step_size).div_(denom)
        decay = (weight - scaled).mul_(eta * lam)
        weight.sub_(scaled).sub_(decay)


@torch.no_grad()
def lamb_update(
    weights: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    moments_1: Sequence[torch.Tensor],
    moments_2: Sequence[torch.Tensor],
    *,
    lr: float,
    step: int,
    alphas: Sequence[float],
    betas: Sequence[float],
    lambdas: Sequence[float],
    epsilons: Sequence[float],
    divisors: Sequence[Scalar],
    ratio_min: float = -math.inf,
    ratio_max: float = math.inf,
    do_bias_correction: int = 0,
) -> None:
    """LambOptimizer over all weights; `step` is the shared Step before the call (1 at first).

    Per weight: m1, m2 updated from g/divisor; d = lambda*w + (m1/ac) / (sqrt(m2/bc) + eps),
    where a non-finite d element becomes 0 and keeps its old moments; then
    r = lr * clamp(||w|| / ||d||, ratio_min, ratio_max) (just lr when either norm is 0) and
    w <- w - r*d, keeping the old element where the result is not finite.
    """
    eta = float(f32(lr))
    for i, (w, grad, m1, m2) in enumerate(zip(weights, grads, moments_1, moments_2)):
        a, b = float(f32(alphas[i])), float(f32(betas[i]))
        lam, eps = float(f32(lambdas[i])), float(f32(epsilons[i]))
        ac = bias_correction(a, step) if do_bias_correction else 1.0
        bc = bias_correction(b, step) if do_bias_correction else 1.0
        g = grad.to(m1.dtype) / divisors[i]
        m1_new = m1 * a + g * float(f32(1.0) - f32(a))
        m2_new = m2 * b + g * g * float(f32(1.0) - f32(b))
        direction = (m1_new / ac) / ((m2_new / bc).sqrt() + eps) + w * lam
        finite = torch.isfinite(direction)
        direction = torch.where(finite, direction, torch.zeros_like(direction))
        m1.copy_(torch.where(finite, m1_new, m1))
        m2.copy_(torch.where(finite, m2_new, m2))

        w_sq = w.float().square().sum()
        d_sq = direction.float().square().sum()
        trust = torch.sqrt(w_sq / d_sq)
        trust = torch.clamp(torch.clamp(trust, max=float(f32(ratio_max))), min=float(f32(ratio_min)))
        usable = (w_sq != 0) & (d_sq != 0)
        ratio = torch.where(usable, trust * eta, torch.full_like(trust, eta))
        w_new = w - ratio.to(w.dtype) * direction
        w.copy_(torch.where(torch.isfinite(w_new), w_new, w))
