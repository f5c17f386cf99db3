"""ONNX RNN / LSTM / GRU (and ORT's LSTMTraining / GRUTraining, same forward) as explicit
time loops over the ONNX gate layout (LSTM: i,o,f,c; GRU: z,r,h), so weights stay the
checkpoint's tensors and autograd sees exactly ONNX's equations: activations and their
alpha/beta, clip, input_forget, LSTM peepholes, per-batch sequence_lens (steps past a
sequence's length give zeros in Y and leave its state unchanged).

The common case, an LSTM (or a GRU with linear_before_reset) with the default activations
and no clip, peepholes, input_forget or sequence_lens, forward or bidirectional, on the
CPU, runs as torch's own recurrent op instead (`_native`: the weights' gate blocks
reordered to torch's layout; one kernel per direction forward and backward, where the loop
runs ~12 autograd ops per time step).  Same equations, float32 rounding apart (measured:
outputs and gradients within 2e-6 relative of the loop); 2.1x faster (LSTM, 8 steps,
hidden 32) to 2.4x (bidirectional) per forward+backward at on-device sizes.  In a trace
for the traced step such an LSTM or GRU, in any direction, is one `lstm_sequence` /
`gru_sequence` operator per direction (graph/traced_operators.py: the same equations, a
backward of fewer calls).
Other traces keep the loop, which Inductor fuses and the traced step (engine/traced_step.py)
runs call by call for the other cells, so what does not change between time steps is
computed once per direction: the input projection, the recurrent weights' transposes, an
LSTM's recurrent bias (added to the projection), the time steps' slices (one unbind).
A torch-exported layer whose gates the exporter only reordered (graph/recurrent_layout.py)
runs as `TorchGateRecurrent`, on the layer's own parameters in torch's gate order: no
reordering on any path."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from ..converter_registry import register
from ..dense_kernel import plain_aten_active
from ..fusion import FUSED_DOMAIN
from ..recurrent_layout import TORCH_BLOCK_OF_ONNX_GATE
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .named_activations import named_activation

_DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
# Where torch's gate blocks come from in ONNX's layout: LSTM i,o,f,c -> i,f,c,o (0, 2, 3, 1); GRU z,r,h -> r,z,n.
_TORCH_GATE_ORDER = {
    cell: tuple(blocks.index(position) for position in range(len(blocks)))
    for cell, blocks in TORCH_BLOCK_OF_ONNX_GATE.items()
}
_NATIVE_ACTIVATIONS = {"LSTM": (torch.sigmoid, torch.tanh, torch.tanh), "GRU": (torch.sigmoid, torch.tanh)}


class Recurrent(OnnxModule):
    def __init__(
        self,
        cell: str,
        hidden: int,
        direction: str,
        layout: int,
        linear_before_reset: int,
        outputs: int,
        activations: Sequence[Callable],
        clip: Optional[float],
        input_forget: bool,
    ):
        super().__init__()
        self.cell, self.hidden, self.direction, self.layout = cell, hidden, direction, layout
        self.linear_before_reset, self.outputs = linear_before_reset, outputs
        self.activations, self.clip, self.input_forget = list(activations), clip, input_forget
        directions = 2 if direction == "bidirectional" else 1
        plain = (  # ONNX's equations with torch's activations: no clip, input_forget or other activations
            cell in _TORCH_GATE_ORDER
            and clip is None
            and not input_forget
            and (cell == "LSTM" or linear_before_reset)
            and len(self.activations) == len(_NATIVE_ACTIVATIONS[cell]) * directions
            and all(a is e for a, e in zip(self.activations, _NATIVE_ACTIVATIONS[cell] * directions))
        )
        self.native = plain and direction != "reverse"  # torch's op runs reverse only as bidirectional's half
        self.sequence_operator = plain  # graph/traced_operators.py's LSTM and GRU, in traces
        self.torch_gates = False  # the weights' gate blocks in ONNX's order (TorchGateRecurrent: torch's)

    def forward(self, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
        if self.layout == 1:
            x, initial_h, initial_c = _time_major(x, initial_h, initial_c)
        if sequence_lens is None and p is None and _on_fast_path(x, w, r):
            traced = plain_aten_active()
            if self.native and not traced:
                return self._native(x, self._torch_parameters(w, r, b), b is not None, initial_h, initial_c)
            if self.sequence_operator and traced and x.shape[0] > 0 and _operators_in_use():
                input_biases = recurrent_biases = None
                if b is not None and self.cell == "LSTM":  # the two added as a sum over a view (backward: an expand)
                    input_biases = _per_direction(b.view(w.shape[0], 2, 4 * self.hidden).sum(1))
                elif b is not None:  # a GRU's recurrent bias is inside the reset gate's product
                    input_biases = _per_direction(b[:, : 3 * self.hidden])
                    recurrent_biases = _per_direction(b[:, 3 * self.hidden :])
                ws, rs = _per_direction(w), _per_direction(r)
                return self._traced_sequence(x, ws, rs, input_biases, recurrent_biases, initial_h, initial_c)
        seq, batch = x.shape[0], x.shape[1]
        gates = _GATES[self.cell]
        per_direction = len(self.activations) // w.shape[0]
        lengths = None
        if sequence_lens is not None:
            lengths = sequence_lens.to(torch.int64).to(x.device)
            if bool((lengths == seq).all()):
                lengths = None
        ys, hs, cs = [], [], []
        for d in range(w.shape[0]):
            reverse = self.direction == "reverse" or (self.direction == "bidirectional" and d == 1)
            acts = self.activations[d * per_direction : (d + 1) * per_direction]
            wb = b[d, : gates * self.hidden] if b is not None else None
            rb = b[d, gates * self.hidden :] if b is not None else None
            h = initial_h[d] if initial_h is not None else x.new_zeros(batch, self.hidden)
            c = initial_c[d] if initial_c is not None else x.new_zeros(batch, self.hidden)
            peep = p[d] if p is not None else None
            # One product for every time step, as a 2-D one: a transposed (batch-first)
            # input would otherwise make matmul a batched product against an expanded weight,
            # whose backward is a per-step weight gradient summed afterwards.
            x_proj = torch.matmul(x.reshape(seq * batch, x.shape[2]), w[d].t()).view(seq, batch, w.shape[1])
            if wb is not None:
                x_proj = x_proj + wb
            if rb is not None and self.cell == "LSTM":  # added once, not per step (float32 rounding apart)
                x_proj, rb = x_proj + rb, None
            # Per direction, not per step: the recurrent weights' transposes and the time
            # steps' slices (one unbind, whose backward is one stack; a select per step has a
            # zero-filled select_backward per step), a trace's calls cut by a fifth.
            x_steps = x_proj.unbind(0) if lengths is None or not reverse else None  # else gathered per step
            r_t = self._transposed(r[d])
            steps: List[torch.Tensor] = []
            for k in range(seq):  # the k-th step each sequence takes
                if not reverse:
                    step_in = x_steps[k]
                elif lengths is None:
                    step_in = x_steps[seq - 1 - k]
                else:  # backwards from each sequence's own last element
                    step_in = x_proj[(lengths - 1 - k).clamp(min=0), torch.arange(batch, device=x.device)]
                new_h, new_c = self._step(step_in, h, c, r_t, rb, peep, acts)
                if lengths is not None:
                    live = (k < lengths).unsqueeze(1)
                    h, c = torch.where(live, new_h, h), torch.where(live, new_c, c)
                    steps.append(torch.where(live, new_h, torch.zeros_like(new_h)))
                else:
                    h, c = new_h, new_c
                    steps.append(new_h)
            y = torch.stack(steps, 0)
            if reverse and lengths is None:
                y = y.flip(0)
            elif reverse:  # step k of sequence b belongs at time lengths[b] - 1 - k
                time = torch.arange(seq, device=x.device).view(-1, 1)
                source = torch.where(time < lengths.view(1, -1), lengths.view(1, -1) - 1 - time, time)
                y = torch.gather(y, 0, source.unsqueeze(-1).expand_as(y))
            ys.append(y)
            hs.append(h)
            cs.append(c)
        return self._onnx_outputs(torch.stack(ys, 1), torch.stack(hs, 0), torch.stack(cs, 0))

    def _torch_parameters(self, w, r, b) -> List[torch.Tensor]:
        """ONNX's stacked W, R (and B) as torch's recurrent op takes them: per direction
        the input and recurrent weights (and their biases) with torch's gate order."""
        order = list(range(_GATES[self.cell]) if self.torch_gates else _TORCH_GATE_ORDER[self.cell])
        gates, hidden = len(order), self.hidden

        def torch_layout(t):  # [gates * hidden, ...] with torch's gate order
            return t.reshape(gates, hidden, *t.shape[1:])[order].reshape(t.shape)

        flat = []
        for d in range(w.shape[0]):
            flat += [torch_layout(w[d]), torch_layout(r[d])]
            if b is not None:
                flat += [torch_layout(b[d, : gates * hidden]), torch_layout(b[d, gates * hidden :])]
        return flat

    def _native(self, x, flat, has_biases, initial_h, initial_c):
        """torch's LSTM/GRU op on its flat parameters (per direction: input and recurrent
        weights, then their biases where `has_biases`; torch's gate order); `x` is [seq, batch, in]."""
        seq, batch, hidden = x.shape[0], x.shape[1], self.hidden
        directions = 2 if self.direction == "bidirectional" else 1
        h0 = initial_h if initial_h is not None else x.new_zeros(directions, batch, hidden)
        bidirectional = directions == 2
        if self.cell == "LSTM":
            c0 = initial_c if initial_c is not None else x.new_zeros(directions, batch, hidden)
            y, y_h, y_c = torch._VF.lstm(
                x, (h0, c0), flat, has_biases, 1, 0.0, torch.is_grad_enabled(), bidirectional, False
            )
        else:
            y, y_h = torch._VF.gru(x, h0, flat, has_biases, 1, 0.0, torch.is_grad_enabled(), bidirectional, False)
            y_c = None
        return self._onnx_outputs(y.view(seq, batch, directions, hidden).transpose(1, 2), y_h, y_c)

    def _traced_sequence(self, x, ws, rs, input_biases, recurrent_biases, initial_h, initial_c):
        """The node as one `lstm_sequence` / `gru_sequence` operator per direction, for a
        trace without autograd (graph/traced_operators.py); `x` is [seq, batch, in], the
        weights and biases per direction (or None): `input_biases` added to the input
        projection (an LSTM's two biases summed), `recurrent_biases` a GRU's recurrent ones.
        ONNX's stacked weights come as views whose backward is a view too (one direction) or
        one stack (two), not selects, whose backward fills a zero tensor per weight."""
        from .. import traced_operators

        seq, batch, hidden = x.shape[0], x.shape[1], self.hidden
        width = _GATES[self.cell] * hidden
        h0s = _per_direction(initial_h) if initial_h is not None else None
        c0s = _per_direction(initial_c) if initial_c is not None else None
        inputs = x.reshape(seq * batch, x.shape[2])
        ys, hs, cs = [], [], []
        for d in range(len(ws)):
            if input_biases is None:
                x_proj = torch.mm(inputs, ws[d].t())
            else:
                x_proj = torch.addmm(input_biases[d], inputs, ws[d].t())
            x_proj = x_proj.view(seq, batch, width)
            h0 = h0s[d] if h0s is not None else x.new_zeros(batch, hidden)
            reverse = self.direction == "reverse" or d == 1
            if self.cell == "LSTM":
                c0 = c0s[d] if c0s is not None else x.new_zeros(batch, hidden)
                y, h, c = traced_operators.lstm_sequence(x_proj, h0, c0, rs[d], reverse, self.torch_gates)[:3]
                cs.append(c)
            else:
                rb = recurrent_biases[d] if recurrent_biases is not None else x.new_zeros(width)
                y, h = traced_operators.gru_sequence(x_proj, h0, rs[d], rb, reverse, self.torch_gates)[:2]
            ys.append(y)
            hs.append(h)
        return self._onnx_outputs(_stacked(ys, 1), _stacked(hs, 0), _stacked(cs, 0) if cs else None)

    def _onnx_outputs(self, y, y_h, y_c):
        """The node's outputs from y [seq, dirs, batch, hidden] and the last states
        [dirs, batch, hidden] (y_c None for a GRU): in the node's layout, as many as it has."""
        if self.layout == 1:
            y = y.permute(2, 0, 1, 3)
            y_h = y_h.transpose(0, 1)
            y_c = None if y_c is None else y_c.transpose(0, 1)
        values = (y, y_h, y_c)[: self.outputs]
        return values[0] if self.outputs == 1 else values

    def _transposed(self, r):
        """The recurrent weight as `_step` takes it: r.t(), or a GRU's three gate blocks'."""
        if self.cell == "GRU":
            return [block.t() for block in r.split(self.hidden, dim=0)]
        return r.t()

    def _step(self, xw, h, c, r_t, rb, peep, acts):
        if self.cell == "RNN":
            g = xw + torch.matmul(h, r_t)
            if rb is not None:
                g = g + rb
            return acts[0](self._clipped(g)), c
        if self.cell == "GRU":
            return self._gru_step(xw, h, r_t, rb, acts), c
        return self._lstm_step(xw, h, c, r_t, rb, peep, acts)

    def _clipped(self, value):
        return value if self.clip is None else value.clamp(-self.clip, self.clip)

    def _onnx_gates(self, blocks: Sequence) -> Sequence:
        """The gate blocks of the weights' layout in ONNX's order (LSTM i, o, f, c; GRU z, r, h)."""
        return [blocks[p] for p in TORCH_BLOCK_OF_ONNX_GATE[self.cell]] if self.torch_gates else blocks

    def _lstm_step(self, xw, h, c, r_t, rb, peep, acts):
        f_act, g_act, h_act = acts
        g = xw + torch.matmul(h, r_t)
        if rb is not None:
            g = g + rb
        i, o, f, cand = self._onnx_gates(g.chunk(4, dim=-1))
        if peep is not None:
            p_i, p_o, p_f = peep.chunk(3)
            i, f = i + p_i * c, f + p_f * c
        i = f_act(self._clipped(i))
        f = 1 - i if self.input_forget else f_act(self._clipped(f))
        c = f * c + i * g_act(self._clipped(cand))
        if peep is not None:
            o = o + p_o * c
        o = f_act(self._clipped(o))
        return o * h_act(c), c

    def _gru_step(self, xw, h, r_t, rb, acts):
        f_act, g_act = acts
        hid = self.hidden
        xz, xr, xh = self._onnx_gates(xw.split(hid, dim=-1))
        rz_t, rr_t, rh_t = self._onnx_gates(r_t)
        bz, br, bh = self._onnx_gates(rb.split(hid)) if rb is not None else (0.0, 0.0, 0.0)
        z = f_act(self._clipped(xz + torch.matmul(h, rz_t) + bz))
        rt = f_act(self._clipped(xr + torch.matmul(h, rr_t) + br))
        if self.linear_before_reset:
            cand = g_act(self._clipped(xh + rt * (torch.matmul(h, rh_t) + bh)))
        else:
            cand = g_act(self._clipped(xh + torch.matmul(rt * h, rh_t) + bh))
        return (1 - z) * cand + z * h


