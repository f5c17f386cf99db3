"""ORT's legacy optimizer nodes as the torch optimizers of `optim/`.

`TrainingParameters` names the optimizer op (`SGDOptimizer`, `AdamOptimizer`,
`LambOptimizer`) and gives its attributes per weight; here each weight becomes a param
group carrying its attributes under ORT's names, so a missing attribute takes the
optimizer's default: the CPU kernel's for Adam, the graph builder's for Lamb (which had
only a CUDA kernel).  Sources: docs/legacy.md.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Dict, List

import torch

from ..optim import Lamb, LegacyAdam, LegacySGD
from .training_parameters import TrainingParameters

OPTIMIZERS = ("SGDOptimizer", "AdamOptimizer", "LambOptimizer")

# Attributes each op reads, per weight: (float attributes, int attributes).
_ATTRIBUTES = {
    "SGDOptimizer": ((), ()),
    "AdamOptimizer": (("alpha", "beta", "lambda", "epsilon"), ("do_bias_correction", "weight_decay_mode")),
    "LambOptimizer": (
        ("alpha", "beta", "lambda", "epsilon", "max_norm_clip", "ratio_min", "ratio_max"),
        ("do_bias_correction",),
    ),
}
# AdamOptimizer's schema declares max_norm_clip, but the CPU kernel never reads it: accepted, no effect.
_WITHOUT_EFFECT = {"AdamOptimizer": ("max_norm_clip",)}
# One value for the whole LambOptimizer node: the builder reads the first weight's, the others must agree.
_LAMB_NODE_WIDE = ("ratio_min", "ratio_max", "do_bias_correction")


def build_optimizer(name: str, weights: Dict[str, torch.Tensor], params: TrainingParameters) -> torch.optim.Optimizer:
    """The optimizer `name` over `weights` ({name: parameter tensor}, in ORT's sorted order)."""
    groups = _param_groups(name, weights, params)
    if name == "SGDOptimizer":
        return LegacySGD(groups)
    if name == "AdamOptimizer":
        return LegacyAdam(groups)
    defaults = inspect.signature(Lamb).parameters
    node_wide = {key: groups[0].get(key, defaults[key].default) for key in _LAMB_NODE_WIDE}
    for group in groups:
        for key in _LAMB_NODE_WIDE:
            value = group.pop(key, node_wide[key])
            if value != node_wide[key]:
                raise ValueError(
                    f"LambOptimizer: '{key}' is one value for all weights; '{group['name']}' has "
                    f"{value} but '{groups[0]['name']}' has {node_wide[key]}"
                )
    return Lamb(groups, clip_grad_norm=bool(params.enable_grad_norm_clip), **node_wide)


def _param_groups(name: str, weights: Dict[str, torch.Tensor], params: TrainingParameters) -> List[Dict[str, Any]]:
    floats, ints = _ATTRIBUTES[name]
    ignored = set()
    groups = []
    for weight, tensor in weights.items():
        group: Dict[str, Any] = {"params": [tensor], "name": weight}
        for given, kind, convert in (
            (params.optimizer_attributes_map, floats, float),
            (params.optimizer_int_attributes_map, ints, int),
        ):
            for key, value in (given.get(weight) or {}).items():
                if key in kind:
                    group[key] = convert(value)
                elif key not in _WITHOUT_EFFECT.get(name, ()):
                    ignored.add(key)
        groups.append(group)
    if ignored:
        warnings.warn(
            f"{name} ignores attribute(s) {sorted(ignored)} (it reads {sorted(floats)} and {sorted(ints)})",
            RuntimeWarning,
            stacklevel=4,
        )
    return groups
