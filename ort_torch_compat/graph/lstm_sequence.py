"""One LSTM direction over a whole sequence as one traceable operator with a hand-derived
backward, for the traced step (a graph run without autograd by TorchScript).

Why (measured, docs/design.md "The LSTM in the traced step"): at on-device sizes (hidden
32, batch 2) every aten call of an LSTM's time loop costs ~1 us of framework and almost no
arithmetic.  Autograd's backward of the loop (graph/converters/recurrent.py) differentiates
each gate's activation on its own, concatenates the four gate gradients, and computes and
accumulates a recurrent-weight gradient product per time step.  Here the three sigmoid
gates (ONNX's i, o, f blocks are adjacent) activate and differentiate as one, the recurrent
weight's gradient is one product over all time steps, and the forward's product and bias
add are one `addmm`: LSTM-tiny's traced step makes 225 calls besides views (265 before)
and 355 in all (452), and its Static Runtime run takes 0.26 ms instead of 0.33.  Same
equations as ONNX's LSTM (default activations; no clip, peepholes, input_forget or
sequence_lens); float32 rounding apart, the values and gradients are autograd's of the loop
(tests/test_lstm_sequence.py compares them in float64).

How: `lstm_sequence` is a `torch.library` custom operator, so the specializing trace
(graph/specialize.py, with `sequence_operators`) keeps it as one node; `joint_train_graph`
(engine/joint_graph.py) traces it with `LSTM_SEQUENCE_DECOMPOSITION`, which inlines its
forward, and autograd runs `_backward`, whose aten calls the same trace records.  Run
eagerly, with autograd, the operator computes the same forward and backward.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Dict, Iterator, List, Optional, Tuple

import torch

_NAME = "ort_torch_compat::lstm_sequence"
_tracing = threading.local()  # whether this thread's trace uses the operator (`operators_in_traces`)


@contextlib.contextmanager
def operators_in_traces(enabled: bool) -> Iterator[None]:
    """While `enabled`, the LSTM converter traces `lstm_sequence` instead of its time loop
    (graph/specialize.py, for the traced step: Inductor fuses the loop's backward better
    than this one's, measured 0.17 against 0.14 ms a compiled LSTM-tiny step)."""
    previous = getattr(_tracing, "enabled", False)
    _tracing.enabled = enabled
    try:
        yield
    finally:
        _tracing.enabled = previous


def operators_in_use() -> bool:
    """Whether the trace running in this thread uses `lstm_sequence` (`operators_in_traces`)."""
    return getattr(_tracing, "enabled", False)


def _forward(
    x_proj: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, r: torch.Tensor, reverse: bool
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h_n, c_n) of one direction, then what the backward needs, time-indexed: the
    cell states, the sigmoid gates (i, o, f), the candidates and tanh of the cell states.
    `x_proj` is [seq, batch, 4 * hidden] with both biases added, `r` ONNX's [4 * hidden, hidden]
    recurrent weight of this direction."""
    seq, hidden = x_proj.shape[0], h0.shape[-1]
    r_t = r.t()
    steps = x_proj.unbind(0)
    h, c = h0, c0
    hs: List[torch.Tensor] = [h0] * seq
    cs, sigs, cands, tcs = list(hs), list(hs), list(hs), list(hs)
    for k in _order(seq, reverse):
        g = torch.addmm(steps[k], h, r_t)
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


_SCHEMA = "(Tensor x_proj, Tensor h0, Tensor c0, Tensor r, bool reverse) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"


@torch.library.custom_op(_NAME, mutates_args=(), schema=_SCHEMA)  # a schema: torch 2.6 reads no string annotations
def lstm_sequence(
    x_proj: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, r: torch.Tensor, reverse: bool
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One LSTM direction (see the module docstring): y [seq, batch, hidden], h_n, c_n, then
    four tensors for the backward (not outputs of the ONNX node)."""
    return _forward(x_proj, h0, c0, r, reverse)


@lstm_sequence.register_fake
def _(x_proj, h0, c0, r, reverse):
    seq, batch, hidden = x_proj.shape[0], h0.shape[0], h0.shape[1]
    state = x_proj.new_empty(seq, batch, hidden)
    return (
        state,
        h0.new_empty(batch, hidden),
        h0.new_empty(batch, hidden),
        x_proj.new_empty(seq, batch, hidden),
        x_proj.new_empty(seq, batch, 3 * hidden),
        x_proj.new_empty(seq, batch, hidden),
        x_proj.new_empty(seq, batch, hidden),
    )


def _setup_context(ctx, inputs, output) -> None:
    _, h0, c0, r, reverse = inputs
    y, _, _, cells, sigs, cands, tcs = output
    ctx.save_for_backward(h0, c0, r, y, cells, sigs, cands, tcs)
    ctx.reverse = reverse


def _backward(ctx, dy, dh_n, dc_n, *_unused) -> Tuple[Optional[torch.Tensor], ...]:
    h0, c0, r, y, cells, sigs, cands, tcs = ctx.saved_tensors
    seq, hidden = y.shape[0], h0.shape[-1]
    order = list(_order(seq, ctx.reverse))
    dh = dh_n if dh_n is not None else torch.zeros_like(h0)
    dc = dc_n if dc_n is not None else torch.zeros_like(c0)
    dys = dy.unbind(0) if dy is not None else None
    cell_steps, sig_steps, cand_steps, tc_steps = cells.unbind(0), sigs.unbind(0), cands.unbind(0), tcs.unbind(0)
    i_steps, o_steps, f_steps = (gate.unbind(0) for gate in sigs.split(hidden, dim=2))
    dgs: List[torch.Tensor] = [dh] * seq
    for position in range(seq - 1, -1, -1):
        k = order[position]
        c_prev = cell_steps[order[position - 1]] if position else c0
        if dys is not None:
            dh = dh + dys[k]
        sig, cand, tc = sig_steps[k], cand_steps[k], tc_steps[k]
        i, o, f = i_steps[k], o_steps[k], f_steps[k]
        dc = dc + torch.ops.aten.tanh_backward(dh * o, tc)
        gates = torch.cat([dc * cand, dh * tc, dc * c_prev], 1)  # d i, d o, d f
        dg = torch.cat([torch.ops.aten.sigmoid_backward(gates, sig), torch.ops.aten.tanh_backward(dc * i, cand)], 1)
        dgs[k] = dg
        dc = dc * f
        dh = dg.mm(r)
    d_proj = torch.stack(dgs, 0)
    # the state each time step started from, time-indexed
    starts = torch.cat([h0.unsqueeze(0), y[:-1]], 0) if not ctx.reverse else torch.cat([y[1:], h0.unsqueeze(0)], 0)
    dr = d_proj.reshape(-1, 4 * hidden).t().mm(starts.reshape(-1, hidden))
    return d_proj, dh, dc, dr, None


lstm_sequence.register_autograd(_backward, setup_context=_setup_context)

LSTM_SEQUENCE_DECOMPOSITION: Dict[object, object] = {torch.ops.ort_torch_compat.lstm_sequence.default: _forward}
"""For `make_fx`'s decomposition table: the operator's forward inlined as aten calls."""
