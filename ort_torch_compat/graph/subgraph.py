"""Cutting the part of an ONNX graph that computes a chosen set of outputs.

ORT's training graph interleaves forward, loss and gradient nodes (not even in that
order), so the forward+loss computation is defined as the ancestors of the user-facing
outputs.  Unused optional node outputs are then dropped: onnx2torch-style wiring treats a
node with several declared outputs as returning a tuple, which silently indexes the batch
dimension of a module that returns one tensor (Dropout's mask, LayerNorm's mean/inv-std,
BatchNorm's running stats, MaxPool's indices).
"""

from __future__ import annotations

from typing import Iterable, List, Sequence, Set

import onnx

from .errors import GraphConversionError


def ancestor_nodes(graph: onnx.GraphProto, outputs: Iterable[str]) -> List[onnx.NodeProto]:
    """Nodes needed to compute `outputs`, in the graph's (topological) order."""
    producer = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if name:
                producer[name] = index
    needed: Set[int] = set()
    stack = [name for name in outputs]
    seen: Set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        index = producer.get(name)
        if index is None or index in needed:
            continue
        needed.add(index)
        stack.extend(graph.node[index].input)
    return [graph.node[index] for index in sorted(needed)]


def prune_unused_outputs(nodes: Sequence[onnx.NodeProto], keep: Iterable[str]) -> List[onnx.NodeProto]:
    """`nodes` with the outputs nobody reads blanked (trailing blanks trimmed) in copies;
    nodes that need no change are returned as they are (copying 100,000 of them costs)."""
    used = set(keep)
    for node in nodes:
        used.update(node.input)
    pruned = []
    for node in nodes:
        names = [name if name in used else "" for name in node.output]
        while len(names) > 1 and names[-1] == "":
            names.pop()
        if names != list(node.output):
            node_copy = onnx.NodeProto()
            node_copy.CopyFrom(node)
            del node_copy.output[:]
            node_copy.output.extend(names)
            node = node_copy
        pruned.append(node)
    return pruned


def forward_graph(
    model: onnx.ModelProto,
    outputs: Sequence[str],
    inputs: Sequence[str],
    name: str,
) -> onnx.GraphProto:
    """A self-contained graph computing `outputs` from `inputs` plus the model's constants.

    Raises GraphConversionError when an output has no producer or a needed value is neither
    an input, an initializer nor produced by a node (e.g. the eval model does not match).
    """
    graph = model.graph
    nodes = prune_unused_outputs(ancestor_nodes(graph, outputs), outputs)
    produced = {out for node in nodes for out in node.output if out}
    initializers = {init.name: init for init in graph.initializer}
    available = set(inputs) | produced | set(initializers)
    for out in outputs:
        if out not in available:
            raise GraphConversionError(f"{name}: output '{out}' is not computed by the graph")
    needed_values = {value for node in nodes for value in node.input if value}
    missing = sorted(value for value in needed_values if value not in available)
    if missing:
        raise GraphConversionError(f"{name}: values {missing} are neither graph inputs, initializers nor node outputs")
    value_types = {vi.name: vi for vi in list(graph.input) + list(graph.value_info) + list(graph.output)}
    sub = onnx.helper.make_graph(
        nodes,
        graph.name or name,
        [value_types[n] if n in value_types else onnx.helper.make_empty_tensor_value_info(n) for n in inputs],
        [value_types[n] if n in value_types else onnx.helper.make_empty_tensor_value_info(n) for n in outputs],
        initializer=[initializers[n] for n in sorted(needed_values & set(initializers))],
    )
    return sub
