"""Name generation and graph-output helpers shared by the blocks.

Names follow onnxruntime-training 1.19.2: ``onnx::<token>::<n>`` with ``n`` a process-wide
counter that every block advances.  The loss name in a training model (and therefore the
first output of ``Module.output_names()``) is such a name, so generating the same model in
a fresh process gives ORT's names exactly; a second generation in the same process gives
higher numbers, as in ORT.  ``reset_name_counter()`` is the explicit way to get the
fresh-process names again.
"""

from __future__ import annotations

import itertools
import threading
from typing import List, Union

import onnx

_COUNTER_LOCK = threading.Lock()
_COUNTER = itertools.count(1)


def reset_name_counter() -> None:
    """Restart the ``onnx::<token>::<n>`` numbering at 1, as in a fresh process.

    onnxruntime-training never resets it, so the second ``generate_artifacts`` call in a
    process names its loss differently from the first (``onnx::loss::2`` becomes
    ``onnx::loss::6``...).  Call this before generating to get the names a fresh process gives.
    """
    global _COUNTER  # noqa: PLW0603 - the counter is process-wide by design (ORT's quirk)
    with _COUNTER_LOCK:
        _COUNTER = itertools.count(1)


def generate_graph_name(token: str) -> str:
    """``onnx::<token>::<n>``, with the next number of the process-wide counter."""
    with _COUNTER_LOCK:
        return f"onnx::{token}::{next(_COUNTER)}"


def get_output_from_output_name(onnx_model: onnx.ModelProto, output_name: str) -> onnx.ValueInfoProto:
    """The graph output called ``output_name``; LookupError if there is none."""
    for output in onnx_model.graph.output:
        if output.name == output_name:
            return output
    raise LookupError(f"The provided output name {output_name} is not a graph output.")


def get_input_from_input_name(onnx_model: onnx.ModelProto, input_name: str) -> onnx.ValueInfoProto:
    """The graph input called ``input_name``; LookupError if there is none."""
    for graph_input in onnx_model.graph.input:
        if graph_input.name == input_name:
            return graph_input
    raise LookupError(f"The provided input name {input_name} is not a graph input.")


def register_graph_outputs(model: onnx.ModelProto, output_names: Union[List[str], str]) -> None:
    """Make ``output_names`` (and only those) the graph outputs, in that order.

    Types come from the existing outputs or from ``value_info`` (run shape inference first);
    a name with neither raises LookupError, because an output without a type is useless to
    the training runtime.
    """
    if isinstance(output_names, str):
        output_names = [output_names]
    known = {info.name: info for info in model.graph.value_info}
    known.update({output.name: output for output in model.graph.output})
    outputs = []
    for name in output_names:
        if name not in known:
            raise LookupError(f"The provided name {name} is not a graph value info or a graph output.")
        outputs.append(known[name])
    del model.graph.output[:]
    model.graph.output.extend(outputs)


def node_arg_exists(model: onnx.ModelProto, node_arg_name: str) -> bool:
    """True if some node of the graph reads or writes ``node_arg_name``."""
    return any(node_arg_name in node.input or node_arg_name in node.output for node in model.graph.node)
