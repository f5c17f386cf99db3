"""Encoder for ORT's ``ODTC`` checkpoint files, byte-exact with ORT's own writers.

Byte-exactness matters because users diff checkpoints, cache them by hash, and because
"re-saving an untouched ORT checkpoint yields the same file" is the simplest proof that we
write what ORT would.  Flatbuffers output depends on the *order* of builder calls, on which
default-valued fields are omitted, and on alignment bookkeeping, so this module follows the
recipe of spec section 1.4 call by call.  Policy (which tensors, in which order, sorted or
not) is *not* decided here: the encoder writes exactly what the record holds, in the order
it holds it; :mod:`.layout` builds records the way each ORT writer would.

Python's ``flatbuffers.Builder`` produces the same bytes as ORT's C++ builder given the
same call sequence, with one exception handled in :meth:`_Encoder.int64_vector`.
"""
from __future__ import annotations

import math
import numbers
import operator
import os
import struct
from typing import Dict, List, Optional, Tuple, Union

import flatbuffers

from ..atomic_files import atomic_write, atomic_write_pair
from .dtypes import TensorDataType, element_size
from .records import CheckpointRecord, PropertyValue, TensorRecord

__all__ = ["encode_checkpoint", "write_checkpoint", "external_alignment"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# Measured with ORT 1.19.2: INT64 and DOUBLE start on 8-byte boundaries in the .data file,
# every other type (UINT64 included, unlike what one would guess) on 4-byte boundaries.
_EIGHT_BYTE_ALIGNED = (TensorDataType.INT64, TensorDataType.DOUBLE)


def external_alignment(data_type: int) -> int:
    """Padding unit ORT uses before a tensor in the ``.data`` file: 8 for INT64/DOUBLE, else 4."""
    return 8 if data_type in _EIGHT_BYTE_ALIGNED else 4


def _check_int(value: object, lo: int, hi: int, what: str) -> int:
    """Validate an integer field up front: flatbuffers would fail later with a vaguer error."""
    if isinstance(value, bool):
        value = int(value)
    elif not isinstance(value, int):
        try:
            value = operator.index(value)  # numpy integers
        except TypeError:
            raise TypeError(f"{what} must be an int, got {type(value).__name__}") from None
    if not lo <= value <= hi:
        raise ValueError(f"{what} {value} does not fit the file's {hi.bit_length() + 1}-bit field")
    return value


def _to_float32(value: float) -> float:
    """Round to float32 like ORT does; out-of-range values become +-inf instead of raising."""
    value = float(value)
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


class _Encoder:
    """One encoding run: a flatbuffers builder plus the growing external-data blob."""

    def __init__(self, size_hint: int, ext_min: Optional[int]) -> None:
        self.b = flatbuffers.Builder(min(max(size_hint, 1024), flatbuffers.Builder.MAX_BUFFER_SIZE))
        self.ext_min = ext_min
        self.ext: Optional[bytearray] = bytearray() if ext_min is not None else None

    # -- vectors --------------------------------------------------------------------------
    def int64_vector(self, values: Tuple[int, ...], what: str) -> int:
        b = self.b
        if not values:
            # ORT's C++ builder does not record alignment for an empty vector, so an empty
            # int64 vector must not raise minalign to 8 (it would add 4 bytes of padding
            # after the file identifier).  Announce it with 4-byte alignment instead.
            b.StartVector(8, 0, 4)
            return b.EndVector()
        checked = [_check_int(v, _INT64_MIN, _INT64_MAX, what) for v in values]
        b.StartVector(8, len(checked), 8)
        for v in reversed(checked):
            b.PrependInt64(v)
        return b.EndVector()

    def offset_vector(self, offsets: List[int]) -> int:
        b = self.b
        b.StartVector(4, len(offsets), 4)
        for off in reversed(offsets):
            b.PrependUOffsetTRelative(off)
        return b.EndVector()

    # -- tables ---------------------------------------------------------------------------
    def tensor(self, t: TensorRecord, may_go_external: bool) -> int:
        b = self.b
        if not isinstance(t.name, str):
            raise TypeError(f"tensor name must be a str, got {type(t.name).__name__}")
        what = f"tensor {t.name!r}"
        data_type = _check_int(t.data_type, _INT32_MIN, _INT32_MAX, f"{what} data_type")
        name = b.CreateString(t.name)
        doc = b.CreateString(t.doc_string) if t.doc_string else 0
        dims = self.int64_vector(tuple(t.dims), f"{what} dimension")

        is_string = data_type == TensorDataType.STRING
        strings = raw = 0
        ext_offset = -1
        if is_string:
            offs = [b.CreateString(s) for s in (t.string_data or [])]
            strings = self.offset_vector(offs)
        elif may_go_external and self.ext is not None and len(t.raw_data) >= self.ext_min:
            ext_offset = self._append_external(t, data_type)
        else:
            raw = b.CreateByteVector(bytes(t.raw_data))

        b.StartObject(7)
        b.PrependUOffsetTRelativeSlot(0, name, 0)
        if doc:
            b.PrependUOffsetTRelativeSlot(1, doc, 0)
        b.PrependUOffsetTRelativeSlot(2, dims, 0)
        b.PrependInt32Slot(3, data_type, 0)
        if is_string:
            b.PrependUOffsetTRelativeSlot(5, strings, 0)
        elif ext_offset >= 0:
            b.PrependInt64Slot(6, ext_offset, -1)
        else:
            b.PrependUOffsetTRelativeSlot(4, raw, 0)
        return b.EndObject()

    def _append_external(self, t: TensorRecord, data_type: int) -> int:
        assert self.ext is not None
        try:
            need = math.prod(int(d) for d in t.dims) * element_size(data_type)
        except ValueError:
            raise ValueError(f"tensor {t.name!r}: type {data_type} cannot be stored as external data") from None
        if any(int(d) < 0 for d in t.dims) or need != len(t.raw_data):
            # The reader derives the byte count from dims, so a mismatch could never decode.
            raise ValueError(
                f"tensor {t.name!r}: raw_data has {len(t.raw_data)} bytes but dims {tuple(t.dims)} "
                f"need {need}; it cannot be stored as external data"
            )
        align = external_alignment(data_type)
        self.ext.extend(b"\0" * (-len(self.ext) % align))
        offset = len(self.ext)
        self.ext.extend(t.raw_data)
        return offset

    def module_state(self, ms) -> int:
        b = self.b
        req = [self.tensor(t, True) for t in ms.trainable]
        fro = [self.tensor(t, True) for t in ms.frozen]
        req_vec = self.offset_vector(req)
        fro_vec = self.offset_vector(fro)
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, req_vec, 0)
        b.PrependUOffsetTRelativeSlot(1, fro_vec, 0)
        b.PrependBoolSlot(2, bool(ms.is_nominal), False)
        b.PrependBoolSlot(3, self.ext is not None, False)
        return b.EndObject()

    def optimizer_group(self, g) -> int:
        b = self.b
        states = []
        for st in g.states:
            moms = [self.tensor(m, False) for m in st.momentums]
            pname = b.CreateString(st.param_name)
            mvec = self.offset_vector(moms)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, pname, 0)
            b.PrependUOffsetTRelativeSlot(1, mvec, 0)
            states.append(b.EndObject())
        gname = b.CreateString(g.group_name)
        svec = self.offset_vector(states)
        step = _check_int(g.step, _INT64_MIN, _INT64_MAX, f"optimizer group {g.group_name!r} step")
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, gname, 0)
        # ORT adds the learning rate before the step; the order changes the bytes.
        b.PrependFloat32Slot(2, _to_float32(g.initial_learning_rate), 0.0)
        b.PrependInt64Slot(1, step, 0)
        b.PrependUOffsetTRelativeSlot(3, svec, 0)
        return b.EndObject()

    def property_bag(self, props: Dict[str, PropertyValue]) -> int:
        b = self.b
        ints: List[int] = []
        floats: List[int] = []
        strs: List[int] = []
        # ORT walks its property map in sorted-name order and builds each table as it goes,
        # so the three kinds end up interleaved in the buffer.
        for name in sorted(props):
            value = props[name]
            if not isinstance(name, str):
                raise TypeError(f"property names must be str, got {type(name).__name__}")
            what = f"property {name!r}"
            noff = b.CreateString(name)
            if isinstance(value, str):
                voff = b.CreateString(value)
                b.StartObject(2)
                b.PrependUOffsetTRelativeSlot(0, noff, 0)
                b.PrependUOffsetTRelativeSlot(1, voff, 0)
                strs.append(b.EndObject())
            elif isinstance(value, numbers.Integral):
                ival = _check_int(value, _INT64_MIN, _INT64_MAX, what)
                b.StartObject(2)
                b.PrependUOffsetTRelativeSlot(0, noff, 0)
                b.PrependInt64Slot(1, ival, 0)
                ints.append(b.EndObject())
            elif isinstance(value, numbers.Real):
                b.StartObject(2)
                b.PrependUOffsetTRelativeSlot(0, noff, 0)
                b.PrependFloat32Slot(1, _to_float32(value), 0.0)
                floats.append(b.EndObject())
            else:
                raise TypeError(f"{what} must be int, float or str, got {type(value).__name__}")
        ivec = self.offset_vector(ints)
        fvec = self.offset_vector(floats)
        svec = self.offset_vector(strs)
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, ivec, 0)
        b.PrependUOffsetTRelativeSlot(1, fvec, 0)
        b.PrependUOffsetTRelativeSlot(2, svec, 0)
        return b.EndObject()

    def checkpoint(self, record: CheckpointRecord) -> bytes:
        b = self.b
        ms = self.module_state(record.module_state) if record.module_state is not None else 0
        groups = None
        if record.optimizer_groups is not None:
            groups = [self.optimizer_group(g) for g in record.optimizer_groups]
        pbag = self.property_bag(record.properties) if record.properties is not None else 0
        gvec = self.offset_vector(groups) if groups is not None else 0
        version = _check_int(record.version, _INT32_MIN, _INT32_MAX, "version")
        b.StartObject(4)
        b.PrependInt32Slot(0, version, 0)
        if ms:
            b.PrependUOffsetTRelativeSlot(1, ms, 0)
        if groups is not None:
            b.PrependUOffsetTRelativeSlot(2, gvec, 0)
        if pbag:
            b.PrependUOffsetTRelativeSlot(3, pbag, 0)
        root = b.EndObject()
        b.Finish(root, file_identifier=b"ODTC")
        return bytes(memoryview(b.Bytes)[b.Head() :])


