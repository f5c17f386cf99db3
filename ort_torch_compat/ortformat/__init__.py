"""Reading onnxruntime's ORT-format (`.ort`, flatbuffers) models as ONNX models.

`is_ort_format(data)` tells the format from the bytes ("ORTM" at bytes 4..8);
`read_ort_model(data)` converts the model to an `onnx.ModelProto` or raises `OrtFormatError`.
Neither imports torch or onnxruntime (onnx is imported when a model is read).
"""

from .model import FILE_IDENTIFIER, OrtFormatError, is_ort_format, read_ort_model, runtime_optimization_summary

__all__ = ["FILE_IDENTIFIER", "OrtFormatError", "is_ort_format", "read_ort_model", "runtime_optimization_summary"]
