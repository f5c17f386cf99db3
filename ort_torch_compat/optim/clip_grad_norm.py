"""ORT's InplaceClipGradNorm kernel (com.microsoft; onnxblock's ``optim.ClipGradNorm``, which an
optimizer block given ``clip_grad=`` puts before its AdamWOptimizer / SGDOptimizerV2 node).

Over all the gradients together: total = sqrt(sum of squares), in float32 like ORT's CPU
kernel; coefficient = min(max_norm / (total + 1e-6), 1); every gradient is multiplied by it
in place (ORT scales its gradient buffers, so the clipped values stay until the next reset).
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

#: ORT's kernel (orttraining/training_ops/cpu/optimizer/clip_grad_norm/clip_grad_norm.cc)
EPSILON = 1e-6


@torch.no_grad()
def clip_grad_norm_(grads: Iterable[Optional[torch.Tensor]], max_norm: float) -> torch.Tensor:
    """Scale `grads` (None: a gradient that is all zeros) in place; returns the total norm."""
    present = [g for g in grads if g is not None]
    if not present:
        return torch.zeros(())
    total = torch.zeros((), dtype=torch.float32, device=present[0].device)
    for g in present:
        flat = g.float()
        total = total + (flat * flat).sum().to(total.device)
    norm = total.sqrt()
    # max_norm rounded to float32 on the device (no host copy: a CUDA graph records this too)
    coefficient = torch.clamp(torch.full_like(norm, max_norm) / (norm + EPSILON), max=1.0)
    for g in present:
        g.mul_(coefficient.to(device=g.device, dtype=g.dtype))
    return norm