def _size_hint(record: CheckpointRecord, ext_min: Optional[int]) -> int:
    """Roughly the output size, so the builder allocates once instead of doubling repeatedly."""
    def cost(t: TensorRecord, may_go_external: bool) -> int:
        raw = len(t.raw_data)
        if may_go_external and ext_min is not None and raw >= ext_min:
            raw = 0
        return raw + 4 * len(t.name) + 8 * len(t.dims) + 64 + sum(8 + 4 * len(s) for s in t.string_data or ())

    total = 1024
    if record.module_state is not None:
        total += sum(cost(t, True) for t in record.module_state.trainable + record.module_state.frozen)
    for g in record.optimizer_groups or []:
        total += 64 + 4 * len(g.group_name)
        for st in g.states:
            total += 64 + 4 * len(st.param_name) + sum(cost(t, False) for t in st.momentums)
    return total


def encode_checkpoint(
    record: CheckpointRecord, *, external_min_bytes: Optional[int] = None
) -> Tuple[bytes, Optional[bytes]]:
    """Serialize ``record``; return ``(checkpoint bytes, external .data bytes or None)``.

    ``external_min_bytes`` decides external data:

    * an int: every module-state tensor whose raw size is ``>= external_min_bytes`` goes
      to the ``.data`` blob (zero padding before each one to 8 bytes for INT64/DOUBLE,
      4 otherwise, as ORT 1.19.2 does) and the file gets
      ``has_external_data=true``.  ORT's artifact writer uses 64 (see
      :func:`.layout.artifact_external_min_bytes`), its state writer 0.
    * ``None``: follow the record.  If ``module_state.has_external_data`` is set, behave
      like ORT's state writer (threshold 0, every module tensor external) so that
      decode -> encode reproduces a state-written external checkpoint; otherwise all inline.

    Optimizer momentums and STRING tensors are always inline, as in ORT.  When external
    data is in use the second item is the (possibly empty) blob, else None.
    """
    ext_min = external_min_bytes
    ms = record.module_state
    if ext_min is None and ms is not None and ms.has_external_data:
        ext_min = 0
    if ext_min is not None:
        # Without a ModuleState the flag has nowhere to go, but the (empty) blob is still
        # returned: ORT's state writer creates an empty .data file in that case too.
        ext_min = _check_int(ext_min, 0, _INT64_MAX, "external_min_bytes")
    enc = _Encoder(_size_hint(record, ext_min), ext_min)
    try:
        main = enc.checkpoint(record)
    except flatbuffers.builder.BuilderSizeError as exc:
        raise ValueError(f"checkpoint too large for a flatbuffers file (2 GiB limit); use external data: {exc}") from None
    ext = bytes(enc.ext) if enc.ext is not None else None
    return main, ext


def write_checkpoint(
    record: CheckpointRecord,
    path: Union[str, os.PathLike],
    *,
    external_min_bytes: Optional[int] = None,
) -> None:
    """Encode ``record`` and write it to ``path`` (and ``<path>.data``) atomically.

    With external data both files are written completely first and then renamed into place
    under a journal that the next load or save completes or rolls back after a crash (see
    :func:`ort_torch_compat.atomic_files.atomic_write_pair`).  A stale ``<path>.data`` is left alone
    when the new checkpoint is inline (ORT does the same; the reader ignores it because the
    flag is off).  Errors are the OSError of the failing call, naming ``path``; the previous
    file at ``path`` is untouched on failure.  ``external_min_bytes`` is as in
    :func:`encode_checkpoint`.
    """
    target = os.fspath(path)
    if isinstance(target, bytes):
        target = os.fsdecode(target)
    if os.path.islink(target):
        target = os.path.realpath(target)  # write through the link, as ofstream would
    main, ext = encode_checkpoint(record, external_min_bytes=external_min_bytes)
    if ext is None:
        atomic_write(target, main)
    else:
        atomic_write_pair(target, main, ext)
