"""Scaled dot-product attention written out node by node, recognised as one node.

Exporters write an attention head group as

    scores = MatMul(Q [* c_q], K^T [* c_k])  [/ c or * c]  [+ mask]
    output = MatMul(Softmax(scores, axis=-1) [-> Casts to float types, Dropouts of ratio 0], V)

(torch's exporter splits the scale as sqrt(c) on both Q and K^T; older code divides the
scores; decoders add a constant causal mask, encoders one made from the attention mask
input).  This pass replaces each such chain by one fused-domain `ScaledAttention` node
(converters/attention.py) taking Q, K^T, V, the scalar constants and the mask.  Run
eagerly or traced for the compiler it computes the same calls as the nodes it replaces, in
the same order, bit for bit; the traced step (graph/traced_operators.py,
`scaled_attention`) runs it as one attention kernel forward and one backward where the
shapes allow, instead of ~20 products, copies and views
(docs/design.md, "Attention in the traced step").

Only a chain whose intermediate values nothing else reads (and no graph output is) is
rewritten; the scale factors must be float scalars known when the graph is built (an
initializer or a Constant node), the softmax over the last axis (axis -1, or absent from
opset 13 on), the binary ops without the legacy broadcast attributes.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import numpy_helper

from .fusion import FUSED_DOMAIN

_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


class _Chain:
    """What the matcher reads: producers, readers and scalar constants of the node list."""

    def __init__(self, graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto]):
        self.producer = {out: node for node in nodes for out in node.output if out}
        self.readers = Counter(name for node in nodes for name in node.input if name)
        self.readers.update(out.name for out in graph.output)  # a graph output is read outside
        self.initializers = {init.name: init for init in graph.initializer}

    def only_read_once(self, name: str) -> bool:
        return self.readers[name] == 1

    def plain(self, name: str, op_type: str) -> Optional[onnx.NodeProto]:
        """The producer of `name` if it is an `op_type` node of ONNX's domain without
        attributes (no legacy broadcast) and `name` is read once."""
        node = self.producer.get(name)
        if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            return None
        if op_type != "Softmax" and node.attribute:
            return None
        return node if self.only_read_once(name) else None

    def constant(self, name: str) -> Optional[float]:
        """The value of a one-element float constant (initializer or Constant node), or None."""
        tensor = self.initializers.get(name)
        if tensor is None:
            node = self.producer.get(name)
            if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
                return None
            values = [a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR]
            if len(node.attribute) != 1 or not values:
                return None
            tensor = values[0]
        if tensor.data_type not in _FLOAT_TYPES or int(np.prod(tensor.dims, dtype=np.int64)) != 1:
            return None
        if tensor.data_location == onnx.TensorProto.EXTERNAL:  # model loading reads these first; never here
            return None
        try:
            return float(numpy_helper.to_array(tensor).reshape(()))
        except (ValueError, TypeError, AttributeError, onnx.checker.ValidationError):  # undecodable: no match
            return None

    def scalar(self, name: str) -> Optional[float]:
        """A scale factor: a finite, nonzero float constant."""
        value = self.constant(name)
        return value if value is not None and math.isfinite(value) and value != 0.0 else None

    def zero_dropout(self, node: onnx.NodeProto, opset: int) -> bool:
        """A Dropout (opset 12 on) whose ratio is the constant 0 and whose mask nothing reads:
        the identity, active or not, forward and backward (no draw, no 1/(1 - ratio))."""
        if opset < 12 or len(node.input) < 2 or any(a.name != "seed" for a in node.attribute):
            return False
        if len(node.output) > 1 and node.output[1] and self.readers[node.output[1]]:
            return False
        return self.constant(node.input[1]) == 0.0

    def scaled(self, name: str) -> Tuple[str, str, float, Optional[onnx.NodeProto]]:
        """(value, constant, factor, Mul node): `name` = value * constant, or (name, "", 1.0, None)."""
        node = self.plain(name, "Mul")
        if node is not None and len(node.input) == 2:
            for position in (0, 1):
                factor = self.scalar(node.input[1 - position])
                if factor is not None:
                    return node.input[position], node.input[1 - position], factor, node
        return name, "", 1.0, None

    def scaled_product(self, name: str) -> Optional[Tuple[onnx.NodeProto, str, str, int]]:
        """(node, scores, constant, divides) where `name` = scores / constant or scores *
        constant and scores is a MatMul's output read only there."""
        for op_type, divides in (("Div", 1), ("Mul", 0)):
            node = self.plain(name, op_type)
            if node is None or len(node.input) != 2:
                continue
            for position in (0,) if divides else (0, 1):  # a division only by the constant
                if self.scalar(node.input[1 - position]) is not None and self.plain(node.input[position], "MatMul"):
                    return node, node.input[position], node.input[1 - position], divides
        return None


