"""Checkpoint codec: ORT ``ODTC`` flatbuffers files <-> plain records.

The codec knows bytes and records only (no torch or engine imports at module level):
``decode``/``read`` verify untrusted input, ``encode``/``write`` reproduce ORT's bytes,
``layout`` holds the two ORT writer policies and ``dtypes`` the tensor type table.
"""

from .decode import (
    FILE_IDENTIFIER,
    SUPPORTED_VERSION,
    Payload,
    decode_checkpoint,
    has_external_data,
    open_checkpoint,
    read_checkpoint,
)
from .dtypes import (
    TensorDataType,
    code_from_numpy,
    code_from_torch,
    dtype_name,
    element_size,
    numpy_dtype,
    tensor_nbytes,
    tensor_record_from_numpy,
    tensor_record_from_torch,
    tensor_record_to_numpy,
    tensor_record_to_torch,
    torch_dtype,
)
from .encode import encode_checkpoint, encode_checkpoint_segments, external_alignment, write_checkpoint
from .errors import CheckpointError, CheckpointFormatError
from .records import (
    CheckpointRecord,
    ModuleStateRecord,
    OptimizerGroupRecord,
    ParameterOptimizerStateRecord,
    PropertyValue,
    TensorRecord,
)
from .writer_layouts import (
    ARTIFACT_EXTERNAL_MIN_TENSOR_BYTES,
    ARTIFACT_EXTERNAL_THRESHOLD_BYTES,
    artifact_external_min_bytes,
    artifact_writer_record,
    state_writer_external_min_bytes,
    state_writer_record,
    tensor_proto_size,
)

__all__ = [
    "FILE_IDENTIFIER",
    "SUPPORTED_VERSION",
    "decode_checkpoint",
    "read_checkpoint",
    "open_checkpoint",
    "Payload",
    "has_external_data",
    "encode_checkpoint",
    "encode_checkpoint_segments",
    "write_checkpoint",
    "external_alignment",
    "CheckpointError",
    "CheckpointFormatError",
    "TensorDataType",
    "numpy_dtype",
    "torch_dtype",
    "code_from_numpy",
    "code_from_torch",
    "element_size",
    "dtype_name",
    "tensor_nbytes",
    "tensor_record_from_numpy",
    "tensor_record_to_numpy",
    "tensor_record_from_torch",
    "tensor_record_to_torch",
    "state_writer_record",
    "state_writer_external_min_bytes",
    "artifact_writer_record",
    "artifact_external_min_bytes",
    "tensor_proto_size",
    "ARTIFACT_EXTERNAL_THRESHOLD_BYTES",
    "ARTIFACT_EXTERNAL_MIN_TENSOR_BYTES",
    "CheckpointRecord",
    "ModuleStateRecord",
    "OptimizerGroupRecord",
    "ParameterOptimizerStateRecord",
    "PropertyValue",
    "TensorRecord",
]
