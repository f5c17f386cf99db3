"""Drop-in `onnxruntime.training.api.checkpoint_state`: CheckpointState, Parameter(s), Properties.

Signatures, return types and exceptions follow onnxruntime-training 1.19.2.  Two ORT
defects are *not* reproduced because they cannot be relied upon: `repr(Parameters)` and
`repr(Properties)` return a string (ORT returns a list, so `repr()` raises TypeError), and
setting a parameter before any Module exists works (ORT segfaults).
"""

from __future__ import annotations

import os
from typing import Iterator, Optional, Tuple, Union

import numpy as np
import torch

from ..engine import TrainingState, load_state, save_state
from ..engine.state import ParameterSlot, PropertyValue, numpy_to_torch, torch_to_numpy
from ..engine.training_engine import LOAD_HINT
from ..errors import InvalidArgumentError, NominalStateError

# ORT 1.19.2's messages, verbatim (tests/fixtures/edges); our hint follows as a new sentence.
NOMINAL_GET = "Cannot get parameter from a nominal state. Please load the parameter states first"
NOMINAL_SET = "Cannot copy parameter to a nominal state. Please load all the parameter states first"
_LOAD_HINT = f". {LOAD_HINT}"


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return torch_to_numpy(tensor)  # bfloat16 / float8 included


def _assign(slot: ParameterSlot, value: np.ndarray) -> None:
    """Copy `value` into the parameter in place (it may be a view the engine trains)."""
    array = np.asarray(value)
    if slot.tensor is None:
        raise NominalStateError(NOMINAL_SET + _LOAD_HINT)
    expected_shape = tuple(slot.tensor.shape)
    # ORT's text first (code may match it), then which parameter and what to pass.
    hint = (
        f". Parameter '{slot.name}' takes a numpy array of shape {expected_shape} and dtype "
        f"{slot.numpy_dtype} (e.g. value.astype(np.{slot.numpy_dtype}))"
    )
    if array.shape != expected_shape:
        raise InvalidArgumentError(
            f"Parameter data shape mismatch. Expected: {{{', '.join(map(str, expected_shape))}}}, "
            f"Got: {{{', '.join(map(str, array.shape))}}}" + hint
        )
    if array.dtype != slot.numpy_dtype:
        raise InvalidArgumentError(
            f"Parameter data type mismatch. Expected: {slot.numpy_dtype}, Got: {array.dtype}" + hint
        )
    with torch.no_grad():
        slot.tensor.copy_(numpy_to_torch(array))


class Parameter:
    """A model parameter: name, data (numpy copy; assignable), grad and requires_grad."""

    def __init__(self, parameter: ParameterSlot, state: TrainingState):
        self._parameter = parameter
        self._state = state

    @property
    def name(self) -> str:
        return self._parameter.name

    @property
    def data(self) -> np.ndarray:
        if self._parameter.tensor is None:
            raise NominalStateError(NOMINAL_GET + _LOAD_HINT)
        return _to_numpy(self._parameter.tensor)

    @data.setter
    def data(self, value: np.ndarray) -> None:
        _assign(self._parameter, value)

    @property
    def grad(self) -> Optional[np.ndarray]:
        grad = self._parameter.grad
        return None if grad is None else _to_numpy(grad)

    @property
    def requires_grad(self) -> bool:
        return self._parameter.requires_grad

    def __repr__(self) -> str:
        return f"Parameter(name={self.name}, requires_grad={self.requires_grad})"


class Parameters:
    """Mapping-like view of the state's parameters; iteration yields (name, Parameter) sorted by name."""

    def __init__(self, state: TrainingState):
        self._state = state

    def _slot(self, name: str, nominal_message: str = NOMINAL_GET) -> ParameterSlot:
        slot = self._state.parameter(name)
        if self._state.is_nominal:
            raise NominalStateError(nominal_message + _LOAD_HINT)
        return slot

    def __getitem__(self, name: str) -> Parameter:
        return Parameter(self._slot(name), self._state)

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        _assign(self._slot(name, NOMINAL_SET), value)

    def __contains__(self, name: str) -> bool:
        return name in self._state.parameters

    def __iter__(self) -> Iterator[Tuple[str, Parameter]]:
        for name in self._state.sorted_names():
            yield name, self[name]

    def __repr__(self) -> str:
        return repr(self._state.sorted_names())

    def __len__(self) -> int:
        return len(self._state.parameters)


class Properties:
    """User properties (int, float, str); iteration yields (name, value) sorted by name."""

    def __init__(self, state: TrainingState):
        self._state = state

    def __getitem__(self, name: str) -> PropertyValue:
        return self._state.get_property(name)

    def __setitem__(self, name: str, value: PropertyValue) -> None:
        self._state.set_property(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self._state.properties

    def __iter__(self) -> Iterator[Tuple[str, PropertyValue]]:
        for name in sorted(self._state.properties):
            yield name, self._state.properties[name]

    def __repr__(self) -> str:
        return repr(sorted(self._state.properties))

    def __len__(self) -> int:
        return len(self._state.properties)


class CheckpointState:
    """The training state: parameters, gradients, optimizer state and user properties.

    Create it with `CheckpointState.load_checkpoint(path_or_bytes)`.
    """

    def __init__(self, state: TrainingState):
        if not isinstance(state, TrainingState):
            raise TypeError(f"Invalid argument for CheckpointState received {type(state)}")
        self._state = state
        self._parameters = Parameters(state)
        self._properties = Properties(state)

    @classmethod
    def load_checkpoint(
        cls,
        checkpoint_uri: Union[str, os.PathLike, bytes, bytearray, memoryview],
        *,
        allow_external_symlinks: bool = False,
    ) -> "CheckpointState":
        """Load from a checkpoint file, or from its bytes (ORT's LoadCheckpointFromBuffer).

        ``allow_external_symlinks=True`` accepts a ``.data`` companion that is a symlink to a
        file outside the checkpoint's folder (refused by default)."""
        if isinstance(checkpoint_uri, (bytes, bytearray, memoryview)):
            return cls(load_state(checkpoint_uri))
        return cls(load_state(os.fspath(checkpoint_uri), allow_external_symlinks=allow_external_symlinks))

    @classmethod
    def save_checkpoint(
        cls, state: "CheckpointState", checkpoint_uri: Union[str, os.PathLike], include_optimizer_state: bool = False
    ) -> None:
        """Save atomically (temp file + fsync + rename): an interrupted save keeps the old file."""
        save_state(state._state, os.fspath(checkpoint_uri), include_optimizer_state)

    @property
    def parameters(self) -> Parameters:
        return self._parameters

    @property
    def properties(self) -> Properties:
        return self._properties

    # ---- C API names (OrtTrainingApi's checkpoint functions) ---------------------------
    def add_property(self, name: str, value: PropertyValue) -> None:
        self._state.set_property(name, value)

    def get_property(self, name: str) -> PropertyValue:
        return self._state.get_property(name)

    def get_parameter_type_and_shape(self, name: str) -> Tuple[np.dtype, Tuple[int, ...]]:
        slot = self._parameters._slot(name)
        return slot.numpy_dtype, tuple(slot.tensor.shape)

    def get_parameter(self, name: str) -> np.ndarray:
        return self.parameters[name].data

    def update_parameter(self, name: str, value: np.ndarray) -> None:
        self.parameters[name] = value
