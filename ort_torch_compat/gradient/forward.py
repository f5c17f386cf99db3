"""Forward-graph rewrites the training model needs before its gradient can be built.

ORT's ``get_optimized_model`` applies these (among semantics-preserving fusions, which we
leave out) before autodiff, and they change what the training model computes or exposes:

* ``BatchNormalization`` -> com.microsoft ``BatchNormInternal`` with ``training_mode=1``,
  **always**, even for a node exported in inference mode: ORT's training graph normalizes
  with batch statistics and updates the running statistics in place.  Reproduced so the
  artifacts train to ORT's numbers; the eval model keeps inference-mode BN.
* ``LSTM``/``GRU`` -> com.microsoft ``LSTMTraining``/``GRUTraining``, whose extra outputs
  (all cell states, gate values) their gradient ops read.
* ``SplitToSequence`` whose sequence is only read by ``SequenceAt`` at constant positions (the
  dynamo exporter's ``torch.split``/``chunk``) -> ``Split`` into the pieces, and each
  ``SequenceAt`` -> ``Identity`` of its piece (``Squeeze`` for ``keepdims=0``), so the
  gradient flows through Split's builder.  ORT's builder has no gradient for sequences (its
  generator finds the parameters before the split unreachable).  Other sequence uses are
  left alone and refused by name.
* ``MaxPool`` gets its indices output, ``Dropout`` its mask, ``SoftmaxCrossEntropyLoss`` its
  log-probabilities, ``LayerNormalization`` its mean and inverse standard deviation: the
  gradient ops read them.  (ORT's builder assumes LayerNormalization already declares them
  and fails when it does not; here they are added.)
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import UnsupportedGradientError
from .graph_index import GraphIndex

MS_DOMAIN = "com.microsoft"
Rewrite = Callable[[onnx.NodeProto, GraphIndex], onnx.NodeProto]


def _pad_outputs(node: onnx.NodeProto, index: GraphIndex, names: List[str]) -> List[str]:
    """The node's outputs, with empty or missing slots from ``names`` given fresh names."""
    outputs = list(node.output)
    stem = node.output[0] if node.output and node.output[0] else (node.name or node.op_type)
    for slot, suffix in enumerate(names):
        if not suffix:
            continue
        if slot >= len(outputs):
            outputs.extend([""] * (slot + 1 - len(outputs)))
        if not outputs[slot]:
            outputs[slot] = index.unique(f"{stem}_{suffix}")
    return outputs


def _attributes(node: onnx.NodeProto, drop: Tuple[str, ...] = ()) -> List[onnx.AttributeProto]:
    return [a for a in node.attribute if a.name not in drop]


def _batch_norm(node: onnx.NodeProto, index: GraphIndex) -> onnx.NodeProto:
    outputs = list(node.output[:3])
    stem = node.output[0] or node.name or "BatchNormalization"
    while len(outputs) < 3:
        outputs.append("")
    outputs[1] = outputs[1] or index.unique(f"{stem}_running_mean")
    outputs[2] = outputs[2] or index.unique(f"{stem}_running_var")
    outputs += [index.unique(f"{stem}_saved_mean"), index.unique(f"{stem}_saved_inv_std")]
    new = onnx.helper.make_node(
        "BatchNormInternal",
        list(node.input),
        outputs,
        name=index.unique(f"{node.name or stem}_BatchNormInternal"),
        domain=MS_DOMAIN,
    )
    new.attribute.extend(a for a in node.attribute if a.name in ("epsilon", "momentum"))
    new.attribute.append(onnx.helper.make_attribute("training_mode", 1))
    return new


def _recurrent(training_op: str, extra_outputs: Tuple[str, ...]) -> Rewrite:
    def rewrite(node: onnx.NodeProto, index: GraphIndex) -> onnx.NodeProto:
        layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
        if layout:
            raise UnsupportedGradientError(
                [("ai.onnx", node.op_type, node.name, f"layout=1 (batch-first) has no {training_op} kernel")]
            )
        state_outputs = 3 if node.op_type == "LSTM" else 2
        outputs = list(node.output[:state_outputs])
        stem = node.name or node.op_type
        if not outputs or not outputs[0]:
            hidden = index.unique(f"{stem}_all_hidden_states")
            outputs = [hidden] + outputs[1:]
        outputs += [""] * (state_outputs - len(outputs))
        outputs += [index.unique(f"{stem}_{suffix}") for suffix in extra_outputs]
        new = onnx.helper.make_node(
            training_op, list(node.input), outputs, name=index.unique(f"{stem}_training"), domain=MS_DOMAIN
        )
        new.attribute.extend(_attributes(node, drop=("layout",)))
        return new

    return rewrite


def _with_outputs(*suffixes: str) -> Rewrite:
    """Declare optional outputs (``suffixes[k]`` for output ``k+1``) that are missing."""

    def rewrite(node: onnx.NodeProto, index: GraphIndex) -> onnx.NodeProto:
        wanted = [""] + list(suffixes)
        if len(node.output) >= len(wanted) and all(node.output[1 : len(wanted)]):
            return node
        new = onnx.NodeProto()
        new.CopyFrom(node)
        del new.output[:]
        new.output.extend(_pad_outputs(node, index, wanted))
        return new

    return rewrite


