"""Drop-in replacement for `onnxruntime.training.api` (onnxruntime-training 1.19.2)."""

try:
    import torch  # noqa: F401  (the engine trains on PyTorch)
except ImportError as error:  # the artifacts-only install (pip install --no-deps) has no torch
    raise ImportError(
        "ort_torch_compat.api trains on PyTorch, which is not installed: pip install torch torchvision "
        "(CPU-only: add --index-url https://download.pytorch.org/whl/cpu). Making artifacts "
        "(ort_torch_compat.artifacts) and reading checkpoints (ort_torch_compat.codec) need no torch."
    ) from error

from .checkpoint_state import CheckpointState, Parameter, Parameters, Properties
from .lr_scheduler import CorrectedLinearLRScheduler, LinearLRScheduler
from .module import Module
from .optimizer import Optimizer
from .ortvalue import OrtValue

__all__ = [
    "CheckpointState",
    "Parameter",
    "Parameters",
    "Properties",
    "Module",
    "Optimizer",
    "LinearLRScheduler",
    "CorrectedLinearLRScheduler",
    "OrtValue",
]
