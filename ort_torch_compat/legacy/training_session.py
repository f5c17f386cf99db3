"""The legacy `onnxruntime.TrainingSession` (1.10-era Python wrapper): a facade over the engine.

The model is a plain ONNX graph that computes a loss.  ORT appended gradient,
accumulation, gradient-norm and optimizer nodes to it; here the model becomes an engine
loss model (`engine/loss_model.py`: the trained weights are the parameters of a
TrainingEngine, which does the forward, backward and gradient accumulation) and the
optimizer node is one of `optim/`'s legacy optimizers (`legacy/optimizers.py`).  This
module only speaks ORT's legacy API: feeds and fetches by name, the learning rate from the
feed, the update on every `gradient_accumulation_steps`-th call, and state under ORT's
initializer names (`Moment_1_<w>`, `Update_Count_<w>`, `Step`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
import torch

from ..engine.io_spec import check_inputs, onnx_type_name
from ..engine.loss_model import LossModel, loss_model
from ..engine.model_io import describe, load_model
from ..engine.precision import tf32_requested, with_precision
from ..errors import InvalidInputError, ModelLoadError, ModelMismatchError
from ..optim import Lamb
from ..values import OrtValue, to_numpy, to_tensor
from .optimizers import OPTIMIZERS, build_optimizer
from .session_info import GPU_PROVIDERS, ModelMetadata, NodeArg, SessionOptions, resolve_providers, session_config_entry
from .training_parameters import DDP_HINT, MIXED_PRECISION_FIELDS, MULTI_NODE_FIELDS, TrainingParameters
from .weights import select_weights

SHARED_STATE_KEY = "shared_optimizer_state"
MOMENTS = {"Moment_1": "moment_1", "Moment_2": "moment_2"}  # ORT's state prefix -> the optimizer's state key
_DUMP_FIELDS = ("model_after_graph_transforms_path", "model_with_gradient_graph_path", "model_with_training_graph_path")


class TrainingSession:
    """Drop-in for onnxruntime's legacy `TrainingSession(path_or_bytes, parameters, ...)`."""

    def __init__(
        self, path_or_bytes, parameters: TrainingParameters, sess_options=None, providers=None, provider_options=None
    ):
        if not isinstance(parameters, TrainingParameters):
            raise TypeError(
                f"parameters must be an ort_torch_compat.legacy.TrainingParameters, got {type(parameters).__name__}"
            )
        params = parameters._snapshot()
        _check_supported(params)
        self._parameters = params
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        self._providers, self._provider_options, device = resolve_providers(providers, provider_options)
        label = f"training model {describe(path_or_bytes, 'training model')}"
        model = _load(path_or_bytes, self._sess_options)
        graph = model.graph
        self._meta = ModelMetadata(model)

        initializers = {t.name: t for t in graph.initializer}
        self._input_args = [NodeArg.from_value_info(i) for i in graph.input if i.name not in initializers]
        self._overridable_args = [NodeArg.from_value_info(i) for i in graph.input if i.name in initializers]
        self._value_types = {vi.name: vi for vi in list(graph.input) + list(graph.value_info) + list(graph.output)}
        self._produced = {out for node in graph.node for out in node.output if out}
        self._output_args = [NodeArg.from_value_info(o) for o in graph.output]

        self._loss = params.loss_output_name
        if not self._loss:
            raise ValueError("TrainingParameters.loss_output_name must name the graph output that holds the loss")
        if self._loss not in self._produced:
            raise ModelLoadError(f"loss output '{self._loss}' is not produced by any node of {label}")
        if self._loss not in {o.name for o in graph.output}:
            info = self._value_types.get(self._loss)
            self._output_args.append(
                NodeArg.from_value_info(info) if info is not None else NodeArg(self._loss, "tensor(float)", None)
            )

        self._weights: List[str] = select_weights(graph, params, self._loss, label)
        self._grad_args = (
            [
                NodeArg(f"{w}_grad", onnx_type_name(initializers[w].data_type), list(initializers[w].dims))
                for w in self._weights
            ]
            if params.set_gradients_as_graph_outputs
            else []
        )
        self._grad_names = {arg.name for arg in self._grad_args}
        self._output_names = [arg.name for arg in self._output_args + self._grad_args]  # what run() may fetch
        self._optimizer_name = params.training_optimizer_name
        if self._optimizer_name and self._optimizer_name not in OPTIMIZERS:
            raise ValueError(
                f"training_optimizer_name '{self._optimizer_name}' is not supported; use one of {list(OPTIMIZERS)}"
            )
        self._lr_name = params.lr_params_feed_name
        self._accumulation_steps = int(params.gradient_accumulation_steps)
        if self._accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {self._accumulation_steps}")
        self._weight_names = set(self._weights)
        self._model: LossModel = loss_model(model, self._weights, self._loss, label)
        del model, graph, initializers
        # converts the graph now: unsupported operators fail at construction
        self._start(device, _tf32(self._sess_options, self._providers, self._provider_options))
        self._apply_initial_state(params.optimizer_initial_state)

    def _start(self, device: torch.device, use_tf32: bool) -> None:
        """(Re)create the engine and the optimizer on `device` from the current weight values;
        on CUDA their steps run with TF32 only where `use_tf32` (engine/precision.py)."""
        self._device = device
        self._engine = self._model.engine(str(device), use_tf32)
        self._input_specs = {spec.name: spec for spec in self._engine.train_io.user_inputs}
        self._defaults = {name: t.to(device) for name, t in self._model.defaults.items()}
        weights = {w: self._weight(w) for w in self._weights}
        self._optimizer = (
            build_optimizer(self._optimizer_name, weights, self._parameters)
            if self._optimizer_name and weights
            else None
        )
        self._optimizer_step = with_precision(self._optimizer.step, self._engine.tf32) if self._optimizer else None
        self._accumulated = 0

    def _weight(self, name: str) -> torch.Tensor:
        return self._engine.state.parameters[name].tensor

    # ---- the training step ------------------------------------------------------------
    def run(
        self, output_names: Optional[Sequence[str]], input_feed: Dict[str, Any], run_options=None
    ) -> List[np.ndarray]:
        """One training step; returns the requested outputs (computed before the update) as numpy arrays."""
        fetches = list(output_names) if output_names else self._output_names
        for name in fetches:
            if name not in self._output_names:
                raise InvalidInputError(f"Invalid Output Name:{name}")
        feeds = self._convert_feeds(input_feed)
        updates = bool(self._optimizer_name) and self._accumulated + 1 == self._accumulation_steps
        lr = self._learning_rate(feeds) if updates else None
        inputs = []
        for spec in self._engine.train_io.user_inputs:
            if spec.name not in feeds and spec.name not in self._defaults:
                raise InvalidInputError(f"Missing Input: {spec.name}")
            inputs.append(feeds.get(spec.name, self._defaults.get(spec.name)))

        grads: Dict[str, torch.Tensor] = {}
        if self._grad_names.intersection(fetches):
            outputs, grads = self._engine.train_step_with_gradients(inputs)
        else:
            outputs = self._engine.train_step(inputs)
        values = dict(zip(self._engine.train_io.outputs, outputs))
        values.update((f"{w}_grad", g) for w, g in grads.items())
        results = [_host_copy(values[name]) for name in fetches]

        self._accumulated += 1
        if self._accumulated == self._accumulation_steps:
            if updates and self._optimizer is not None:
                self._update(lr)
            self._engine.lazy_reset_grad()
            self._accumulated = 0
        return results

    def _update(self, lr: float) -> None:
        """ORT's optimizer graph: the mean of the accumulated gradients, then the optimizer node."""
        if self._accumulation_steps > 1:
            self._engine.scale_gradients(float(np.float32(1.0) / np.float32(self._accumulation_steps)))
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        self._optimizer_step()

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        """`run` taking and returning OrtValues (ort_torch_compat.api.OrtValue)."""
        return [OrtValue.ortvalue_from_numpy(out) for out in self.run(output_names, input_dict_ort_values, run_options)]

    def _convert_feeds(self, input_feed: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        if not isinstance(input_feed, dict):
            raise TypeError("input_feed must be a dict {input_name: value}")
        specs = self._input_specs
        feeds = {}
        for name, value in input_feed.items():
            if name in self._weight_names:
                raise InvalidInputError(f"'{name}' is a trained weight; set it with load_state(), not through the feed")
            if name not in specs and name != self._lr_name:
                raise InvalidInputError(f"Invalid Feed Input Name:{name}")
            if not isinstance(value, (torch.Tensor, OrtValue)):
                value = to_numpy(value)
                if value.dtype == object:
                    raise InvalidInputError(f"input '{name}' is not a numeric array")
            tensor = to_tensor(value, f"input '{name}'").detach().to(self._device)
            if name in self._defaults:
                default = self._defaults[name]
                if tensor.dtype != default.dtype or tensor.shape != default.shape:
                    raise InvalidInputError(
                        f"TrainingSession.run: initializer override '{name}' must be {default.dtype} with shape "
                        f"{list(default.shape)}, got {tensor.dtype} {list(tensor.shape)}"
                    )
            elif name in specs:
                check_inputs([specs[name]], [tensor], "TrainingSession.run")
            feeds[name] = tensor
        return feeds

    def _learning_rate(self, feeds: Dict[str, torch.Tensor]) -> float:
        if self._lr_name not in feeds:
            raise InvalidInputError(
                f"Missing Input: {self._lr_name} (the learning rate feed named by "
                "TrainingParameters.lr_params_feed_name is required on every step that updates the weights)"
            )
        value = feeds[self._lr_name]
        if value.numel() != 1 or not value.dtype.is_floating_point:
            raise InvalidInputError(
                f"learning rate '{self._lr_name}' must be one float value (shape [1]), "
                f"got {value.dtype} {list(value.shape)}"
            )
        return float(value.reshape(-1)[0])

    # ---- state ------------------------------------------------------------------------
    def _optimizer_entries(self) -> List[Tuple[str, str, str, Any]]:
        """(owner, prefix, kind, target) of every optimizer state value, kind "tensor" (target: the
        live tensor) or "count" (target: (holder, key)).  The owner is a weight, whose value ORT
        names `<prefix>_<weight>`, or SHARED_STATE_KEY for Lamb's one `Step`."""
        entries: List[Tuple[str, str, str, Any]] = []
        if self._optimizer is None:
            return entries
        for w in self._weights:
            state = self._optimizer.state[self._weight(w)]
            entries += [(w, prefix, "tensor", state[key]) for prefix, key in MOMENTS.items() if key in state]
            if "update_count" in state:
                entries.append((w, "Update_Count", "count", (state, "update_count")))
        if isinstance(self._optimizer, Lamb):
            entries.append((SHARED_STATE_KEY, "Step", "count", (vars(self._optimizer), "step_count")))
        return entries

    def _state_entries(self) -> Dict[str, Tuple[str, Any]]:
        """ORT's state tensor names -> (kind, target), weights first."""
        entries: Dict[str, Tuple[str, Any]] = {w: ("tensor", self._weight(w)) for w in self._weights}
        for owner, prefix, kind, target in self._optimizer_entries():
            entries[prefix if owner == SHARED_STATE_KEY else f"{prefix}_{owner}"] = (kind, target)
        return entries

    def get_state(self) -> Dict[str, np.ndarray]:
        """Trained weights and optimizer state, keyed by ORT's initializer names."""
        return {name: _entry_value(kind, target) for name, (kind, target) in self._state_entries().items()}

    def load_state(self, dict: Dict[str, Any], strict: bool = False) -> None:  # noqa: A002 - ORT's name
        """Set state tensors from `dict`; unknown names are skipped, or an error when `strict`.
        The load is all or nothing: every value is checked before any is set."""
        entries = self._state_entries()
        staged = []
        for name, value in dict.items():
            if name not in entries:
                if strict:
                    raise ModelMismatchError(f"Checkpoint tensor: {name} is not a known state tensor.")
                continue
            kind, target = entries[name]
            array = to_numpy(value)
            if kind == "tensor":
                expected, dtype = tuple(target.shape), torch.empty(0, dtype=target.dtype).numpy().dtype
                if tuple(array.shape) != expected or array.dtype != dtype:
                    raise ModelMismatchError(
                        f"state tensor '{name}': expected {dtype} {list(expected)}, "
                        f"got {array.dtype} {list(array.shape)}"
                    )
            else:
                array = np.array(_count(array, f"state tensor '{name}'"))
            staged.append((kind, target, array))
        with torch.no_grad():
            for kind, target, array in staged:
                if kind == "tensor":
                    target.copy_(torch.from_numpy(np.ascontiguousarray(array)))
                else:
                    holder, key = target
                    holder[key] = int(array)

    def get_model_state(self, include_mixed_precision_weights: bool = False) -> Dict[str, Dict[str, np.ndarray]]:
        """{"full_precision": {weight: array}} (+ an empty "mixed_precision" when asked: no fp16 copies exist)."""
        state = {"full_precision": {w: _host_copy(self._weight(w)) for w in self._weights}}
        if include_mixed_precision_weights:
            state["mixed_precision"] = {}
        return state

    def get_optimizer_state(self) -> Dict[str, Dict[str, np.ndarray]]:
        """{weight: {"Moment_1", "Moment_2"[, "Update_Count"]}}, plus {"shared_optimizer_state": {"Step"}} for Lamb."""
        state: Dict[str, Dict[str, np.ndarray]] = {}
        for owner, prefix, kind, target in self._optimizer_entries():
            state.setdefault(owner, {})[prefix] = _entry_value(kind, target)
        return state

    def get_partition_info_map(self) -> Dict[str, Dict[str, List[int]]]:
        """Always empty: weights are never partitioned (no ZeRO / Megatron)."""
        return {}

    def _apply_initial_state(self, initial: Dict[str, Dict[str, np.ndarray]]) -> None:
        """`TrainingParameters.set_optimizer_initial_state`, in get_optimizer_state()'s layout."""
        entries = self._state_entries()
        for key, values in initial.items():
            if key == SHARED_STATE_KEY:
                if "Step" in values and "Step" in entries:
                    self.load_state({"Step": values["Step"]})
                continue
            if key not in self._weights:
                warnings.warn(
                    f"optimizer initial state for '{key}' ignored: it is not a trained weight",
                    RuntimeWarning,
                    stacklevel=3,
                )
                continue
            for prefix, array in values.items():
                name = f"{prefix}_{key}"
                if name not in entries:
                    warnings.warn(
                        f"optimizer initial state '{prefix}' of '{key}' ignored by "
                        f"{self._optimizer_name or 'no optimizer'}",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                else:
                    try:
                        self.load_state({name: array})
                    except ModelMismatchError as error:
                        raise ModelMismatchError(f"initial {prefix} of '{key}': {error}") from None

    # ---- inference-session accessors ----------------------------------------------------
    def get_inputs(self) -> List[NodeArg]:
        """Graph inputs that are not initializers, then the learning-rate feed (ORT adds it as a graph input)."""
        extra = [NodeArg(self._lr_name, "tensor(float)", [1])] if self._optimizer_name else []
        return list(self._input_args) + extra

    def get_outputs(self) -> List[NodeArg]:
        """Graph outputs (the loss included), plus `<weight>_grad` when set_gradients_as_graph_outputs."""
        return list(self._output_args) + list(self._grad_args)

    def get_overridable_initializers(self) -> List[NodeArg]:
        """Initializers that are also graph inputs (IR < 4 style); frozen ones may be fed to `run`."""
        return list(self._overridable_args)

    def get_modelmeta(self) -> ModelMetadata:
        return self._meta

    def get_session_options(self):
        return self._sess_options

    def get_providers(self) -> List[str]:
        return list(self._providers)

    def get_provider_options(self) -> Dict[str, Dict[str, str]]:
        return {name: dict(opts) for name, opts in zip(self._providers, self._provider_options)}

    def set_providers(self, providers=None, provider_options=None) -> None:
        """Move the session (weights, optimizer state, gradients accumulated since the last
        update) to another provider's device."""
        names, options, device = resolve_providers(providers, provider_options)
        state, grads, accumulated = self.get_state(), self._engine.gradients(), self._accumulated
        self._start(device, _tf32(self._sess_options, names, options))
        self.load_state(state)
        if accumulated:
            self._engine.continue_accumulation(grads)
            self._accumulated = accumulated
        self._providers, self._provider_options = names, options

    def is_output_fp32_node(self, output_name: str) -> bool:
        if output_name not in self._produced:
            raise ValueError(f"Output: {output_name} is not produced by any node.")
        info = self._value_types.get(output_name)
        return info is not None and info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT

    # onnxruntime.InferenceSession odds and ends
    def end_profiling(self) -> str:
        return ""

    def get_profiling_start_time_ns(self) -> int:
        return 0

    def disable_fallback(self) -> None:
        pass

    def enable_fallback(self) -> None:
        pass

    def io_binding(self):
        raise NotImplementedError("IOBinding is not supported by ort_torch_compat.legacy.TrainingSession; use run()")

    def run_with_iobinding(self, iobinding, run_options=None):
        raise NotImplementedError("IOBinding is not supported by ort_torch_compat.legacy.TrainingSession; use run()")


# ---- helpers --------------------------------------------------------------------------
def _check_supported(params: TrainingParameters) -> None:
    for field, asks_for_more in MULTI_NODE_FIELDS:
        value = getattr(params, field)
        if asks_for_more(value):
            raise NotImplementedError(
                f"TrainingParameters.{field}={value!r} configures multi-node / distributed "
                f"training, which is not implemented. {DDP_HINT}"
            )
    for field in MIXED_PRECISION_FIELDS:
        if getattr(params, field):
            raise NotImplementedError(
                f"TrainingParameters.{field}=True asks for mixed-precision training (fp16 weight copies, fp16 moments, "
                "loss scaling), which ort_torch_compat.legacy.TrainingSession does not implement: it trains in the "
                "model's own precision. Set it to False, or train with torch.autocast and torch.amp.GradScaler in a "
                "plain torch loop."
            )
    for field in _DUMP_FIELDS:
        if getattr(params, field):
            warnings.warn(
                f"TrainingParameters.{field} is ignored: no ORT training graph exists to be saved",
                RuntimeWarning,
                stacklevel=3,
            )


def _tf32(sess_options: Any, providers: List[str], options: List[Dict[str, str]]) -> bool:
    """TF32 asked for: the CUDA provider's own `use_tf32` option (when a GPU provider was
    chosen), else the config entry "ort_torch_compat.use_tf32"; else float32."""
    gpu_options = options[0] if providers and providers[0] in GPU_PROVIDERS else None
    return tf32_requested(sess_options, gpu_options)


def _load(source, sess_options) -> onnx.ModelProto:
    fmt = (session_config_entry(sess_options, "session.load_model_format") or "").upper()
    orts = NotImplementedError("ORT format models (.ort) are not supported; pass the ONNX model instead")
    path = None
    if isinstance(source, (bytes, bytearray)):
        if fmt == "ORT" or bytes(source[4:8]) == b"ORTM":
            raise orts
    elif not isinstance(source, onnx.ModelProto):
        path = os.fspath(source)
        if fmt == "ORT" or (fmt != "ONNX" and path.lower().endswith(".ort")):
            raise orts
    model = load_model(source, "training model")  # external data already read, next to the model file
    if path is not None and any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        from onnx.external_data_helper import convert_model_from_external_data

        convert_model_from_external_data(model)  # older onnx leaves the location EXTERNAL: mark it embedded
    return model


def _host_copy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy copy: what the session returns never aliases its live tensors."""
    return tensor.detach().to("cpu", copy=True).numpy()


def _entry_value(kind: str, target: Any) -> np.ndarray:
    if kind == "tensor":
        return _host_copy(target)
    holder, key = target
    return np.array([holder[key]], dtype=np.int64)


def _count(array: np.ndarray, what: str) -> int:
    if array.size != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ModelMismatchError(f"{what} must be one int64 value, got {array.dtype} {list(array.shape)}")
    return int(array.reshape(-1)[0])