class TorchGateRecurrent(Recurrent):
    """An LSTM/GRU node fed its layer's parameters as torch holds them
    (graph/recurrent_layout.py: per direction the input and recurrent weights,
    [gates * hidden, in] and [gates * hidden, hidden], and their biases, torch's gate
    order).  On the fast paths they go to torch's op or the sequence operators as they are;
    elsewhere (another device or dtype, traces for the compiler) they are stacked as ONNX's
    W, R and B are and run through the ONNX node's code, which reads the gates in torch's
    order (`torch_gates`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.torch_gates = True

    def forward(
        self,
        x,
        w_ih,
        w_hh,
        b_ih=None,
        b_hh=None,
        w_ih_reverse=None,
        w_hh_reverse=None,
        b_ih_reverse=None,
        b_hh_reverse=None,
        initial_h=None,
        initial_c=None,
    ):
        ws = [w_ih] if w_ih_reverse is None else [w_ih, w_ih_reverse]
        rs = [w_hh] if w_hh_reverse is None else [w_hh, w_hh_reverse]
        biases = None if b_ih is None else [(b_ih, b_hh), (b_ih_reverse, b_hh_reverse)][: len(ws)]
        if self.native and _on_fast_path(x, *ws, *rs):
            x_t, h0, c0 = _time_major(x, initial_h, initial_c) if self.layout == 1 else (x, initial_h, initial_c)
            if not plain_aten_active():
                flat = []
                for d in range(len(ws)):
                    flat += [ws[d], rs[d], *(biases[d] if biases is not None else ())]
                return self._native(x_t, flat, biases is not None, h0, c0)
            if self.sequence_operator and x_t.shape[0] > 0 and _operators_in_use():
                input_biases = recurrent_biases = None
                if biases is not None and self.cell == "LSTM":
                    input_biases = [b_i + b_h for b_i, b_h in biases]
                elif biases is not None:
                    input_biases, recurrent_biases = [b_i for b_i, _ in biases], [b_h for _, b_h in biases]
                return self._traced_sequence(x_t, ws, rs, input_biases, recurrent_biases, h0, c0)
        b = None if biases is None else _stacked([torch.cat([b_i, b_h]) for b_i, b_h in biases], 0)
        return super().forward(x, _stacked(ws, 0), _stacked(rs, 0), b, None, initial_h, initial_c)


def _time_major(x, initial_h, initial_c):
    """layout 1's batch-first input and states as layout 0's."""
    return (
        x.transpose(0, 1),
        None if initial_h is None else initial_h.transpose(0, 1),
        None if initial_c is None else initial_c.transpose(0, 1),
    )


def _on_fast_path(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether torch's recurrent op (or a sequence operator) may run the node: CPU, float32 or
    float64, the weights of the input's dtype."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and all(weight.dtype == x.dtype for weight in weights)
    )


def _operators_in_use() -> bool:
    """Whether this trace runs graph/traced_operators.py's operators (imported here only:
    registering them costs 13 ms at model load)."""
    from .. import traced_operators

    return traced_operators.operators_in_use()


def _per_direction(tensor: torch.Tensor) -> Sequence[torch.Tensor]:
    """`tensor`'s slices along dim 0 (directions): a squeeze for one, an unbind for two."""
    return [tensor.squeeze(0)] if tensor.shape[0] == 1 else tensor.unbind(0)


