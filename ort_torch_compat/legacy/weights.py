"""Which initializers the legacy `TrainingSession` trains (ORT's `ConfigureForTraining`)."""

from __future__ import annotations

import warnings
from typing import Dict, List, Sequence, Tuple

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelMismatchError
from ..graph.subgraph import ancestor_nodes
from .training_parameters import TrainingParameters

# Inputs through which ORT's gradient builder never propagates (its STOP_GRADIENT_EDGES);
# an initializer reached only through them is not trainable by default.
STOP_GRADIENT_EDGES = {
    "Not": {0},
    "And": {0, 1},
    "Or": {0, 1},
    "Xor": {0, 1},
    "Equal": {0, 1},
    "Less": {0, 1},
    "LessOrEqual": {0, 1},
    "Greater": {0, 1},
    "GreaterOrEqual": {0, 1},
    "IsInf": {0},
    "IsNaN": {0},
    "NonZero": {0},
    "Pow": {1},
    "Gather": {1},
    "GatherElements": {1},
    "GatherND": {1},
    "Shape": {0},
    "Size": {0},
    "Reshape": {1},
    "Expand": {1},
    "Dropout": {1, 2},
    "Slice": {1, 2, 3, 4},
    "SparseSoftmaxCrossEntropy": {1, 2},
    "SoftmaxCrossEntropyLoss": {1, 2},
    "ConstantOfShape": {0},
    "Scatter": {1},
    "OneHot": {0, 1, 2},
    "Where": {0},
    "Range": {0, 1, 2},
    "BatchNormalization": {3, 4},
}
_FLOATING = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


def select_weights(graph: onnx.GraphProto, params: TrainingParameters, loss: str, label: str) -> List[str]:
    """The trained weights, sorted by name (ORT's optimizer builder sorts them).

    ORT's rule: weights_to_train (the names that are initializers) or, when that leaves
    nothing, the initializers reached from the loss through differentiable edges minus
    immutable_weights; then minus weights_not_to_train.
    """
    initializers = {t.name: t for t in graph.initializer}
    requested = {str(name) for name in params.weights_to_train}
    unknown = sorted(requested - set(initializers))
    if unknown:
        warnings.warn(
            f"weights_to_train {unknown} are not initializers of {label}; ignored", RuntimeWarning, stacklevel=4
        )
    chosen = requested & set(initializers)
    if not chosen:
        chosen = _default_trainable(graph, initializers, loss, params.immutable_weights)
    chosen -= {str(name) for name in params.weights_not_to_train}

    reachable = {name for node in ancestor_nodes(graph, [loss]) for name in node.input}
    for name in sorted(chosen):
        if initializers[name].data_type not in _FLOATING:
            raise ModelMismatchError(f"weight '{name}' of {label} is not floating point and cannot be trained")
        if name not in reachable:
            raise ModelMismatchError(f"weight '{name}' does not contribute to the loss '{loss}' of {label}")
    return sorted(chosen)


def _default_trainable(
    graph: onnx.GraphProto,
    initializers: Dict[str, onnx.TensorProto],
    loss: str,
    immutable: Dict[str, Sequence[Tuple[int, float]]],
) -> set:
    producers = {out: node for node in graph.node for out in node.output if out}
    trainable: set = set()
    seen: set = set()
    stack = [producers[loss]]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stops = STOP_GRADIENT_EDGES.get(node.op_type, ())
        for index, name in enumerate(node.input):
            if not name or index in stops:
                continue
            if name in initializers:
                tensor = initializers[name]
                if tensor.data_type in _FLOATING and not _is_immutable(immutable, node, index, tensor):
                    trainable.add(name)
            elif name in producers:
                stack.append(producers[name])
    return trainable


def _is_immutable(immutable, node: onnx.NodeProto, index: int, tensor: onnx.TensorProto) -> bool:
    """ORT's immutable_weights: {op_type: [(input_index, value)]} freezes float scalars equal to value."""
    for entry in (immutable or {}).get(node.op_type, ()):
        input_index, value = entry
        if int(input_index) == index and tensor.data_type == onnx.TensorProto.FLOAT and len(tensor.dims) == 0:
            if float(numpy_helper.to_array(tensor)) == float(np.float32(value)):
                return True
    return False
