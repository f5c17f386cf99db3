"""`to_torch_module`: ORT training artifacts as a plain, natively trainable `torch.nn.Module`.

The module owns one `nn.Parameter` per checkpoint parameter (a copy: the checkpoint file
and any CheckpointState stay untouched).  A parameter `fc1.weight` is registered as
parameter `weight` of a child module `fc1`, so `named_parameters()` and `state_dict()`
keys *are* the checkpoint names.  Names that cannot be a module path (empty segments, a
name that is also the prefix of another, a clash with an nn.Module attribute such as
`training`) are registered under the child `_flat` with a sanitised name instead;
`state_dict()` / `load_state_dict()` still use the checkpoint names for them, and
`checkpoint_names` maps every `named_parameters()` key to its checkpoint name.

Frozen parameters (ORT's non-trainable ones) have `requires_grad=False`; BatchNorm
running statistics among them are updated in place in training mode, as ORT does (only those:
running-stat inputs that alias weights are never written, see graph/running_stats.py).

Graphs: `train()` mode runs the training model's forward part, `eval()` mode the eval
model (found as `eval_model.onnx` next to the training model unless given; without one,
eval mode runs the training graph too).  `with_loss=True` returns the loss (and any
additional outputs the artifacts declare); `with_loss=False` returns the model's own
outputs, i.e. the values the loss block consumes (or `outputs=[...]`), from inputs
without the labels.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
import torch
from torch import nn

from ..engine.export import model_outputs
from ..engine.graph_io import GraphIO, check_parameter_types, eval_io, training_io
from ..engine.graph_module import build_module, frozen_parameters, io_for_outputs
from ..engine.io_spec import check_inputs
from ..engine.model_io import ModelSource, describe, load_model
from ..engine.state import TrainingState
from ..errors import InvalidInputError, ModelMismatchError
from .state_dict import MigrationError, _as_state, state_dict_to_checkpoint

EVAL_MODEL_FILE = "eval_model.onnx"

__all__ = ["to_torch_module", "OrtTorchModule", "model_outputs"]


@dataclass
class _Graph:
    module: torch.nn.Module
    io: GraphIO  # the user inputs and parameters the module takes, and its outputs
    params: List[str]  # io.param_names(), once: forward feeds them every call


def _build_graph(
    model: onnx.ModelProto, io: GraphIO, outputs: Sequence[str], label: str, state: TrainingState
) -> _Graph:
    """The engine's module for `outputs`, fed only the inputs and parameters they need."""
    cut = io_for_outputs(model, io, outputs, label)
    module = build_module(model, cut, label, buffers=frozen_parameters(cut, state))
    return _Graph(module, cut, cut.param_names())


def _is_path(source: object) -> bool:
    return isinstance(source, (str, os.PathLike))


