"""ORT's AdamWOptimizer kernel as a functional torch kernel over (flat) tensors.

ORT's two modes differ in where eps and weight decay go (spec §3.3):
  mode 1 (HF, generate_artifacts' default): w -= lr*sqrt(bc)/ac * m/(sqrt(v)+eps); w -= lr*wd*w
  mode 0 (torch): w -= lr*wd*w; w -= lr * m / (ac*(sqrt(v/bc)+eps))
Scalar factors are computed in float32 exactly as ORT does, so results agree to float32
rounding.  Each call is a fixed handful of whole-tensor ops, independent of how many
parameters a model has, because the engine hands us flat buffers.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

f32 = np.float32


def bias_corrections(alpha: float, beta: float, step: int, correct_bias: bool):
    """(1 - alpha^t, 1 - beta^t) in float32 from a float64 power, as ORT computes them."""
    if not correct_bias:
        return f32(1.0), f32(1.0)
    return f32(1.0) - f32(math.pow(float(f32(alpha)), step)), f32(1.0) - f32(math.pow(float(f32(beta)), step))


def adamw_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    *,
    lr: float,
    step: int,
    alpha: float,
    beta: float,
    epsilon: float,
    weight_decay: float,
    adam_mode: int,
    correct_bias: bool,
) -> None:
    """Update params and moments in place; `step` is the 1-based step ORT feeds the kernel."""
    lr32, a, b, eps, wd = f32(lr), f32(alpha), f32(beta), f32(epsilon), f32(weight_decay)
    ac, bc = bias_corrections(a, b, step, correct_bias)
    with torch.no_grad():
        for w, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            if adam_mode == 0 and wd != 0:
                w.add_(w, alpha=float(-(lr32 * wd)))
            m.mul_(float(a)).add_(g, alpha=float(f32(1.0) - a))
            v.mul_(float(b)).addcmul_(g, g, value=float(f32(1.0) - b))
            if adam_mode == 1:
                step_size = lr32 * f32(math.sqrt(bc)) / ac if correct_bias else lr32
                denom = v.sqrt().add_(float(eps))
                w.addcdiv_(m, denom, value=float(-step_size))
                if wd != 0:
                    w.add_(w, alpha=float(-(lr32 * wd)))
            else:
                denom = (v / float(bc)).sqrt_().add_(float(eps)).mul_(float(ac))
                w.addcdiv_(m, denom, value=float(-lr32))
