"""Loading ONNX artifacts from paths or bytes, with errors that name the file."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Union

from ..errors import ModelLoadError

if TYPE_CHECKING:  # onnx is imported when a model is first read, not with the package
    import onnx

ModelSource = Union[str, "os.PathLike[str]", bytes, bytearray, "onnx.ModelProto"]


def _is_model_proto(source: object) -> bool:
    """isinstance(source, onnx.ModelProto) without importing onnx (no ModelProto exists before)."""
    onnx = sys.modules.get("onnx")
    return onnx is not None and isinstance(source, onnx.ModelProto)


def describe(source: ModelSource, role: str) -> str:
    """How to name this artifact in messages: its path, or '<role from buffer>'."""
    if isinstance(source, (bytes, bytearray)) or _is_model_proto(source):
        return f"<{role} from buffer>"
    return os.fspath(source)


def load_model(source: ModelSource, role: str) -> "onnx.ModelProto":
    """Read an ONNX model; FileNotFoundError/IsADirectoryError/ModelLoadError name the file."""
    if _is_model_proto(source):
        return source
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(source, (bytes, bytearray)):
        data = bytes(source)
    else:
        path = os.fspath(source)
        if os.path.isdir(path):
            raise IsADirectoryError(f"{role} '{path}' is a directory, not an ONNX file")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{role} '{path}' does not exist")
        with open(path, "rb") as handle:
            data = handle.read()
    name = describe(source, role)
    if not data:
        raise ModelLoadError(f"{role} {name} is empty")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as error:
        raise ModelLoadError(f"{role} {name} is not an ONNX model: {error}") from error
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelLoadError(f"{role} {name} is not an ONNX model (no graph)")
    return model


def opset_map(model: "onnx.ModelProto") -> dict:
    return {("" if entry.domain == "ai.onnx" else entry.domain): entry.version for entry in model.opset_import}
