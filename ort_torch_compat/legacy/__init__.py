"""The legacy `onnxruntime.TrainingSession` / `TrainingParameters` API (onnxruntime-training 1.10 era).

    from ort_torch_compat.legacy import TrainingParameters, TrainingSession

See docs/legacy.md for what is supported, and the optimizer formulas.
"""

from .session_info import ModelMetadata, NodeArg, SessionOptions
from .training_parameters import TrainingParameters
from .training_session import TrainingSession

__all__ = ["TrainingSession", "TrainingParameters", "NodeArg", "ModelMetadata", "SessionOptions"]
