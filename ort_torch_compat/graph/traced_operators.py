"""Operators with hand-derived backwards for the traced step (a graph of aten calls run
without autograd by TorchScript): an LSTM or GRU direction over a whole sequence
(`lstm_sequence`, `gru_sequence`), RMSNorm (`rms_norm`, ORT's SimplifiedLayerNormalization) and the
dense layer on oneDNN's matmul (`onednn_linear`).

Why (measured, docs/design.md "Hand-derived backwards in the traced step"): at on-device
sizes every aten call costs ~1 us of framework and almost no arithmetic, and autograd's
backward of the converters' aten calls takes more calls than the derivative needs.

- LSTM (hidden 32, batch 2): autograd's backward of the time loop
  (graph/converters/recurrent.py) takes ~14 calls a time step: each gate's activation
  differentiated on its own, the four gate gradients concatenated, a recurrent-weight
  gradient product made and accumulated.  Here the recurrence takes five (`_lstm_backward`):
  what does not depend on it (the activations' derivatives times what they multiply) is
  computed for all time steps at once, the recurrent weight's gradient is one product over
  all steps, and the forward's product and bias add are one `addmm`: LSTM-tiny's traced
  step made 164 calls besides views (265 before) and 292 in all (452) when the recurrence
  took six (a separate `add` of the output's gradient); its Static Runtime run took
  0.23-0.25 ms instead of 0.33 then (0.19 ms after later changes; five calls instead of six
  saved 1-2 us of it).  Same equations as ONNX's LSTM (default
  activations; no clip, peepholes, input_forget or sequence_lens).
- GRU (linear_before_reset, torch's GRU): autograd's backward of the loop took ~20 calls a
  time step; `_gru_backward` takes four (the gate gradients are dh times coefficients
  computed for all steps at once).  A GRU-tiny classifier's (embedding 1000x32, GRU 32,
  batch 2, sequence 8) Static Runtime run: 850 -> 443 us (alternating in one process, one
  thread).
- RMSNorm: autograd differentiates pow, mean, add, rsqrt and two products one by one (17
  calls); here dx = inv_std * (g - xn * mean(g * xn)) with g = dy * scale, and the scale's
  gradient sum(dy * xn): seven calls; means as sums (ATen's mean is a sum and a division).
  Llama-tiny's Static Runtime run: 0.53 -> 0.46 ms.
- The dense layer: the eager step sends products of at least 4M multiply-adds to oneDNN's
  matmul (graph/dense_kernel.py: on AMD's EPYC, MKL's GEMM is half as fast), but the trace
  records aten's products for the compiler; without this operator the traced step ran them
  on MKL: the hand-made transformer's (4x16 tokens, width 256) traced step took 9.9-11.3 ms
  against its eager step's 7.1-9.1 and was refused; with it, 4.4-5.3 ms.  Its forward and
  backward are the eager step's (`dense_kernel.onednn_product`, `onednn_linear_backward`):
  the same products, bit for bit.

Float32 rounding apart, values and gradients are autograd's of the converters' aten calls
(tests/test_traced_operators.py compares them in float64).

How: each is a `torch.library` custom operator, so the specializing trace
(graph/specialize.py, with `hand_derived_backwards`) keeps it as one node;
`joint_train_graph` (engine/joint_graph.py) traces it with `TRACED_OPERATOR_DECOMPOSITIONS`,
which inlines its forward, and autograd runs its backward, whose aten calls the same trace
records.  Run eagerly, with autograd, an operator computes the same forward and backward.
Traces for the compiler keep the converters' calls: Inductor fuses the LSTM loop's backward
better than this one's (a compiled LSTM-tiny step: 0.14 ms, 0.17 with the operator).
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .dense_kernel import onednn_linear_backward, onednn_product

_tracing = threading.local()  # whether this thread's trace uses the operators (`operators_in_traces`)


@contextlib.contextmanager
def operators_in_traces(enabled: bool) -> Iterator[None]:
    """While `enabled`, the converters trace these operators instead of their own aten
    calls (graph/specialize.py, for the traced step)."""
    previous = getattr(_tracing, "enabled", False)
    _tracing.enabled = enabled
    try:
        yield
    finally:
        _tracing.enabled = previous


def operators_in_use() -> bool:
    """Whether the trace running in this thread uses these operators (`operators_in_traces`)."""
    return getattr(_tracing, "enabled", False)


# ---- LSTM --------------------------------------------------------------------------------


def _lstm_forward(
    x_proj: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, r: torch.Tensor, reverse: bool, torch_gates: bool
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h_n, c_n) of one direction, then what the backward needs, time-indexed: the
    cell states, the sigmoid gates, the candidates and tanh of the cell states.
    `x_proj` is [seq, batch, 4 * hidden] with both biases added, `r` the [4 * hidden, hidden]
    recurrent weight of this direction; the gate blocks in ONNX's order (i, o, f, c; the
    sigmoid gates i, o, f) or, `torch_gates`, in torch's (i, f, g, o: the sigmoid taken of
    all four blocks in one call, the candidates' block unused)."""
    seq, hidden = x_proj.shape[0], h0.shape[-1]
    r_t = r.t()
    steps = x_proj.unbind(0)
    h, c = h0, c0
    hs: List[torch.Tensor] = [h0] * seq
    cs, sigs, cands, tcs = list(hs), list(hs), list(hs), list(hs)
    for k in _order(seq, reverse):
        g = torch.addmm(steps[k], h, r_t)
        if torch_gates:
            sig, cand = torch.sigmoid(g), torch.tanh(g[:, 2 * hidden : 3 * hidden])
            i, f, o = sig[:, :hidden], sig[:, hidden : 2 * hidden], sig[:, 3 * hidden :]
        else:
            sig, cand = torch.sigmoid(g[:, : 3 * hidden]), torch.tanh(g[:, 3 * hidden :])
            i, o, f = sig[:, :hidden], sig[:, hidden : 2 * hidden], sig[:, 2 * hidden :]  # slices: cheaper than a split
        c = torch.addcmul(f * c, i, cand)
        tc = torch.tanh(c)
        h = o * tc
        hs[k], cs[k], sigs[k], cands[k], tcs[k] = h, c, sig, cand, tc
    stacked = [torch.stack(values, 0) for values in (hs, cs, sigs, cands, tcs)]
    return stacked[0], h, c, *stacked[1:]  # seq > 0: h and c are new tensors, not h0 and c0


