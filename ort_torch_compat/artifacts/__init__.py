"""Make ONNX Runtime training artifacts without onnxruntime-training (and without torch).

``generate_artifacts`` has onnxruntime-training 1.19.2's signature and writes the same four
files; the gradient graph comes from this library's own gradient builder
(``ort_torch_compat.gradient``).  Needs only onnx, numpy and flatbuffers, so it
runs on any Python onnx supports.  With ``ort_torch_compat.install()`` and no
onnxruntime-training, ``onnxruntime.training.artifacts`` is this module.
"""

from ..errors import ArtifactGenerationError, UnsupportedGradientError
from ..gradient import supported_ops
from .generate import LossType, OptimType, generate_artifacts

__all__ = [
    "generate_artifacts",
    "LossType",
    "OptimType",
    "ArtifactGenerationError",
    "UnsupportedGradientError",
    "supported_ops",
]
