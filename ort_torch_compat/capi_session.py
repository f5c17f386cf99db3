"""The C / C# / Objective-C training session surface (`OrtTrainingApi`) in Python.

`TrainingSession` has one method per function of ONNX Runtime's training C API, named in
snake_case (`TrainStep` -> `train_step`, `CopyParametersToBuffer` ->
`copy_parameters_to_buffer`...), plus the C# / Objective-C spellings where they differ
(`to_buffer`, `from_buffer`, `input_names(training)`, `output_names(training)`).  The
checkpoint functions (`LoadCheckpoint`, `LoadCheckpointFromBuffer`, `SaveCheckpoint`) are
module-level functions that return / take the same `CheckpointState` class as the drop-in
`ort_torch_compat.api`; its `add_property`, `get_property`, `get_parameter_type_and_shape`,
`get_parameter` and `update_parameter` methods are the C API's checkpoint accessors.

There is one engine: a session wraps the same `TrainingEngine` / `OptimizerEngine` as
`ort_torch_compat.api.Module` / `Optimizer`, so the same call sequence gives the same numbers
through either surface.  docs/capi-session.md has the full mapping.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Mapping
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .api.checkpoint_state import CheckpointState
from .engine import OptimizerEngine, TrainingEngine, load_state, save_state
from .engine.export import export_inference_model
from .engine.model_io import describe
from .engine.optimizer_engine import learning_rate_value, step_count_value
from .errors import InvalidInputError, ModelLoadError, OrtTorchCompatError, ReleasedError
from .values import OrtValue, to_tensor, to_tensors, values_as

__all__ = ["TrainingSession", "load_checkpoint", "load_checkpoint_from_buffer", "save_checkpoint", "set_seed"]

PathLike = Union[str, "os.PathLike[str]"]
ModelArg = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview]

NO_SCHEDULER_MESSAGE = "No learning rate scheduler was registered. Please register a valid learning rate scheduler"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_BUFFER_TYPES = (bytes, bytearray, memoryview)


# ---------------------------------------------------------------------------------------
# Checkpoint functions (OrtTrainingApi: LoadCheckpoint, LoadCheckpointFromBuffer, SaveCheckpoint)
# ---------------------------------------------------------------------------------------
def load_checkpoint(checkpoint_path: PathLike) -> CheckpointState:
    """`LoadCheckpoint`: read a checkpoint file into a `CheckpointState`.

    For bytes already in memory use `load_checkpoint_from_buffer` (the C API's
    `LoadCheckpointFromBuffer`).
    """
    if isinstance(checkpoint_path, _BUFFER_TYPES):
        raise TypeError("load_checkpoint takes a path; use load_checkpoint_from_buffer(data) for in-memory bytes")
    return CheckpointState(load_state(os.fspath(checkpoint_path)))


def load_checkpoint_from_buffer(checkpoint_buffer: Union[bytes, bytearray, memoryview]) -> CheckpointState:
    """`LoadCheckpointFromBuffer`: parse the bytes of a checkpoint file into a `CheckpointState`."""
    if not isinstance(checkpoint_buffer, _BUFFER_TYPES):
        raise TypeError(
            f"load_checkpoint_from_buffer takes bytes, bytearray or memoryview, got {type(checkpoint_buffer).__name__}"
        )
    return CheckpointState.load_checkpoint(checkpoint_buffer)


def save_checkpoint(
    checkpoint_state: CheckpointState, checkpoint_path: PathLike, include_optimizer_state: bool = False
) -> None:
    """`SaveCheckpoint`: write the state (parameters, properties and, when asked, the optimizer
    state) to `checkpoint_path`.  The write is atomic (temporary file + rename)."""
    if not isinstance(checkpoint_state, CheckpointState):
        raise TypeError(f"checkpoint_state must be a CheckpointState, got {type(checkpoint_state).__name__}")
    save_state(checkpoint_state._state, os.fspath(checkpoint_path), bool(include_optimizer_state))


# ---------------------------------------------------------------------------------------
# SetSeed
# ---------------------------------------------------------------------------------------
def set_seed(seed: int) -> None:
    """`SetSeed`: seed every random number generator the training graphs use.

    Seeds torch's CPU generator and every CUDA device's generator (Dropout and the other
    random ops run on those), numpy's global generator and Python's `random`.  With the same
    seed, the same sequence of calls gives the same results run to run (on the same device
    and library versions).  The generators are process-global, as ORT's seed is: other torch
    code that draws random numbers in between shifts the sequence.
    """
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if not _INT64_MIN <= seed <= _INT64_MAX:
        raise ValueError(f"seed must fit in int64, got {seed}")
    torch.manual_seed(seed)  # CPU and all CUDA devices
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    unsigned = seed & 0xFFFFFFFFFFFFFFFF
    np.random.seed([unsigned & 0xFFFFFFFF, unsigned >> 32])
    random.seed(seed)


# ---------------------------------------------------------------------------------------
# TrainingSession
# ---------------------------------------------------------------------------------------
def _model_source(model: Any, role: str) -> Any:
    if model is None:
        return None
    if isinstance(model, _BUFFER_TYPES):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    try:
        import onnx  # a ModelProto is accepted as well (the engine reads it as is)

        if isinstance(model, onnx.ModelProto):
            return model
    except ImportError:  # pragma: no cover - onnx is a dependency
        pass
    raise TypeError(f"{role} must be a path or the model's bytes, got {type(model).__name__}")


def _live(method):
    """Refuse calls on a released session (ReleasedError names the session and the call)."""

    @functools.wraps(method)
    def wrapper(self: "TrainingSession", *args, **kwargs):
        if self._engine is None:
            raise ReleasedError(
                f"{self._label} has been released (release() / end of its `with` block); "
                f"{method.__name__}() cannot be called on it. Create a new TrainingSession."
            )
        return method(self, *args, **kwargs)

    return wrapper


class TrainingSession:
    """An `OrtTrainingSession`: training, evaluation and optimizer steps over a checkpoint state.

    `TrainingSession(state, train_model, eval_model=None, optimizer_model=None, device="cpu",
    session_options=None)` is `CreateTrainingSession` when the models are paths and
    `CreateTrainingSessionFromBuffer` when they are bytes (each model may be either).  The
    eval and optimizer models are optional, as in the C API: without them `eval_step` /
    `optimizer_step` and the learning-rate calls raise a clear error.

    `state` is a `CheckpointState` (from `load_checkpoint`, `load_checkpoint_from_buffer` or
    `ort_torch_compat.api.CheckpointState.load_checkpoint`).  The session trains it in place:
    parameters, gradients, optimizer moments and properties all live in that state, so
    `save_checkpoint(state, ...)` saves the current training state.

    `device` is "cpu", "cuda" or "cuda:N".  Of `session_options` (ORT's, or any object
    with the same attributes) the engine uses `intra_op_num_threads` (its thread count; 0:
    measured), `graph_optimization_level` ORT_DISABLE_ALL (no compiled train steps) and the
    config entries "ort_torch_compat.compile" ("auto", "on", "off") and
    "ort_torch_compat.use_tf32" ("1": TF32 on CUDA; default float32); see docs/performance.md.

    Lifecycle: `release()` (`ReleaseTrainingSession`, C# `Dispose`) or a `with` block; any
    later call raises `ort_torch_compat.errors.ReleasedError`.  Releasing the session does not
    release the state: it stays valid (and saveable), as in the C API.
    """

    def __init__(
        self,
        state: CheckpointState,
        train_model: ModelArg,
        eval_model: Optional[ModelArg] = None,
        optimizer_model: Optional[ModelArg] = None,
        device: str = "cpu",
        session_options: object = None,
    ) -> None:
        self._engine: Optional[TrainingEngine] = None
        self._label = "TrainingSession"
        if not isinstance(state, CheckpointState):
            raise TypeError(f"state must be a CheckpointState, got {type(state).__name__}")
        if train_model is None:
            raise TypeError("train_model is required (a path or the model's bytes)")
        train_source = _model_source(train_model, "train_model")
        self._label = f"TrainingSession(train_model={describe(train_source, 'training model')!r})"
        engine = TrainingEngine(
            state._state, train_source, _model_source(eval_model, "eval_model"), device, session_options=session_options
        )
        optimizer_source = _model_source(optimizer_model, "optimizer_model")
        self._optimizer: Optional[OptimizerEngine] = (
            None if optimizer_source is None else OptimizerEngine(optimizer_source, engine)
        )
        self._state = state
        self._scheduler: Optional[Tuple[int, int]] = None
        self._session_options = session_options
        self._engine = engine

    # ---- lifecycle (ReleaseTrainingSession / IDisposable) -------------------------------
    def release(self) -> None:
        """`ReleaseTrainingSession` (C# `Dispose`): free the session.  Idempotent.

        The checkpoint state is not released: it keeps the trained values and can be saved or
        given to a new session.
        """
        self._engine = None
        self._optimizer = None
        self._scheduler = None

    dispose = release

    @property
    def released(self) -> bool:
        """True once `release()` was called (or the `with` block ended)."""
        return self._engine is None

    @_live
    def __enter__(self) -> "TrainingSession":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"{self._label}{' [released]' if self.released else ''}"

    @property
    @_live
    def state(self) -> CheckpointState:
        """The `CheckpointState` this session trains (the ObjC session's strong reference)."""
        return self._state

    @property
    @_live
    def device(self) -> torch.device:
        return self._engine.device

    # ---- helpers ------------------------------------------------------------------------
    def _user_tensors(self, inputs: Any, training: bool) -> Tuple[List[torch.Tensor], str]:
        if isinstance(inputs, Mapping):  # {name: value}: ordered by the model's user inputs
            names = self._engine.input_names(training)
            unknown = [k for k in inputs if k not in names]
            missing = [n for n in names if n not in inputs]
            if unknown or missing:
                raise InvalidInputError(
                    f"{'train' if training else 'eval'} step inputs by name: expected {names}"
                    + (f", missing {missing}" if missing else "")
                    + (f", unknown {unknown}" if unknown else "")
                )
            inputs = [inputs[n] for n in names]
        elif isinstance(inputs, (np.ndarray, torch.Tensor, OrtValue)) or callable(getattr(inputs, "numpy", None)):
            inputs = [inputs]  # a single value for a single-input model
        elif not isinstance(inputs, (list, tuple)):
            try:
                inputs = list(inputs)
            except TypeError:
                raise TypeError(
                    f"inputs must be a list of numpy arrays, OrtValues or torch tensors, got {type(inputs).__name__}"
                ) from None
        return to_tensors(list(inputs))

    def _require_optimizer(self, call: str, c_name: str) -> OptimizerEngine:
        if self._optimizer is None:
            raise ModelLoadError(
                f"No optimizer model was provided to this TrainingSession: {call}() ({c_name}) needs one. "
                "Pass optimizer_model=... when creating the session."
            )
        return self._optimizer

    # ---- training loop --------------------------------------------------------------------
    @_live
    def train_step(self, inputs: Any, run_options: object = None) -> list:
        """`TrainStep`: forward + backward on the training model; returns the user outputs
        (loss first, then any additional outputs) as a list.

        `inputs`: a list (in `training_model_input_names()` order) of numpy arrays, OrtValues or
        torch tensors, or a dict by input name.  Outputs come back as numpy arrays for numpy
        inputs, OrtValues for OrtValue inputs and torch tensors (on the session's device) for
        torch inputs.  The first step after creation or `lazy_reset_grad()` overwrites the
        gradients, later steps accumulate into them.  `run_options` is accepted and ignored.
        """
        tensors, kind = self._user_tensors(inputs, training=True)
        return values_as(self._engine.train_step(tensors), kind)

    @_live
    def eval_step(self, inputs: Any, run_options: object = None) -> list:
        """`EvalStep`: run the eval model (no gradients); returns its outputs as a list, in the
        kind the inputs came in.  Raises ModelLoadError when the session has no eval model."""
        if self._engine.eval_module is None:
            raise ModelLoadError(
                "Eval model was not provided. Cannot run an eval step: pass eval_model=... when creating "
                "the TrainingSession."
            )
        tensors, kind = self._user_tensors(inputs, training=False)
        return values_as(self._engine.eval_step(tensors), kind)

    @_live
    def lazy_reset_grad(self) -> None:
        """`LazyResetGrad`: the next `train_step` overwrites the gradients instead of adding to them."""
        self._engine.lazy_reset_grad()

    @_live
    def optimizer_step(self, run_options: object = None) -> None:
        """`OptimizerStep`: update the trainable parameters from their gradients with the
        optimizer model (AdamW or SGD); increments the optimizer's completed step count."""
        self._require_optimizer("optimizer_step", "OptimizerStep").step()

    # ---- learning rate ----------------------------------------------------------------------
    @_live
    def set_learning_rate(self, learning_rate: float) -> None:
        """`SetLearningRate`: set the current learning rate (stored as float32).  Does not change
        the initial learning rate a registered scheduler scales; its next `scheduler_step()`
        overwrites this value."""
        self._require_optimizer("set_learning_rate", "SetLearningRate").set_learning_rate(learning_rate)

    @_live
    def get_learning_rate(self) -> float:
        """`GetLearningRate`: the current learning rate (a float32 value; 0.001 until set)."""
        return self._require_optimizer("get_learning_rate", "GetLearningRate").get_learning_rate()

    @_live
    def register_linear_lr_scheduler(self, warmup_step_count: int, total_step_count: int, initial_lr: float) -> None:
        """`RegisterLinearLRScheduler`: warm the lr up linearly from 0 to `initial_lr` over
        `warmup_step_count` optimizer steps, then decay it linearly to 0 at `total_step_count`.

        With s = the optimizer's completed step count, each `scheduler_step()` sets
        ``lr = initial_lr * (s / max(1, W) if s < W else max(0, (T - s) / max(1, T - W)))``.
        As in the C API the counts are used in the documented roles (the Python 1.19
        `LinearLRScheduler` swaps them), and the initial lr is set *after* the scheduler is
        created, so `get_learning_rate()` returns `initial_lr` until the first `scheduler_step()`.
        The counts must be ints (TypeError otherwise); negative counts are accepted, as ORT's
        C API and the drop-in `LinearLRScheduler` accept them (the same C++ scheduler).
        """
        optimizer = self._require_optimizer("register_linear_lr_scheduler", "RegisterLinearLRScheduler")
        warmup = step_count_value(warmup_step_count, "warmup_step_count")
        total = step_count_value(total_step_count, "total_step_count")
        initial_lr = learning_rate_value(initial_lr, "initial_lr")  # checked before anything changes
        optimizer.apply_linear_schedule(warmup, total)  # the C++ scheduler's constructor steps once ...
        optimizer.set_initial_learning_rate(initial_lr)  # ... then RegisterScheduler sets the initial lr
        self._scheduler = (warmup, total)

    @_live
    def scheduler_step(self) -> None:
        """`SchedulerStep`: recompute the lr from the registered scheduler and the optimizer's
        completed step count (calling it twice without an optimizer step changes nothing)."""
        if self._scheduler is None:
            raise OrtTorchCompatError(NO_SCHEDULER_MESSAGE)
        self._require_optimizer("scheduler_step", "SchedulerStep").apply_linear_schedule(*self._scheduler)

    # ---- parameter buffers ------------------------------------------------------------------
    @_live
    def get_parameters_size(self, trainable_only: bool = True) -> int:
        """`GetParametersSize`: number of elements of all parameters (trainable ones only when
        `trainable_only`)."""
        return self._engine.parameters_size(bool(trainable_only))

    @_live
    def copy_parameters_to_buffer(self, trainable_only: bool = True, buffer: Any = None) -> Any:
        """`CopyParametersToBuffer` (C# `ToBuffer`, ObjC `toBufferWithTrainable:`): the
        parameters, flattened and concatenated in training-graph order, float32.

        Without `buffer`, returns a new 1-D `OrtValue` (use `.numpy()` / `.to_torch()`).  With
        `buffer` (a pre-allocated float32 numpy array, OrtValue or torch tensor of
        `get_parameters_size(trainable_only)` elements, any shape), fills it in place and returns it,
        as the C API does.
        """
        if not isinstance(trainable_only, (bool, np.bool_, int, np.integer)):
            raise TypeError(
                f"trainable_only must be a bool, got {type(trainable_only).__name__}; pass a pre-allocated buffer "
                "as copy_parameters_to_buffer(trainable_only, buffer=...)"
            )
        values = self._engine.copy_parameters_to_buffer(bool(trainable_only))
        if buffer is None:
            return OrtValue(values)
        if isinstance(buffer, np.ndarray) and not (buffer.flags.c_contiguous and buffer.flags.writeable):
            raise InvalidInputError("parameters buffer: a numpy buffer must be C-contiguous and writeable")
        target = to_tensor(buffer, "parameters buffer")
        if target.dtype != torch.float32:
            raise InvalidInputError(f"Data types must match: the parameters buffer must be float32, got {target.dtype}")
        if target.numel() != values.numel():
            raise InvalidInputError(
                f"Parameters buffer size incorrect. Expected:{values.numel()}, Actual:{target.numel()}"
            )
        with torch.no_grad():
            target.copy_(values.view(target.shape))
        return buffer

    @_live
    def to_buffer(self, trainable_only: bool = True) -> OrtValue:
        """C# `ToBuffer(onlyTrainable)` / ObjC `toBufferWithTrainable:`: `copy_parameters_to_buffer`."""
        return self.copy_parameters_to_buffer(trainable_only)

    @_live
    def copy_buffer_to_parameters(self, buffer: Any, trainable_only: bool = True) -> None:
        """`CopyBufferToParameters`: load a float32 buffer of `get_parameters_size(trainable_only)`
        elements into the parameters (training-graph order).  On a session created from a
        nominal checkpoint, call it with `trainable_only=False` to complete the state."""
        self._engine.copy_buffer_to_parameters(to_tensor(buffer, "parameters buffer"), bool(trainable_only))

    @_live
    def from_buffer(self, buffer: Any, trainable_only: Optional[bool] = None) -> None:
        """C# `FromBuffer(buffer, onlyTrainable)` / ObjC `fromBufferWithValue:`.

        With `trainable_only=None` (the C++/ObjC form) the buffer's size decides: all parameters
        when it matches `get_parameters_size(False)`, else the trainable ones when it matches
        `get_parameters_size(True)`, else InvalidInputError.
        """
        tensor = to_tensor(buffer, "parameters buffer")
        if trainable_only is None:
            if tensor.numel() == self._engine.parameters_size(False):
                trainable_only = False
            elif tensor.numel() == self._engine.parameters_size(True):
                trainable_only = True
            else:
                raise InvalidInputError(
                    f"Incorrect buffer size received: {tensor.numel()} elements, expected "
                    f"{self._engine.parameters_size(False)} (all parameters) or "
                    f"{self._engine.parameters_size(True)} (trainable parameters)"
                )
        self._engine.copy_buffer_to_parameters(tensor, bool(trainable_only))

    # ---- export -------------------------------------------------------------------------------
    @_live
    def export_model_for_inferencing(self, inference_model_path: PathLike, graph_output_names: Sequence[str]) -> None:
        """`ExportModelForInferencing` (ObjC `exportModelForInferenceWithOutputPath:`): write the
        eval model cut to `graph_output_names`, with the current parameter values as
        initializers, to a file InferenceSession can load.  Needs an eval model (which, unlike
        ORT, may have been given as bytes)."""
        if isinstance(graph_output_names, str):
            graph_output_names = [graph_output_names]
        export_inference_model(self._engine, os.fspath(inference_model_path), list(graph_output_names))

    # ---- model IO information -----------------------------------------------------------------
    @_live
    def training_model_input_names(self) -> List[str]:
        """`TrainingSessionGetTrainingModelInputName` for every index (ObjC `getTrainInputNames`)."""
        return self._engine.input_names(True)

    @_live
    def training_model_output_names(self) -> List[str]:
        """`TrainingSessionGetTrainingModelOutputName` for every index (ObjC `getTrainOutputNames`)."""
        return self._engine.output_names(True)

    @_live
    def eval_model_input_names(self) -> List[str]:
        """`TrainingSessionGetEvalModelInputName` for every index (ObjC `getEvalInputNames`);
        [] without an eval model."""
        return self._engine.input_names(False)

    @_live
    def eval_model_output_names(self) -> List[str]:
        """`TrainingSessionGetEvalModelOutputName` for every index (ObjC `getEvalOutputNames`);
        [] without an eval model."""
        return self._engine.output_names(False)

    @_live
    def training_model_input_count(self) -> int:
        """`TrainingSessionGetTrainingModelInputCount`."""
        return len(self._engine.input_names(True))

    @_live
    def training_model_output_count(self) -> int:
        """`TrainingSessionGetTrainingModelOutputCount`."""
        return len(self._engine.output_names(True))

    @_live
    def eval_model_input_count(self) -> int:
        """`TrainingSessionGetEvalModelInputCount` (0 without an eval model)."""
        return len(self._engine.input_names(False))

    @_live
    def eval_model_output_count(self) -> int:
        """`TrainingSessionGetEvalModelOutputCount` (0 without an eval model)."""
        return len(self._engine.output_names(False))

    @_live
    def input_names(self, training: bool) -> List[str]:
        """C# `InputNames(training)`: the training or eval model's user input names."""
        return self._engine.input_names(bool(training))

    @_live
    def output_names(self, training: bool) -> List[str]:
        """C# `OutputNames(training)`: the training or eval model's user output names."""
        return self._engine.output_names(bool(training))
