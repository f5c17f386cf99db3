"""The two ORT checkpoint writers, expressed as record-building policies.

ORT 1.19 has two writers that lay the same data out differently (spec section 1.3):

* **A, the artifact writer** (``generate_artifacts`` / ``onnxblock.save_checkpoint``):
  tensors in the order given (initializer order), no optimizer groups, no properties,
  external data only above ~1.8 GiB and then only for tensors of at least 64 bytes.
* **B, the state writer** (``CheckpointState.save_checkpoint``): params sorted by name,
  ModuleState omitted with no params, ``optimizer_groups`` always present, sorted
  optimizer state, property bag only when non-empty, external data exactly when the state
  was loaded from an external-data checkpoint.

Keeping these rules here, apart from the byte-level encoder, means the encoder stays a
faithful "write what the record says" layer and each policy is testable on its own.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence

from .dtypes import TensorDataType
from .records import (
    CheckpointRecord,
    ModuleStateRecord,
    OptimizerGroupRecord,
    ParameterOptimizerStateRecord,
    PropertyValue,
    TensorRecord,
)

__all__ = [
    "ARTIFACT_EXTERNAL_THRESHOLD_BYTES",
    "ARTIFACT_EXTERNAL_MIN_TENSOR_BYTES",
    "state_writer_record",
    "state_writer_external_min_bytes",
    "artifact_writer_record",
    "artifact_external_min_bytes",
    "tensor_proto_size",
]

#: Writer A goes external when the summed TensorProto sizes exceed 1799 MiB.
ARTIFACT_EXTERNAL_THRESHOLD_BYTES = 1799 * 1024 * 1024  # 1886388224
#: ...and then moves only tensors whose raw data is at least this big.
ARTIFACT_EXTERNAL_MIN_TENSOR_BYTES = 64


def _by_name(tensors: Iterable[TensorRecord]) -> List[TensorRecord]:
    # std::sort on std::string compares bytes; for UTF-8 that equals code point order,
    # which is how Python compares str.
    return sorted(tensors, key=lambda t: t.name)


def state_writer_record(
    trainable: Sequence[TensorRecord],
    frozen: Sequence[TensorRecord],
    *,
    is_nominal: bool = False,
    optimizer_groups: Optional[Sequence[OptimizerGroupRecord]] = None,
    properties: Optional[Dict[str, PropertyValue]] = None,
    include_optimizer_state: bool = False,
    has_external_data: bool = False,
) -> CheckpointRecord:
    """Record laid out as ``CheckpointState.save_checkpoint`` (writer B) would write it.

    ``has_external_data`` must be True exactly when the state was *loaded* from a
    checkpoint whose module state had external data: ORT's state writer makes that flag
    stick, independent of size.  Encode the result with
    ``external_min_bytes=state_writer_external_min_bytes(has_external_data)`` (or None,
    which follows the flag) so that every module tensor goes to ``.data``.
    """
    names = [t.name for t in trainable] + [t.name for t in frozen]
    _reject_duplicates(names)
    record = CheckpointRecord(version=2)
    if names:
        record.module_state = ModuleStateRecord(
            trainable=_by_name(trainable),
            frozen=_by_name(frozen),
            is_nominal=bool(is_nominal),
            has_external_data=bool(has_external_data),
        )
    groups: List[OptimizerGroupRecord] = []
    if include_optimizer_state and optimizer_groups:
        for g in sorted(optimizer_groups, key=lambda g: g.group_name):
            states = [
                ParameterOptimizerStateRecord(st.param_name, _by_name(st.momentums))
                for st in sorted(g.states, key=lambda s: s.param_name)
            ]
            groups.append(OptimizerGroupRecord(g.group_name, g.step, g.initial_learning_rate, states))
    record.optimizer_groups = groups  # always present, possibly empty
    if properties:
        record.properties = {k: properties[k] for k in sorted(properties)}
    return record


def state_writer_external_min_bytes(loaded_had_external_data: bool) -> Optional[int]:
    """Writer B's external threshold: 0 (every module tensor, even 1 byte) or None (inline)."""
    return 0 if loaded_had_external_data else None


def artifact_writer_record(
    trainable: Sequence[TensorRecord],
    frozen: Sequence[TensorRecord],
    *,
    nominal: bool = False,
) -> CheckpointRecord:
    """Record laid out as ``generate_artifacts``/``onnxblock.save_checkpoint`` (writer A).

    Tensors keep the given order (callers pass ONNX initializer order).  A nominal
    checkpoint keeps names, dtypes and the trainable/frozen split but stores every tensor
    with empty (present) dims and raw_data and no doc_string.  Duplicate names raise ValueError like ORT.
    """
    _reject_duplicates([t.name for t in trainable] + [t.name for t in frozen])

    def conv(t: TensorRecord) -> TensorRecord:
        if not nominal:
            return t
        # ORT drops doc_string in nominal tensors (measured) and writes STRING ones with an
        # empty string_data vector.
        strings = [] if t.data_type == TensorDataType.STRING else None
        return TensorRecord(name=t.name, data_type=t.data_type, dims=(), raw_data=b"", string_data=strings)

    ms = ModuleStateRecord(
        trainable=[conv(t) for t in trainable],
        frozen=[conv(t) for t in frozen],
        is_nominal=bool(nominal),
        has_external_data=False,
    )
    return CheckpointRecord(version=2, module_state=ms, optimizer_groups=None, properties=None)


def _varint_len(value: int) -> int:
    if value < 0:
        return 10  # protobuf encodes negative int64/int32 as 10-byte varints
    n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


def tensor_proto_size(t: TensorRecord) -> int:
    """Serialized size of the ONNX TensorProto holding ``t`` (what ORT sums for writer A).

    Computed with onnx's ``ByteSize`` on a proto *without* the raw bytes, plus the
    raw_data field's size, so a multi-GB tensor is not copied into protobuf just to be
    measured.  Equals ``ByteSize()`` of the full proto (tested).
    """
    from onnx import TensorProto

    proto = TensorProto()
    proto.name = t.name
    proto.dims.extend(int(d) for d in t.dims)
    proto.data_type = int(t.data_type)
    if t.doc_string:
        proto.doc_string = t.doc_string
    if t.data_type == TensorDataType.STRING:
        proto.string_data.extend(s.encode("utf-8") for s in (t.string_data or []))
        return proto.ByteSize()
    n = len(t.raw_data)
    return proto.ByteSize() + 1 + _varint_len(n) + n  # field 9 (raw_data): 1-byte tag


def artifact_external_min_bytes(
    tensors: Iterable[TensorRecord], threshold_bytes: int = ARTIFACT_EXTERNAL_THRESHOLD_BYTES
) -> Optional[int]:
    """Writer A's rule: 64 when the summed TensorProto sizes exceed ``threshold_bytes``, else None.

    Pass all tensors (trainable and frozen, with their real data even for a nominal
    checkpoint).  ``threshold_bytes`` exists so tests can exercise the rule at small scale.
    """
    total = sum(tensor_proto_size(t) for t in tensors)
    return ARTIFACT_EXTERNAL_MIN_TENSOR_BYTES if total > threshold_bytes else None


def _reject_duplicates(names: List[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise ValueError(f"Duplicated tensor proto named {n}")
        seen.add(n)
