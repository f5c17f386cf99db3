"""The one training engine behind both the drop-in API and the C-API-shaped session.

It converts the forward+loss part of the training model (and the eval model) into torch
modules once, feeds them the state's parameter views, and implements ORT's TrainStep /
EvalStep / LazyResetGrad semantics: the first train step after a reset overwrites the
gradients, later ones accumulate (InPlaceAccumulatorV2), eval never touches them.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import onnx
import torch

from ..errors import InvalidInputError, ModelLoadError, NominalStateError
from ..graph import build_graph_module, forward_graph
from .device import parse_device
from .host_allocator import tune_host_allocator
from .io_spec import StepInput, check_inputs, names
from .model_io import ModelSource, describe, load_model, opset_map
from .parameters import ParameterStore
from .state import TrainingState
from .step_failure import raise_explained
from .string_inputs import StringCasts
from .training_graph import GraphIO, check_eval_matches, check_parameter_types, eval_io, training_io


# ORT 1.19.2's messages for a nominal state, verbatim (tests/fixtures/edges/expected.json).
NOMINAL_TRAIN_STEP = "Cannot perform TrainStep with a nominal state. Please load the model parameters first."
NOMINAL_EVAL_STEP = "Cannot perform EvalStep with a nominal state. Please load the model parameters first."
NOMINAL_COPY = "Cannot copy parameters from a nominal checkpoint state. Please load the model parameters first."
NOMINAL_EXPORT = "Cannot export the model with a nominal state. Please load the model parameters first."
NOMINAL_OPTIMIZER = "The optimizer state cannot be constructed. Please load the model parameters first."
LOAD_HINT = "Load them with module.copy_buffer_to_parameters(buffer, trainable_only=False)."  # follows ORT's words


def _build(model: onnx.ModelProto, fed_names: List[str], io: GraphIO, label: str) -> torch.nn.Module:
    input_names = fed_names + io.param_names()
    graph = forward_graph(model, io.outputs, input_names, label)
    return build_graph_module(graph, opset_map(model), input_names, io.outputs, label)


class TrainingEngine:
    """Forward/backward/eval over a TrainingState on one device."""

    def __init__(
        self,
        state: TrainingState,
        train_model: ModelSource,
        eval_model: Optional[ModelSource] = None,
        device: str = "cpu",
    ):
        self.state = state
        self.device = parse_device(device)
        tune_host_allocator()
        self.train_label = f"training model {describe(train_model, 'training model')}"
        train_proto = load_model(train_model, "training model")
        self.train_io = training_io(train_proto, state, self.train_label)
        shapes = check_parameter_types(self.train_io, state, self.train_label)
        self.train_strings = StringCasts(train_proto, self.train_io.user_inputs, self.train_label)
        self.train_module = _build(self.train_strings.model, self.train_strings.fed_names, self.train_io,
                                   self.train_label).to(self.device).train()

        self.eval_source = eval_model
        self.eval_io: Optional[GraphIO] = None
        self.eval_module: Optional[torch.nn.Module] = None
        self.eval_strings: Optional[StringCasts] = None
        if eval_model is not None:
            eval_label = f"eval model {describe(eval_model, 'eval model')}"
            eval_proto = load_model(eval_model, "eval model")
            self.eval_io = eval_io(eval_proto, state)
            check_eval_matches(self.eval_io, self.train_io, eval_label)
            check_parameter_types(self.eval_io, state, eval_label)
            self.eval_strings = StringCasts(eval_proto, self.eval_io.user_inputs, eval_label)
            self.eval_module = _build(self.eval_strings.model, self.eval_strings.fed_names, self.eval_io,
                                      eval_label).to(self.device).eval()

        self.store = ParameterStore(state, self.train_io.param_names(), shapes, self.device)
        self._train_params = [state.parameters[n].tensor for n in self.train_io.param_names()]
        self._eval_params = [state.parameters[n].tensor for n in (self.eval_io.param_names() if self.eval_io else [])]
        self._accumulate = False

    # ---- steps -----------------------------------------------------------------------
    def _feeds(self, inputs: Sequence[StepInput], strings: StringCasts, step: str) -> List[torch.Tensor]:
        """The module's user feeds on this device (string inputs parsed by their Cast nodes)."""
        tensors = strings.feeds(inputs, step)
        fed = strings.fed_names
        return [t if t.device == self.device else self._move(t, fed[i]) for i, t in enumerate(tensors)]

    def _move(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """Copy an input from another device (slow path only); name it if that is impossible."""
        if tensor.is_meta:
            raise InvalidInputError(f"input '{name}' is a meta tensor (no data); pass a tensor on {self.device}")
        try:
            return tensor.to(self.device)
        except (RuntimeError, NotImplementedError) as error:
            raise InvalidInputError(
                f"input '{name}' on {tensor.device} cannot be copied to the module's device {self.device}: {error}"
            ) from error

    def train_step(self, inputs: Sequence[StepInput]) -> List[torch.Tensor]:
        if self.state.is_nominal:
            raise NominalStateError(f"{NOMINAL_TRAIN_STEP} {LOAD_HINT}")
        check_inputs(self.train_io.user_inputs, inputs, "train step")
        feeds = self._feeds(inputs, self.train_strings, "train step")
        previous_grads = None
        if not self._accumulate:
            previous_grads = [tensor.grad for tensor in self.store.trainable]
            self.store.release_grads()
        try:
            with torch.enable_grad():
                outputs = self.train_module(*feeds, *self._train_params)
                loss = outputs[0]
                if loss.requires_grad:
                    loss.backward(torch.ones_like(loss) if loss.dim() else None)
        except BaseException as error:  # a failed step leaves the gradients as they were, as ORT's does
            if previous_grads is not None:
                for tensor, grad in zip(self.store.trainable, previous_grads):
                    tensor.grad = grad
            if not isinstance(error, Exception):
                raise
            raise_explained(error, self.train_module, [*feeds, *self._train_params], self.train_strings.fed_from,
                            "train step")
        if not self._accumulate:
            self.store.fill_missing_grads()
        self._accumulate = True
        return [out.detach() for out in outputs]

    def eval_step(self, inputs: Sequence[StepInput]) -> List[torch.Tensor]:
        if self.eval_module is None:
            raise ModelLoadError("Eval model was not provided. Cannot run an eval step.")
        if self.state.is_nominal:
            raise NominalStateError(f"{NOMINAL_EVAL_STEP} {LOAD_HINT}")
        check_inputs(self.eval_io.user_inputs, inputs, "eval step")
        feeds = self._feeds(inputs, self.eval_strings, "eval step")
        try:
            with torch.no_grad():
                return list(self.eval_module(*feeds, *self._eval_params))
        except Exception as error:
            raise_explained(error, self.eval_module, [*feeds, *self._eval_params], self.eval_strings.fed_from,
                            "eval step")

    def lazy_reset_grad(self) -> None:
        """Schedule the next train step to overwrite (not add to) the gradients."""
        self._accumulate = False

    # ---- names -----------------------------------------------------------------------
    def input_names(self, training: bool) -> List[str]:
        io = self.train_io if training else self.eval_io
        return names(io.user_inputs) if io else []

    def output_names(self, training: bool) -> List[str]:
        io = self.train_io if training else self.eval_io
        return list(io.outputs) if io else []

    # ---- parameter buffers -------------------------------------------------------------
    def parameters_size(self, trainable_only: bool) -> int:
        return self.store.size(trainable_only)

    def copy_parameters_to_buffer(self, trainable_only: bool) -> torch.Tensor:
        if self.state.is_nominal:
            raise NominalStateError(f"{NOMINAL_COPY} {LOAD_HINT}")
        return self.store.to_buffer(trainable_only)

    def copy_buffer_to_parameters(self, buffer: torch.Tensor, trainable_only: bool) -> None:
        if self.state.is_nominal and trainable_only:
            raise NominalStateError(
                "For nominal checkpoint state, all parameters need to be loaded into the model (trainable_only = false)."
            )
        self.store.from_buffer(buffer, trainable_only)
        if not trainable_only:
            self.state.is_nominal = False
