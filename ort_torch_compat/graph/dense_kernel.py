"""A dense-layer kernel that is fast on every x86 CPU.

PyTorch runs float32 `mm`/`addmm` on the CPU through MKL, which takes slow code paths on
non-Intel processors: on the AMD EPYC (Zen 4) machines this project is measured on, MKL
reaches ~200 GFLOP/s where oneDNN (which PyTorch also ships, for convolutions) reaches
~400 on the same shapes, and ONNX Runtime's MLAS is as fast as oneDNN.  Dense layers
dominate training steps, so `linear` routes float32 CPU dense layers, forward and both
backward products, through oneDNN's matmul (`torch.ops.mkldnn._linear_pointwise`, the op
TorchInductor uses), and falls back to `F.linear` wherever that op is unavailable or the
tensors are not float32 CPU tensors.  Results are float32 GEMMs either way; only the
summation order differs.

Small products stay on `F.linear`: oneDNN's op builds its primitive on every call (the
weight is fed, not prepacked), ~20-25 us of fixed cost, where MKL's small GEMM costs
3-10 us in all (measured on a Xeon, 1 thread: 16x32x32 24 us vs 3.6 us; 64x128x128
46 vs 22; from 128x256x256, 8M multiply-adds, the two are within 15%).  At on-device sizes
(batch 2-4, sequence 8-16) every dense layer is that small, and the fixed cost was a third
of a train step.  So oneDNN serves products of at least `ONEDNN_MIN_MACS` multiply-adds,
where its fixed cost is amortized (and, on AMD, its faster GEMM wins).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Tuple

import torch
import torch.nn.functional as F

ONEDNN_MIN_MACS = 1 << 22  # rows * in * out below which MKL's small-GEMM path is cheaper (see above)
_ONEDNN = (
    getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if torch.backends.mkldnn.is_available()
    else None
)


def onednn_product(a: torch.Tensor, b_t: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """a @ b_t^T (+ bias) by oneDNN's matmul; `a` may have leading batch dims, views are fine."""
    return _ONEDNN(a, b_t, bias, "none", [], "")


def onednn_linear_backward(ctx, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
    """The dense layer's backward on oneDNN (`ctx` saved x and weight, and says `has_bias`):
    the input's gradient grad @ weight, the weight's grad^T @ x over all rows, the bias's the
    rows' sum.  Shared by the eager step's autograd Function and the traced step's operator
    (graph/traced_operators.py), so both compute the same products."""
    x, weight = ctx.saved_tensors
    grad_x = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = onednn_product(grad, weight.t())
    flat_grad = grad.reshape(-1, grad.shape[-1])
    if ctx.needs_input_grad[1]:
        grad_weight = onednn_product(flat_grad.t(), x.reshape(-1, x.shape[-1]).t())
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = flat_grad.sum(0)
    return grad_x, grad_weight, grad_bias


class _OneDnnLinear(torch.autograd.Function):
    """The dense layer on oneDNN with autograd (eager steps): ~30 us less per forward and
    backward than `traced_operators.onednn_linear`'s custom-operator dispatch."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_product(x, weight, bias)

    backward = staticmethod(onednn_linear_backward)


_plain_aten = False


@contextlib.contextmanager
def plain_aten_kernels() -> Iterator[None]:
    """`linear` as plain `F.linear` while tracing (graph/specialize.py): TorchInductor lowers
    aten matmuls itself and cannot lower oneDNN's op with a fed weight.  A trace for the
    traced step (`traced_operators.operators_in_traces`) keeps oneDNN's products as
    `traced_operators.onednn_linear`, the eager step's kernel."""
    global _plain_aten
    previous, _plain_aten = _plain_aten, True
    try:
        yield
    finally:
        _plain_aten = previous


def plain_aten_active() -> bool:
    """Whether the graph is being traced for the compiler (inside `plain_aten_kernels`):
    converters with a faster eager kernel (recurrent.py) then trace their plain form."""
    return _plain_aten


def _onednn_applies(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """Whether oneDNN's matmul serves this product (size, device, dtypes; see the module docstring)."""
    return (
        _ONEDNN is not None
        and weight.dim() == 2
        and x.numel() * weight.shape[0] >= ONEDNN_MIN_MACS  # first: the usual "no" at on-device sizes
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() >= 2
        and (bias is None or (bias.dim() == 1 and bias.dtype == torch.float32))
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x @ weight^T + bias (weight [out, in]), with autograd, as fast as the CPU allows."""
    if _onednn_applies(x, weight, bias):
        if not _plain_aten:
            return _OneDnnLinear.apply(x, weight, bias)
        from . import traced_operators  # registers its operators: only where a trace needs them

        if traced_operators.operators_in_use():  # a trace for the traced step: the eager step's kernel
            return traced_operators.onednn_linear(x, weight, bias)
    if x.dim() > 2 and weight.dim() == 2:
        # One 2-D product, as torch's matmul folds it when the weight requires grad.  A trace
        # (graph/specialize.py: no grad) does not fold a non-contiguous input: it records a
        # batched product against the weight expanded per row block, whose backward sums a
        # weight-sized gradient per block (the hand-made transformer's seq-first projections:
        # a 16x256x768 sum per layer; its traced step took 1.4x its eager step).
        out = F.linear(x.reshape(-1, x.shape[-1]), weight, bias)
        return out.view(*x.shape[:-1], out.shape[-1])
    return F.linear(x, weight, bias)
