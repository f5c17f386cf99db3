"""Loading ONNX artifacts from paths or bytes, with errors that name the file."""

from __future__ import annotations

import math
import os
import sys
from typing import TYPE_CHECKING, Optional, Union

from ..codec.dtypes import element_size
from ..errors import ModelLoadError

if TYPE_CHECKING:  # onnx (and protobuf) load with the first model, not with the package
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
    """Read an ONNX model; FileNotFoundError/IsADirectoryError/ModelLoadError name the file.

    ORT-format models (`.ort`, told by their contents: "ORTM" at bytes 4..8) are converted
    to an equivalent ONNX model by `ort_torch_compat.ortformat` and checked like any other.

    ONNX external data is read relative to the model file's folder (never the working
    directory), through onnx's checked reader; a model given as bytes cannot say where its
    external data is and is refused if it has any.  A model newer than the installed onnx
    (IR version, default-domain opset) or with an initializer whose dims disagree with its
    data is refused here, as ORT refuses it at load.
    """
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(source, onnx.ModelProto):
        model, folder = source, None
    else:
        if isinstance(source, (bytes, bytearray)):
            data, folder = bytes(source), None
        else:
            path = os.fspath(source)
            if os.path.isdir(path):
                raise IsADirectoryError(f"{role} '{path}' is a directory, not an ONNX file")
            if not os.path.exists(path):
                raise FileNotFoundError(f"{role} '{path}' does not exist")
            with open(path, "rb") as handle:
                data = handle.read()
            folder = os.path.dirname(os.path.abspath(path))
        name = describe(source, role)
        if not data:
            raise ModelLoadError(f"{role} {name} is empty")
        if _is_ort_format(data):
            model = _read_ort_format(data, role, name)
        else:
            model = onnx.ModelProto()
            try:
                model.ParseFromString(data)
            except (DecodeError, ValueError, RuntimeError) as error:
                raise ModelLoadError(f"{role} {name} is not an ONNX model: {error}") from error
    name = describe(source, role)
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelLoadError(f"{role} {name} is not an ONNX model (no graph)")
    _check_text(model.graph, role, name)
    _check_versions(model, role, name)
    _load_external_data(model, folder, role, name)
    _check_initializers(model, role, name)
    return model


def _is_ort_format(data: bytes) -> bool:
    """ORT-format (flatbuffers) models carry the file identifier "ORTM" at bytes 4..8; an ONNX
    model (protobuf) there has field tags and lengths, never these four letters in a row
    that a model could start with (the first field of a ModelProto is ir_version, tag 0x08)."""
    from ..ortformat import is_ort_format

    return is_ort_format(data)


def _read_ort_format(data: bytes, role: str, name: str) -> "onnx.ModelProto":
    from ..ortformat import OrtFormatError, read_ort_model

    try:
        return read_ort_model(data)
    except OrtFormatError as error:
        raise ModelLoadError(f"{role} {name} is an ORT-format model this package cannot read: {error}") from error


def _check_text(graph: "onnx.GraphProto", role: str, name: str) -> None:
    """Every name in the graph (and its subgraphs) is text: protobuf hands a damaged string
    field back as bytes, which would fail later, far from the cause."""

    def check(value: object, field: str) -> None:
        if not isinstance(value, str):
            raise ModelLoadError(f"{role} {name}: {field} {value!r} is not valid UTF-8 text (a damaged file)")

    pending = [graph]
    while pending:
        current = pending.pop()
        check(current.name, "graph name")
        for info in (
            *current.input,
            *current.output,
            *current.value_info,
            *current.initializer,
            *current.sparse_initializer,
        ):
            check(getattr(info, "name", ""), "value name")
        for node in current.node:
            for field in ("name", "op_type", "domain"):
                check(getattr(node, field), f"node {field}")
            for value in (*node.input, *node.output):
                check(value, f"input/output of node {node.name!r}")
            for attribute in node.attribute:
                check(attribute.name, f"attribute name of node {node.name!r}")
                if attribute.HasField("g"):
                    pending.append(attribute.g)
                pending.extend(attribute.graphs)


def _check_versions(model: "onnx.ModelProto", role: str, name: str) -> None:
    import onnx

    if model.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(
            f"{role} {name} has IR version {model.ir_version}; the newest the installed onnx "
            f"{onnx.__version__} knows is {onnx.IR_VERSION}"
        )
    newest = onnx.defs.onnx_opset_version()
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx") and entry.version > newest:
            raise ModelLoadError(
                f"{role} {name} imports opset {entry.version} of the default ONNX domain; the newest "
                f"the installed onnx {onnx.__version__} knows is {newest}"
            )


