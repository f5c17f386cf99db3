"""View calls on the parameters taken out of a traced step and made once, not every step.

Why (measured, docs/design.md "The traced step"): a traced step on Static Runtime pays
about a microsecond for every aten call, a view's too, and most dense layers transpose their
weight every step (`addmm(b, x, t(w))`): 21 of LoRA-tiny's 302 calls, 14-15 of the tiny
transformers'.  A view of a parameter is the same alias every step: the optimizer updates
the parameter in place, so the view sees the new values.

How: `hoist_fixed_views` finds the chains of aliasing view calls (transpose, view, permute,
expand, ...) whose source is an input that stays the same tensor from step to step (the
parameters and the trace's constants), gives each chain's result a new input of the graph
(after the others) and removes the calls.  `FixedViews` makes those views from the step's
arguments, again only where a source is another tensor object than last time (the engine
binds its parameter tensors once; an engine with other tensors gets new views): a check of
object identity per source, ~1.5 us a step for 21 sources, against the ~20-30 us the calls
cost on Static Runtime.  The values are unchanged: each input is the alias the call made.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch
from torch import fx

_aten = torch.ops.aten
# calls returning an alias of their first argument determined by their arguments alone
ALIASING_VIEWS = {
    _aten.t.default,
    _aten.transpose.int,
    _aten.permute.default,
    _aten.view.default,
    _aten._unsafe_view.default,
    _aten.expand.default,
    _aten.unsqueeze.default,
    _aten.squeeze.dim,
}
Recipe = Tuple[int, Tuple[Tuple[object, tuple, dict], ...]]  # (source argument, the calls made on it)


def _plain(values: object) -> bool:
    """Whether `values` (a call's arguments past its first) hold no graph node."""
    if isinstance(values, fx.Node):
        return False
    if isinstance(values, (list, tuple)):
        return all(_plain(v) for v in values)
    if isinstance(values, dict):
        return all(_plain(v) for v in values.values())
    return True


def hoist_fixed_views(graph: fx.GraphModule, fixed_from: int) -> List[Recipe]:
    """Replace each chain of view calls of `graph` on an input at position `fixed_from` or
    later (inputs that are the same tensors every step) by a new input, appended after the
    others; returns, per new input in order, how to make it from the step's arguments."""
    inputs = [node for node in graph.graph.nodes if node.op == "placeholder"]
    chains: Dict[fx.Node, Recipe] = {node: (index, ()) for index, node in enumerate(inputs) if index >= fixed_from}
    for node in graph.graph.nodes:
        if (
            node.op == "call_function"
            and node.target in ALIASING_VIEWS
            and node.args
            and node.args[0] in chains
            and _plain(node.args[1:])
            and _plain(node.kwargs)
        ):
            source, calls = chains[node.args[0]]
            chains[node] = (source, calls + ((node.target, tuple(node.args[1:]), dict(node.kwargs)),))
    recipes: List[Recipe] = []
    last = inputs[-1]
    for node, recipe in list(chains.items()):
        if node.op == "placeholder" or all(user in chains for user in node.users):
            continue  # an input itself, or read only by further views (hoisted with them)
        with graph.graph.inserting_after(last):
            last = graph.graph.placeholder(f"fixed_view_{len(recipes)}")
        last.meta = dict(node.meta)
        node.replace_all_uses_with(last)
        recipes.append(recipe)
    for node in reversed(list(chains)):
        if node.op != "placeholder" and not node.users:
            graph.graph.erase_node(node)
    graph.recompile()
    return recipes


class FixedViews:
    """The hoisted views of a traced step (`hoist_fixed_views`' recipes), made from the
    step's arguments and kept while their sources are the same tensor objects."""

    def __init__(self, recipes: Sequence[Recipe]):
        self.recipes = list(recipes)
        self.sources = sorted({source for source, _ in self.recipes})
        self._seen: List[torch.Tensor] = []  # the source tensors the views were made of
        self._views: List[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self.recipes)

    def of(self, arguments: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """The views for a step on `arguments` (made again where a source changed)."""
        seen = self._seen
        if len(seen) != len(self.sources) or not all(
            arguments[index] is tensor for index, tensor in zip(self.sources, seen)
        ):
            with torch.no_grad():  # plain aliases: no autograd view records on the parameters
                self._views = [self._made(arguments[source], calls) for source, calls in self.recipes]
            self._seen = [arguments[index] for index in self.sources]
        return self._views

    @staticmethod
    def _made(tensor: torch.Tensor, calls: Tuple[Tuple[object, tuple, dict], ...]) -> torch.Tensor:
        for operator, args, kwargs in calls:
            tensor = operator(tensor, *args, **kwargs)
        return tensor
