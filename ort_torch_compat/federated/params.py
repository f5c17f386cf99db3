"""The parameters a federation exchanges, checked: no Flower needed here.

A federation trains the *trainable* parameters of one set of ORT artifacts.  On the wire they
are a list of numpy arrays in the checkpoint's trainable-parameter order as ORT's API lists
them (`CheckpointState.parameters`: sorted by name), which is the same for every file of the
same model (the artifact generator's checkpoint lists them in initializer order, a checkpoint
ORT or this library saves in name order); the names travel beside them (config and metrics, as a JSON
list) and both ends check names, count, shapes, dtypes and finiteness before they use an
update.  The global model is written with this library's checkpoint writer, so the file is
onnxruntime-training 1.19.2's format; it carries no optimizer state, so a device that resumes
from it starts its optimizer afresh, as ORT does with such a checkpoint.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

PARAM_NAMES_KEY = "ort_param_names"  # JSON list of names, in config (server -> client) and metrics (back)


@dataclass(frozen=True)
class ParameterSpec:
    """Names, shapes and dtypes of the trainable parameters, in ORT's parameter order."""

    names: Tuple[str, ...]
    shapes: Tuple[Tuple[int, ...], ...]
    dtypes: Tuple[np.dtype, ...]

    @classmethod
    def from_state(cls, state) -> "ParameterSpec":
        """From a `CheckpointState` (ours): its trainable parameters, in ORT's parameter order."""
        slots = [
            slot for slot in (state._state.parameter(n) for n in state._state.sorted_names()) if slot.requires_grad
        ]
        if not slots:
            raise ValueError("the checkpoint has no trainable parameters: there is nothing to federate")
        return cls(
            tuple(s.name for s in slots),
            tuple(tuple(s.tensor.shape) for s in slots),
            tuple(np.dtype(s.numpy_dtype) for s in slots),
        )

    def names_json(self) -> str:
        return json.dumps(list(self.names))

    def check_names(self, names_json: object) -> Optional[str]:
        """None when `names_json` (the JSON list a peer sent) names our parameters in our order."""
        if not isinstance(names_json, str):
            return f"no parameter names ({PARAM_NAMES_KEY!r} missing or not a string)"
        try:
            names = json.loads(names_json)
        except ValueError:
            return f"{PARAM_NAMES_KEY!r} is not JSON"
        if not isinstance(names, list) or list(names) != list(self.names):
            return f"parameter names differ: expected {list(self.names)}, got {names!r:.300}"
        return None

    def check_arrays(self, arrays: Sequence[np.ndarray]) -> Optional[str]:
        """None when `arrays` match the spec (count, shapes, float kind) and are all finite."""
        if len(arrays) != len(self.names):
            return f"expected {len(self.names)} arrays, got {len(arrays)}"
        for name, shape, dtype, array in zip(self.names, self.shapes, self.dtypes, arrays):
            if not isinstance(array, np.ndarray):
                return f"{name}: not a numpy array ({type(array).__name__})"
            if tuple(array.shape) != shape:
                return f"{name}: shape {tuple(array.shape)}, expected {shape}"
            if array.dtype.kind != dtype.kind:
                return f"{name}: dtype {array.dtype}, expected {dtype}"
            if array.dtype.kind in "fc" and not np.isfinite(array).all():
                return f"{name}: contains NaN or Inf"
        return None

    def check(self, names_json: object, arrays: Sequence[np.ndarray]) -> Optional[str]:
        return self.check_names(names_json) or self.check_arrays(arrays)

    def cast(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """The arrays in the checkpoint's dtypes (an average may come back as float64)."""
        return [np.ascontiguousarray(a, dtype=d) for a, d in zip(arrays, self.dtypes)]


def trainable_arrays(state, spec: ParameterSpec) -> List[np.ndarray]:
    """Copies of the state's trainable parameters, in `spec` order."""
    return [state.parameters[name].data for name in spec.names]


def assign_arrays(state, spec: ParameterSpec, arrays: Sequence[np.ndarray]) -> None:
    """Copy `arrays` (checked by the caller) into the state's parameters, in place."""
    for name, array in zip(spec.names, spec.cast(arrays)):
        state.parameters[name] = array


def write_checkpoint(state, path: Union[str, os.PathLike], include_optimizer_state: bool = False) -> None:
    """ORT's checkpoint format, written atomically (an interrupted write keeps the old file)."""
    from ..api import CheckpointState

    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=include_optimizer_state)
