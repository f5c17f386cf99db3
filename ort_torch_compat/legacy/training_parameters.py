"""`TrainingParameters`: the legacy training configuration object, field for field.

Fields and defaults are those of onnxruntime's pybind `TrainingParameters` (1.10 era).
Like the pybind class, it rejects unknown attribute names, so a typo fails loudly instead
of being ignored.  Which fields this implementation honours is checked by
`TrainingSession` (see docs/legacy.md): multi-node fields raise NotImplementedError.
"""

from __future__ import annotations

import copy
from typing import Any, Dict

import numpy as np

from ..values import to_numpy

DDP_HINT = (
    "ort_torch_compat.legacy.TrainingSession trains on one device. For multi-process data-parallel training "
    "wrap the model in torch.nn.parallel.DistributedDataParallel instead (see examples/ddp_train.py)."
)

_DEFAULTS: Dict[str, Any] = {
    "loss_output_name": "",
    "weights_to_train": set(),
    "weights_not_to_train": set(),
    "immutable_weights": {},
    "training_optimizer_name": "",
    "lr_params_feed_name": "Learning_Rate",
    "optimizer_attributes_map": {},
    "optimizer_int_attributes_map": {},
    "gradient_accumulation_steps": 1,
    "enable_grad_norm_clip": True,
    "set_gradients_as_graph_outputs": False,
    "use_mixed_precision": False,
    "use_fp16_moments": False,
    "loss_scale": 0.0,
    # multi-node / model-parallel
    "world_rank": 0,
    "world_size": 1,
    "data_parallel_size": 1,
    "horizontal_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "num_pipeline_micro_batches": 1,
    "pipeline_cut_info_string": "",
    "sliced_schema": {},
    "sliced_axes": {},
    "sliced_tensor_names": [],
    "allreduce_post_accumulation": False,
    "deepspeed_zero_stage": 0,
    "enable_adasum": False,
    # memory / graph-transformation options with no numerical effect
    "use_memory_efficient_gradient": False,
    "attn_dropout_recompute": False,
    "gelu_recompute": False,
    "transformer_layer_recompute": False,
    "number_recompute_layers": 0,
    "propagate_cast_ops_level": 1,
    "propagate_cast_ops_allow": [],
    "allow_layer_norm_mod_precision": False,
    # graph dumps
    "model_after_graph_transforms_path": "",
    "model_with_gradient_graph_path": "",
    "model_with_training_graph_path": "",
}

# (field, predicate saying the value asks for more than one process / device)
MULTI_NODE_FIELDS = (
    ("world_size", lambda v: int(v) > 1),
    ("world_rank", lambda v: int(v) != 0),
    ("data_parallel_size", lambda v: int(v) > 1),
    ("horizontal_parallel_size", lambda v: int(v) > 1),
    ("pipeline_parallel_size", lambda v: int(v) > 1),
    ("num_pipeline_micro_batches", lambda v: int(v) > 1),
    ("pipeline_cut_info_string", bool),
    ("sliced_schema", bool),
    ("sliced_axes", bool),
    ("sliced_tensor_names", bool),
    ("allreduce_post_accumulation", bool),
    ("deepspeed_zero_stage", lambda v: int(v) != 0),
    ("enable_adasum", bool),
)

MIXED_PRECISION_FIELDS = ("use_mixed_precision", "use_fp16_moments")


class TrainingParameters:
    """Configuration information for training (drop-in for onnxruntime's `TrainingParameters`)."""

    __slots__ = tuple(_DEFAULTS) + ("_optimizer_initial_state",)

    def __init__(self) -> None:
        for name, value in _DEFAULTS.items():
            object.__setattr__(self, name, copy.copy(value))
        object.__setattr__(self, "_optimizer_initial_state", {})

    def set_optimizer_initial_state(self, state: Dict[str, Dict[str, Any]]) -> None:
        """Initial optimizer state, in `TrainingSession.get_optimizer_state()`'s layout:
        `{weight: {"Moment_1": arr, "Moment_2": arr, "Update_Count": arr}, "shared_optimizer_state": {"Step": arr}}`."""
        if not isinstance(state, dict):
            raise TypeError("set_optimizer_initial_state expects a dict {weight_name: {state_name: array}}")
        converted = {}
        for weight, entries in state.items():
            if not isinstance(entries, dict):
                raise TypeError(f"optimizer initial state for '{weight}' must be a dict {{state_name: array}}")
            converted[str(weight)] = {str(k): np.array(to_numpy(v)) for k, v in entries.items()}  # a copy
        object.__setattr__(self, "_optimizer_initial_state", converted)

    @property
    def optimizer_initial_state(self) -> Dict[str, Dict[str, np.ndarray]]:
        return self._optimizer_initial_state

    def __repr__(self) -> str:
        changed = {k: getattr(self, k) for k, v in _DEFAULTS.items() if getattr(self, k) != v}
        return f"TrainingParameters({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    def _snapshot(self) -> "TrainingParameters":
        """A deep copy: a session keeps the configuration it was created with."""
        other = TrainingParameters()
        for name in _DEFAULTS:
            object.__setattr__(other, name, copy.deepcopy(getattr(self, name)))
        object.__setattr__(other, "_optimizer_initial_state", copy.deepcopy(self._optimizer_initial_state))
        return other
