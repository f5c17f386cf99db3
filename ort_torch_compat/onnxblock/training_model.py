"""From a forward model with its loss to ORT's training and eval models.

The conventions here are what ORT's training runtime (and ``ort_torch_compat.api``) rely on:

* parameters (trainable and frozen) become graph inputs after the user inputs, in
  initializer order; other initializers stay embedded constants;
* training-model outputs are the user outputs (loss first), then one bool
  ``<p>_grad.accumulation.out`` per trainable parameter, in parameter-input order, each
  written by an ``InPlaceAccumulatorV2`` node ``GradientAccumulator<k>`` that adds the
  gradient to the input ``<p>_grad.accumulation.buffer`` (or overwrites it when the last
  input, ``lazy_reset_grad``, is true);
* the eval model is the forward model with Dropout's training input cleared and
  BatchNormalization in inference mode.
"""

from __future__ import annotations

import copy
from typing import Iterable, List, Sequence, Set, Tuple, Union

import onnx

from ..gradient import add_gradient_graph
from ..gradient.graph_index import onnx_opset

MAX_ORT_IR_VERSION = 10
LAZY_RESET_GRAD = "lazy_reset_grad"


def get_model_parameters(
    model: onnx.ModelProto, requires_grad: Set[str], frozen_params: Set[str]
) -> Tuple[List[onnx.TensorProto], List[onnx.TensorProto]]:
    """``(trainable, frozen)`` initializers, each in the model's initializer order."""
    trainable = [init for init in model.graph.initializer if init.name in requires_grad]
    frozen = [init for init in model.graph.initializer if init.name in frozen_params and init.name not in requires_grad]
    return trainable, frozen


def _move_initializers_to_inputs(model: onnx.ModelProto, names: Set[str]) -> None:
    """Make the named initializers graph inputs (all of them when ``names`` is empty, as ORT does)."""
    kept = []
    inputs = {i.name for i in model.graph.input}  # IR < 4 models may list initializers as inputs already
    for init in model.graph.initializer:
        if not names or init.name in names:
            if init.name not in inputs:
                model.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            kept.append(init)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)


def _consumed(graph: onnx.GraphProto) -> Set[str]:
    names = {o.name for o in graph.output}
    for node in graph.node:
        names.update(node.input)
    return names


def _disable_training_mode(model: onnx.ModelProto) -> None:
    """Dropout without its training input, BatchNormalization with ``training_mode=0``.

    ORT stops there and writes BN nodes that keep their running-statistics outputs, which
    ONNX forbids in inference mode, so ORT 1.19 cannot load its own eval model.  Those
    outputs are unused in the eval graph and are dropped here.
    """
    used = _consumed(model.graph)
    for node in model.graph.node:
        if node.op_type == "Dropout" and node.domain in ("", "ai.onnx") and len(node.input) > 2:
            node.input[2] = ""
        elif node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
            for attribute in node.attribute:
                if attribute.name == "training_mode":
                    attribute.i = 0
            while len(node.output) > 1 and node.output[-1] not in used:
                del node.output[-1]


def cap_ir_version(model: onnx.ModelProto) -> None:
    """Lower the IR version to 10, the highest ORT 1.19 loads (onnx >= 1.17 writes newer ones)."""
    if model.ir_version > MAX_ORT_IR_VERSION:
        model.ir_version = MAX_ORT_IR_VERSION


def _reorder_outputs(model: onnx.ModelProto, user_outputs: Sequence[str], requires_grad: Set[str]) -> None:
    by_name = {output.name: output for output in model.graph.output}
    ordered = [by_name[name] for name in user_outputs]
    ordered += [by_name[f"{i.name}_grad"] for i in model.graph.input if i.name in requires_grad]
    del model.graph.output[:]
    model.graph.output.extend(ordered)


def build_gradient_graph(
    model: onnx.ModelProto, requires_grad: Set[str], frozen_params: Set[str], output_names: Union[List[str], str]
) -> Tuple[onnx.ModelProto, onnx.ModelProto]:
    """``(training model, eval model)`` from a shape-inferred forward model whose outputs are ``output_names``.

    Backpropagation starts at ``output_names[0]``.  ``model`` is modified (parameters
    become inputs).
    """
    if isinstance(output_names, str):
        output_names = [output_names]
    output_names = list(output_names)
    onnx_opset(model)  # a model without an ai.onnx opset cannot be trained: fail early and clearly
    _move_initializers_to_inputs(model, set(requires_grad) | set(frozen_params))
    eval_model = copy.deepcopy(model)
    _disable_training_mode(eval_model)
    cap_ir_version(eval_model)

    training_model = copy.deepcopy(model)
    order = [i.name for i in model.graph.input if i.name in requires_grad]
    order += sorted(set(requires_grad) - set(order))  # names that are not inputs: reported by the builder
    add_gradient_graph(training_model, order, output_names[0])
    _reorder_outputs(training_model, output_names, set(requires_grad))
    cap_ir_version(training_model)
    return training_model, eval_model


def build_gradient_accumulation_graph(grad_model: onnx.ModelProto, requires_grad: Iterable[str]) -> None:
    """Route every gradient output through ``InPlaceAccumulatorV2`` into its buffer input (in place)."""
    gradient_outputs = {f"{name}_grad" for name in requires_grad}
    graph = grad_model.graph
    outputs = []
    for position, output in enumerate(graph.output):
        if output.name not in gradient_outputs:
            outputs.append(output)
            continue
        buffer_name = f"{output.name}.accumulation.buffer"
        flag_name = f"{output.name}.accumulation.out"
        graph.node.append(
            onnx.helper.make_node(
                "InPlaceAccumulatorV2",
                [buffer_name, output.name, LAZY_RESET_GRAD],
                [flag_name],
                name=f"GradientAccumulator{position}",
                domain="com.microsoft",
            )
        )
        buffer = copy.deepcopy(output)
        buffer.name = buffer_name
        graph.input.append(buffer)
        outputs.append(onnx.helper.make_tensor_value_info(flag_name, onnx.TensorProto.BOOL, [1]))
    graph.input.append(onnx.helper.make_tensor_value_info(LAZY_RESET_GRAD, onnx.TensorProto.BOOL, [1]))
    del graph.output[:]
    graph.output.extend(outputs)