class OrtTorchModule(nn.Module):
    """A torch module computing an ORT training model's forward (+ loss) part; see the module doc."""

    def __init__(self, state: TrainingState, graphs: Dict[str, _Graph], with_loss: bool, order: Sequence[str] = ()):
        super().__init__()
        self.with_loss = with_loss
        self._graphs = graphs  # plain dict: not submodules, so they stay out of state_dict/modules()
        self._template = state
        self._key_of: Dict[str, str] = {}  # checkpoint name -> named_parameters() key
        self._name_of: Dict[str, str] = {}  # named_parameters() key -> checkpoint name
        names = [n for n in order if n in state.parameters]
        names += [n for n in state.parameters if n not in set(names)]
        for name in names:
            slot = state.parameters[name]
            value = slot.tensor.detach().clone()
            parameter = nn.Parameter(value, requires_grad=slot.requires_grad and value.is_floating_point())
            key = self._place(name, parameter)
            self._key_of[name], self._name_of[key] = key, name
        if any(k != n for k, n in self._name_of.items()):
            self.register_state_dict_post_hook(_rename_to_checkpoint_names)
            self.register_load_state_dict_pre_hook(_rename_from_checkpoint_names)

    # ---- parameter naming ---------------------------------------------------------------
    def _place(self, name: str, parameter: nn.Parameter) -> str:
        parts = name.split(".")
        if all(parts) and self._try_nested(parts, parameter):
            return name
        if "_flat" not in self._modules:
            self.add_module("_flat", nn.Module())
        flat = self._modules["_flat"]
        base = re.sub(r"\W", "_", name) or "param"
        key, index = base, 1
        while hasattr(flat, key):
            index += 1
            key = f"{base}_{index}"
        flat.register_parameter(key, parameter)
        return f"_flat.{key}"

    def _try_nested(self, parts: List[str], parameter: nn.Parameter) -> bool:
        if parts[0] == "_flat":
            return False
        module: nn.Module = self
        created: List[Tuple[nn.Module, str]] = []
        for part in parts[:-1]:
            child = module._modules.get(part)
            if child is None:
                if hasattr(module, part):
                    break
                child = nn.Module()
                module.add_module(part, child)
                created.append((module, part))
            module = child
        else:
            if not hasattr(module, parts[-1]):
                module.register_parameter(parts[-1], parameter)
                return True
        for parent, part in reversed(created):  # undo empty containers made for a failed path
            del parent._modules[part]
        return False

    @property
    def checkpoint_names(self) -> Dict[str, str]:
        """{named_parameters() key: checkpoint parameter name} (the identity for most names)."""
        return dict(self._name_of)

    def checkpoint_parameters(self) -> Dict[str, nn.Parameter]:
        """{checkpoint name: parameter}, in the training model's parameter order (ORT's buffer order)."""
        params = dict(self.named_parameters())
        return {name: params[key] for name, key in self._key_of.items()}

    def checkpoint_state_dict(self) -> Dict[str, torch.Tensor]:
        """{checkpoint name: detached tensor}: what `from-torch` / `save_checkpoint` consume."""
        return {name: p.detach() for name, p in self.checkpoint_parameters().items()}

    def save_checkpoint(self, path: Union[str, "os.PathLike[str]"], *, keep_optimizer_state: bool = False) -> None:
        """Write an ORT checkpoint with the current values and the source checkpoint's structure.

        The source's optimizer moments no longer match values trained by a torch optimizer,
        so they are dropped unless `keep_optimizer_state=True`.
        """
        state_dict_to_checkpoint(
            self.checkpoint_state_dict(),
            self._template,
            path,
            drop_optimizer=not keep_optimizer_state,
            what="the module's parameters",
        )

    # ---- graphs -------------------------------------------------------------------------
    def _graph(self) -> _Graph:
        return self._graphs["train" if self.training else "eval"]

    @property
    def input_names(self) -> List[str]:
        """Names of forward()'s positional inputs in the current mode."""
        return [spec.name for spec in self._graph().io.user_inputs]

    @property
    def output_names(self) -> List[str]:
        return list(self._graph().io.outputs)

    def forward(self, *inputs, **named_inputs):
        graph = self._graph()
        specs = graph.io.user_inputs
        feeds = list(inputs)
        if named_inputs:
            rest = specs[len(feeds) :]
            unknown = sorted(set(named_inputs) - {spec.name for spec in rest})
            if unknown:
                raise InvalidInputError(
                    f"forward: unexpected or duplicate input(s) {unknown}; inputs are {self.input_names}"
                )
            missing = [spec.name for spec in rest if spec.name not in named_inputs]
            if missing:
                raise InvalidInputError(f"forward: missing input(s) {missing}; inputs are {self.input_names}")
            feeds += [named_inputs[spec.name] for spec in rest]
        feeds = [torch.from_numpy(np.ascontiguousarray(f)) if isinstance(f, np.ndarray) else f for f in feeds]
        check_inputs(specs, feeds, "forward")
        params = self.checkpoint_parameters()
        outputs = graph.module(*feeds, *[params[name] for name in graph.params])
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for graph in {id(g.module): g for g in self._graphs.values()}.values():
            graph.module._apply(fn, recurse)
        return self

    def extra_repr(self) -> str:
        graph = self._graphs["train"]
        return (
            f"with_loss={self.with_loss}, inputs={[s.name for s in graph.io.user_inputs]}, outputs={graph.io.outputs}, "
            f"parameters={len(self._key_of)}"
        )