_REWRITES: Dict[Tuple[str, str], Rewrite] = {
    ("", "BatchNormalization"): _batch_norm,
    ("", "LSTM"): _recurrent("LSTMTraining", ("all_cell_states", "iofc")),
    ("", "GRU"): _recurrent("GRUTraining", ("zrh",)),
    ("", "MaxPool"): _with_outputs("mask"),
    ("", "Dropout"): _with_outputs("mask"),
    ("", "SoftmaxCrossEntropyLoss"): _with_outputs("log_prob"),
    ("", "LayerNormalization"): _with_outputs("mean", "inv_std_dev"),
}


#: ``(domain, op_type)`` of the ops rewritten here ("" is ai.onnx); all have gradients.
REWRITTEN_OPS = frozenset(_REWRITES)


def _constant(graph: onnx.GraphProto, name: str):
    """``name``'s value when it is an initializer (not a graph input) or a Constant node's output, else None."""
    if not name or name in {i.name for i in graph.input}:
        return None
    for tensor in graph.initializer:
        if tensor.name == name:
            return numpy_helper.to_array(tensor)
    for node in graph.node:
        if name in node.output:
            if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
                return None
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if "value" in attributes:
                return numpy_helper.to_array(attributes["value"])
            for key in ("value_int", "value_ints"):
                if key in attributes:
                    return np.asarray(attributes[key])
            return None
    return None


def _split_sizes(node: onnx.NodeProto, index: GraphIndex) -> Optional[List[int]]:
    """The piece sizes of a SplitToSequence when they are fixed when the artifacts are built."""
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    shape = index.shape(node.input[0])
    axis = int(attributes.get("axis", 0))
    dim = None
    if shape is not None and -len(shape) <= axis < len(shape) and isinstance(shape[axis], int):
        dim = shape[axis]
    if len(node.input) > 1 and node.input[1]:
        split = _constant(index.graph, node.input[1])
        if split is None:
            return None
        split = np.asarray(split)
        if split.ndim == 1:
            return [int(s) for s in split]
        if dim is None or int(split) <= 0:
            return None
        size = int(split)
        return [size] * (dim // size) + ([dim % size] if dim % size else [])
    return None if dim is None else [1] * dim


def _sequences_to_split(index: GraphIndex) -> None:
    """SplitToSequence read only by SequenceAt at constant positions -> Split + Identity/Squeeze."""
    graph = index.graph
    outputs = {o.name for o in graph.output}
    consumers: Dict[str, List[int]] = {}
    for position, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(position)
    for position, node in enumerate(list(graph.node)):
        if node.op_type != "SplitToSequence" or node.domain not in ("", "ai.onnx") or node.output[0] in outputs:
            continue
        readers = consumers.get(node.output[0], [])
        if not readers or any(
            graph.node[r].op_type != "SequenceAt" or graph.node[r].input[0] != node.output[0] for r in readers
        ):
            continue
        sizes = _split_sizes(node, index)
        if not sizes:
            continue
        places = [_constant(graph, graph.node[r].input[1]) for r in readers]
        if any(p is None or np.asarray(p).size != 1 for p in places):
            continue
        places = [int(np.asarray(p).reshape(())) for p in places]
        if any(not -len(sizes) <= p < len(sizes) for p in places):
            continue
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        axis = int(attributes.get("axis", 0))
        squeeze = (len(node.input) < 2 or not node.input[1]) and not int(attributes.get("keepdims", 1))
        stem = node.output[0]
        pieces = [index.unique(f"{stem}_piece_{k}") for k in range(len(sizes))]
        shape = index.shape(node.input[0])
        elem = index.elem_type(node.input[0])
        for k, piece in enumerate(pieces):
            if elem and shape is not None:
                dims = list(shape)
                dims[axis] = sizes[k]
                index.set_type(piece, onnx.helper.make_tensor_type_proto(elem, dims))
        split_name = index.unique(f"{node.name or stem}_as_Split")
        if index.opset >= 13:
            sizes_name = index.add_initializer(index.unique(f"{stem}_split_sizes"), np.asarray(sizes, np.int64))
            new = onnx.helper.make_node("Split", [node.input[0], sizes_name], pieces, name=split_name, axis=axis)
        else:
            new = onnx.helper.make_node("Split", [node.input[0]], pieces, name=split_name, axis=axis, split=sizes)
        graph.node[position].CopyFrom(new)
        for reader, place in zip(readers, places):
            old = graph.node[reader]
            piece = pieces[place]
            name = index.unique(f"{old.name or old.output[0]}_as_{'Squeeze' if squeeze else 'Identity'}")
            if not squeeze:
                replacement = onnx.helper.make_node("Identity", [piece], [old.output[0]], name=name)
            elif index.opset >= 13:
                axes = index.add_initializer(index.unique(f"{old.output[0]}_axes"), np.asarray([axis], np.int64))
                replacement = onnx.helper.make_node("Squeeze", [piece, axes], [old.output[0]], name=name)
            else:
                replacement = onnx.helper.make_node("Squeeze", [piece], [old.output[0]], name=name, axes=[axis])
            graph.node[reader].CopyFrom(replacement)


def rewrite_for_training(index: GraphIndex) -> None:
    """Apply the rewrites to every node of ``index.graph`` in place (see the module docstring)."""
    graph = index.graph
    _sequences_to_split(index)
    for position, node in enumerate(graph.node):
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        rewrite = _REWRITES.get((domain, node.op_type))
        if rewrite is None:
            continue
        if node.op_type == "MaxPool" and index.opset < 8:
            continue  # MaxPool-1 has no indices output
        if node.op_type == "Dropout" and index.opset < 7 and domain == "":
            continue
        new = rewrite(node, index)
        if new is not node:
            graph.node[position].CopyFrom(new)
