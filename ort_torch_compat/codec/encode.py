"""Encoder for ORT's ``ODTC`` checkpoint files, byte-exact with ORT's own writers.

Byte-exactness matters because users diff checkpoints, cache them by hash, and because
"re-saving an untouched ORT checkpoint yields the same file" is the simplest proof that we
write what ORT would.  Flatbuffers output depends on the *order* of builder calls, on which
default-valued fields are omitted, and on alignment bookkeeping, so this module follows the
recipe of spec section 1.4 call by call.  Policy (which tensors, in which order, sorted or
not) is *not* decided here: the encoder writes exactly what the record holds, in the order
it holds it; :mod:`.layout` builds records the way each ORT writer would.

Python's ``flatbuffers.Builder`` produces the same bytes as ORT's C++ builder given the
same call sequence, with one exception handled in :meth:`_Encoder.int64_vector`; the
:class:`.builder.SegmentBuilder` used here lays out the same bytes as that builder but
leaves tensor payloads where they are (the output is a list of segments, metadata and the
callers' own buffers), so a save streams the tensors to disk without copying them.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
import os
import struct
from typing import Callable, ContextManager, Dict, List, Optional, Tuple, Union

from ..atomic_files import AtomicSave
from .decode import Payload
from .dtypes import TensorDataType, element_size
from .records import CheckpointRecord, PropertyValue, TensorRecord
from .streaming_builder import Buffer, BuilderSizeError, SegmentBuilder

__all__ = ["encode_checkpoint", "encode_checkpoint_segments", "write_checkpoint", "external_alignment"]

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


#: Byte vectors at least this long are written from the caller's buffer, not copied (the
#: bytes of the file do not depend on it; tests set it to 0 and to "never").
HOLE_BYTES = 1 << 16


def _byte_view(raw: object) -> Buffer:
    """``raw_data`` as a flat byte buffer without copying it (bytes, or any C-contiguous
    buffer such as a numpy array or a memoryview of a tensor's storage)."""
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, Payload):  # a record of open_checkpoint, re-encoded inside its block
        return raw.tobytes()
    view = memoryview(raw)  # type: ignore[arg-type]
    if not view.c_contiguous:
        raise ValueError("raw_data must be a C-contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class _Encoder:
    """One encoding run: a segment builder plus the external-data segments.

    Payloads are referenced, not copied: the caller's buffers must stay unchanged until
    the segments are written."""

    def __init__(self, ext_min: Optional[int]) -> None:
        self.b = SegmentBuilder(HOLE_BYTES)
        self.ext_min = ext_min
        self.ext: Optional[List[Buffer]] = [] if ext_min is not None else None
        self.ext_size = 0

    # -- vectors --------------------------------------------------------------------------
    def int64_vector(self, values: Tuple[int, ...], what: str) -> int:
        b = self.b
        if not values:
            # ORT's C++ builder does not record alignment for an empty vector, so an empty
            # int64 vector must not raise minalign to 8 (it would add 4 bytes of padding
            # after the file identifier).  Announce it with 4-byte alignment instead.
            b.start_vector(8, 0, 4)
            return b.end_vector()
        checked = [_check_int(v, _INT64_MIN, _INT64_MAX, what) for v in values]
        b.start_vector(8, len(checked), 8)
        for v in reversed(checked):
            b.prepend_int64(v)
        return b.end_vector()

    def offset_vector(self, offsets: List[int]) -> int:
        b = self.b
        b.start_vector(4, len(offsets), 4)
        for off in reversed(offsets):
            b.prepend_uoffset(off)
        return b.end_vector()

    # -- tables ---------------------------------------------------------------------------
    def tensor(self, t: TensorRecord, may_go_external: bool) -> int:
        b = self.b
        if not isinstance(t.name, str):
            raise TypeError(f"tensor name must be a str, got {type(t.name).__name__}")
        what = f"tensor {t.name!r}"
        data_type = _check_int(t.data_type, _INT32_MIN, _INT32_MAX, f"{what} data_type")
        name = b.create_string(t.name)
        doc = b.create_string(t.doc_string) if t.doc_string else 0
        dims = self.int64_vector(tuple(t.dims), f"{what} dimension")

        is_string = data_type == TensorDataType.STRING
        strings = raw = 0
        ext_offset = -1
        if is_string:
            offs = [b.create_string(s) for s in (t.string_data or [])]
            strings = self.offset_vector(offs)
        else:
            payload = _byte_view(t.raw_data)
            if may_go_external and self.ext is not None and len(payload) >= self.ext_min:
                ext_offset = self._append_external(t, data_type, payload)
            else:
                raw = b.create_byte_vector(payload)

        b.start_object(7)
        b.add_offset(0, name)
        if doc:
            b.add_offset(1, doc)
        b.add_offset(2, dims)
        b.add_int32(3, data_type, 0)
        if is_string:
            b.add_offset(5, strings)
        elif ext_offset >= 0:
            b.add_int64(6, ext_offset, -1)
        else:
            b.add_offset(4, raw)
        return b.end_object()

    def _append_external(self, t: TensorRecord, data_type: int, payload: Buffer) -> int:
        assert self.ext is not None
        try:
            need = math.prod(int(d) for d in t.dims) * element_size(data_type)
        except ValueError:
            raise ValueError(f"tensor {t.name!r}: type {data_type} cannot be stored as external data") from None
        if any(int(d) < 0 for d in t.dims) or need != len(payload):
            # The reader derives the byte count from dims, so a mismatch could never decode.
            raise ValueError(
                f"tensor {t.name!r}: raw_data has {len(payload)} bytes but dims {tuple(t.dims)} "
                f"need {need}; it cannot be stored as external data"
            )
        padding = -self.ext_size % external_alignment(data_type)
        if padding:
            self.ext.append(bytes(padding))
        offset = self.ext_size + padding
        if len(payload):
            self.ext.append(payload)
        self.ext_size = offset + len(payload)
        return offset

    def module_state(self, ms) -> int:
        b = self.b
        req = [self.tensor(t, True) for t in ms.trainable]
        fro = [self.tensor(t, True) for t in ms.frozen]
        req_vec = self.offset_vector(req)
        fro_vec = self.offset_vector(fro)
        b.start_object(4)
        b.add_offset(0, req_vec)
        b.add_offset(1, fro_vec)
        b.add_bool(2, bool(ms.is_nominal), False)
        b.add_bool(3, self.ext is not None, False)
        return b.end_object()

    def optimizer_group(self, g) -> int:
        b = self.b
        states = []
        for st in g.states:
            moms = [self.tensor(m, False) for m in st.momentums]
            pname = b.create_string(st.param_name)
            mvec = self.offset_vector(moms)
            b.start_object(2)
            b.add_offset(0, pname)
            b.add_offset(1, mvec)
            states.append(b.end_object())
        gname = b.create_string(g.group_name)
        svec = self.offset_vector(states)
        step = _check_int(g.step, _INT64_MIN, _INT64_MAX, f"optimizer group {g.group_name!r} step")
        b.start_object(4)
        b.add_offset(0, gname)
        # ORT adds the learning rate before the step; the order changes the bytes.
        b.add_float32(2, _to_float32(g.initial_learning_rate), 0.0)
        b.add_int64(1, step, 0)
        b.add_offset(3, svec)
        return b.end_object()

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
            noff = b.create_string(name)
            if isinstance(value, str):
                voff = b.create_string(value)
                b.start_object(2)
                b.add_offset(0, noff)
                b.add_offset(1, voff)
                strs.append(b.end_object())
            elif isinstance(value, numbers.Integral):
                ival = _check_int(value, _INT64_MIN, _INT64_MAX, what)
                b.start_object(2)
                b.add_offset(0, noff)
                b.add_int64(1, ival, 0)
                ints.append(b.end_object())
            elif isinstance(value, numbers.Real):
                b.start_object(2)
                b.add_offset(0, noff)
                b.add_float32(1, _to_float32(value), 0.0)
                floats.append(b.end_object())
            else:
                raise TypeError(f"{what} must be int, float or str, got {type(value).__name__}")
        ivec = self.offset_vector(ints)
        fvec = self.offset_vector(floats)
        svec = self.offset_vector(strs)
        b.start_object(3)
        b.add_offset(0, ivec)
        b.add_offset(1, fvec)
        b.add_offset(2, svec)
        return b.end_object()

    def checkpoint(self, record: CheckpointRecord) -> List[Buffer]:
        b = self.b
        ms = self.module_state(record.module_state) if record.module_state is not None else 0
        groups = None
        if record.optimizer_groups is not None:
            groups = [self.optimizer_group(g) for g in record.optimizer_groups]
        pbag = self.property_bag(record.properties) if record.properties is not None else 0
        gvec = self.offset_vector(groups) if groups is not None else 0
        version = _check_int(record.version, _INT32_MIN, _INT32_MAX, "version")
        b.start_object(4)
        b.add_int32(0, version, 0)
        if ms:
            b.add_offset(1, ms)
        if groups is not None:
            b.add_offset(2, gvec)
        if pbag:
            b.add_offset(3, pbag)
        root = b.end_object()
        b.finish(root, b"ODTC")
        return b.segments()


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
    data is in use the second item is the (possibly empty) blob, else None.  (This joins
    :func:`encode_checkpoint_segments`' output; :func:`write_checkpoint` streams it.)
    """
    main, ext = encode_checkpoint_segments(record, external_min_bytes=external_min_bytes)
    return b"".join(main), (b"".join(ext) if ext is not None else None)


def encode_checkpoint_segments(
    record: CheckpointRecord, *, external_min_bytes: Optional[int] = None
) -> Tuple[List[Buffer], Optional[List[Buffer]]]:
    """Like :func:`encode_checkpoint`, but each file is a list of buffers in file order:
    metadata the encoder made, and the records' own ``raw_data`` buffers, not copied (they
    must stay unchanged until written)."""
    ext_min = external_min_bytes
    ms = record.module_state
    if ext_min is None and ms is not None and ms.has_external_data:
        ext_min = 0
    if ext_min is not None:
        # Without a ModuleState the flag has nowhere to go, but the (empty) blob is still
        # returned: ORT's state writer creates an empty .data file in that case too.
        ext_min = _check_int(ext_min, 0, _INT64_MAX, "external_min_bytes")
    enc = _Encoder(ext_min)
    try:
        main = enc.checkpoint(record)
    except BuilderSizeError as exc:
        raise ValueError(
            f"checkpoint too large for a flatbuffers file (2 GiB limit); use external data: {exc}"
        ) from None
    return main, enc.ext


RecordSource = Union[CheckpointRecord, Callable[[], CheckpointRecord]]


def write_checkpoint(
    record: RecordSource,
    path: Union[str, os.PathLike],
    *,
    external_min_bytes: Optional[int] = None,
    hold: Optional[ContextManager] = None,
) -> None:
    """Encode ``record`` and write it to ``path`` (and ``<path>.data``) atomically.

    The tensors' bytes are streamed from the records' buffers straight into temp files
    beside ``path`` (no copy of the payload is made), which are then fsynced and renamed
    into place.  With external data both files are written completely first and then
    renamed into place under a journal that the next load or save completes or rolls back
    after a crash (see :func:`ort_torch_compat.atomic_files.atomic_write_pair`).  A stale
    ``<path>.data`` is left alone when the new checkpoint is inline (ORT does the same; the
    reader ignores it because the flag is off).  Errors are the OSError of the failing
    call, naming ``path``; the previous file at ``path`` is untouched on failure.
    ``external_min_bytes`` is as in :func:`encode_checkpoint`.

    ``hold``, a context manager (e.g. the lock of the state the records view), is held
    while the record is built (``record`` may be a function returning it) and its bytes are
    written into the temp files; fsync and the renames happen after it is released.
    """
    target = os.fspath(path)
    if isinstance(target, bytes):
        target = os.fsdecode(target)
    if os.path.islink(target):
        target = os.path.realpath(target)  # write through the link, as ofstream would
    save = AtomicSave(target)
    with save:
        with hold if hold is not None else contextlib.nullcontext():
            rec = record() if callable(record) else record
            main, ext = encode_checkpoint_segments(rec, external_min_bytes=external_min_bytes)
            if ext is not None:
                save.write_data(ext)
            save.write_main(main)
