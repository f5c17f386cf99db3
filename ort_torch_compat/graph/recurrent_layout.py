"""Recurrent nodes fed torch's own parameters, where the exporter only reordered their gates.

torch's exporter (TorchScript-based, with the parameters kept as inputs, as training exports
are made) writes an `nn.LSTM` / `nn.GRU` layer as one ONNX LSTM / GRU node whose W, R and B
are the layer's parameters cut into gate blocks and concatenated in ONNX's gate order
(LSTM: torch's i,f,g,o -> ONNX's i,o,f,c; GRU: r,z,n -> z,r,h), per direction, then stacked:

    W = Unsqueeze(Concat(Slice(weight_ih_l0, 0:h), Slice(.., 3h:4h), Slice(.., h:3h)))
    B = Unsqueeze(Concat(Concat(<bias_ih_l0 reordered>), Concat(<bias_hh_l0 reordered>)))

(ORT's artifact generation turns the three Slices into one Split; a bidirectional layer
concatenates the two directions' Unsqueezes.)  Running that as written costs ~20 calls a
step on tiny tensors, forward and backward (the reordered gradients are concatenated back),
and the converter's fast paths then reorder ONNX's layout back into torch's.  This pass
recognises the pattern and replaces such a node with a fused-domain `LSTMTorchGates` /
`GRUTorchGates` node taking the parameters themselves (converters/recurrent.py): the same
equations on the same values, with no reordering at all on the CPU's fast paths.

Only the plain case is rewritten, the one the fast paths run: default activations, no clip,
input_forget, peepholes or sequence_lens, direction forward or bidirectional.  The slicing
nodes are dropped where nothing else reads them.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

import onnx
from onnx import numpy_helper

from .fusion import FUSED_DOMAIN

# For each gate in ONNX's order, its block's position in torch's layout.
TORCH_BLOCK_OF_ONNX_GATE = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2)}
_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}
_CELL_OF_OP = {
    ("", "LSTM"): "LSTM",
    ("com.microsoft", "LSTMTraining"): "LSTM",
    ("", "GRU"): "GRU",
    ("com.microsoft", "GRUTraining"): "GRU",
}
_CONCATS = {("", "Concat"), ("com.microsoft", "ConcatTraining")}

Block = Tuple[str, int, int]  # rows [start, end) of a graph input or initializer, along axis 0


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain == "ai.onnx" else node.domain


class _Graph:
    """What the pattern matcher reads: producers, constants and the first dimension of
    every graph input and initializer."""

    def __init__(self, graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto]):
        self.producer = {out: node for node in nodes for out in node.output if out}
        self.initializers = {init.name: init for init in graph.initializer}
        self.rows: Dict[str, int] = {init.name: init.dims[0] for init in graph.initializer if init.dims}
        for info in graph.input:
            dims = info.type.tensor_type.shape.dim
            if dims and dims[0].HasField("dim_value"):
                self.rows[info.name] = dims[0].dim_value

    def constant(self, name: str) -> Optional[List[int]]:
        """The integers of a constant value (initializer or Constant node), else None (also
        for a tensor that does not decode: the converters report those)."""
        tensor = self.initializers.get(name)
        node = self.producer.get(name)
        if tensor is None and node is not None and node.op_type == "Constant" and _domain(node) == "":
            for attribute in node.attribute:
                if attribute.name == "value":
                    tensor = attribute.t
                elif attribute.name == "value_ints":
                    return list(attribute.ints)
                elif attribute.name == "value_int":
                    return [attribute.i]
        if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:  # loading reads those first
            return None
        try:
            values = numpy_helper.to_array(tensor)
        except (ValueError, TypeError, AttributeError, onnx.checker.ValidationError):
            return None
        return values.reshape(-1).tolist() if values.dtype.kind in "iu" else None

    def operand(self, node: onnx.NodeProto, attribute: str, position: int) -> Optional[List[int]]:
        """An integer list given as an attribute (older opsets) or as a constant input."""
        for found in node.attribute:
            if found.name == attribute:
                return list(found.ints)
        if position < len(node.input) and node.input[position]:
            return self.constant(node.input[position])
        return None

    def blocks(self, name: str, visited: List[onnx.NodeProto]) -> Optional[List[Block]]:
        """`name` as row ranges of sources concatenated along axis 0, else None."""
        node = self.producer.get(name)
        if node is None:
            rows = self.rows.get(name)
            return None if rows is None else [(name, 0, rows)]
        key = (_domain(node), node.op_type)
        if key in _CONCATS:
            if _int_attribute(node, "axis", 0) != 0:
                return None
            parts: List[Block] = []
            for part in node.input:
                found = self.blocks(part, visited)
                if found is None:
                    return None
                parts += found
            visited.append(node)
            return parts
        if key == ("", "Slice"):
            return self._slice(node, visited)
        if key == ("", "Split"):
            return self._split(node, name, visited)
        return None

    def _source_rows(self, name: str) -> Optional[int]:
        return None if name in self.producer else self.rows.get(name)

    def _slice(self, node: onnx.NodeProto, visited: List[onnx.NodeProto]) -> Optional[List[Block]]:
        source = node.input[0]
        rows = self._source_rows(source)
        starts, ends = self.operand(node, "starts", 1), self.operand(node, "ends", 2)
        axes, steps = self.operand(node, "axes", 3), self.operand(node, "steps", 4)
        if rows is None or starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
            return None
        if axes not in (None, [0]) or steps not in (None, [1]):
            return None
        start, end = (value + rows if value < 0 else value for value in (starts[0], ends[0]))
        start, end = max(0, min(start, rows)), max(0, min(end, rows))
        if start >= end:
            return None
        visited.append(node)
        return [(source, start, end)]

    def _split(self, node: onnx.NodeProto, name: str, visited: List[onnx.NodeProto]) -> Optional[List[Block]]:
        source = node.input[0]
        rows = self._source_rows(source)
        if rows is None or _int_attribute(node, "axis", 0) != 0:
            return None
        sizes = self.operand(node, "split", 1)
        outputs = len(node.output)
        if sizes is None:
            if rows % outputs:
                return None
            sizes = [rows // outputs] * outputs
        if len(sizes) != outputs or sum(sizes) != rows:
            return None
        position = list(node.output).index(name)
        start = sum(sizes[:position])
        visited.append(node)
        return [(source, start, start + sizes[position])]

    def per_direction(self, name: str, directions: int, visited: List[onnx.NodeProto]) -> Optional[List[List[Block]]]:
        """Each direction's blocks of a stacked W, R or B: Unsqueeze(axis 0) of one
        direction, or a Concat of those."""
        node = self.producer.get(name)
        if node is None:
            return None
        if directions > 1:
            if (_domain(node), node.op_type) not in _CONCATS or _int_attribute(node, "axis", 0) != 0:
                return None
            if len(node.input) != directions:
                return None
            found = [self.per_direction(part, 1, visited) for part in node.input]
            if any(one is None for one in found):
                return None
            visited.append(node)
            return [one[0] for one in found]
        if (_domain(node), node.op_type) != ("", "Unsqueeze") or self.operand(node, "axes", 1) != [0]:
            return None
        blocks = self.blocks(node.input[0], visited)
        if blocks is None:
            return None
        visited.append(node)
        return [blocks]


def _int_attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return attribute.i
    return default


def _merged(blocks: Sequence[Block]) -> List[Block]:
    """Adjacent row ranges of one source as one range."""
    merged: List[Block] = []
    for source, start, end in blocks:
        if merged and merged[-1][0] == source and merged[-1][2] == start:
            merged[-1] = (source, merged[-1][1], end)
        else:
            merged.append((source, start, end))
    return merged


def _reordered(source: str, cell: str, hidden: int) -> List[Block]:
    """The blocks of `source` (torch's layout) that make its ONNX-ordered copy."""
    return _merged([(source, block * hidden, (block + 1) * hidden) for block in TORCH_BLOCK_OF_ONNX_GATE[cell]])


def _torch_sources(
    blocks: List[Block], cell: str, hidden: int, count: int, rows: Dict[str, int]
) -> Optional[List[str]]:
    """The `count` torch-layout sources (each exactly one layer's gates) whose ONNX
    reorderings, one after another, are `blocks`."""
    merged, sources = _merged(blocks), []
    gates = len(TORCH_BLOCK_OF_ONNX_GATE[cell])
    for _ in range(count):
        if not merged or rows.get(merged[0][0]) != gates * hidden:
            return None
        source = merged[0][0]
        expected = _reordered(source, cell, hidden)
        if merged[: len(expected)] != expected:
            return None
        sources.append(source)
        merged = merged[len(expected) :]
    return sources if not merged else None


def _plain(node: onnx.NodeProto, cell: str) -> bool:
    """Default activations, no clip, input_forget, sequence_lens or peepholes, not reverse."""
    attributes = {a.name: a for a in node.attribute}
    direction = attributes["direction"].s if "direction" in attributes else b"forward"
    if direction not in (b"forward", b"bidirectional") or "clip" in attributes:
        return False
    if "input_forget" in attributes and attributes["input_forget"].i:
        return False
    if cell == "GRU" and not ("linear_before_reset" in attributes and attributes["linear_before_reset"].i):
        return False  # torch's GRU computes the reset gate's product first
    if "activations" in attributes:
        names = list(attributes["activations"].strings)
        defaults = [name.encode() for name in _DEFAULT_ACTIVATIONS[cell]]
        if names != defaults * (2 if direction == b"bidirectional" else 1) and names != defaults:
            return False
    if "activation_alpha" in attributes or "activation_beta" in attributes:
        return False
    inputs = list(node.input) + [""] * 8
    return not inputs[4] and not inputs[7]  # sequence_lens, peepholes


def _rewritten(node: onnx.NodeProto, cell: str, graph: _Graph, visited: List[onnx.NodeProto]):
    """The fused node replacing `node`, or None where its weights are not torch's reordered."""
    attributes = {a.name: a for a in node.attribute}
    if "hidden_size" not in attributes or attributes["hidden_size"].i <= 0 or not _plain(node, cell):
        return None
    hidden = attributes["hidden_size"].i
    bidirectional = "direction" in attributes and attributes["direction"].s == b"bidirectional"
    directions = 2 if bidirectional else 1
    inputs = list(node.input) + [""] * 8
    weights = [graph.per_direction(inputs[position], directions, visited) for position in (1, 2)]
    if any(found is None for found in weights):
        return None
    biases = None
    if inputs[3]:
        biases = graph.per_direction(inputs[3], directions, visited)
        if biases is None:
            return None
    fused_inputs = [inputs[0]]
    for direction in range(directions):
        w = _torch_sources(weights[0][direction], cell, hidden, 1, graph.rows)
        r = _torch_sources(weights[1][direction], cell, hidden, 1, graph.rows)
        b = _torch_sources(biases[direction], cell, hidden, 2, graph.rows) if biases is not None else ["", ""]
        if w is None or r is None or b is None:
            return None
        fused_inputs += w + r + b
    if directions == 1:
        fused_inputs += [""] * 4
    fused_inputs += [inputs[5], inputs[6] if cell == "LSTM" else ""]
    kept = [a for a in node.attribute if a.name in ("hidden_size", "direction", "layout", "linear_before_reset")]
    fused = onnx.helper.make_node(
        f"{cell}TorchGates", fused_inputs, list(node.output), name=node.name, domain=FUSED_DOMAIN
    )
    fused.attribute.extend(kept)
    return fused


def torch_gate_recurrents(graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto]) -> List[onnx.NodeProto]:
    """`nodes` with each torch-exported LSTM/GRU node fed its layer's parameters directly
    (see the module docstring), and the reordering nodes nothing else reads dropped."""
    cells = {index: _CELL_OF_OP.get((_domain(node), node.op_type)) for index, node in enumerate(nodes)}
    if not any(cells.values()):
        return list(nodes)
    view = _Graph(graph, nodes)
    replaced: Dict[int, onnx.NodeProto] = {}
    candidates: List[onnx.NodeProto] = []
    for index, cell in cells.items():
        if cell is None:
            continue
        visited: List[onnx.NodeProto] = []
        fused = _rewritten(nodes[index], cell, view, visited)
        if fused is not None:
            replaced[index] = fused
            candidates += visited
    kept = [replaced.get(index, node) for index, node in enumerate(nodes)]
    return _without_unread(kept, {id(node) for node in candidates}, {out.name for out in graph.output}, view)


def _without_unread(nodes: List[onnx.NodeProto], candidates: set, outputs: set, view: _Graph) -> List[onnx.NodeProto]:
    """`nodes` less the candidates (and the Constants they read) whose outputs nothing reads."""
    constants = {
        id(view.producer[name])
        for node in nodes
        if id(node) in candidates
        for name in node.input
        if name in view.producer and view.producer[name].op_type == "Constant"
    }
    removable = candidates | constants
    while True:
        readers = Counter(name for node in nodes for name in node.input if name)
        dropped = [
            node
            for node in nodes
            if id(node) in removable and not any(readers[out] or out in outputs for out in node.output if out)
        ]
        if not dropped:
            return nodes
        gone = {id(node) for node in dropped}
        nodes = [node for node in nodes if id(node) not in gone]
