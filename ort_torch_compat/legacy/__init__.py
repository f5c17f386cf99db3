"""The legacy `onnxruntime.TrainingSession` / `TrainingParameters` API (onnxruntime-training 1.10 era).

    from ort_torch_compat.legacy import TrainingParameters, TrainingSession

See docs/legacy.md for what is supported, and the optimizer formulas.
"""
from .training_parameters import TrainingParameters
from .training_session import TrainingSession
from .session_info import ModelMetadata, NodeArg, SessionOptions

__all__ = ["TrainingSession", "TrainingParameters", "NodeArg", "ModelMetadata", "SessionOptions"]