def _softmax_over_last_axis(node: onnx.NodeProto, opset: int) -> bool:
    axes = [a for a in node.attribute if a.name == "axis"]
    if len(node.attribute) != len(axes):
        return False
    if not axes:
        return opset >= 13  # Softmax-1/11 default to axis 1 (flattening), 13 to -1
    return axes[0].type == onnx.AttributeProto.INT and axes[0].i == -1


def _float_cast(node: onnx.NodeProto) -> int:
    """The float type a Cast converts to (HF's softmax(..., dtype=float32).to(dtype)), or 0."""
    targets = [a.i for a in node.attribute if a.name == "to" and a.type == onnx.AttributeProto.INT]
    if len(targets) != 1 or any(a.name not in ("to", "saturate") for a in node.attribute):
        return 0
    return targets[0] if targets[0] in _FLOAT_TYPES else 0


def _match(chain: _Chain, output: onnx.NodeProto, opset: int) -> Optional[Tuple[onnx.NodeProto, List[onnx.NodeProto]]]:
    """The fused node for the attention ending in MatMul `output`, and the nodes it replaces."""
    replaced = [output]
    probabilities, casts = output.input[0], []
    between = chain.producer.get(probabilities)  # Casts and zero-ratio Dropouts, read once each
    while between is not None and between.domain in ("", "ai.onnx") and len(replaced) < 6:
        if between.op_type == "Cast" and _float_cast(between):
            casts.insert(0, _float_cast(between))
        elif not (between.op_type == "Dropout" and chain.zero_dropout(between, opset)):
            break
        if not chain.only_read_once(probabilities):
            return None
        probabilities = between.input[0]
        replaced.append(between)
        between = chain.producer.get(probabilities)
    softmax = chain.plain(probabilities, "Softmax")
    if softmax is None or not _softmax_over_last_axis(softmax, opset):
        return None
    replaced.append(softmax)
    scores, mask = softmax.input[0], ""
    add = chain.plain(scores, "Add")
    if add is not None:  # scores + mask, in either order: the mask is the input not made of Q and K
        if len(add.input) != 2:
            return None
        position = next(
            (p for p in (0, 1) if chain.plain(add.input[p], "MatMul") or chain.scaled_product(add.input[p])), None
        )
        if position is None:
            return None
        scores, mask = add.input[position], add.input[1 - position]
        replaced.append(add)
    scale_input, divides, scale = "", 0, 1.0
    scaler = chain.scaled_product(scores)
    if scaler is not None:
        node, scores, scale_input, divides = scaler
        factor = chain.scalar(scale_input)
        scale = 1.0 / factor if divides else factor
        replaced.append(node)
    product = chain.plain(scores, "MatMul")
    if product is None or len(product.input) != 2:
        return None
    replaced.append(product)
    query, query_scale, query_factor, query_mul = chain.scaled(product.input[0])
    keys, keys_scale, keys_factor, keys_mul = chain.scaled(product.input[1])
    replaced.extend(node for node in (query_mul, keys_mul) if node is not None)
    fused = onnx.helper.make_node(
        "ScaledAttention",
        [query, keys, output.input[1], query_scale, keys_scale, scale_input, mask],
        list(output.output),
        name=f"{output.name or output.output[0]}/ScaledAttention",
        domain=FUSED_DOMAIN,
        scores_divided=divides,
        # in float64 (a FLOAT attribute would round it): the operator's scale for any input type
        scale=numpy_helper.from_array(np.array(scale * query_factor * keys_factor, dtype=np.float64)),
    )
    if casts:
        fused.attribute.append(onnx.helper.make_attribute("probabilities_casts", casts))
    return fused, replaced


def fuse_scaled_attention(graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto], opset: int) -> List[onnx.NodeProto]:
    """`nodes` (a topologically ordered node list of `graph`; `opset`: its ONNX opset) with
    every attention chain replaced by one `ScaledAttention` node, placed where the chain's
    last MatMul was (every input of the chain is computed before that)."""
    nodes = list(nodes)
    if not any(node.op_type == "Softmax" for node in nodes):
        return nodes
    chain = _Chain(graph, nodes)
    index_of = {id(node): index for index, node in enumerate(nodes)}  # these objects, this list
    fused_at: Dict[int, onnx.NodeProto] = {}
    dropped = set()
    for index, node in enumerate(nodes):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        found = _match(chain, node, opset)
        if found is None:
            continue
        indices = {index_of[id(n)] for n in found[1]}
        if indices & dropped:
            continue
        fused_at[index] = found[0]
        dropped |= indices
    return [fused_at.get(index, node) for index, node in enumerate(nodes) if index in fused_at or index not in dropped]
