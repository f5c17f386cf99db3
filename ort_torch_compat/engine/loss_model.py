"""A plain ONNX model that computes its own loss, trained by the TrainingEngine.

This is what the legacy `TrainingSession` trains: no ORT training artifacts (no
`lazy_reset_grad` input, no gradient outputs, no eval model, no checkpoint).  The weights
to train are initializers; they become parameter inputs of the converted graph and the
values of a TrainingState, so parameter storage, gradients and their accumulation are the
engine's.  Other initializers stay constants, except those that are also graph inputs
(IR < 4 style): they stay inputs, which a caller feeds with their `defaults` unless it
overrides them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from .graph_io import GraphIO
from .io_spec import ValueSpec, value_spec
from .state import ParameterSlot, TrainingState
from .training_engine import TrainingEngine


@dataclass
class LossModel:
    """The model with its trained and overridable initializers turned into inputs."""

    model: onnx.ModelProto
    io: GraphIO  # user inputs (overridable initializers last), weights, outputs
    state: TrainingState  # the weights: trainable parameters, in `io`'s order
    defaults: Dict[str, torch.Tensor]  # values of the overridable initializers
    label: str

    def engine(self, device: str, use_tf32: Optional[bool] = None) -> TrainingEngine:
        """A TrainingEngine over the model, fed with the current values of `state`
        (`use_tf32`: see `TrainingEngine`)."""
        return TrainingEngine.over_graph(self.state, self.model, self.io, self.label, device, use_tf32=use_tf32)


def loss_model(model: onnx.ModelProto, weights: Sequence[str], loss: str, label: str) -> LossModel:
    """Prepare `model` for training `weights` (initializer names) on the output `loss`.

    The engine's outputs are the loss, then every other graph output.
    """
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    trained = set(weights)
    overridable = [i for i in graph.input if i.name in initializers and i.name not in trained]
    user_inputs = [value_spec(i) for i in graph.input if i.name not in initializers]
    user_inputs += [value_spec(i) for i in overridable]
    params = [ValueSpec(w, initializers[w].data_type, tuple(int(d) for d in initializers[w].dims)) for w in weights]
    outputs = [loss] + [o.name for o in graph.output if o.name != loss]
    state = TrainingState()
    for w in weights:
        state.parameters[w] = ParameterSlot(w, initializers[w].data_type, True, _tensor(initializers[w]))
    defaults = {i.name: _tensor(initializers[i.name]) for i in overridable}
    stripped = _without_initializers(model, trained | set(defaults))
    return LossModel(stripped, GraphIO(user_inputs, params, outputs), state, defaults, label)


def _tensor(initializer: onnx.TensorProto) -> torch.Tensor:
    return torch.from_numpy(np.array(numpy_helper.to_array(initializer)))


def _without_initializers(model: onnx.ModelProto, names: set) -> onnx.ModelProto:
    """A copy of `model` whose initializers named in `names` are gone (they become graph inputs)."""
    graph = model.graph
    copy = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(copy, field, getattr(model, field))
    copy.opset_import.extend(model.opset_import)
    copy.functions.extend(model.functions)
    g = copy.graph
    g.name = graph.name
    g.node.extend(graph.node)
    g.input.extend(graph.input)
    g.output.extend(graph.output)
    g.value_info.extend(graph.value_info)
    g.initializer.extend(t for t in graph.initializer if t.name not in names)
    g.sparse_initializer.extend(graph.sparse_initializer)
    return copy
