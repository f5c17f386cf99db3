"""The legacy `onnxruntime.TrainingSession` (1.10-era Python wrapper), running on torch.

The model is a plain ONNX graph that computes a loss.  ORT used to append gradient,
accumulation, gradient-norm and optimizer nodes to that graph; here the forward+loss part
is converted once with the library's graph builder (trained weights become inputs fed
with our own leaf tensors), autograd provides the gradients, and the optimizer nodes are
functional torch kernels (`kernels.py`).  One `run()` is one training step: forward,
backward, gradient accumulation, and every `gradient_accumulation_steps`-th call the
optimizer update with the learning rate read from the feed named `lr_params_feed_name`.
State names follow ORT's initializer names (`Moment_1_<w>`, `Update_Count_<w>`, `Step`),
so `get_state()` / `load_state()` dictionaries keep their keys.
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ..engine.io_spec import ONNX_TYPE_NAMES, ValueSpec, check_inputs, value_spec
from ..engine.model_io import describe, load_model, opset_map
from ..errors import InvalidInputError, ModelLoadError, ModelMismatchError
from ..graph import build_graph_module, forward_graph
from ..graph.subgraph import ancestor_nodes
from . import kernels
from .parameters import DDP_HINT, MIXED_PRECISION_FIELDS, MULTI_NODE_FIELDS, TrainingParameters
from .session_info import ModelMetadata, NodeArg, SessionOptions, resolve_providers, session_config_entry

OPTIMIZERS = ("SGDOptimizer", "AdamOptimizer", "LambOptimizer")
SHARED_STATE_KEY = "shared_optimizer_state"
MOMENTS = ("Moment_1", "Moment_2")

# Attribute defaults of the optimizer nodes ORT built (docs/legacy.md gives the sources).
_FLOAT_ATTRS = {
    "SGDOptimizer": {},
    "AdamOptimizer": {"alpha": 0.9, "beta": 0.999, "lambda": 0.0, "epsilon": 1e-8, "max_norm_clip": 1.0},
    "LambOptimizer": {"alpha": 0.9, "beta": 0.999, "lambda": 0.0, "epsilon": 1e-6, "max_norm_clip": 1.0,
                      "ratio_min": -math.inf, "ratio_max": math.inf},
}
_INT_ATTRS = {
    "SGDOptimizer": {},
    "AdamOptimizer": {"do_bias_correction": 1, "weight_decay_mode": 0},
    "LambOptimizer": {"do_bias_correction": 0},
}
_LAMB_GLOBAL = ("ratio_min", "ratio_max", "do_bias_correction")

# Inputs through which ORT's gradient builder never propagates (its STOP_GRADIENT_EDGES);
# an initializer reached only through them is not trainable by default.
STOP_GRADIENT_EDGES = {
    "Not": {0}, "And": {0, 1}, "Or": {0, 1}, "Xor": {0, 1}, "Equal": {0, 1}, "Less": {0, 1},
    "LessOrEqual": {0, 1}, "Greater": {0, 1}, "GreaterOrEqual": {0, 1}, "IsInf": {0}, "IsNaN": {0},
    "NonZero": {0}, "Pow": {1}, "Gather": {1}, "GatherElements": {1}, "GatherND": {1}, "Shape": {0},
    "Size": {0}, "Reshape": {1}, "Expand": {1}, "Dropout": {1, 2}, "Slice": {1, 2, 3, 4},
    "SparseSoftmaxCrossEntropy": {1, 2}, "SoftmaxCrossEntropyLoss": {1, 2}, "ConstantOfShape": {0},
    "Scatter": {1}, "OneHot": {0, 1, 2}, "Where": {0}, "Range": {0, 1, 2}, "BatchNormalization": {3, 4},
}
_FLOATING = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
_DUMP_FIELDS = ("model_after_graph_transforms_path", "model_with_gradient_graph_path",
                "model_with_training_graph_path")


class _Forward:
    """A converted forward graph for one set of outputs, and the user inputs it consumes."""

    __slots__ = ("module", "required")

    def __init__(self, module: torch.nn.Module, required: set):
        self.module = module
        self.required = required


class TrainingSession:
    """Drop-in for onnxruntime's legacy `TrainingSession(path_or_bytes, parameters, ...)`."""

    def __init__(self, path_or_bytes, parameters: TrainingParameters, sess_options=None, providers=None,
                 provider_options=None):
        if not isinstance(parameters, TrainingParameters):
            raise TypeError("parameters must be an ort_torch_compat.legacy.TrainingParameters, "
                            f"got {type(parameters).__name__}")
        params = parameters._snapshot()
        _check_supported(params)
        self._parameters = params
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        self._providers, self._provider_options, self._device = resolve_providers(providers, provider_options)
        self._label = f"training model {describe(path_or_bytes, 'training model')}"
        model = _load(path_or_bytes, self._sess_options)
        graph = model.graph
        self._meta = ModelMetadata(model)
        self._opsets = opset_map(model)

        initializers = {t.name: t for t in graph.initializer}
        self._initializers_info = {name: (t.data_type, tuple(t.dims)) for name, t in initializers.items()}
        self._user_inputs: List[ValueSpec] = [value_spec(i) for i in graph.input if i.name not in initializers]
        self._input_args = [NodeArg.from_value_info(i) for i in graph.input if i.name not in initializers]
        self._overridable_args = [NodeArg.from_value_info(i) for i in graph.input if i.name in initializers]
        self._value_types = {vi.name: vi for vi in list(graph.input) + list(graph.value_info) + list(graph.output)}
        self._produced = {out for node in graph.node for out in node.output if out}
        self._output_args = [NodeArg.from_value_info(o) for o in graph.output]

        self._loss = params.loss_output_name
        if not self._loss:
            raise ValueError("TrainingParameters.loss_output_name must name the graph output that holds the loss")
        if self._loss not in self._produced:
            raise ModelLoadError(f"loss output '{self._loss}' is not produced by any node of {self._label}")
        if self._loss not in {o.name for o in graph.output}:
            info = self._value_types.get(self._loss)
            self._output_args.append(NodeArg.from_value_info(info) if info is not None
                                     else NodeArg(self._loss, "tensor(float)", None))

        self._weights: List[str] = _select_weights(graph, initializers, params, self._loss, self._label)
        self._params: Dict[str, torch.Tensor] = {
            name: _tensor(numpy_helper.to_array(initializers[name]), self._device).requires_grad_()
            for name in self._weights
        }
        self._frozen_inputs = [arg.name for arg in self._overridable_args if arg.name not in self._params]
        self._frozen_defaults = {name: _tensor(numpy_helper.to_array(initializers[name]), self._device)
                                 for name in self._frozen_inputs}
        self._module_inputs = [s.name for s in self._user_inputs] + self._frozen_inputs + self._weights
        self._graph_model = _without_initializers(model, set(self._module_inputs))
        del model, initializers
        self._forwards: Dict[Tuple[str, ...], _Forward] = {}

        self._grad_names = ({f"{w}_grad": w for w in self._weights}
                            if params.set_gradients_as_graph_outputs else {})
        self._optimizer = params.training_optimizer_name
        if self._optimizer and self._optimizer not in OPTIMIZERS:
            raise ValueError(f"training_optimizer_name '{self._optimizer}' is not supported; "
                             f"use one of {list(OPTIMIZERS)}")
        self._lr_name = params.lr_params_feed_name
        self._accumulation_steps = int(params.gradient_accumulation_steps)
        if self._accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {self._accumulation_steps}")
        self._clip = bool(params.enable_grad_norm_clip)
        self._attrs = _optimizer_attributes(self._optimizer, self._weights, params)
        self._moments: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}
        self._update_count: Dict[str, int] = {}
        self._step = 1
        if self._optimizer in ("AdamOptimizer", "LambOptimizer"):
            self._moments = {w: (torch.zeros_like(p.detach()), torch.zeros_like(p.detach()))
                             for w, p in self._params.items()}
        if self._optimizer == "AdamOptimizer":
            self._update_count = {w: 1 for w in self._weights}
        self._apply_initial_state(params.optimizer_initial_state)
        self._buffers: Optional[List[torch.Tensor]] = None
        self._accumulated = 0

        self._forward_for([self._loss])  # convert now: unsupported operators fail at construction

    # ---- the training step ------------------------------------------------------------
    def run(self, output_names: Optional[Sequence[str]], input_feed: Dict[str, Any],
            run_options=None) -> List[np.ndarray]:
        """One training step; returns the requested outputs (computed before the update) as numpy arrays."""
        fetches = [arg.name for arg in self.get_outputs()] if not output_names else list(output_names)
        valid = {arg.name for arg in self._output_args} | set(self._grad_names)
        for name in fetches:
            if name not in valid:
                raise InvalidInputError(f"Invalid Output Name:{name}")
        feeds = self._convert_feeds(input_feed)

        update = bool(self._optimizer) and self._accumulated + 1 >= self._accumulation_steps
        lr = self._learning_rate(feeds) if update else None

        graph_fetches = [name for name in fetches if name not in self._grad_names]
        outputs = list(dict.fromkeys([self._loss] + graph_fetches))
        forward = self._forward_for(outputs)
        args: List[Optional[torch.Tensor]] = []
        for spec in self._user_inputs:
            if spec.name in feeds:
                args.append(feeds[spec.name])
            elif spec.name in forward.required:
                raise InvalidInputError(f"Missing Input: {spec.name}")
            else:
                args.append(None)
        args.extend(feeds.get(name, self._frozen_defaults[name]) for name in self._frozen_inputs)
        args.extend(self._params[w] for w in self._weights)

        with torch.enable_grad():
            values = dict(zip(outputs, forward.module(*args)))
        grads = self._gradients(values[self._loss])
        results = []
        for name in fetches:
            tensor = grads[self._weights.index(self._grad_names[name])] if name in self._grad_names else values[name]
            results.append(_numpy(tensor))
        self._accumulate_and_update(grads, lr)
        return results

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        """`run` taking and returning OrtValues (ort_torch_compat.api.OrtValue)."""
        from ..api.ortvalue import OrtValue

        return [OrtValue.ortvalue_from_numpy(out) for out in self.run(output_names, input_dict_ort_values, run_options)]

    def _convert_feeds(self, input_feed: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        if not isinstance(input_feed, dict):
            raise TypeError("input_feed must be a dict {input_name: value}")
        specs = {spec.name: spec for spec in self._user_inputs}
        feeds = {}
        for name, value in input_feed.items():
            if name in self._params:
                raise InvalidInputError(f"'{name}' is a trained weight; set it with load_state(), not through the feed")
            if name not in specs and name not in self._frozen_defaults and name != self._lr_name:
                raise InvalidInputError(f"Invalid Feed Input Name:{name}")
            tensor = _tensor(value, self._device, name)
            if name in specs:
                check_inputs([specs[name]], [tensor], "TrainingSession.run")
            elif name in self._frozen_defaults:
                default = self._frozen_defaults[name]
                if tensor.dtype != default.dtype or tensor.shape != default.shape:
                    raise InvalidInputError(
                        f"TrainingSession.run: initializer override '{name}' must be {default.dtype} with shape "
                        f"{list(default.shape)}, got {tensor.dtype} {list(tensor.shape)}")
            feeds[name] = tensor
        return feeds

    def _learning_rate(self, feeds: Dict[str, torch.Tensor]) -> float:
        if self._lr_name not in feeds:
            raise InvalidInputError(
                f"Missing Input: {self._lr_name} (the learning rate feed named by "
                "TrainingParameters.lr_params_feed_name is required on every step that updates the weights)")
        value = feeds[self._lr_name]
        if value.numel() != 1 or not value.dtype.is_floating_point:
            raise InvalidInputError(f"learning rate '{self._lr_name}' must be one float value (shape [1]), "
                                    f"got {value.dtype} {list(value.shape)}")
        return float(value.reshape(-1)[0])

    def _forward_for(self, outputs: Sequence[str]) -> _Forward:
        key = tuple(outputs)
        if key not in self._forwards:
            graph = forward_graph(self._graph_model, list(outputs), self._module_inputs, self._label)
            module = build_graph_module(graph, self._opsets, self._module_inputs, list(outputs), self._label)
            consumed = {name for node in graph.node for name in node.input} | set(outputs)
            required = {spec.name for spec in self._user_inputs if spec.name in consumed}
            self._forwards[key] = _Forward(module.to(self._device).train(), required)
        return self._forwards[key]

    def _gradients(self, loss: torch.Tensor) -> List[torch.Tensor]:
        weights = [self._params[w] for w in self._weights]
        if not weights:
            return []
        if not loss.requires_grad:
            return [torch.zeros_like(w.detach()) for w in weights]
        grads = torch.autograd.grad(loss, weights, grad_outputs=torch.ones_like(loss), allow_unused=True)
        return [torch.zeros_like(w.detach()) if g is None else g for w, g in zip(weights, grads)]

    def _accumulate_and_update(self, grads: List[torch.Tensor], lr: Optional[float]) -> None:
        steps = self._accumulation_steps
        if steps > 1:
            if self._buffers is None:
                self._buffers = [torch.zeros_like(g) for g in grads]
            for buffer, grad in zip(self._buffers, grads):
                buffer.add_(grad)
            self._accumulated += 1
            if self._accumulated < steps:
                return
            scale = float(np.float32(1.0 / steps))
            grads = [buffer * scale for buffer in self._buffers]
            for buffer in self._buffers:
                buffer.zero_()
            self._accumulated = 0
        if self._optimizer and self._weights:
            self._update(grads, lr)

    def _update(self, grads: List[torch.Tensor], lr: float) -> None:
        weights = [self._params[w] for w in self._weights]
        if self._optimizer == "SGDOptimizer":
            kernels.sgd_update(weights, grads, lr=lr)
            return
        norm = kernels.global_norm(grads) if self._clip else None
        attrs = [self._attrs[w] for w in self._weights]
        divisors = [kernels.clip_divisor(norm, a["max_norm_clip"]) for a in attrs]
        if self._optimizer == "AdamOptimizer":
            for name, weight, grad, a, divisor in zip(self._weights, weights, grads, attrs, divisors):
                m1, m2 = self._moments[name]
                kernels.adam_update(weight, grad, m1, m2, lr=lr, step=self._update_count[name], alpha=a["alpha"],
                                    beta=a["beta"], lambda_=a["lambda"], epsilon=a["epsilon"],
                                    do_bias_correction=a["do_bias_correction"],
                                    weight_decay_mode=a["weight_decay_mode"], divisor=divisor)
                self._update_count[name] += 1
        else:
            first = attrs[0]
            kernels.lamb_update(
                weights, grads,
                [self._moments[w][0] for w in self._weights], [self._moments[w][1] for w in self._weights],
                lr=lr, step=self._step, alphas=[a["alpha"] for a in attrs], betas=[a["beta"] for a in attrs],
                lambdas=[a["lambda"] for a in attrs], epsilons=[a["epsilon"] for a in attrs], divisors=divisors,
                ratio_min=first["ratio_min"], ratio_max=first["ratio_max"],
                do_bias_correction=first["do_bias_correction"])
            self._step += 1

    # ---- state ------------------------------------------------------------------------
    def _state_entries(self) -> Dict[str, Tuple[str, Any]]:
        """ORT's state tensor names -> ("tensor", tensor) | ("count", weight) | ("step", None)."""
        entries: Dict[str, Tuple[str, Any]] = {w: ("tensor", self._params[w]) for w in self._weights}
        for w, (m1, m2) in self._moments.items():
            entries[f"Moment_1_{w}"] = ("tensor", m1)
            entries[f"Moment_2_{w}"] = ("tensor", m2)
        for w in self._update_count:
            entries[f"Update_Count_{w}"] = ("count", w)
        if self._optimizer == "LambOptimizer" and self._weights:
            entries["Step"] = ("step", None)
        return entries

    def _entry_value(self, kind: str, target: Any) -> np.ndarray:
        if kind == "tensor":
            return _numpy(target)
        count = self._update_count[target] if kind == "count" else self._step
        return np.array([count], dtype=np.int64)

    def get_state(self) -> Dict[str, np.ndarray]:
        """Trained weights and optimizer state, keyed by ORT's initializer names."""
        return {name: self._entry_value(kind, target) for name, (kind, target) in self._state_entries().items()}

    def load_state(self, dict: Dict[str, Any], strict: bool = False) -> None:  # noqa: A002 - ORT's name
        """Set state tensors from `dict`; unknown names are skipped, or an error when `strict`."""
        entries = self._state_entries()
        staged = []
        for name, value in dict.items():
            if name not in entries:
                if strict:
                    raise ModelMismatchError(f"Checkpoint tensor: {name} is not a known state tensor.")
                continue
            kind, target = entries[name]
            array = _plain_numpy(value)
            if kind == "tensor":
                expected = tuple(target.shape)
                dtype = _numpy(target.detach().reshape(-1)[:0]).dtype
                if tuple(array.shape) != expected or array.dtype != dtype:
                    raise ModelMismatchError(f"state tensor '{name}': expected {dtype} {list(expected)}, "
                                             f"got {array.dtype} {list(array.shape)}")
            elif array.size != 1 or not np.issubdtype(array.dtype, np.integer):
                raise ModelMismatchError(f"state tensor '{name}' must be one int64 value, got {array.dtype} "
                                         f"{list(array.shape)}")
            staged.append((kind, target, array))
        with torch.no_grad():
            for kind, target, array in staged:
                if kind == "tensor":
                    target.copy_(torch.from_numpy(np.ascontiguousarray(array)))
                elif kind == "count":
                    self._update_count[target] = int(array.reshape(-1)[0])
                else:
                    self._step = int(array.reshape(-1)[0])

    def get_model_state(self, include_mixed_precision_weights: bool = False) -> Dict[str, Dict[str, np.ndarray]]:
        """{"full_precision": {weight: array}} (+ an empty "mixed_precision" when asked: no fp16 copies exist)."""
        state = {"full_precision": {w: _numpy(self._params[w]) for w in self._weights}}
        if include_mixed_precision_weights:
            state["mixed_precision"] = {}
        return state

    def get_optimizer_state(self) -> Dict[str, Dict[str, np.ndarray]]:
        """{weight: {"Moment_1", "Moment_2"[, "Update_Count"]}}, plus {"shared_optimizer_state": {"Step"}} for Lamb."""
        state: Dict[str, Dict[str, np.ndarray]] = {}
        for w, (m1, m2) in self._moments.items():
            state[w] = {"Moment_1": _numpy(m1), "Moment_2": _numpy(m2)}
            if w in self._update_count:
                state[w]["Update_Count"] = np.array([self._update_count[w]], dtype=np.int64)
        if self._optimizer == "LambOptimizer" and self._weights:
            state[SHARED_STATE_KEY] = {"Step": np.array([self._step], dtype=np.int64)}
        return state

    def get_partition_info_map(self) -> Dict[str, Dict[str, List[int]]]:
        """Always empty: weights are never partitioned (no ZeRO / Megatron)."""
        return {}

    def _apply_initial_state(self, initial: Dict[str, Dict[str, np.ndarray]]) -> None:
        for key, entries in initial.items():
            if key == SHARED_STATE_KEY:
                if "Step" in entries and self._optimizer == "LambOptimizer":
                    self._step = _int_state(entries["Step"], "Step")
                continue
            if key not in self._params:
                warnings.warn(f"optimizer initial state for '{key}' ignored: it is not a trained weight",
                              RuntimeWarning, stacklevel=3)
                continue
            weight = self._params[key]
            for prefix, array in entries.items():
                if prefix in MOMENTS and key in self._moments:
                    if tuple(array.shape) != tuple(weight.shape) or array.dtype != np.float32:
                        raise ModelMismatchError(
                            f"initial {prefix} of '{key}' must be float32 with shape {list(weight.shape)}, "
                            f"got {array.dtype} {list(array.shape)}")
                    with torch.no_grad():
                        self._moments[key][MOMENTS.index(prefix)].copy_(torch.from_numpy(np.ascontiguousarray(array)))
                elif prefix == "Update_Count" and key in self._update_count:
                    self._update_count[key] = _int_state(array, f"Update_Count of '{key}'")
                else:
                    warnings.warn(f"optimizer initial state '{prefix}' of '{key}' ignored by "
                                  f"{self._optimizer or 'no optimizer'}", RuntimeWarning, stacklevel=3)

    # ---- inference-session accessors ----------------------------------------------------
    def get_inputs(self) -> List[NodeArg]:
        """Graph inputs that are not initializers, then the learning-rate feed (ORT adds it as a graph input)."""
        extra = [NodeArg(self._lr_name, "tensor(float)", [1])] if self._optimizer else []
        return list(self._input_args) + extra

    def get_outputs(self) -> List[NodeArg]:
        """Graph outputs (the loss included), plus `<weight>_grad` when set_gradients_as_graph_outputs."""
        grads = []
        for grad_name, w in self._grad_names.items():
            data_type, dims = self._initializers_info[w]
            grads.append(NodeArg(grad_name, f"tensor({ONNX_TYPE_NAMES.get(data_type, 'undefined')})", list(dims)))
        return list(self._output_args) + grads

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
        """Move the session (weights, optimizer state, accumulation buffers) to another provider's device."""
        names, options, device = resolve_providers(providers, provider_options)
        with torch.no_grad():
            self._params = {w: p.detach().to(device).requires_grad_() for w, p in self._params.items()}
            self._moments = {w: (m1.to(device), m2.to(device)) for w, (m1, m2) in self._moments.items()}
            self._frozen_defaults = {n: t.to(device) for n, t in self._frozen_defaults.items()}
            if self._buffers is not None:
                self._buffers = [b.to(device) for b in self._buffers]
        for forward in self._forwards.values():
            forward.module.to(device)
        self._providers, self._provider_options, self._device = names, options, device

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
            raise NotImplementedError(f"TrainingParameters.{field}={value!r} configures multi-node / distributed "
                                      f"training, which is not implemented. {DDP_HINT}")
    for field in MIXED_PRECISION_FIELDS:
        if getattr(params, field):
            raise NotImplementedError(
                f"TrainingParameters.{field}=True asks for mixed-precision training (fp16 weight copies, fp16 moments, "
                "loss scaling), which ort_torch_compat.legacy.TrainingSession does not implement: it trains in the "
                "model's own precision. Set it to False, or train with torch.autocast and torch.amp.GradScaler in a "
                "plain torch loop.")
    for field in _DUMP_FIELDS:
        if getattr(params, field):
            warnings.warn(f"TrainingParameters.{field} is ignored: no ORT training graph exists to be saved",
                          RuntimeWarning, stacklevel=3)


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
    model = load_model(source, "training model")
    if path is not None and any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    return model


def _select_weights(graph: onnx.GraphProto, initializers: Dict[str, onnx.TensorProto], params: TrainingParameters,
                    loss: str, label: str) -> List[str]:
    """ORT's rule: weights_to_train (names that are initializers) or, when that leaves nothing, the
    initializers reached from the loss through differentiable edges minus immutable_weights;
    then minus weights_not_to_train."""
    requested = {str(name) for name in params.weights_to_train}
    unknown = sorted(requested - set(initializers))
    if unknown:
        warnings.warn(f"weights_to_train {unknown} are not initializers of {label}; ignored", RuntimeWarning,
                      stacklevel=4)
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


def _default_trainable(graph: onnx.GraphProto, initializers: Dict[str, onnx.TensorProto], loss: str,
                       immutable: Dict[str, Sequence[Tuple[int, float]]]) -> set:
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


def _optimizer_attributes(optimizer: str, weights: List[str], params: TrainingParameters) -> Dict[str, Dict[str, Any]]:
    if not optimizer:
        return {}
    float_defaults, int_defaults = _FLOAT_ATTRS[optimizer], _INT_ATTRS[optimizer]
    ignored = set()
    attrs: Dict[str, Dict[str, Any]] = {}
    explicit: Dict[str, set] = {}
    for w in weights:
        values: Dict[str, Any] = dict(float_defaults)
        values.update(int_defaults)
        given = set()
        for key, value in (params.optimizer_attributes_map.get(w) or {}).items():
            if key in float_defaults:
                values[key] = float(value)
                given.add(key)
            else:
                ignored.add(key)
        for key, value in (params.optimizer_int_attributes_map.get(w) or {}).items():
            if key in int_defaults:
                values[key] = int(value)
                given.add(key)
            else:
                ignored.add(key)
        attrs[w] = values
        explicit[w] = given
    if ignored:
        warnings.warn(f"{optimizer} ignores attribute(s) {sorted(ignored)} (it reads {sorted(float_defaults)} and "
                      f"{sorted(int_defaults)})", RuntimeWarning, stacklevel=4)
    for w, values in attrs.items():
        for key in ("alpha", "beta", "lambda", "epsilon"):
            if key in values and values[key] < 0:
                raise ValueError(f"{optimizer}: attribute '{key}' of '{w}' must be >= 0, got {values[key]}")
        if "max_norm_clip" in values and values["max_norm_clip"] == 0:
            raise ValueError(f"{optimizer}: max_norm_clip of '{w}' must not be 0")
        if values.get("do_bias_correction", 0) not in (0, 1):
            raise ValueError(f"{optimizer}: do_bias_correction of '{w}' must be 0 or 1")
        if values.get("weight_decay_mode", 0) not in (0, 1):
            raise ValueError(f"{optimizer}: weight_decay_mode of '{w}' must be 0 or 1")
    if optimizer == "LambOptimizer" and weights:
        first = attrs[weights[0]]
        for w in weights[1:]:
            for key in _LAMB_GLOBAL:
                if key in explicit[w] and attrs[w][key] != first[key]:
                    raise ValueError(f"LambOptimizer: '{key}' is one value for all weights; '{w}' has {attrs[w][key]} "
                                     f"but '{weights[0]}' has {first[key]}")
                attrs[w][key] = first[key]
    return attrs


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


def _plain_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True).numpy()
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        return np.asarray(value.numpy())
    return np.asarray(value)


def _tensor(value: Any, device: torch.device, name: str = "") -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
    elif hasattr(value, "to_torch"):  # ort_torch_compat OrtValue
        tensor = value.to_torch().detach()
    else:
        array = _plain_numpy(value)
        if array.dtype == object:
            raise InvalidInputError(f"input '{name}' is not a numeric array")
        if not array.flags.writeable:  # torch.from_numpy warns on read-only memory
            array = array.copy()
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.to(device)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", copy=True).numpy()


def _int_state(array: np.ndarray, what: str) -> int:
    array = np.asarray(array)
    if array.size != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ModelMismatchError(f"{what} must be one int64 value, got {array.dtype} {list(array.shape)}")
    return int(array.reshape(-1)[0])

