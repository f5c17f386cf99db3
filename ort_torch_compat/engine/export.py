"""`export_model_for_inferencing`: the eval graph, cut to the requested outputs, with the
trained parameter values embedded as initializers (ORT's steps, spec §2.5).

Differences from ORT, all in favour of a loadable file: unused optional node outputs are
pruned (ORT keeps BatchNorm's 3 outputs, which ORT itself then refuses to load), and ORT's
cosmetic additions (attribute defaults, extra opset imports) are not made.  Files whose
weights would pass protobuf's 2 GiB limit, or whose checkpoint used external data, are
written with ONNX external data next to the model, laid out as ORT lays it out (measured
with onnxruntime-training 1.19.2): every initializer of 64 bytes or more, in initializer
order and unpadded, in `<model file name>.data`; smaller ones stay in the model.

Misuse raises ORT's messages verbatim (nominal state, no eval model, empty or unknown output
names), as RuntimeError subclasses like ORT's; an unknown name's error also lists the names
that can be exported.
"""

from __future__ import annotations

import os
from typing import List, Sequence

import onnx
from onnx import external_data_helper, numpy_helper

from ..errors import InvalidArgumentError, ModelLoadError, ModelMismatchError, NominalStateError
from ..graph.subgraph import ancestor_nodes, prune_unused_outputs
from .model_io import load_model
from .training_engine import LOAD_HINT, NOMINAL_EXPORT, TrainingEngine

PROTOBUF_LIMIT = 2**31 - 1
EXTERNAL_MIN_BYTES = 64  # ORT's export keeps a 60-byte initializer inline, writes a 64-byte one out (measured)
LOSS_NODE_PREFIX = "onnx::"  # onnxblock names the nodes of the loss blocks it appends this way


def model_outputs(model: onnx.ModelProto, roots: Sequence[str], label: str = "model") -> List[str]:
    """The model's own outputs inside a training/eval graph: what the loss block consumes.

    onnxblock names the nodes of the loss it appends `onnx::<Op>::<n>`; the values those
    nodes read from other (model) nodes are the model's outputs.  Graph outputs computed
    by model nodes (generate_artifacts' `additional_output_names`) are added after them.
    These are what an inference model exports by default.
    """
    graph = model.graph
    nodes = ancestor_nodes(graph, roots)
    producer = {out: node for node in graph.node for out in node.output if out}

    def is_model_value(name: str) -> bool:
        node = producer.get(name)
        return node is not None and not node.name.startswith(LOSS_NODE_PREFIX)

    found: List[str] = []
    for node in nodes:
        if node.name.startswith(LOSS_NODE_PREFIX):
            found.extend(v for v in node.input if v and is_model_value(v) and v not in found)
    found.extend(r for r in roots if is_model_value(r) and r not in found)
    if not found:
        raise ModelMismatchError(
            f"{label}: cannot tell the model's outputs from its loss (no onnxblock loss nodes found); "
            "pass outputs=[...] with the names of the model outputs"
        )
    return found


def _exportable_names(model: onnx.ModelProto) -> str:
    """The names to suggest when a requested output does not exist."""
    roots = [out.name for out in model.graph.output]
    try:
        suggested = model_outputs(model, roots)
    except ModelMismatchError:
        suggested = roots
    return (
        f"The eval model's outputs are {roots}, and the model outputs its loss reads are {suggested}; "
        "any other value the eval graph computes can be exported too."
    )


def _output_infos(model: onnx.ModelProto, wanted: List[str]) -> List[onnx.ValueInfoProto]:
    known = {vi.name: vi for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)}
    if any(name not in known for name in wanted):
        inferred = onnx.shape_inference.infer_shapes(model)
        known.update({vi.name: vi for vi in inferred.graph.value_info})
    return [known.get(name) or onnx.helper.make_empty_tensor_value_info(name) for name in wanted]


def build_inference_model(engine: TrainingEngine, graph_output_names: List[str]) -> onnx.ModelProto:
    if engine.state.is_nominal:
        raise NominalStateError(f"{NOMINAL_EXPORT} {LOAD_HINT}")
    if engine.eval_source is None:
        raise ModelLoadError("Eval model was not provided. Cannot export a model for inferencing.")
    if not graph_output_names:
        raise InvalidArgumentError("Expected a non empty vector of graph output names. Got an empty vector.")
    model = load_model(engine.eval_source, "eval model")
    graph = model.graph
    produced = {out for node in graph.node for out in node.output} | {i.name for i in graph.input}
    for name in graph_output_names:
        if name not in produced:
            raise InvalidArgumentError(
                f"Expected graph output for inference graph {name} could not be found. "
                f"Please regenerate the eval graph. {_exportable_names(model)}"
            )
    outputs = _output_infos(model, graph_output_names)
    nodes = prune_unused_outputs(ancestor_nodes(graph, graph_output_names), graph_output_names)
    used = {value for node in nodes for value in node.input} | set(graph_output_names)
    state = engine.state
    params = [i for i in graph.input if i.name in state.parameters and i.name in used]
    user_inputs = [i for i in graph.input if i.name not in state.parameters and i.name in used]
    initializers = [init for init in graph.initializer if init.name in used]
    for info in params:
        value = state.parameters[info.name].tensor.detach().cpu().numpy()
        initializers.append(numpy_helper.from_array(value, info.name))

    del graph.node[:]
    graph.node.extend(nodes)
    del graph.input[:]
    graph.input.extend(user_inputs)
    del graph.output[:]
    graph.output.extend(outputs)
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    return model


def export_inference_model(engine: TrainingEngine, path: str, graph_output_names: List[str]) -> None:
    model = build_inference_model(engine, graph_output_names)
    weights = sum(len(init.raw_data) for init in model.graph.initializer)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot export to '{path}': directory '{directory}' does not exist")
    if engine.state.has_external_data or weights >= PROTOBUF_LIMIT:
        _move_to_external_data(model, path)
    onnx.save_model(model, path)


def _move_to_external_data(model: onnx.ModelProto, path: str) -> None:
    """Write the raw data of every initializer of `EXTERNAL_MIN_BYTES` or more to `<path>.data`,
    back to back in initializer order, and point the initializers at it."""
    location = os.path.basename(path) + ".data"
    with open(path + ".data", "wb") as data:
        for tensor in model.graph.initializer:
            if tensor.HasField("raw_data") and len(tensor.raw_data) >= EXTERNAL_MIN_BYTES:
                external_data_helper.set_external_data(tensor, location, data.tell(), len(tensor.raw_data))
                data.write(tensor.raw_data)
                tensor.ClearField("raw_data")
