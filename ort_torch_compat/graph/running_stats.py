"""Which BatchNorm running-stat inputs a train step may update in place.

A training-mode BatchNormalization / com.microsoft BatchNormInternal writes its running mean
and variance back into its inputs 3 and 4.  That is only sound when those inputs are the
checkpoint's own buffers (frozen parameters holding running stats) or the graph's own
initializer constants, each read by that one node input and nothing else.  Real exports
break this: a freshly initialised model exported in eval mode has its running stats
de-duplicated by the exporter into `Identity` of the (equal-valued) BatchNorm weight and
bias, and several BatchNorms can share one such value.  Writing there would change trained
or frozen weights behind autograd's back.  ORT 1.19.2 does exactly that (measured: a train
step alone changes `bn.weight` in such artifacts); we do not: those inputs are blanked, so
the node normalizes with batch statistics and updates nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import onnx

_TRAINING_BATCH_NORMS = {
    ("", "BatchNormalization"),
    ("ai.onnx", "BatchNormalization"),
    ("com.microsoft", "BatchNormInternal"),
}
_RUNNING_STAT_POSITIONS = (3, 4)


def _training_mode(node: onnx.NodeProto) -> bool:
    default = 1 if node.op_type == "BatchNormInternal" else 0
    for attribute in node.attribute:
        if attribute.name == "training_mode":
            return bool(attribute.i)
    return bool(default)


def detach_unowned_running_stats(graph: onnx.GraphProto, buffers: Iterable[str]) -> onnx.GraphProto:
    """Blank (in place) the running-stat inputs of training-mode BatchNorms that are not
    `buffers` (names of frozen checkpoint parameters) or initializers of the graph, or that
    are read anywhere else; returns the graph."""
    owned = set(buffers) | {init.name for init in graph.initializer}
    reads = Counter(name for node in graph.node for name in node.input if name)
    reads.update(out.name for out in graph.output)
    for node in graph.node:
        if (node.domain, node.op_type) not in _TRAINING_BATCH_NORMS or not _training_mode(node):
            continue
        for position in _RUNNING_STAT_POSITIONS:
            name = node.input[position] if position < len(node.input) else ""
            if name and (name not in owned or reads[name] > 1):
                node.input[position] = ""
    return graph
