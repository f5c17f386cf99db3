"""Drop-in `onnxruntime.training.api.Module`."""

from __future__ import annotations

import os
from typing import List, Optional, Union

from ..engine import TrainingEngine
from ..values import OrtValue, from_tensors, to_tensor, to_tensors
from .checkpoint_state import CheckpointState

PathOrBytes = Union[str, os.PathLike, bytes]


class Module:
    """Training and evaluation of ORT training artifacts on PyTorch.

    `device` is "cpu", "cuda" or "cuda:N".  Of `session_options` (ORT's, or any object
    with the same attributes) the engine uses `intra_op_num_threads` (its thread count; 0:
    measured), `graph_optimization_level` ORT_DISABLE_ALL (no compiled train steps) and the
    config entries "ort_torch_compat.compile" ("auto", "on", "off") and
    "ort_torch_compat.use_tf32" ("1": TF32 on CUDA; default float32); see docs/performance.md.
    `gradients` (keyword only, not in ORT's API): "ort" (default) gives ONNX Runtime 1.19.2's
    gradients, quirks included (an inactive Dropout with a ratio input scales its gradient by
    1/(1 - ratio)); "exact" gives the derivative of what the forward computes.
    Inputs may be numpy arrays (outputs come back as numpy), OrtValues (outputs are
    OrtValues of the same class: onnxruntime's for onnxruntime's, ours for ours) or torch
    tensors (outputs are torch tensors on the module's device: the zero-copy path).
    String inputs are numpy arrays of str, bytes or objects, as in ORT.
    """

    def __init__(
        self,
        train_model_uri: PathOrBytes,
        state: CheckpointState,
        eval_model_uri: Optional[PathOrBytes] = None,
        device: str = "cpu",
        session_options: object = None,
        *,
        gradients: str = "ort",
    ) -> None:
        if not isinstance(state, CheckpointState):
            raise TypeError(f"state must be a CheckpointState, got {type(state).__name__}")
        self.training = True
        self._state = state
        self._eval_model_uri = eval_model_uri
        self._engine = TrainingEngine(
            state._state,
            train_model_uri if isinstance(train_model_uri, bytes) else os.fspath(train_model_uri),
            None
            if eval_model_uri is None
            else (eval_model_uri if isinstance(eval_model_uri, bytes) else os.fspath(eval_model_uri)),
            device,
            gradients,
            session_options,
        )

    def __call__(self, *user_inputs):
        tensors, kind = to_tensors(user_inputs)
        step = self._engine.train_step if self.training else self._engine.eval_step
        return from_tensors(step(tensors), kind)

    def train(self, mode: bool = True) -> "Module":
        self.training = mode
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def lazy_reset_grad(self) -> None:
        """The next train step overwrites the gradients instead of accumulating."""
        self._engine.lazy_reset_grad()

    def get_contiguous_parameters(self, trainable_only: bool = False) -> OrtValue:
        return OrtValue(self._engine.copy_parameters_to_buffer(trainable_only))

    def get_parameters_size(self, trainable_only: bool = True) -> int:
        return self._engine.parameters_size(trainable_only)

    def copy_buffer_to_parameters(self, buffer, trainable_only: bool = True) -> None:
        self._engine.copy_buffer_to_parameters(to_tensor(buffer, "buffer"), trainable_only)

    def export_model_for_inferencing(
        self, inference_model_uri: Union[str, os.PathLike], graph_output_names: List[str]
    ) -> None:
        """Write the eval model cut to `graph_output_names` with the trained parameters embedded.

        As in ORT, the names must be a list of str (a bare str is a TypeError, not a list of
        its characters); an unknown name raises an error that lists the exportable names.
        """
        if isinstance(graph_output_names, (str, bytes)) or not all(isinstance(n, str) for n in graph_output_names):
            raise TypeError(f"graph_output_names must be a list of str, got {graph_output_names!r}")
        from ..engine.export import export_inference_model  # onnx and the graph tools: at first use

        export_inference_model(self._engine, os.fspath(inference_model_uri), list(graph_output_names))

    def input_names(self) -> List[str]:
        return self._engine.input_names(self.training)

    def output_names(self) -> List[str]:
        return self._engine.output_names(self.training)