def _order(seq: int, reverse: bool) -> range:
    return range(seq - 1, -1, -1) if reverse else range(seq)


_LSTM_SCHEMA = "(Tensor x_proj, Tensor h0, Tensor c0, Tensor r, bool reverse, bool torch_gates) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"


# schemas given: torch 2.6 reads no string annotations
@torch.library.custom_op("ort_torch_compat::lstm_sequence", mutates_args=(), schema=_LSTM_SCHEMA)
def lstm_sequence(
    x_proj: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, r: torch.Tensor, reverse: bool, torch_gates: bool
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One LSTM direction (see the module docstring): y [seq, batch, hidden], h_n, c_n, then
    four tensors for the backward (not outputs of the ONNX node)."""
    return _lstm_forward(x_proj, h0, c0, r, reverse, torch_gates)


@lstm_sequence.register_fake
def _(x_proj, h0, c0, r, reverse, torch_gates):
    seq, batch, hidden = x_proj.shape[0], h0.shape[0], h0.shape[1]
    state = x_proj.new_empty(seq, batch, hidden)
    return (
        state,
        h0.new_empty(batch, hidden),
        h0.new_empty(batch, hidden),
        x_proj.new_empty(seq, batch, hidden),
        x_proj.new_empty(seq, batch, (4 if torch_gates else 3) * hidden),
        x_proj.new_empty(seq, batch, hidden),
        x_proj.new_empty(seq, batch, hidden),
    )


def _lstm_setup_context(ctx, inputs, output) -> None:
    _, h0, c0, r, reverse, torch_gates = inputs
    y, _, _, cells, sigs, cands, tcs = output
    ctx.save_for_backward(h0, c0, r, y, cells, sigs, cands, tcs)
    ctx.reverse, ctx.torch_gates = reverse, torch_gates
    ctx.set_materialize_grads(False)  # no zero-filled gradients of the outputs the backward ignores


def _lstm_backward(ctx, dy, dh_n, dc_n, *_unused) -> Tuple[Optional[torch.Tensor], ...]:
    """The time steps' recurrence takes five calls a step; what does not depend on it is
    computed for all steps at once.  With dh the gradient of a step's state and dc of its
    cell: dc += dh * o * (1 - tanh(c)^2); the gates' gradient is [dc, dh, dc, dc] times
    [cand * i(1 - i), tanh(c) * o(1 - o), c_prev * f(1 - f), i * (1 - cand^2)] (ONNX's gate
    order; torch's: [dc, dc, dc, dh] times the i, f, g, o coefficients); then dc *= f and
    dh = gates' gradient @ r plus the output's gradient for the step before (one addmm)."""
    h0, c0, r, y, cells, sigs, cands, tcs = ctx.saved_tensors
    seq, hidden = y.shape[0], h0.shape[-1]
    if ctx.torch_gates:
        i, f, _, o = sigs.split(hidden, dim=2)
    else:
        i, o, f = sigs.split(hidden, dim=2)
    through_tanh = torch.ops.aten.tanh_backward(o, tcs)
    gate_coefficients = {
        "i": torch.ops.aten.sigmoid_backward(cands, i),
        "o": torch.ops.aten.sigmoid_backward(tcs, o),
        "f": torch.ops.aten.sigmoid_backward(_starts(cells, c0, ctx.reverse), f),
        "c": torch.ops.aten.tanh_backward(i, cands),
    }
    coefficients = torch.cat([gate_coefficients[gate] for gate in ("ifco" if ctx.torch_gates else "iofc")], 2)
    dc = dc_n if dc_n is not None else torch.zeros_like(c0)
    dys, order, dh = _backward_start(dy, dh_n, h0, seq, ctx.reverse)
    tanh_steps, coefficient_steps, f_steps = through_tanh.unbind(0), coefficients.unbind(0), f.unbind(0)
    dgs: List[torch.Tensor] = [dc] * seq
    for position, k in enumerate(order):
        dc = torch.addcmul(dc, dh, tanh_steps[k])
        dg = torch.cat([dc, dc, dc, dh] if ctx.torch_gates else [dc, dh, dc, dc], 1) * coefficient_steps[k]
        dgs[k] = dg
        dc = dc * f_steps[k]
        if dys is not None and position + 1 < seq:  # the step before's output gradient added by the product
            dh = torch.addmm(dys[order[position + 1]], dg, r)
        else:
            dh = dg.mm(r)
    d_proj = torch.stack(dgs, 0)
    dr = d_proj.reshape(-1, 4 * hidden).t().mm(_starts(y, h0, ctx.reverse).reshape(-1, hidden))
    return d_proj, dh, dc, dr, None, None


def _backward_start(
    dy: Optional[torch.Tensor], dh_n: Optional[torch.Tensor], h0: torch.Tensor, seq: int, reverse: bool
) -> Tuple[Optional[Sequence[torch.Tensor]], List[int], torch.Tensor]:
    """Where a recurrence's backward starts: the output's per-step gradients (None where the
    output has none), the time steps in the order the backward visits them, and the
    gradient of the state the forward ended with (the final state's plus that step's
    output's)."""
    dys = dy.unbind(0) if dy is not None else None
    order = list(reversed(_order(seq, reverse)))
    if dys is None:
        dh = dh_n if dh_n is not None else torch.zeros_like(h0)
    else:
        dh = dys[order[0]] if dh_n is None else dh_n + dys[order[0]]
    return dys, order, dh


def _starts(values: torch.Tensor, initial: torch.Tensor, reverse: bool) -> torch.Tensor:
    """What each time step started from, time-indexed: the step before's value (`values`,
    time-indexed), or `initial` for the first step taken."""
    if reverse:
        return torch.cat([values[1:], initial.unsqueeze(0)], 0)
    return torch.cat([initial.unsqueeze(0), values[:-1]], 0)


lstm_sequence.register_autograd(_lstm_backward, setup_context=_lstm_setup_context)


# ---- GRU ----------------------------------------------------------------------------------


def _gru_forward(
    x_proj: torch.Tensor, h0: torch.Tensor, r: torch.Tensor, rb: torch.Tensor, reverse: bool, torch_gates: bool
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h_n) of one GRU direction with `linear_before_reset` (torch's GRU), then what the
    backward needs, time-indexed: the two sigmoid gates, the candidates and the recurrent
    product's candidate block (with its bias).  `x_proj` is [seq, batch, 3 * hidden] with
    the input bias added, `r` the [3 * hidden, hidden] recurrent weight, `rb` its bias; the
    gate blocks in ONNX's order (z, r, h) or, `torch_gates`, torch's (r, z, n): both end with
    the candidate's."""
    seq, hidden = x_proj.shape[0], h0.shape[-1]
    r_t = r.t()
    steps = x_proj.unbind(0)
    h = h0
    hs: List[torch.Tensor] = [h0] * seq
    gates, cands, recurrent = list(hs), list(hs), list(hs)
    for k in _order(seq, reverse):
        gh = torch.addmm(rb, h, r_t)
        gx = steps[k]
        sig = torch.sigmoid(gx[:, : 2 * hidden] + gh[:, : 2 * hidden])
        reset, update = _reset_and_update(sig, hidden, torch_gates)
        gh_n = gh[:, 2 * hidden :]
        n = torch.tanh(torch.addcmul(gx[:, 2 * hidden :], reset, gh_n))
        h = torch.addcmul(n, update, h - n)  # (1 - z) * n + z * h
        hs[k], gates[k], cands[k], recurrent[k] = h, sig, n, gh_n
    stacked = [torch.stack(values, 0) for values in (hs, gates, cands, recurrent)]
    return stacked[0], h, *stacked[1:]


def _reset_and_update(gates: torch.Tensor, hidden: int, torch_gates: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """The reset and update gates of the two sigmoid blocks (last dimension)."""
    first, second = gates[..., :hidden], gates[..., hidden:]
    return (first, second) if torch_gates else (second, first)


_GRU_SCHEMA = "(Tensor x_proj, Tensor h0, Tensor r, Tensor rb, bool reverse, bool torch_gates) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"


@torch.library.custom_op("ort_torch_compat::gru_sequence", mutates_args=(), schema=_GRU_SCHEMA)
def gru_sequence(
    x_proj: torch.Tensor, h0: torch.Tensor, r: torch.Tensor, rb: torch.Tensor, reverse: bool, torch_gates: bool
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One GRU direction (see `_gru_forward`): y [seq, batch, hidden], h_n, then three
    tensors for the backward (not outputs of the ONNX node)."""
    return _gru_forward(x_proj, h0, r, rb, reverse, torch_gates)


@gru_sequence.register_fake
def _(x_proj, h0, r, rb, reverse, torch_gates):
    seq, batch, hidden = x_proj.shape[0], h0.shape[0], h0.shape[1]
    return (
        x_proj.new_empty(seq, batch, hidden),
        h0.new_empty(batch, hidden),
        x_proj.new_empty(seq, batch, 2 * hidden),
        x_proj.new_empty(seq, batch, hidden),
        x_proj.new_empty(seq, batch, hidden),
    )


def _gru_setup_context(ctx, inputs, output) -> None:
    _, h0, r, _, reverse, torch_gates = inputs
    y, _, gates, cands, recurrent = output
    ctx.save_for_backward(h0, r, y, gates, cands, recurrent)
    ctx.reverse, ctx.torch_gates = reverse, torch_gates
    ctx.set_materialize_grads(False)


def _gru_backward(ctx, dy, dh_n, *_unused) -> Tuple[Optional[torch.Tensor], ...]:
    """Four calls a time step.  With dh the gradient of a step's state, every gate gradient
    is dh times a coefficient computed for all steps at once before the loop: the
    candidate's pre-activation (1 - z)(1 - n^2), the update gate's (h_prev - n) z(1 - z),
    the reset gate's (that of the candidate) gh_n r(1 - r); the recurrent product's gradient
    is [dh, dh, dh] times [reset's, update's, candidate's times r] (in the weights' gate
    order), and dh for the step before is dh z plus that gradient @ R plus the step before's
    output gradient (one addcmul, one addmm).  The input projection's gradient ([dh, dh, dh]
    times the same coefficients with the candidate's not times r) and the recurrent weight's
    and bias's are computed for all steps at once after it."""
    h0, r, y, gates, cands, recurrent = ctx.saved_tensors
    seq, hidden = y.shape[0], h0.shape[-1]
    reset, update = _reset_and_update(gates, hidden, ctx.torch_gates)
    previous = _starts(y, h0, ctx.reverse)
    through_candidate = torch.ops.aten.tanh_backward(1 - update, cands)
    through_update = torch.ops.aten.sigmoid_backward(previous - cands, update)
    through_reset = torch.ops.aten.sigmoid_backward(through_candidate * recurrent, reset)
    sigmoid_blocks = [through_reset, through_update] if ctx.torch_gates else [through_update, through_reset]
    recurrent_coefficients = torch.cat([*sigmoid_blocks, through_candidate * reset], 2)
    input_coefficients = torch.cat([*sigmoid_blocks, through_candidate], 2)
    dys, order, dh = _backward_start(dy, dh_n, h0, seq, ctx.reverse)
    coefficient_steps, update_steps = recurrent_coefficients.unbind(0), update.unbind(0)
    dh3s: List[torch.Tensor] = [dh] * seq
    dghs: List[torch.Tensor] = [dh] * seq
    for position, k in enumerate(order):
        dh3 = torch.cat([dh, dh, dh], 1)
        dgh = dh3 * coefficient_steps[k]
        dh3s[k], dghs[k] = dh3, dgh
        if dys is not None and position + 1 < seq:  # the step before's output gradient added here
            direct = torch.addcmul(dys[order[position + 1]], dh, update_steps[k])
        else:
            direct = dh * update_steps[k]
        dh = torch.addmm(direct, dgh, r)
    d_recurrent = torch.stack(dghs, 0).reshape(-1, 3 * hidden)
    dr = d_recurrent.t().mm(previous.reshape(-1, hidden))
    return torch.stack(dh3s, 0) * input_coefficients, dh, dr, d_recurrent.sum(0), None, None


gru_sequence.register_autograd(_gru_backward, setup_context=_gru_setup_context)


# ---- RMSNorm -----------------------------------------------------------------------------
def _rms_norm_forward(
    x: torch.Tensor, scale: torch.Tensor, axis: int, epsilon: float
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = x * inv_std * scale over the axes from `axis` on, then x * inv_std and inv_std
    (for the backward).  The mean of squares as a sum times 1/n: ATen's mean over a row of
    64 takes 4.4 us, its sum 2.4 and a product 1.2."""
    count = math.prod(x.shape[axis:])
    squares = (x * x).sum(dim=tuple(range(axis, x.dim())), keepdim=True)
    inv_std = torch.rsqrt(squares * (1.0 / count) + epsilon)
    normalized = x * inv_std
    return normalized * scale, normalized, inv_std


@torch.library.custom_op(
    "ort_torch_compat::rms_norm",
    mutates_args=(),
    schema="(Tensor x, Tensor scale, int axis, float epsilon) -> (Tensor, Tensor, Tensor)",
)
def rms_norm(
    x: torch.Tensor, scale: torch.Tensor, axis: int, epsilon: float
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm over the axes from `axis` (>= 0) on, `scale` of their shape: y, then two
    tensors for the backward (see the module docstring)."""
    return _rms_norm_forward(x, scale, axis, epsilon)


@rms_norm.register_fake
def _(x, scale, axis, epsilon):
    return x.new_empty(x.shape), x.new_empty(x.shape), x.new_empty(*x.shape[:axis], *[1] * (x.dim() - axis))


def _rms_norm_setup_context(ctx, inputs, output) -> None:
    _, scale, axis, _ = inputs
    _, normalized, inv_std = output
    ctx.save_for_backward(scale, normalized, inv_std)
    ctx.axis = axis
    ctx.set_materialize_grads(False)


def _rms_norm_backward(ctx, dy, *_unused) -> Tuple[Optional[torch.Tensor], ...]:
    scale, normalized, inv_std = ctx.saved_tensors
    axes = tuple(range(ctx.axis, normalized.dim()))
    dx = dscale = None
    if dy is None:
        return dx, dscale, None, None
    if ctx.needs_input_grad[0]:  # inv_std * (g - normalized * mean(g * normalized)), g = dy * scale
        g = dy * scale
        dots = (g * normalized).sum(dim=axes, keepdim=True)
        dx = inv_std * torch.addcmul(g, normalized, dots, value=-1.0 / math.prod(normalized.shape[ctx.axis :]))
    if ctx.needs_input_grad[1]:
        dscale = (dy * normalized).sum(dim=tuple(range(ctx.axis))) if ctx.axis else dy * normalized
    return dx, dscale, None, None


rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup_context)


# ---- Scaled dot-product attention --------------------------------------------------------
_ATTENTION_TYPES = (torch.float32, torch.float64)
_FLASH_KERNELS = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")


def attention_fits(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: Optional[torch.Tensor]) -> bool:
    """Whether `scaled_attention` computes this ScaledAttention node (converters/attention.py;
    `keys` is K transposed): 4-D [batch, heads, ., .] CPU tensors of one float type, no
    broadcasting between Q, K and V, one head size, a mask (of that type) broadcastable to
    the scores."""
    if not _FLASH_KERNELS or query.dim() != 4 or keys.dim() != 4 or values.dim() != 4 or query.device.type != "cpu":
        return False
    if query.dtype not in _ATTENTION_TYPES or keys.dtype != query.dtype or values.dtype != query.dtype:
        return False
    batch, heads, rows, size = query.shape
    columns = keys.shape[3]
    if keys.shape != (batch, heads, size, columns) or values.shape != (batch, heads, columns, size):
        return False
    if not (batch and heads and rows and size and columns):
        return False
    if mask is None:
        return True
    if mask.dtype != query.dtype or mask.device != query.device or not 1 <= mask.dim() <= 4:
        return False
    scores = (batch, heads, rows, columns)[4 - mask.dim() :]
    return all(m in (1, s) for m, s in zip(mask.shape, scores))


def _attention_forward(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor], scale: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """softmax(query @ key^T * scale + mask) @ value, and the rows' log-sum-exp (for the
    backward): ATen's CPU flash-attention kernel."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, False, attn_mask=mask, scale=scale
    )


@torch.library.custom_op(
    "ort_torch_compat::scaled_attention",
    mutates_args=(),
    schema="(Tensor query, Tensor key, Tensor value, Tensor? mask, float scale) -> (Tensor, Tensor)",
)
def _scaled_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor], scale: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    return _attention_forward(query, key, value, mask, scale)


@_scaled_attention.register_fake
def _(query, key, value, mask, scale):
    batch, heads, rows, size = query.shape  # as the kernel lays them out: [batch, rows, heads, .] transposed
    output = query.new_empty(batch, rows, heads, size).transpose(1, 2)
    return output, query.new_empty(batch, rows, heads).transpose(1, 2)


def _attention_setup_context(ctx, inputs, output) -> None:
    query, key, value, mask, scale = inputs
    ctx.save_for_backward(query, key, value, mask, *output)
    ctx.scale = scale
    ctx.set_materialize_grads(False)


def _attention_backward(ctx, d_output, _d_logsumexp) -> Tuple[Optional[torch.Tensor], ...]:
    """The kernel's backward for Q, K and V; the mask's gradient (where it needs one: a
    learned bias) from the probabilities recomputed, dS = P * (dP - rowsum(dP * P))."""
    query, key, value, mask, output, logsumexp = ctx.saved_tensors
    if d_output is None:
        return None, None, None, None, None
    d_query, d_key, d_value = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        d_output, query, key, value, output, logsumexp, 0.0, False, attn_mask=mask, scale=ctx.scale
    )
    d_mask = None
    if mask is not None and ctx.needs_input_grad[3]:
        probabilities = torch.softmax(torch.matmul(query, key.transpose(-1, -2)) * ctx.scale + mask, -1)
        d_probabilities = torch.matmul(d_output, value.transpose(-1, -2))
        d_scores = probabilities * (d_probabilities - (d_probabilities * probabilities).sum(-1, keepdim=True))
        broadcast = [d for d in range(4) if mask.shape[d] == 1 and d_scores.shape[d] != 1]
        d_mask = d_scores.sum(broadcast, keepdim=True) if broadcast else d_scores
    return d_query, d_key, d_value, d_mask, None


_scaled_attention.register_autograd(_attention_backward, setup_context=_attention_setup_context)


def scaled_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor], scale: float
) -> torch.Tensor:
    """softmax(query @ key^T * scale [+ mask]) @ value for [batch, heads, rows, size] tensors
    that `attention_fits` (with `key` as K, not K transposed); the mask is broadcast."""
    if mask is not None and mask.dim() < 4:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    return _scaled_attention(query, key, value, mask, scale)[0]


# ---- oneDNN's dense layer ------------------------------------------------------------------
@torch.library.custom_op(
    "ort_torch_compat::onednn_linear",
    mutates_args=(),
    schema="(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
)
def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x @ weight^T + bias (weight [out, in]) through oneDNN's matmul, forward and backward:
    the eager step's dense layer (graph/dense_kernel.py), kept in the traced step's graph."""
    return onednn_product(x, weight, bias)


@onednn_linear.register_fake
def _(x, weight, bias):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _onednn_linear_setup_context(ctx, inputs, output) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


onednn_linear.register_autograd(onednn_linear_backward, setup_context=_onednn_linear_setup_context)

TRACED_OPERATOR_DECOMPOSITIONS: Dict[object, object] = {
    torch.ops.ort_torch_compat.lstm_sequence.default: _lstm_forward,
    torch.ops.ort_torch_compat.gru_sequence.default: _gru_forward,
    torch.ops.ort_torch_compat.rms_norm.default: _rms_norm_forward,
    torch.ops.ort_torch_compat.onednn_linear.default: onednn_product,
    torch.ops.ort_torch_compat.scaled_attention.default: _attention_forward,
}
"""For `make_fx`'s decomposition table: the operators' forwards inlined as aten calls."""