def _stacked(tensors: List[torch.Tensor], dim: int) -> torch.Tensor:
    """`torch.stack(tensors, dim)`; one tensor as a view (an unsqueeze), not a copy."""
    return tensors[0].unsqueeze(dim) if len(tensors) == 1 else torch.stack(tensors, dim)


def _recurrent(cell: str, module_class: type = Recurrent):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        outputs = 3 if cell == "LSTM" else 2
        if len(node.output_values) > outputs:
            raise NotImplementedError(f"{node.operation_type} with training-only outputs in use")
        direction = a.get("direction", "forward")
        directions = 2 if direction == "bidirectional" else 1
        names = a.get("activations") or _DEFAULT_ACTIVATIONS[cell] * directions
        alphas, betas = list(a.get("activation_alpha", [])), list(a.get("activation_beta", []))
        acts = [
            named_activation(n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
            for i, n in enumerate(names)
        ]
        if len(acts) == len(_DEFAULT_ACTIVATIONS[cell]) and directions == 2:
            acts = acts * 2
        module = module_class(
            cell,
            int(a["hidden_size"]),
            direction,
            int(a.get("layout", 0)),
            int(a.get("linear_before_reset", 0)),
            len(node.output_values),
            acts,
            a.get("clip"),
            bool(a.get("input_forget", 0)),
        )
        return result(module, node)

    return convert


register("RNN", 7, 14, 22)(_recurrent("RNN"))
register("LSTM", 7, 14, 22)(_recurrent("LSTM"))
register("GRU", 3, 7, 14, 22)(_recurrent("GRU"))
register("LSTMTraining", 1, domain="com.microsoft")(_recurrent("LSTM"))
register("GRUTraining", 1, domain="com.microsoft")(_recurrent("GRU"))
register("LSTMTorchGates", 1, domain=FUSED_DOMAIN)(_recurrent("LSTM", TorchGateRecurrent))
register("GRUTorchGates", 1, domain=FUSED_DOMAIN)(_recurrent("GRU", TorchGateRecurrent))
