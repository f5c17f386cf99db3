"""``save_checkpoint`` (ORT's artifact-writer layout) and ``load_checkpoint_to_model``, via our codec."""

from __future__ import annotations

import os
from typing import List, Sequence, Tuple, Union

import numpy as np
import onnx

from ..codec import (
    TensorRecord,
    artifact_external_min_bytes,
    artifact_writer_record,
    read_checkpoint,
    tensor_record_to_numpy,
    write_checkpoint,
)

__all__ = ["save_checkpoint", "load_checkpoint_to_model", "tensor_record_from_onnx"]


def tensor_record_from_onnx(tensor: onnx.TensorProto) -> TensorRecord:
    """The checkpoint record of an ONNX initializer: name, dtype, dims, little-endian bytes, doc_string.

    ``raw_data`` is used as is (ONNX stores it little-endian); typed fields (``float_data``...)
    go through onnx's numpy conversion.  External data must have been loaded.
    """
    from onnx import numpy_helper

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise ValueError(f"initializer {tensor.name!r} has external data that was not loaded")
    dims = tuple(int(d) for d in tensor.dims)
    if tensor.data_type == onnx.TensorProto.STRING:
        strings = [s.decode("utf-8") for s in tensor.string_data]
        return TensorRecord(tensor.name, tensor.data_type, dims, b"", tensor.doc_string, strings)
    if tensor.HasField("raw_data"):
        raw = tensor.raw_data
    else:
        array = numpy_helper.to_array(tensor)
        raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return TensorRecord(tensor.name, tensor.data_type, dims, bytes(raw), tensor.doc_string)


def save_checkpoint(
    parameters: Tuple[Sequence[onnx.TensorProto], Sequence[onnx.TensorProto]],
    path_to_checkpoint: Union[str, os.PathLike],
    nominal_checkpoint: bool = False,
) -> None:
    """Write ``(trainable, frozen)`` initializers as ORT's artifact writer does, byte for byte.

    Tensors keep the given order; above 1799 MiB the tensors of 64 bytes or more go to
    ``<path>.data``, as in ORT.  The write is atomic.
    """
    if parameters is None:
        raise RuntimeError("No checkpoint parameters provided.")
    trainable, frozen = parameters
    trainable_records: List[TensorRecord] = [tensor_record_from_onnx(t) for t in trainable]
    frozen_records: List[TensorRecord] = [tensor_record_from_onnx(t) for t in frozen]
    record = artifact_writer_record(trainable_records, frozen_records, nominal=nominal_checkpoint)
    external = artifact_external_min_bytes(trainable_records + frozen_records)
    write_checkpoint(record, os.fspath(path_to_checkpoint), external_min_bytes=external)


def load_checkpoint_to_model(path_to_checkpoint: Union[str, os.PathLike], model: onnx.ModelProto) -> None:
    """Replace the values of ``model``'s initializers with the checkpoint's parameters of the same name.

    Initializers the checkpoint does not hold are left alone, as in ORT.
    """
    from onnx import numpy_helper

    record = read_checkpoint(os.fspath(path_to_checkpoint))
    if record.module_state is None:
        return
    values = {t.name: t for t in record.module_state.trainable + record.module_state.frozen}
    for index, initializer in enumerate(model.graph.initializer):
        stored = values.get(initializer.name)
        if stored is not None:
            model.graph.initializer[index].CopyFrom(
                numpy_helper.from_array(tensor_record_to_numpy(stored), initializer.name)
            )
