"""The one training engine behind every API: the drop-in `api/`, the C-API-shaped session
and the legacy `TrainingSession`.

It converts the forward+loss part of the training model (and the eval model) into torch
modules once, feeds them the state's parameter views, and implements ORT's TrainStep /
EvalStep / LazyResetGrad semantics: the first train step after a reset overwrites the
gradients, later ones accumulate (InPlaceAccumulatorV2), eval never touches them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import torch

from ..errors import InvalidInputError, ModelLoadError, NominalStateError
from .compiled_step import FlatGradientStep, Observer, eager_train_step
from .cuda_graphs import DeviceStream, TrainStepGraphs, graphs_enabled
from .device import parse_device
from .graph_io import GraphIO, ModelGraph, classify_feeds, read_eval_graph, read_training_graph
from .graph_module import build_step_modules
from .host_allocator import tune_host_allocator
from .io_spec import BatchCheck, StepInput, check_inputs, names
from .model_io import ModelSource
from .parameter_store import FlatGroup, bind_parameters
from .precision import precision_of, with_precision
from .state import TrainingState
from .step_failure import raise_explained
from .string_inputs import StringCasts
from .threads import ThreadPolicy, thread_setting, threaded

if TYPE_CHECKING:
    import onnx

# ORT 1.19.2's messages for a nominal state, verbatim (tests/fixtures/edges/expected.json).
NOMINAL_TRAIN_STEP = "Cannot perform TrainStep with a nominal state. Please load the model parameters first."
NOMINAL_EVAL_STEP = "Cannot perform EvalStep with a nominal state. Please load the model parameters first."
NOMINAL_COPY = "Cannot copy parameters from a nominal checkpoint state. Please load the model parameters first."
NOMINAL_EXPORT = "Cannot export the model with a nominal state. Please load the model parameters first."
NOMINAL_OPTIMIZER = "The optimizer state cannot be constructed. Please load the model parameters first."
LOAD_HINT = "Load them with module.copy_buffer_to_parameters(buffer, trainable_only=False)."  # follows ORT's words


class TrainingEngine:
    """Forward/backward/eval over a TrainingState on one device.

    `gradients`: "ort" (default) reproduces ONNX Runtime 1.19.2's gradients where they differ
    from the derivative of its own forward (inactive Dropout with a ratio input scales by
    1/(1 - ratio), and the others in graph.gradient_quirks); "exact" differentiates the forward.
    `session_options`: the thread count, compilation setting and TF32 opt-in (see `threads`,
    `compiled`, `precision`).  `use_tf32`: True/False overrides the options' TF32 opt-in (the
    legacy session passes its CUDA provider option).  On CUDA the steps run without TF32
    unless it is opted in; on CPU nothing is switched.
    """

    def __init__(
        self,
        state: TrainingState,
        train_model: ModelSource,
        eval_model: Optional[ModelSource] = None,
        device: str = "cpu",
        gradients: str = "ort",
        session_options: object = None,
        use_tf32: Optional[bool] = None,
    ):
        self._setup(
            state, read_training_graph(train_model, state), eval_model, device, gradients, session_options, use_tf32
        )

    @classmethod
    def over_graph(
        cls,
        state: TrainingState,
        model: onnx.ModelProto,
        io: GraphIO,
        label: str,
        device: str = "cpu",
        gradients: str = "ort",
        session_options: object = None,
        use_tf32: Optional[bool] = None,
    ) -> "TrainingEngine":
        """An engine over any model whose inputs `io` already classifies (`io.outputs[0]` is the
        loss), with no eval model: the entry point for models that are not ORT training
        artifacts, such as the legacy session's loss-in-graph model (see `loss_model.py`)."""
        engine = cls.__new__(cls)
        engine._setup(state, ModelGraph(model, io, label), None, device, gradients, session_options, use_tf32)
        return engine

    def _setup(
        self,
        state: TrainingState,
        train: ModelGraph,
        eval_model: Optional[ModelSource],
        device: str,
        gradients: str,
        session_options: object,
        use_tf32: Optional[bool] = None,
    ) -> None:
        """The set-up after the training graph is read: the settings, then one pass of the
        pipeline read graph -> classify feeds -> build modules -> bind parameters."""
        self._configure(state, device, gradients, session_options, use_tf32)
        evaluation = read_eval_graph(eval_model, state, train.io)
        train_feeds, eval_feeds = classify_feeds(train, state), classify_feeds(evaluation, state)
        modules = build_step_modules(train_feeds, eval_feeds, state, gradients, self.device, session_options)
        self.store, self._train_params, self._eval_params = bind_parameters(
            state,
            train.io.param_names(),
            evaluation.io.param_names() if evaluation else [],
            train_feeds.shapes,
            self.device,
        )

        self.train_label, self.train_io = train.label, train.io
        self.train_strings, self._train_batch = train_feeds.strings, train_feeds.batch
        self.train_module, self.train_runner = modules.train, modules.train_runner
        self.eval_source = eval_model
        self.eval_io: Optional[GraphIO] = evaluation.io if evaluation else None
        self.eval_strings: Optional[StringCasts] = eval_feeds.strings if eval_feeds else None
        self._eval_batch: Optional[BatchCheck] = eval_feeds.batch if eval_feeds else None
        self.eval_module: Optional[torch.nn.Module] = modules.eval
        self._eval_direct: Optional[torch.nn.Module] = modules.eval_direct
        self._accumulate = False
        # id(compiled or traced step) -> (the step, store groups its flat gradients fill, or None)
        self._flat_layouts: Dict[int, tuple] = {}
        self._checked: Dict[str, tuple] = {}  # step -> signature of the last inputs that passed the checks
        # a training loop's steady state (see `_settled_train_step`): (the user feeds' signature,
        # the runner's settled compiled or traced step, the groups its flat gradients fill), or None
        self._settled: Optional[Tuple[tuple, FlatGradientStep, List[FlatGroup]]] = None
        # CUDA: train (and optimizer) steps replayed as CUDA graphs (cuda_graphs.py)
        self.graph_streams: Optional[DeviceStream] = None
        self._graphs: Optional[TrainStepGraphs] = None
        if graphs_enabled(self.device, session_options):
            self.graph_streams = DeviceStream(self.device)
            self._graphs = TrainStepGraphs(
                self.train_module,
                self.train_runner.eager,
                self._train_params,
                self.store,
                train.label,
                self.graph_streams,
            )

    def _configure(
        self, state: TrainingState, device: str, gradients: str, session_options: object, use_tf32: Optional[bool]
    ) -> None:
        """The engine's settings: gradient mode, device, thread policy and (CUDA) precision."""
        from ..graph import GRADIENT_MODES  # onnx2torch and the converters: with the first model

        if gradients not in GRADIENT_MODES:
            raise ValueError(f"gradients must be one of {GRADIENT_MODES}, got {gradients!r}")
        self.state = state
        self.device = parse_device(device)
        self.threads = ThreadPolicy(thread_setting(session_options))
        # CUDA: float32 (TF32 off) unless opted in, switched around each step (precision.py);
        # None on CPU, where the steps stay unwrapped (no per-step cost)
        self.tf32 = precision_of(self.device, session_options, use_tf32=use_tf32)
        if self.tf32 is not None:
            self.train_step = with_precision(self.train_step, self.tf32)
            self.eval_step = with_precision(self.eval_step, self.tf32)
        tune_host_allocator()

    # ---- steps -----------------------------------------------------------------------
    def _feeds(
        self, inputs: Sequence[StepInput], io: GraphIO, batch: BatchCheck, strings: StringCasts, step: str
    ) -> List[torch.Tensor]:
        """The module's user feeds on this device, after the checks ORT makes (types, fixed
        dims, one batch size); string inputs parsed by their Cast nodes.

        The checks depend on nothing but each input's type, dtype and shape: inputs with the
        signature of the last ones that passed (a training loop's usual case) skip them."""
        try:
            signature = tuple((type(t), t.dtype, t.shape) for t in inputs)
        except AttributeError:  # not an array: the checks say what is wrong
            signature = None
        if signature is None or signature != self._checked.get(step):
            check_inputs(io.user_inputs, inputs, step)
            batch(inputs, step)
            self._checked[step] = signature
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

    def train_tensors(self, inputs: Sequence[StepInput]) -> List[torch.Tensor]:
        """What a train step with `inputs` feeds the train module (and its compiled form): the
        checked user feeds, then the parameters."""
        return (
            self._feeds(inputs, self.train_io, self._train_batch, self.train_strings, "train step") + self._train_params
        )

    @threaded(lambda engine: engine.threads, measure=lambda engine: engine.train_runner.path)
    def train_step(self, inputs: Sequence[StepInput], observe: Optional[Observer] = None) -> List[torch.Tensor]:
        """Forward and backward of the training model on `inputs`; the gradients are added to
        (or, after `lazy_reset_grad`, replace) the parameters' `.grad`.  `observe(parameter,
        gradient)`, where given, sees each parameter's gradient of this step."""
        if observe is None and self._settled is not None:
            outputs = self._settled_train_step(inputs)
            if outputs is not None:
                return outputs
        if self.state.is_nominal:
            raise NominalStateError(f"{NOMINAL_TRAIN_STEP} {LOAD_HINT}")
        feeds = self._feeds(inputs, self.train_io, self._train_batch, self.train_strings, "train step")
        with self.state.lock:  # BatchNorm running stats change in the forward pass (see TrainingState)
            previous_grads = None
            try:
                outputs = None if self._graphs is None else self._graphs.train_step(feeds, self._accumulate, observe)
                if outputs is None:
                    tensors = [*feeds, *self._train_params]
                    compiled = self.train_runner.compiled_for(tensors, fixed=len(self._train_params))
                    groups = None if compiled is None else self._flat_groups(compiled, tensors)
                    if groups is not None:
                        outputs = self._flat_train_step(compiled, groups, tensors, observe)
                        if outputs is not None and observe is None:
                            self._settle(inputs, compiled, groups)
                    if outputs is None:  # not compiled, another layout, or an index out of range
                        if not self._accumulate:
                            previous_grads = [tensor.grad for tensor in self.store.trainable]
                            self.store.release_grads()
                        if compiled is not None and groups is None:
                            outputs = compiled.train(tensors, observe)
                        if outputs is None:  # the eager step raises an out-of-range index's error
                            outputs = eager_train_step(self.train_runner.eager, tensors, observe)
                            if compiled is not None:  # ... or the compiled/traced step was wrong to refuse
                                self.train_runner.disagreed(compiled)
                        if not self._accumulate:
                            self.store.fill_missing_grads()
                    self.train_runner.step_finished()
            except BaseException as error:  # a failed step leaves the gradients as they were, as ORT's does
                if previous_grads is not None:
                    for tensor, grad in zip(self.store.trainable, previous_grads):
                        tensor.grad = grad
                if not isinstance(error, Exception):
                    raise
                raise_explained(
                    error, self.train_module, [*feeds, *self._train_params], self.train_strings.fed_from, "train step"
                )
        self._accumulate = True
        return [out.detach() for out in outputs]

    def _settle(self, inputs: Sequence[StepInput], compiled: FlatGradientStep, groups: List[FlatGroup]) -> None:
        """After `compiled` (a compiled or traced step) ran a full train step on `inputs`: where
        the runner has settled on it and the feeds are plain tensors (no string inputs), later
        steps with inputs of the same signature take `_settled_train_step`."""
        if (
            self._settled is None
            and self.train_runner.is_settled(compiled)
            and not self.train_strings
            and all(isinstance(t, torch.Tensor) for t in inputs)  # (the signature then holds only tensors' types)
        ):
            self._settled = (_settled_signature(inputs), compiled, groups)

    def _settled_train_step(self, inputs: Sequence[StepInput]) -> Optional[List[torch.Tensor]]:
        """The train step's short way through a training loop's steady state: inputs of the
        signature of the step that settled it (so `_feeds`' checks, which depend on nothing
        else, pass, and the inputs are on this device), the runner still on that compiled or
        traced step, no observer.  Measured on LoRA-tiny's compiled step, torch feeds: module
        call 160 -> 152 us (the input checks, runner lookups and bookkeeping skipped).  None
        where this does not hold or the step refused the inputs (an index out of range): the
        full way runs then."""
        signature, compiled, groups = self._settled
        if _settled_signature(inputs) != signature:
            return None
        if not self.train_runner.is_settled(compiled) or self.state.is_nominal:
            self._settled = None
            return None
        tensors = [*inputs, *self._train_params]
        with self.state.lock:
            try:
                outputs = self._flat_train_step(compiled, groups, tensors, None)
            except Exception as error:  # the flat step binds the gradients only after it ran
                raise_explained(error, self.train_module, tensors, self.train_strings.fed_from, "train step")
        if outputs is None:
            return None
        self._accumulate = True
        # computed without autograd: only an output that is a parameter itself needs detaching
        return [out.detach() if out.requires_grad else out for out in outputs]

    def _flat_groups(self, compiled: FlatGradientStep, tensors: List[torch.Tensor]) -> Optional[List[FlatGroup]]:
        """The store's flat groups that `compiled`'s flat gradients fill, one per gradient,
        or None where its layout is not the store's (found once per compiled or traced step)."""
        if id(compiled) not in self._flat_layouts:
            lists = [[tensors[i] for i in group] for group in compiled.grad_groups]
            self._flat_layouts[id(compiled)] = (compiled, self.store.flat_groups_of(lists))
        return self._flat_layouts[id(compiled)][1]

    def _flat_train_step(
        self,
        compiled: FlatGradientStep,
        groups: List[FlatGroup],
        tensors: List[torch.Tensor],
        observe: Optional[Observer],
    ) -> Optional[List[torch.Tensor]]:
        """The compiled step, its flat gradients written into the parameters' flat gradient
        buffers in one call per dtype: copied after a reset, added otherwise (the buffers are
        bound only after the library ran, so a failed step leaves the gradients as they were).
        None, having changed nothing, where an index was out of range."""
        result = compiled.run(tensors, contiguous_tail=len(self._train_params))
        if result is None:
            return None
        outputs, flats = result
        if observe is not None:
            for tensor, grad in compiled.gradients(tensors, flats):
                observe(tensor, grad)
        self.store.bind_flat_grads(copy=self._accumulate)
        for group, flat in zip(groups, flats):  # plain buffers (no autograd): no no_grad scope needed
            group.grad.add_(flat) if self._accumulate else group.grad.copy_(flat)
        return outputs

    @threaded(lambda engine: engine.threads)
    def eval_step(self, inputs: Sequence[StepInput]) -> List[torch.Tensor]:
        if self.eval_module is None:
            raise ModelLoadError("Eval model was not provided. Cannot run an eval step.")
        if self.state.is_nominal:
            raise NominalStateError(f"{NOMINAL_EVAL_STEP} {LOAD_HINT}")
        feeds = self._feeds(inputs, self.eval_io, self._eval_batch, self.eval_strings, "eval step")
        try:
            with torch.no_grad():
                return list(self._eval_direct(*feeds, *self._eval_params))
        except Exception as error:
            raise_explained(
                error, self.eval_module, [*feeds, *self._eval_params], self.eval_strings.fed_from, "eval step"
            )

    def lazy_reset_grad(self) -> None:
        """Schedule the next train step to overwrite (not add to) the gradients."""
        self._accumulate = False

    def train_step_with_gradients(
        self, inputs: Sequence[torch.Tensor]
    ) -> Tuple[List[torch.Tensor], Dict[str, torch.Tensor]]:
        """`train_step`, also returning this step's own gradient of every trainable parameter
        by name (not the accumulated sum; zeros where the loss does not reach a parameter)."""
        index_of = {id(tensor): i for i, tensor in enumerate(self.store.trainable)}
        captured: Dict[int, torch.Tensor] = {}

        def keep(tensor: torch.Tensor, grad: torch.Tensor) -> None:
            if id(tensor) in index_of:  # a copy: later steps add into `grad`
                captured[index_of[id(tensor)]] = grad.detach().clone()

        outputs = self.train_step(inputs, keep)
        grads = {
            name: captured[i] if i in captured else torch.zeros_like(tensor)
            for i, (name, tensor) in enumerate(zip(self.store.trainable_names, self.store.trainable))
        }
        return outputs, grads

    def gradients(self) -> Dict[str, torch.Tensor]:
        """The current (accumulated) gradient of every trainable parameter, by name."""
        return {name: tensor.grad for name, tensor in zip(self.store.trainable_names, self.store.trainable)}

    def continue_accumulation(self, grads: Dict[str, torch.Tensor]) -> None:
        """Take over gradients accumulated elsewhere (another engine, another device): they
        become the current gradients and the next train step adds to them."""
        with torch.no_grad():
            for name, tensor in zip(self.store.trainable_names, self.store.trainable):
                tensor.grad.copy_(grads[name])
        self._accumulate = True

    def scale_gradients(self, factor: float) -> None:
        """Multiply every trainable parameter's gradient by `factor` in place (the legacy
        optimizer graph averages N accumulated steps this way)."""
        with torch.no_grad():
            torch._foreach_mul_([tensor.grad for tensor in self.store.trainable], factor)

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
        with self.state.lock:
            self.store.from_buffer(buffer, trainable_only)
        if not trainable_only:
            self.state.is_nominal = False


def _settled_signature(inputs: Sequence[StepInput]) -> Optional[tuple]:
    """What `_settled_train_step` compares: each input's type, dtype, shape and device; None
    where an input has none of these (no tensor)."""
    try:
        return tuple([(type(t), t.dtype, t.shape, t.device) for t in inputs])
    except AttributeError:
        return None
