"""Gradients of LSTM and GRU, which ``forward.py`` turned into com.microsoft LSTMTraining/GRUTraining.

LSTMGrad and GRUGrad take the forward inputs, the per-step states and gate values the
training ops saved, and the gradients of the hidden-state outputs, and return the gradients
of every input at once; slots that are absent or not needed are empty names.
"""

from __future__ import annotations

from typing import List, Sequence

from ..context import MS_DOMAIN, GradientContext
from ..gradient_registry import register


def _names(ctx: GradientContext, slots: Sequence[int], get) -> List[str]:
    return [get(i) for i in slots]


@register("LSTMTraining", domain=MS_DOMAIN, inputs=(0, 1, 2, 3, 5, 6, 7))
def lstm(ctx: GradientContext) -> None:
    # X, W, R, sequence_lens, initial_h, initial_c; then all hidden states, all cell states, gates.
    inputs = _names(ctx, (0, 1, 2, 4, 5, 6), ctx.I) + [ctx.O(0), ctx.O(3), ctx.O(4)]
    inputs += _names(ctx, (0, 1, 2), ctx.GO)  # d(all hidden states), d(final h), d(final c)
    # dX, dW, dR, dB, d(initial_h), d(initial_c), dP
    outputs = _names(ctx, (0, 1, 2, 3, 5, 6, 7), ctx.GI)
    ctx.emit("LSTMGrad", inputs, outputs, domain=MS_DOMAIN, **ctx.source_attributes())


@register("GRUTraining", domain=MS_DOMAIN, inputs=(0, 1, 2, 3, 5))
def gru(ctx: GradientContext) -> None:
    # X, W, R, B, sequence_lens, initial_h; then all hidden states, gates.
    inputs = _names(ctx, (0, 1, 2, 3, 4, 5), ctx.I) + [ctx.O(0), ctx.O(2)]
    inputs += _names(ctx, (0, 1), ctx.GO)  # d(all hidden states), d(final h)
    outputs = _names(ctx, (0, 1, 2, 3, 5), ctx.GI)  # dX, dW, dR, dB, d(initial_h)
    ctx.emit("GRUGrad", inputs, outputs, domain=MS_DOMAIN, **ctx.source_attributes())
