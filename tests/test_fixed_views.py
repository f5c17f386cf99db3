"""View calls on the parameters taken out of the traced step (engine/fixed_views.py): which
calls leave the graph, that the step's values are unchanged, and that the views follow their
sources (in-place updates seen, another tensor object given new views)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ort_torch_compat.engine import traced_step
from ort_torch_compat.engine.fixed_views import FixedViews, hoist_fixed_views


def _layers(x, w1, b1, w2, scale):
    """Two dense layers (transposed weights), a view of the second weight read by a product
    and by a further view, a view of the feed, a view of a constant, a weight's view output."""
    h = torch.addmm(b1, x, w1.t())
    y = h @ w2.t()
    chain = w2.t().unsqueeze(0)  # a chain of two views
    return y.view(2, 2, 4) * scale.view(1, 1, 1), chain.sum(0) * 2 + x.view(-1)[0], w1.t()


def _inputs():
    generator = torch.Generator().manual_seed(0)
    x, w1, b1, w2 = (torch.randn(*s, generator=generator) for s in ((4, 3), (5, 3), (5,), (4, 5)))
    return [x, w1, b1, w2, torch.tensor(2.0)]


def _calls(graph):
    return [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]


def test_views_of_fixed_inputs_leave_the_graph_and_values_stay():
    inputs = _inputs()
    graph = make_fx(_layers)(*inputs)
    traced_step.drop_redundant_views(graph)  # as the traced step does first: w1's two transposes made once
    before, expected = _calls(graph), graph(*inputs)
    recipes = hoist_fixed_views(graph, fixed_from=1)  # x is fed; the weights and the constant stay
    after = _calls(graph)
    made = [(source, [str(call[0]) for call in calls]) for source, calls in recipes]
    assert made == [
        (1, ["aten.t.default"]),  # w1.t(): the product's and the output
        (3, ["aten.t.default"]),  # w2.t(): the product's ...
        (3, ["aten.t.default", "aten.unsqueeze.default"]),  # ... and the chain, one input
        (4, ["aten.view.default"]),  # the constant's view
    ]
    views = {"aten.t.default", "aten.unsqueeze.default", "aten.view.default"}
    assert [c for c in after if c in views] == ["aten.view.default", "aten.view.default"]  # y's and x's
    assert [c for c in after if c not in views] == [c for c in before if c not in views]  # the computing calls
    inputs_now = [n for n in graph.graph.nodes if n.op == "placeholder"]
    assert len(inputs_now) == len(inputs) + len(recipes)
    for got, want in zip(graph(*inputs, *FixedViews(recipes).of(inputs)), expected):
        assert torch.equal(got, want)


def test_nothing_fed_is_hoisted():
    inputs = _inputs()
    graph = make_fx(_layers)(*inputs)
    before = _calls(graph)
    assert hoist_fixed_views(graph, fixed_from=len(inputs)) == []
    assert _calls(graph) == before


def test_the_views_follow_their_sources():
    inputs = _inputs()
    graph = make_fx(_layers)(*inputs)
    views = FixedViews(hoist_fixed_views(graph, fixed_from=1))
    first = views.of(inputs)
    assert all(a is b for a, b in zip(views.of(list(inputs)), first))  # same sources: kept
    inputs[1].add_(1.0)  # an optimizer's in-place update: seen through the same views
    for got, want in zip(graph(*inputs, *views.of(inputs)), _layers(*inputs)):
        assert torch.equal(got, want)
    replaced = list(inputs)
    replaced[3] = torch.randn(4, 5)  # another tensor object: new views of it
    again = views.of(replaced)
    assert not any(a is b for a, b in zip(again, first))
    for got, want in zip(graph(*replaced, *again), _layers(*replaced)):
        assert torch.allclose(got, want)


def test_views_of_parameters_that_require_grad_are_plain_aliases():
    inputs = _inputs()
    graph = make_fx(_layers)(*inputs)
    views = FixedViews(hoist_fixed_views(graph, fixed_from=1))
    params = [inputs[0]] + [t.clone().requires_grad_() for t in inputs[1:4]] + [inputs[4]]
    made = views.of(params)
    assert all(view.grad_fn is None for view in made)  # made under no_grad: no autograd records
    assert made[0].data_ptr() == params[1].data_ptr()


# The drop-in loop through a traced step with its weights' transposes made once:
# tests/test_traced_step.py, test_the_drop_in_module_trains_traced_with_eagers_losses.
