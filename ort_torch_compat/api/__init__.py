"""Drop-in replacement for `onnxruntime.training.api` (onnxruntime-training 1.19.2)."""
from .checkpoint_state import CheckpointState, Parameter, Parameters, Properties
from .lr_scheduler import CorrectedLinearLRScheduler, LinearLRScheduler
from .module import Module
from .optimizer import Optimizer
from .ortvalue import OrtValue

__all__ = [
    "CheckpointState", "Parameter", "Parameters", "Properties", "Module", "Optimizer",
    "LinearLRScheduler", "CorrectedLinearLRScheduler", "OrtValue",
]
