"""The one training engine behind both the drop-in API and the C-API-shaped session.

It converts the forward+loss part of the training model (and the eval model) into torch
modules once, feeds them the state's parameter views, and implements ORT's TrainStep /
EvalStep / LazyResetGrad semantics: the first train step after a reset overwrites the
gradients, later ones accumulate (InPlaceAccumulatorV2), eval never touches them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence

import torch

from ..errors import InvalidInputError, ModelLoadError, NominalStateError
from .compiled import TrainStepRunner
from .host_allocator import tune_host_allocator
from .io_spec import check_inputs, names
from .model_io import ModelSource, describe, load_model, opset_map
from .parameters import ParameterStore
from .state import TrainingState
from .threads import ThreadPolicy, thread_setting, threaded
from .training_graph import GraphIO, check_eval_matches, check_parameter_types, eval_io, training_io

if TYPE_CHECKING:
    import onnx


def _build(model: "onnx.ModelProto", io: GraphIO, label: str) -> torch.nn.Module:
    from ..graph import build_graph_module, forward_graph  # onnx2torch: imported at first use

    input_names = names(io.user_inputs) + io.param_names()
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
        session_options: object = None,
    ):
        self.state = state
        self.device = torch.device(device)
        self.threads = ThreadPolicy(thread_setting(session_options))
        tune_host_allocator()
        self.train_label = f"training model {describe(train_model, 'training model')}"
        train_proto = load_model(train_model, "training model")
        self.train_io = training_io(train_proto, state, self.train_label)
        shapes = check_parameter_types(self.train_io, state, self.train_label)
        self.train_module = _build(train_proto, self.train_io, self.train_label).to(self.device).train()
        self.train_runner = TrainStepRunner(self.train_module, self.train_label, self.device, session_options)

        self.eval_source = eval_model
        self.eval_io: Optional[GraphIO] = None
        self.eval_module: Optional[torch.nn.Module] = None
        if eval_model is not None:
            eval_label = f"eval model {describe(eval_model, 'eval model')}"
            eval_proto = load_model(eval_model, "eval model")
            self.eval_io = eval_io(eval_proto, state)
            check_eval_matches(self.eval_io, self.train_io, eval_label)
            check_parameter_types(self.eval_io, state, eval_label)
            self.eval_module = _build(eval_proto, self.eval_io, eval_label).to(self.device).eval()

        self.store = ParameterStore(state, self.train_io.param_names(), shapes, self.device)
        self._train_params = [state.parameters[n].tensor for n in self.train_io.param_names()]
        self._eval_params = [state.parameters[n].tensor for n in (self.eval_io.param_names() if self.eval_io else [])]
        self._accumulate = False

    # ---- steps -----------------------------------------------------------------------
    def _to_device(self, tensors: Sequence[torch.Tensor], io: GraphIO) -> List[torch.Tensor]:
        return [t if t.device == self.device else self._move(t, io.user_inputs[i].name) for i, t in enumerate(tensors)]

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

    @threaded(lambda engine: engine.threads, measure=lambda engine: engine.train_runner.path)
    def train_step(self, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        if self.state.is_nominal:
            raise NominalStateError(
                "Cannot perform TrainStep with a nominal state. Please load the model parameters first "
                "(copy_buffer_to_parameters(buffer, trainable_only=False))."
            )
        check_inputs(self.train_io.user_inputs, inputs, "train step")
        feeds = self._to_device(inputs, self.train_io)
        if not self._accumulate:
            self.store.release_grads()
        with torch.enable_grad():
            outputs = self.train_runner(*feeds, *self._train_params)
            loss = outputs[0]
            if loss.requires_grad:
                loss.backward(torch.ones_like(loss) if loss.dim() else None)
        if not self._accumulate:
            self.store.fill_missing_grads()
        self._accumulate = True
        return [out.detach() for out in outputs]

    @threaded(lambda engine: engine.threads)
    def eval_step(self, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        if self.eval_module is None:
            raise ModelLoadError("Eval model was not provided. Cannot run an eval step.")
        if self.state.is_nominal:
            raise NominalStateError("Cannot perform EvalStep with a nominal state. Please load the model parameters first.")
        check_inputs(self.eval_io.user_inputs, inputs, "eval step")
        with torch.no_grad():
            return list(self.eval_module(*self._to_device(inputs, self.eval_io), *self._eval_params))

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
            raise NominalStateError(
                "Cannot copy parameters from a nominal checkpoint state. Please load the parameter states first."
            )
        return self.store.to_buffer(trainable_only)

    def copy_buffer_to_parameters(self, buffer: torch.Tensor, trainable_only: bool) -> None:
        if self.state.is_nominal and trainable_only:
            raise NominalStateError(
                "For nominal checkpoint state, all parameters need to be loaded into the model (trainable_only = false)."
            )
        self.store.from_buffer(buffer, trainable_only)
        if not trainable_only:
            self.state.is_nominal = False
