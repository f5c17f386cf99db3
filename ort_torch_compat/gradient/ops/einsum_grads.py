"""Einsum's gradient as Einsums with permuted equations (ORT 1.19.2 has no Einsum gradient).

For ``out = einsum("S_0,...,S_n->S_out", x_0, ..., x_n)`` the gradient of operand ``i`` is
``einsum("S_out,S_0,..(without S_i)..,S_n->S_i", dY, x_0, ...)``: every index of ``S_i`` that
the other operands or the output share is kept, every other index is summed.  Before that
the equation is made explicit: ``...`` becomes letters (right-aligned, as broadcasting
does), an implicit output becomes the letters used once in alphabetical order (after the
ellipsis), and an operand whose index has static size 1 where another operand's has more
(broadcast) gets a letter of its own.  Indices of ``S_i`` nobody else has (summed inside
``x_i`` alone, like ``j`` in ``"ij->i"``) are added back by Unsqueeze + Expand.

Refused: an index repeated within the operand whose gradient is needed (a diagonal, like
``"ii->i"``), and ``...`` in an operand of unknown rank.
"""

from __future__ import annotations

import string
from typing import Dict, List

from ..context import GradientContext
from ..gradient_registry import register

LETTERS = string.ascii_lowercase + string.ascii_uppercase


def explicit_terms(ctx: GradientContext) -> List[List[str]]:
    """``[S_0, ..., S_n, S_out]`` as lists of single letters, without ``...`` or implicit output."""
    equation = ctx.attr("equation")
    equation = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(" ", "")
    left, arrow, right = equation.partition("->")
    terms = left.split(",")
    if len(terms) != ctx.num_inputs():
        raise ctx.unsupported(f"equation {equation!r} names {len(terms)} operands, the node has {ctx.num_inputs()}")
    used = set(equation) - set(".,->")
    unknown = used - set(LETTERS)
    if unknown:
        raise ctx.unsupported(f"equation {equation!r} uses indices other than letters: {sorted(unknown)}")
    fresh = [c for c in LETTERS if c not in used]
    ellipsis_rank = 0
    ranks: List[int] = []
    for k, term in enumerate(terms):
        named = len(term.replace("...", ""))
        if "..." in term:
            shape = ctx.shape(ctx.I(k))
            if shape is None:
                raise ctx.unsupported(f"'...' in the equation for operand {k}, whose rank is unknown")
            ellipsis_rank = max(ellipsis_rank, len(shape) - named)
        ranks.append(named)
    if ellipsis_rank > len(fresh):
        raise ctx.unsupported("too many indices for the 52 letters Einsum has")
    ellipsis_letters, fresh = fresh[:ellipsis_rank], fresh[ellipsis_rank:]

    def expand(term: str, rank: int) -> List[str]:
        if "..." not in term:
            return list(term)
        before, _, after = term.partition("...")
        count = rank - len(before) - len(after)
        return list(before) + (ellipsis_letters[len(ellipsis_letters) - count :] if count else []) + list(after)

    inputs = [expand(t, len(ctx.shape(ctx.I(k))) if "..." in t else ranks[k]) for k, t in enumerate(terms)]
    if arrow:
        output = expand(right, len(right.replace("...", "")) + ellipsis_rank)
    else:
        counts: Dict[str, int] = {}
        for term in terms:
            for c in term.replace("...", ""):
                counts[c] = counts.get(c, 0) + 1
        output = list(ellipsis_letters) + sorted(c for c, n in counts.items() if n == 1)
    _separate_broadcast_indices(ctx, inputs, fresh)
    return inputs + [output]


def _separate_broadcast_indices(ctx: GradientContext, inputs: List[List[str]], fresh: List[str]) -> None:
    """Give an operand's index of static size 1 its own letter where another operand's is larger."""
    sizes: Dict[str, int] = {}
    shapes = [ctx.shape(ctx.I(k)) for k in range(len(inputs))]
    for term, shape in zip(inputs, shapes):
        if shape is None or len(shape) != len(term):
            continue
        for letter, dim in zip(term, shape):
            if isinstance(dim, int):
                sizes[letter] = max(sizes.get(letter, 1), dim)
    for term, shape in zip(inputs, shapes):
        if shape is None or len(shape) != len(term):
            continue
        for position, (letter, dim) in enumerate(zip(term, shape)):
            if dim == 1 and sizes.get(letter, 1) > 1:
                if not fresh:
                    raise ctx.unsupported("too many indices for the 52 letters Einsum has")
                term[position] = fresh.pop(0)


@register("Einsum")
def einsum(ctx: GradientContext) -> None:
    terms = explicit_terms(ctx)
    inputs, output = terms[:-1], terms[-1]
    for slot, term in enumerate(inputs):
        if not ctx.requires(slot):
            continue
        if len(set(term)) != len(term):
            raise ctx.unsupported(f"index repeated within operand {slot} ({''.join(term)!r}: a diagonal)")
        others = [k for k in range(len(inputs)) if k != slot]
        available = set(output).union(*(inputs[k] for k in others))
        kept = [c for c in term if c in available]
        missing = [p for p, c in enumerate(term) if c not in available]
        target = ctx.GI(slot) if not missing else ctx.IA(f"dI{slot}_kept")
        if not others and kept == output:
            ctx.emit("Identity", [ctx.GO(0)], [target])
        else:
            equation = ",".join("".join(t) for t in [output, *(inputs[k] for k in others)]) + "->" + "".join(kept)
            ctx.emit("Einsum", [ctx.GO(0), *(ctx.I(k) for k in others)], [target], equation=equation)
        if missing:
            unsqueezed = ctx.IA(f"dI{slot}_unsqueezed")
            ctx.unsqueeze(target, missing, unsqueezed)
            dims = ctx.emit("Shape", [ctx.I(slot)], [ctx.IA(f"I{slot}_shape")])[0]
            ctx.emit("Expand", [unsqueezed, dims], [ctx.GI(slot)])
