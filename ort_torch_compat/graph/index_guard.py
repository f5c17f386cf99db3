"""Index bounds in a compiled step: checked in the graph, never by an abort.

Why: TorchInductor's CPU code checks an index taken from a tensor (a token id into an
embedding, a label into the loss) with a C++ assertion inside an OpenMP region, where the
exception cannot be caught: an out-of-range token id ended the user's process with
`terminate called after throwing an instance of 'c10::Error'`.  The eager module raises an
IndexError that the engine explains (ORT returns an error status naming the input).

What: `guard_indices` rewrites an aten graph (the traced train step, before it is
compiled) so that every integer index tensor of an indexing operator is clamped into the
operand's range before use (the compiled kernels then never read or write out of bounds,
and Inductor's assertion cannot fire), and the graph returns one more output: a boolean
scalar, true when every index was within the range the eager operator accepts.  A step
whose flag is false is thrown away by the runner (nothing written back) and run eagerly,
which raises the error with its explanation.  Valid indices are unchanged by the clamp, so
a valid step computes exactly what the unguarded graph computes.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import fx

from .specialize import NotSpecializable

aten = torch.ops.aten

# operator -> (positions of index tensors and the dimension each indexes); `negative`: the
# eager operator accepts -n <= i < n (Python-style), else 0 <= i < n.
_IndexSpec = Tuple[List[Tuple[object, int]], bool]


def _list_indices(node: fx.Node) -> _IndexSpec:
    """index/index_put: args[1] is a list whose k-th tensor (or None) indexes dimension k."""
    return [((1, k), k) for k, index in enumerate(node.args[1]) if isinstance(index, fx.Node)], True


def _dim_index(position: int, negative: bool) -> Callable[[fx.Node], _IndexSpec]:
    def spec(node: fx.Node) -> _IndexSpec:
        return [(position, node.args[1])], negative

    return spec


_INDEXING: Dict[object, Callable[[fx.Node], _IndexSpec]] = {
    aten.index.Tensor: _list_indices,
    aten.index_put.default: _list_indices,
    aten.gather.default: _dim_index(2, False),
    aten.scatter.value: _dim_index(2, False),
    aten.scatter.src: _dim_index(2, False),
    aten.scatter_add.default: _dim_index(2, False),
    aten.scatter_reduce.two: _dim_index(2, False),
    aten.index_select.default: _dim_index(2, True),
    aten.index_add.default: _dim_index(2, True),
    aten.index_copy.default: _dim_index(2, True),
}


_INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_CASTS = (torch.ops.prims.convert_element_type.default, aten._to_copy.default)


def _value(node: object) -> Optional[torch.Tensor]:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _get(node: fx.Node, position: object) -> object:
    if isinstance(position, tuple):
        return node.args[position[0]][position[1]]
    return node.args[position]


def _set(node: fx.Node, position: object, value: fx.Node) -> None:
    args = list(node.args)
    if isinstance(position, tuple):
        inner = list(args[position[0]])
        inner[position[1]] = value
        args[position[0]] = type(node.args[position[0]])(inner)
    else:
        args[position] = value
    node.args = tuple(args)


def _fed_by_inputs(graph: fx.Graph) -> set:
    """The nodes whose value depends on an integer graph input (a token id, a label) or on a
    float cast to an integer: the indices a caller controls.  Indices the graph computes
    from floats itself (a max-pool's argmax offsets) are in range by construction."""
    fed: set = set()
    for node in graph.nodes:
        value = _value(node)
        integer = value is not None and value.dtype in _INTEGERS
        if node.op == "placeholder":
            source = integer
        else:
            parents = [_value(parent) for parent in node.all_input_nodes]
            source = (
                integer
                and node.target in _CASTS
                and any(p is not None and (p.dtype.is_floating_point or p.dtype.is_complex) for p in parents)
            )
        if source or any(parent in fed for parent in node.all_input_nodes):
            fed.add(node)
    return fed


def guard_indices(module: fx.GraphModule) -> bool:
    """Clamp every integer index of an indexing operator in `module` (in place) and append
    the all-within-range flag as its last output.  False, leaving the graph as it was,
    where it has no such index (nothing to guard); NotSpecializable where an operator
    indexes an empty dimension (no clamp makes that safe).  An index tensor computed from
    constants alone is left as it is (the trace already indexed with it), and one index
    tensor used several times with the same range (an embedding's ids in its forward and
    its backward) is checked and clamped once.  Only indices a caller controls are guarded
    (see `_fed_by_inputs`): a max-pool's backward scatters through offsets it computed, and
    guarding those cost the hand-made CNN's compiled step 17%."""
    graph = module.graph
    flags: List[fx.Node] = []
    clamped: Dict[Tuple[fx.Node, int, int], fx.Node] = {}
    fed = _fed_by_inputs(graph)
    for node in list(graph.nodes):
        spec_of = _INDEXING.get(node.target) if node.op == "call_function" else None
        operand = _value(node.args[0]) if spec_of is not None else None
        if operand is None:
            continue
        positions, negative = spec_of(node)
        for position, dim in positions:
            index = _get(node, position)
            value = _value(index)
            if value is None or value.dtype not in _INTEGERS or index not in fed:
                continue
            size = operand.shape[dim] if operand.dim() else 1
            if not isinstance(size, int) or size == 0:  # no index is valid: keep the eager step
                raise NotSpecializable(f"{node.target} indexes an empty dimension")
            bounds = (index, -size if negative else 0, size - 1)
            if bounds not in clamped:
                with graph.inserting_after(index):
                    clamped[bounds] = graph.call_function(aten.clamp.default, bounds)
                with graph.inserting_before(clamped[bounds]):
                    above = graph.call_function(aten.ge.Scalar, (index, bounds[1]))
                    below = graph.call_function(aten.le.Scalar, (index, bounds[2]))
                    within = graph.call_function(aten.logical_and.default, (above, below))
                    flags.append(graph.call_function(aten.all.default, (within,)))
            _set(node, position, clamped[bounds])
    if not flags:
        return False
    output = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(output):
        flag = flags[0]
        for other in flags[1:]:
            flag = graph.call_function(aten.logical_and.default, (flag, other))
    results = output.args[0]
    output.args = ((*results, flag),) if isinstance(results, (list, tuple)) else ((results, flag),)
    graph.lint()
    module.recompile()
    return True
