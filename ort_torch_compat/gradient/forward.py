"""Forward-graph rewrites the training model needs before its gradient can be built.

ORT's ``get_optimized_model`` applies these (among semantics-preserving fusions, which we
leave out) before autodiff, and they change what the training model computes or exposes:

* ``BatchNormalization`` -> com.microsoft ``BatchNormInternal`` with ``training_mode=1``,
  **always**, even for a node exported in inference mode: ORT's training graph normalizes
  with batch statistics and updates the running statistics in place.  Reproduced so the
  artifacts train to ORT's numbers; the eval model keeps inference-mode BN.
* ``LSTM``/``GRU`` -> com.microsoft ``LSTMTraining``/``GRUTraining``, whose extra outputs
  (all cell states, gate values) their gradient ops read.
* ``MaxPool`` gets its indices output, ``Dropout`` its mask, ``SoftmaxCrossEntropyLoss`` its
  log-probabilities, ``LayerNormalization`` its mean and inverse standard deviation: the
  gradient ops read them.  (ORT's builder assumes LayerNormalization already declares them
  and fails when it does not; here they are added.)
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import onnx

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


def rewrite_for_training(index: GraphIndex) -> None:
    """Apply the rewrites to every node of ``index.graph`` in place (see the module docstring)."""
    graph = index.graph
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
