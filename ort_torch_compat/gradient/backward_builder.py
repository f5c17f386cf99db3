"""Reverse-mode autodiff over an ONNX graph: the backward nodes for ``d loss / d params``.

The graph is walked once forward (what the trainable parameters influence) and once
backward (what influences the loss), following only differentiable input slots.  Nodes on
both paths get their op's gradient builder, in reverse topological order, so every
consumer of a tensor has contributed its gradient before the tensor's producer needs it.
A tensor with several contributions gets them as ``<t>_grad_<k>`` and one ``Sum`` node
(``AccumulateGrad_<t>``) into ``<t>_grad``, as ORT names them; parameter gradients are
graph outputs ``<param>_grad``.

Every problem (unknown ops on the path, unsupported configurations, parameters that do
not reach the loss) is raised before the model is touched further, naming all culprits.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Dict, List, Optional, Sequence, Set

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ArtifactGenerationError, UnsupportedGradientError
from . import forward
from .context import GradientContext
from .gradient_registry import GradientBuilder, lookup
from .graph_index import GraphIndex

ORT_DOMAINS = (
    ("ai.onnx.ml", 5),
    ("ai.onnx.training", 1),
    ("ai.onnx.preview.training", 1),
    ("com.microsoft", 1),
    ("com.microsoft.experimental", 1),
    ("com.microsoft.nchwc", 1),
    ("org.pytorch.aten", 1),
)


def add_gradient_graph(model: onnx.ModelProto, requires_grad: Sequence[str], loss_name: str) -> None:
    """Turn the forward model (parameters already graph inputs) into a gradient model, in place.

    Afterwards the graph computes ``<p>_grad`` for every ``p`` in ``requires_grad`` and has
    them as extra outputs (after the existing ones, in ``requires_grad`` order).
    """
    index = GraphIndex(model)
    graph = model.graph
    input_names = {i.name for i in graph.input}
    not_inputs = [p for p in requires_grad if p not in input_names]
    if not_inputs:
        raise ArtifactGenerationError(
            f"requires_grad names {not_inputs} are not parameters of the model (no initializer has that name)"
        )
    forward.rewrite_for_training(index)
    _Autodiff(index, list(requires_grad), loss_name).run()
    graph.node.extend(index.new_nodes)
    graph.initializer.extend(index.new_initializers)
    graph.value_info.extend(index.new_value_info)
    types = {i.name: i.type for i in graph.input}
    for param in requires_grad:
        output = graph.output.add()
        output.name = f"{param}_grad"
        output.type.CopyFrom(types[param])
    _import_ort_domains(model)


def _import_ort_domains(model: onnx.ModelProto) -> None:
    """Declare the contrib domains the gradient ops live in (ORT's training models list them all)."""
    present = {o.domain for o in model.opset_import}
    for domain, version in ORT_DOMAINS:
        if domain not in present:
            model.opset_import.append(onnx.helper.make_opsetid(domain, version))


class _Autodiff:
    def __init__(self, index: GraphIndex, requires_grad: List[str], loss_name: str):
        self.index = index
        self.requires_grad = requires_grad
        self.loss_name = loss_name
        self.nodes = list(index.graph.node)
        self.builders: List[Optional[GradientBuilder]] = [lookup(node) for node in self.nodes]
        self.display_names = self._display_names()

    def _display_names(self) -> List[str]:
        names: List[str] = []
        seen: Set[str] = set()
        for position, node in enumerate(self.nodes):
            name = node.name or f"{node.op_type}_{position}"
            while name in seen:
                name = f"{name}_{position}"
            seen.add(name)
            names.append(name)
        return names

    def _differentiable_inputs(self, position: int) -> List[int]:
        node, builder = self.nodes[position], self.builders[position]
        slots = builder.differentiable_inputs(node, self.index.opset) if builder else range(len(node.input))
        return [i for i in slots if i < len(node.input) and node.input[i] and self.index.may_be_float(node.input[i])]

    def _float_outputs(self, node: onnx.NodeProto) -> List[str]:
        return [o for o in node.output if o and self.index.may_be_float(o)]

    def run(self) -> None:
        diff_inputs = [self._differentiable_inputs(p) for p in range(len(self.nodes))]
        from_params: Set[str] = set(self.requires_grad)
        for position, node in enumerate(self.nodes):
            if any(node.input[i] in from_params for i in diff_inputs[position]):
                from_params.update(self._float_outputs(node))
        to_loss: Set[str] = {self.loss_name}
        for position in reversed(range(len(self.nodes))):
            node = self.nodes[position]
            if any(o in to_loss for o in node.output):
                to_loss.update(node.input[i] for i in diff_inputs[position])
        unreachable = [p for p in self.requires_grad if p not in to_loss]
        if unreachable:
            raise ArtifactGenerationError(
                f"Cannot compute the partial derivative for {unreachable} as they are unreachable from the "
                f"loss output {self.loss_name!r}"
            )
        needs = from_params & to_loss
        backward = [p for p, node in enumerate(self.nodes) if any(o in needs for o in node.output)]
        missing = [
            (
                "ai.onnx" if self.nodes[p].domain in ("", "ai.onnx") else self.nodes[p].domain,
                self.nodes[p].op_type,
                self.display_names[p],
                "no gradient builder",
            )
            for p in backward
            if self.builders[p] is None
        ]
        if missing:
            raise UnsupportedGradientError(missing)

        required = {p: [i for i in diff_inputs[p] if self.nodes[p].input[i] in needs] for p in backward}
        self.contributions = Counter(self.nodes[p].input[i] for p in backward for i in required[p])
        self.final_names = {t: self._gradient_name(t) for t in self.contributions}
        for tensor, name in self.final_names.items():
            if tensor not in self.requires_grad:  # parameter gradients are typed as graph outputs
                self.index.declare_like(name, tensor)
        self.pending: Dict[str, List[str]] = defaultdict(list)
        seed = self._loss_seed()
        problems = []
        for position in reversed(backward):
            node = self.nodes[position]
            output_grads = [
                seed if o == self.loss_name else (self._finish(o) if o in needs else "") for o in node.output
            ]
            input_grads = [""] * len(node.input)
            for i in required[position]:
                input_grads[i] = self._contribution_name(node.input[i])
            context = GradientContext(self.index, node, self.display_names[position], output_grads, input_grads)
            first_new = len(self.index.new_nodes)
            try:
                self.builders[position].build(context)
            except UnsupportedGradientError as error:
                problems.extend(error.ops)
                continue
            produced = {o for n in self.index.new_nodes[first_new:] for o in n.output}
            lost = [g for g in input_grads if g and g not in produced]
            if lost:  # a builder bug, not a user error
                raise AssertionError(f"gradient builder for {node.op_type} did not produce {lost}")
        if problems:
            raise UnsupportedGradientError(problems)
        for param in self.requires_grad:
            self._finish(param)

    def _gradient_name(self, tensor: str) -> str:
        wanted = f"{tensor}_grad"
        if tensor in self.requires_grad:
            if wanted in self.index.taken:
                raise ArtifactGenerationError(
                    f"the model already has a tensor named {wanted!r}, the name of parameter {tensor!r}'s gradient"
                )
            self.index.reserve(wanted)
            return wanted
        return self.index.unique(wanted)

    def _contribution_name(self, tensor: str) -> str:
        if self.contributions[tensor] == 1:
            name = self.final_names[tensor]
        else:
            name = self.index.unique(f"{tensor}_grad_{len(self.pending[tensor])}")
            self.index.declare_like(name, tensor)
        self.pending[tensor].append(name)
        return name

    def _finish(self, tensor: str) -> str:
        """The full gradient of ``tensor`` (summing its contributions first when there are several)."""
        final = self.final_names[tensor]
        parts = self.pending.pop(tensor, None)
        if parts is not None and len(parts) > 1:
            self.index.new_nodes.append(
                onnx.helper.make_node("Sum", parts, [final], name=self.index.unique(f"AccumulateGrad_{tensor}"))
            )
        return final

    def _loss_seed(self) -> str:
        """``<loss>_grad``: ones shaped like the loss (a constant when the shape is known)."""
        name = self.index.unique(f"{self.loss_name}_grad")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(self.index.elem_type(self.loss_name) or onnx.TensorProto.FLOAT)
        shape = self.index.shape(self.loss_name)
        if shape is not None and all(isinstance(d, int) for d in shape):
            self.index.add_initializer(name, np.ones(shape, dtype=dtype))
            return name
        dims = self.index.unique(f"{self.loss_name}_shape")
        self.index.new_nodes.append(onnx.helper.make_node("Shape", [self.loss_name], [dims], name=dims))
        self.index.new_nodes.append(
            onnx.helper.make_node(
                "ConstantOfShape", [dims], [name], name=name, value=numpy_helper.from_array(np.ones([1], dtype=dtype))
            )
        )
        return name
