"""ONNX LSTM / GRU (and ORT's LSTMTraining / GRUTraining, same forward) as explicit
time loops over the ONNX gate layout (LSTM: i,o,f,c; GRU: z,r,h), so weights stay the
checkpoint's tensors and autograd sees exactly ONNX's equations."""
from __future__ import annotations

from typing import List, Optional

import torch

from ..registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


class Recurrent(OnnxModule):
    def __init__(self, cell: str, hidden: int, direction: str, layout: int, linear_before_reset: int, outputs: int):
        super().__init__()
        self.outputs = outputs
        self.cell, self.hidden, self.direction = cell, hidden, direction
        self.layout, self.linear_before_reset = layout, linear_before_reset

    def forward(self, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
        if sequence_lens is not None:
            lens = sequence_lens.tolist()
            if any(length != x.shape[1 - self.layout] for length in lens) and min(lens) != max(lens):
                raise NotImplementedError("LSTM/GRU with varying sequence_lens")
        if p is not None:
            raise NotImplementedError("LSTM peepholes")
        if self.layout == 1:
            x = x.transpose(0, 1)
        seq, batch = x.shape[0], x.shape[1]
        directions = w.shape[0]
        gates = 4 if self.cell == "LSTM" else 3
        ys, hs, cs = [], [], []
        for d in range(directions):
            reverse = self.direction == "reverse" or (self.direction == "bidirectional" and d == 1)
            wb = b[d, : gates * self.hidden] if b is not None else None
            rb = b[d, gates * self.hidden :] if b is not None else None
            h = initial_h[d] if initial_h is not None else x.new_zeros(batch, self.hidden)
            c = initial_c[d] if initial_c is not None else x.new_zeros(batch, self.hidden)
            x_proj = torch.matmul(x, w[d].t())
            if wb is not None:
                x_proj = x_proj + wb
            steps = range(seq - 1, -1, -1) if reverse else range(seq)
            outputs: List[Optional[torch.Tensor]] = [None] * seq
            for t in steps:
                if self.cell == "LSTM":
                    h, c = self._lstm_step(x_proj[t], h, c, r[d], rb)
                else:
                    h = self._gru_step(x_proj[t], h, r[d], rb)
                outputs[t] = h
            ys.append(torch.stack(outputs, 0))
            hs.append(h)
            cs.append(c)
        y = torch.stack(ys, 1)  # [seq, dirs, batch, hidden]
        y_h = torch.stack(hs, 0)
        y_c = torch.stack(cs, 0)
        if self.layout == 1:
            y = y.permute(2, 0, 1, 3)
            y_h, y_c = y_h.transpose(0, 1), y_c.transpose(0, 1)
        values = (y, y_h, y_c)[: self.outputs]
        return values[0] if self.outputs == 1 else values

    def _lstm_step(self, xw, h, c, r, rb):
        g = xw + torch.matmul(h, r.t())
        if rb is not None:
            g = g + rb
        i, o, f, cand = g.chunk(4, dim=-1)
        i, o, f, cand = torch.sigmoid(i), torch.sigmoid(o), torch.sigmoid(f), torch.tanh(cand)
        c = f * c + i * cand
        return o * torch.tanh(c), c

    def _gru_step(self, xw, h, r, rb):
        hid = self.hidden
        xz, xr, xh = xw.split(hid, dim=-1)
        rz, rr, rh = r.split(hid, dim=0)
        bz, br, bh = rb.split(hid) if rb is not None else (0.0, 0.0, 0.0)
        z = torch.sigmoid(xz + torch.matmul(h, rz.t()) + bz)
        rt = torch.sigmoid(xr + torch.matmul(h, rr.t()) + br)
        if self.linear_before_reset:
            cand = torch.tanh(xh + rt * (torch.matmul(h, rh.t()) + bh))
        else:
            cand = torch.tanh(xh + torch.matmul(rt * h, rh.t()) + bh)
        return (1 - z) * cand + z * h


def _recurrent(cell: str):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        default_acts = ["Sigmoid", "Tanh", "Tanh"] if cell == "LSTM" else ["Sigmoid", "Tanh"]
        acts = a.get("activations")
        if acts and [s.lower() for s in acts[: len(default_acts)]] != [s.lower() for s in default_acts]:
            raise NotImplementedError(f"{cell} with activations {acts}")
        if a.get("clip") is not None or a.get("input_forget", 0):
            raise NotImplementedError(f"{cell} with clip/input_forget")
        outputs = 3 if cell == "LSTM" else 2
        if len(node.output_values) > outputs:
            raise NotImplementedError(f"{cell}Training with training-only outputs in use")
        module = Recurrent(cell, int(a["hidden_size"]), a.get("direction", "forward"), int(a.get("layout", 0)),
                           int(a.get("linear_before_reset", 0)), len(node.output_values))
        return result(module, node)
    return convert


register("LSTM", 7, 14, 22)(_recurrent("LSTM"))
register("GRU", 7, 14, 22)(_recurrent("GRU"))
register("LSTMTraining", 1, domain="com.microsoft")(_recurrent("LSTM"))
register("GRUTraining", 1, domain="com.microsoft")(_recurrent("GRU"))
