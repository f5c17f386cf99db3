"""ort_torch_compat: ONNX Runtime training artifacts and API, running on PyTorch.

`ort_torch_compat.api` is the drop-in replacement for `onnxruntime.training.api`.
"""
__version__ = "0.1.0"
