"""The mutable training state: parameters, their gradients, optimizer moments, properties.

This is what ORT calls the CheckpointState.  Tensors are torch tensors; once a training
engine owns the state, each parameter tensor is a view into the engine's flat storage, so
reading the state always shows the current (trained) values and nothing is copied per step.

Threading contract: the engine holds ``TrainingState.lock`` for each call that changes the
state (train step, optimizer step, buffer copy into the parameters), and a checkpoint save
holds it while it copies the state into a record.  So a save from another thread captures
the state between two such calls: one consistent step, with the step count that matches the
parameters.  Training the same state from two threads at once is not supported (as in ORT).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

import numpy as np
import torch

from ..codec.dtypes import numpy_dtype as onnx_numpy_dtype
from ..codec.dtypes import numpy_to_torch, torch_to_numpy  # noqa: F401  (re-exported for api/: every dtype, bf16/fp8 included)

PropertyValue = Union[int, float, str]

DEFAULT_LEARNING_RATE = 0.001
DEFAULT_GROUP_NAME = "group0"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class ParameterSlot:
    """One named parameter. `tensor` is None only while the state is nominal."""

    name: str
    data_type: int
    requires_grad: bool
    tensor: Optional[torch.Tensor]

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of `data_type` (known even while the state is nominal)."""
        return onnx_numpy_dtype(self.data_type)

    @property
    def grad(self) -> Optional[torch.Tensor]:
        """The accumulated gradient; None for frozen params and states with no Module."""
        if not self.requires_grad or self.tensor is None:
            return None
        return self.tensor.grad


@dataclass
class OptimizerState:
    """ORT's single optimizer group: completed step count, lrs and per-parameter moments."""

    group_name: str = DEFAULT_GROUP_NAME
    step: int = 0
    initial_learning_rate: float = DEFAULT_LEARNING_RATE
    learning_rate: float = DEFAULT_LEARNING_RATE
    moments: Dict[str, Dict[str, torch.Tensor]] = field(default_factory=dict)


@dataclass
class TrainingState:
    parameters: Dict[str, ParameterSlot] = field(default_factory=dict)
    optimizer: Optional[OptimizerState] = None
    properties: Dict[str, PropertyValue] = field(default_factory=dict)
    is_nominal: bool = False
    has_external_data: bool = False
    # Held by every state-changing engine call and by the snapshot a save takes (see above).
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def parameter(self, name: str) -> ParameterSlot:
        slot = self.parameters.get(name)
        if slot is None:
            raise KeyError(f"Parameter {name} not found.")
        return slot

    def sorted_names(self) -> List[str]:
        """ORT iterates parameters sorted by (byte-wise) name."""
        return sorted(self.parameters, key=lambda n: n.encode())

    def set_property(self, name: str, value: PropertyValue) -> None:
        if not isinstance(name, str):
            raise TypeError(f"Property names must be str, got {type(name).__name__} {name!r}")
        self.properties[name] = normalize_property(name, value)

    def get_property(self, name: str) -> PropertyValue:
        if name not in self.properties:
            raise KeyError(f"Property {name} not found.")
        return self.properties[name]


def normalize_property(name: str, value: object) -> PropertyValue:
    """Store a property the way ORT does: bool->int, float->float32, big ints->float32."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        value = int(value)
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
        return float(np.float32(value))
    if isinstance(value, (float, np.floating)):
        return float(np.float32(value))
    if isinstance(value, str):
        return value
    raise TypeError(
        f"Property '{name}' has unsupported type {type(value).__name__}; properties can be int, float or str."
    )