def _load_external_data(model: "onnx.ModelProto", folder: Optional[str], role: str, name: str) -> None:
    import onnx
    from onnx import external_data_helper

    external = [t for t in external_data_helper._get_all_tensors(model) if external_data_helper.uses_external_data(t)]
    if not external:
        return
    if folder is None:
        locations = sorted({external_data_helper.ExternalDataInfo(t).location for t in external})
        raise ModelLoadError(
            f"{role} {name} keeps tensor(s) {[t.name for t in external][:5]} in external data file(s) {locations}, "
            "which a model given as bytes cannot locate; pass the model's path instead"
        )
    for tensor in external:
        _bound_external_length(tensor, folder, role, name)
        try:
            external_data_helper.load_external_data_for_tensor(tensor, folder)
        except (OSError, ValueError, RuntimeError, onnx.checker.ValidationError) as error:
            raise ModelLoadError(
                f"{role} {name}: cannot read the external data of tensor '{tensor.name}' "
                f"(relative to {folder}): {error}"
            ) from error


_FOUR_BIT_TYPES = (21, 22, 23)  # UINT4, INT4, FLOAT4E2M1: two elements per byte


def _bound_external_length(tensor: "onnx.TensorProto", folder: str, role: str, name: str) -> None:
    """Check an external tensor's byte count against its dims and dtype *before* reading, and
    make the reader read exactly that many bytes (without a `length`, onnx reads the file's
    whole rest: a sparse 64 GiB file next to the model would be read whole)."""
    from onnx import external_data_helper

    dims = list(tensor.dims)
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{role} {name}: tensor '{tensor.name}' has a negative dimension in {dims}")
    count = math.prod(dims)
    try:
        expected = (count + 1) // 2 if tensor.data_type in _FOUR_BIT_TYPES else count * element_size(tensor.data_type)
    except ValueError:
        return  # strings and unknown types: onnx's reader decides
    info = external_data_helper.ExternalDataInfo(tensor)
    if info.length and info.length != expected:
        raise ModelLoadError(
            f"{role} {name}: tensor '{tensor.name}' declares {info.length} bytes of external data in "
            f"'{info.location}', but its dims {dims} and type need {expected}"
        )
    location = os.path.join(folder, info.location)
    try:
        available = os.path.getsize(location) - (info.offset or 0)
    except OSError:
        return  # missing or refused paths: onnx's checked reader names the problem
    if available < expected:
        raise ModelLoadError(
            f"{role} {name}: tensor '{tensor.name}' needs {expected} bytes of external data from "
            f"offset {info.offset or 0} of '{info.location}', which holds {max(available, 0)}"
        )
    if not info.length:
        entry = next((e for e in tensor.external_data if e.key == "length"), None) or tensor.external_data.add()
        entry.key, entry.value = "length", str(expected)


# Where TensorProto stores each type when not as raw_data, and how many values one element takes.
# (TensorProto codes: FLOAT 1, UINT8 2, INT8 3, UINT16 4, INT16 5, INT32 6, INT64 7, STRING 8,
# BOOL 9, FLOAT16 10, DOUBLE 11, UINT32 12, UINT64 13, COMPLEX64 14, COMPLEX128 15, BFLOAT16 16.)
_TYPED_FIELDS = {
    "float_data": {1: 1, 14: 2},
    "double_data": {11: 1, 15: 2},
    "int64_data": {7: 1},
    "uint64_data": {12: 1, 13: 1},
    "string_data": {8: 1},
    "int32_data": {code: 1 for code in (6, 5, 3, 4, 2, 9, 10, 16)},
}


def _check_initializers(model: "onnx.ModelProto", role: str, name: str) -> None:
    """Each initializer holds as many elements as its dims say (checked by size, not by
    converting it, so a large model costs nothing here)."""
    for init in model.graph.initializer:
        dims = list(init.dims)
        if any(d < 0 for d in dims):
            raise ModelLoadError(f"{role} {name}: initializer '{init.name}' has a negative dimension in {dims}")
        want = math.prod(dims)
        if init.raw_data:
            try:
                have = len(init.raw_data) / element_size(init.data_type)
            except ValueError:
                continue  # packed 4-bit types and others without a byte size
        else:
            have = None
            for field, per_element in _TYPED_FIELDS.items():
                if init.data_type in per_element:
                    have = len(getattr(init, field)) / per_element[init.data_type]
            if have is None:
                continue
        if have != want:
            raise ModelLoadError(
                f"{role} {name}: initializer '{init.name}' declares dims {dims} ({want} elements) but holds {have:g}"
            )


def opset_map(model: "onnx.ModelProto") -> dict:
    return {("" if entry.domain == "ai.onnx" else entry.domain): entry.version for entry in model.opset_import}