def _rename_to_checkpoint_names(module: OrtTorchModule, state_dict, prefix: str, local_metadata) -> None:
    """Checkpoint names as keys, in the module's parameter order (our keys are contiguous)."""
    items = list(state_dict.items())
    ours = {
        key[len(prefix) :]: value
        for key, value in items
        if key.startswith(prefix) and key[len(prefix) :] in module._name_of
    }
    if not ours:
        return
    first = next(i for i, (key, _) in enumerate(items) if key.startswith(prefix) and key[len(prefix) :] in ours)
    state_dict.clear()
    state_dict.update(items[:first])
    state_dict.update((prefix + name, ours[key]) for name, key in module._key_of.items() if key in ours)
    state_dict.update((k, v) for k, v in items[first:] if not (k.startswith(prefix) and k[len(prefix) :] in ours))


def _rename_from_checkpoint_names(module: OrtTorchModule, state_dict, prefix: str, *args) -> None:
    for name, key in module._key_of.items():
        if name != key and prefix + name in state_dict:
            state_dict[prefix + key] = state_dict.pop(prefix + name)


def to_torch_module(
    training_model: ModelSource,
    checkpoint,
    *,
    with_loss: bool = True,
    eval_model: Union[ModelSource, None, bool] = None,
    outputs: Optional[Sequence[str]] = None,
) -> OrtTorchModule:
    """A plain `torch.nn.Module` over ORT training artifacts.

    training_model: the artifacts' `training_model.onnx` (path, bytes or ModelProto).
    checkpoint: a checkpoint path or bytes, or an `api.CheckpointState` (values are copied).
    with_loss: forward returns the loss (inputs: the training model's user inputs, labels
        included), else the model's outputs (inputs: those they need, no labels).
    eval_model: the eval model for `eval()` mode; None looks for `eval_model.onnx` next to a
        training model given by path, False uses none (eval mode then runs the training graph).
    outputs: with_loss=False only: output names, when the automatic choice (the values the
        loss consumes) is not what you want.
    """
    state = _as_state(checkpoint)
    if state.is_nominal:
        raise MigrationError("the checkpoint is nominal (no parameter values); load a full checkpoint")
    train_label = f"training model {describe(training_model, 'training model')}"
    train_proto = load_model(training_model, "training model")
    io = training_io(train_proto, state, train_label)
    check_parameter_types(io, state, train_label)

    if eval_model is None and _is_path(training_model):
        candidate = os.path.join(os.path.dirname(os.path.abspath(os.fspath(training_model))), EVAL_MODEL_FILE)
        eval_model = candidate if os.path.exists(candidate) else False
    eval_proto = eval_label = eval_graph_io = None
    if eval_model is not None and eval_model is not False:
        eval_label = f"eval model {describe(eval_model, 'eval model')}"
        eval_proto = load_model(eval_model, "eval model")
        eval_graph_io = eval_io(eval_proto, state)
        check_parameter_types(eval_graph_io, state, eval_label)

    graphs: Dict[str, _Graph] = {}
    if with_loss:
        if outputs is not None:
            raise ValueError("outputs= applies to with_loss=False only")
        graphs["train"] = _build_graph(train_proto, io, io.outputs, train_label, state)
        if eval_proto is not None:
            graphs["eval"] = _build_graph(eval_proto, eval_graph_io, eval_graph_io.outputs, eval_label, state)
    else:
        if outputs is None:
            if eval_proto is not None:
                outputs = model_outputs(eval_proto, eval_graph_io.outputs, eval_label)
            else:
                outputs = model_outputs(train_proto, io.outputs, train_label)
        outputs = list(outputs)
        if eval_proto is not None:
            graphs["eval"] = _build_graph(eval_proto, eval_graph_io, outputs, eval_label, state)
        try:
            graphs["train"] = _build_graph(train_proto, io, outputs, train_label, state)
        except ModelMismatchError:
            if "eval" not in graphs:
                raise
            warnings.warn(f"{train_label} does not compute {outputs}; train() mode uses the eval model", RuntimeWarning)
            graphs["train"] = graphs["eval"]
    graphs.setdefault("eval", graphs["train"])
    graphs["train"].module.train()
    if graphs["eval"] is not graphs["train"]:
        graphs["eval"].module.eval()
    return OrtTorchModule(state, graphs, with_loss, order=io.param_names())
