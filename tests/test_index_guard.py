"""graph/index_guard.py: out-of-range indices in a compiled step become a flag, not an abort.

The end-to-end case (a compiled library fed an out-of-range label) is in test_compiled.py;
here the graph rewrite itself, run as an fx graph (eager aten), against the unguarded graph.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ort_torch_compat.graph.index_guard import guard_indices
from ort_torch_compat.graph.specialize import NotSpecializable


def _step(table, ids, labels):
    rows = table[ids]  # aten.index: Python-style negative indices are valid
    picked = torch.gather(rows, 1, labels.unsqueeze(1))  # aten.gather: only 0 <= i < n
    return [picked.sum(), rows.mean()]


def _graphs():
    table, ids, labels = torch.randn(5, 3), torch.tensor([0, 4, 2]), torch.tensor([1, 0, 2])
    plain = make_fx(_step)(table, ids, labels)
    guarded = make_fx(_step)(table, ids, labels)
    assert guard_indices(guarded)
    return plain, guarded, table


@pytest.mark.parametrize("ids,labels", [([0, 4, 2], [1, 0, 2]), ([-1, -5, 3], [2, 2, 0])])
def test_valid_indices_compute_what_the_unguarded_graph_computes(ids, labels):
    plain, guarded, table = _graphs()
    ids, labels = torch.tensor(ids), torch.tensor(labels)
    *results, flag = guarded(table, ids, labels)
    assert flag.dtype == torch.bool and bool(flag)
    for a, e in zip(results, plain(table, ids, labels)):
        assert torch.equal(a, e)


@pytest.mark.parametrize(
    "ids,labels",
    [([0, 5, 2], [1, 0, 2]), ([0, -6, 2], [1, 0, 2]), ([0, 1, 2], [3, 0, 2]), ([0, 1, 2], [-1, 0, 2])],
    ids=["row past the end", "row before the start", "label past the end", "negative label"],
)
def test_out_of_range_indices_clear_the_flag_and_touch_no_memory_outside(ids, labels):
    plain, guarded, table = _graphs()
    ids, labels = torch.tensor(ids), torch.tensor(labels)
    with pytest.raises((IndexError, RuntimeError)):  # the eager operators refuse them
        plain(table, ids, labels)
    *_, flag = guarded(table, ids, labels)  # clamped: in bounds, so nothing raises or reads outside
    assert not bool(flag)


def test_a_graph_without_indexing_is_left_alone():
    graph = make_fx(lambda x, w: [(x @ w).relu().sum()])(torch.randn(2, 3), torch.randn(3, 4))
    code = graph.code
    assert not guard_indices(graph)
    assert graph.code == code


def test_indexing_an_empty_dimension_is_not_compiled():
    graph = make_fx(lambda table, ids: [table[ids].sum()])(torch.randn(0, 3), torch.zeros(0, dtype=torch.int64))
    with pytest.raises(NotSpecializable, match="empty dimension"):
        guard_indices(graph)


def test_one_index_tensor_is_checked_once_per_range_and_constants_not_at_all():
    def step(table, other, ids):
        fixed = torch.arange(2)  # computed from no input: in range by construction
        return [table[ids].sum() + other[ids].sum() + table[fixed].sum()]

    graph = make_fx(step)(torch.randn(5, 3), torch.randn(5, 2), torch.tensor([0, 4]))
    assert guard_indices(graph)
    targets = [node.target for node in graph.graph.nodes]
    assert targets.count(torch.ops.aten.clamp.default) == 1 and targets.count(torch.ops.aten.all.default) == 1


def test_indices_the_graph_computes_are_not_guarded_and_floats_cast_to_indices_are():
    """A max-pool's backward scatters through offsets computed from the activations (in
    range by construction: guarding them cost the CNN's compiled step 17%); a float input
    cast to an index is the caller's value like a token id."""
    import torch._inductor.lowering  # noqa: F401  (the decompositions consult the lowerings)
    from torch._inductor.decomposition import select_decomp_table

    def pooled(x):
        x = x.detach().requires_grad_()
        y = torch.nn.functional.max_pool2d(x, 2)
        return list(torch.autograd.grad(y.sum(), x))

    def gathered(x):  # the backward scatters through indices an argmax computed
        x = x.detach().requires_grad_()
        y = torch.gather(x, 1, x.argmax(1, keepdim=True))
        return list(torch.autograd.grad(y.sum(), x))

    for function, example in ((pooled, torch.randn(1, 2, 4, 4)), (gathered, torch.randn(3, 4))):
        with torch.enable_grad():
            graph = make_fx(function, decomposition_table=select_decomp_table())(example)
        targets = {str(node.target) for node in graph.graph.nodes}
        # the backward indexes: a scatter (torch 2.14) or max-pool's own backward kernel (2.6)
        assert any("scatter" in t or "index_put" in t or "max_pool2d_with_indices_backward" in t for t in targets)
        assert not guard_indices(graph), function.__name__

    cast = make_fx(lambda table, position: [table[position.long()].sum()])(torch.randn(5, 3), torch.tensor([1.0, 4.0]))
    assert guard_indices(cast)
    assert not bool(cast(torch.randn(5, 3), torch.tensor([1.0, 7.0]))[-1])
