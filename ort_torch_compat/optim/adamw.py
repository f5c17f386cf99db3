"""ORT's AdamWOptimizer kernel as a functional torch kernel over (flat) tensors.

ORT's two modes differ in where eps and weight decay go (spec §3.3):
  mode 1 (HF, generate_artifacts' default): w -= lr*sqrt(bc)/ac * m/(sqrt(v)+eps); w -= lr*wd*w
  mode 0 (torch): w -= lr*wd*w; w -= lr * m / (ac*(sqrt(v/bc)+eps))
with ac = 1 - alpha^t, bc = 1 - beta^t.

Two implementations:
- `reference`: ORT's formula term by term, scalars rounded to float32 as ORT does them;
  about seven passes over the buffers.
- `fused`: torch's single-pass fused AdamW kernel with hyperparameters rewritten so the
  mathematics is ORT's: for mode 1, eps' = eps/sqrt(bc) moves eps outside the bias
  correction, and lr' = lr*(1-lr*wd), wd' = wd/(1-lr*wd) turn "decay after the update"
  into torch's "decay before".  Mode 0 is torch's AdamW as is.
The two agree to float32 rounding (tested); `fused` is the default where torch has it for
the parameters' device (torch < 2.4 has no CPU kernel: probed once per device type, since the
op exists everywhere but fails at run time), except when lr*wd >= 1 in mode 1, where
the rewrite would divide by 1 - lr*wd <= 0 (ORT's formula then zeroes or flips the weights).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .common import bias_correction, bias_corrections, f32, float32_scalars


@lru_cache(maxsize=None)
def fused_available(device_type: str) -> bool:
    """Whether torch's fused AdamW kernel runs on this device type (probed on one element)."""
    if not hasattr(torch, "_fused_adamw_"):
        return False
    one = [torch.zeros(1, device=device_type)]
    try:
        torch._fused_adamw_(
            one,
            [torch.zeros(1, device=device_type)],
            [torch.zeros(1, device=device_type)],
            [torch.zeros(1, device=device_type)],
            [],
            [torch.ones((), device=device_type)],
            lr=0.1,
            beta1=0.9,
            beta2=0.999,
            weight_decay=0.0,
            eps=1e-8,
            amsgrad=False,
            maximize=False,
        )
    except (RuntimeError, NotImplementedError):
        return False
    return True


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
    fused: Optional[bool] = None,
) -> None:
    """Update params and moments in place; `step` is the 1-based step ORT feeds the kernel."""
    hyper = _fused_hyperparameters(lr, weight_decay, epsilon, alpha, beta, adam_mode) if correct_bias else None
    use_fused = hyper is not None and fused is not False and bool(params) and fused_available(params[0].device.type)
    with torch.no_grad():
        if use_fused:
            _fused(params, grads, exp_avgs, exp_avg_sqs, hyper, step)
        else:
            _reference(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                lr=lr,
                step=step,
                alpha=alpha,
                beta=beta,
                epsilon=epsilon,
                weight_decay=weight_decay,
                adam_mode=adam_mode,
                correct_bias=correct_bias,
            )


def _reference(
    params, grads, exp_avgs, exp_avg_sqs, *, lr, step, alpha, beta, epsilon, weight_decay, adam_mode, correct_bias
):
    lr32, a, b, eps, wd = float32_scalars(lr, alpha, beta, epsilon, weight_decay)
    ac, bc = bias_corrections(a, b, step, correct_bias, legacy=False)
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


@lru_cache(maxsize=64)
def _fused_hyperparameters(
    lr: float, weight_decay: float, epsilon: float, alpha: float, beta: float, adam_mode: int
) -> Optional[Tuple[float, float, float, float, float, bool]]:
    """(lr, weight decay, eps, beta1, beta2, eps divided by sqrt(bc) each step) for torch's
    fused kernel, the rewrite of the module docstring applied; None where it cannot be
    applied (mode 1 with lr*wd >= 1).  Cached: they change only with the learning rate."""
    lr, wd, eps, a, b = (float(x) for x in float32_scalars(lr, weight_decay, epsilon, alpha, beta))
    if adam_mode != 1:
        return lr, wd, eps, a, b, False
    if float(f32(lr) * f32(wd)) >= 1.0:
        return None
    shrink = 1.0 - lr * wd
    return lr * shrink, (wd / shrink if wd else 0.0), eps, a, b, True


def _fused(params, grads, exp_avgs, exp_avg_sqs, hyper, step, steps=None):
    """torch's fused kernel; `steps`: the step-count tensors (holding `step`), or None to
    make them."""
    lr, wd, eps, a, b, eps_outside = hyper
    if eps_outside:  # mode 1: eps is added after the bias correction
        eps = eps / math.sqrt(float(bias_correction(b, step, legacy=False)))
    # The kernel only reads the step counts, and takes tensors of one device (the fused
    # kernels' rule): one step tensor serves every parameter (a tensor per parameter cost
    # ~1.5 us each, per step; so does asking each parameter for its device).
    if steps is None:
        steps = [torch.full((), float(step), dtype=torch.float32, device=params[0].device)] * len(params)
    torch._fused_adamw_(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        lr=lr,
        beta1=a,
        beta2=b,
        weight_decay=wd,
        eps=eps,
        amsgrad=False,
        maximize=False,
    )


class PreparedFusedAdamW:
    """`adamw_step`'s fused path prepared once over fixed lists of CPU tensors that do not
    require grad (the engine's flat groups), for the per-step Python to be the kernel call:
    the step count is written through a NumPy view into a tensor made once (not a new tensor
    per step), no grad-mode switch (nothing here is tracked by autograd), the hyperparameters
    cached per learning rate.  Measured on a 1123-float group, one thread: 4.3-5.0 us per
    step where `adamw_step` takes 9.1-9.6 (the kernel alone 2.6-2.9).  Same kernel, same
    arguments: results are bit-identical to `adamw_step`'s.  One per optimizer: the step
    tensor is its own."""

    def __init__(
        self,
        params: List[torch.Tensor],
        grads: List[torch.Tensor],
        exp_avgs: List[torch.Tensor],
        exp_avg_sqs: List[torch.Tensor],
    ):
        self.tensors = (params, grads, exp_avgs, exp_avg_sqs)
        self._step_value = np.zeros((), dtype=np.float32)
        self._steps = [torch.from_numpy(self._step_value)] * len(params)

    @staticmethod
    def suits(params: Sequence[torch.Tensor], *others: Sequence[torch.Tensor]) -> bool:
        """Whether these tensors qualify: all on the CPU, none requiring grad, and torch has
        the CPU kernel."""
        tensors = [t for group in (params, *others) for t in group]
        return (
            bool(params)
            and all(t.device.type == "cpu" and not t.requires_grad for t in tensors)
            and fused_available("cpu")
        )

    def __call__(self, lr: float, step: int, attributes: Mapping[str, float]) -> bool:
        """One update; `attributes` are `adamw_step`'s keyword arguments past lr and step
        (alpha, beta, epsilon, weight_decay, adam_mode, correct_bias).  False, having done
        nothing, where the fused kernel cannot express it (no bias correction, or mode 1 with
        lr*wd >= 1): the caller then runs `adamw_step`."""
        if not attributes["correct_bias"]:
            return False
        hyper = _fused_hyperparameters(
            lr,
            attributes["weight_decay"],
            attributes["epsilon"],
            attributes["alpha"],
            attributes["beta"],
            int(attributes["adam_mode"]),
        )
        if hyper is None:
            return False
        self._step_value[()] = step
        _fused(*self.tensors, hyper, step, self._steps)
        return True
