"""Verifying decoder for ORT's ``ODTC`` checkpoint files.

Checkpoints arrive from disks, downloads and other programs, so the decoder treats every
byte as untrusted: each offset, vtable, vector length and string length is checked against
the buffer *before* it is used.  The result is that any input (empty, cut short, random,
bit-flipped) either decodes or raises :class:`CheckpointFormatError`; it can never read out
of bounds, allocate memory in proportion to a lying length field, or run for long.

Why the decoder is written by hand instead of using generated flatbuffers accessors: those
accessors trust the buffer and fail with ``struct.error``/``IndexError`` (or silently read
garbage) on corrupt input, and Python has no flatbuffers Verifier.

Termination and memory are bounded because flatbuffers offsets (``uoffset_t``) only ever
point forward, so the object graph is acyclic, and because a work budget caps the total
number of tables visited and bytes copied at what a non-overlapping file of this size
could hold, which defeats "many references to one big blob" amplification.

Reading a file never loads it whole: the metadata is read in 64 KiB pages as the decoder
visits it (``_PagedFile``, with ``pread``, so a file cut short while it is read gives a
format error, where a memory map would crash the process), and ``open_checkpoint`` hands
out each tensor's bytes as a :class:`Payload` that the caller reads straight into the
tensor's own memory (``readinto``).  A load thus holds one copy of the data: the tensors.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
import struct
from typing import Dict, Iterator, List, Optional, Tuple, Union

from ..atomic_files import JournalError, stable_pair
from .dtypes import TensorDataType, dtype_name, element_size
from .errors import CheckpointFormatError
from .records import (
    CheckpointRecord,
    ModuleStateRecord,
    OptimizerGroupRecord,
    ParameterOptimizerStateRecord,
    PropertyValue,
    TensorRecord,
)

__all__ = [
    "decode_checkpoint",
    "read_checkpoint",
    "open_checkpoint",
    "Payload",
    "has_external_data",
    "FILE_IDENTIFIER",
    "SUPPORTED_VERSION",
]

FILE_IDENTIFIER = b"ODTC"
SUPPORTED_VERSION = 2

_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F32 = struct.Struct("<f")
_BOOL = struct.Struct("<B")

BytesLike = Union[bytes, bytearray, memoryview]


class _Table:
    """Position and vtable of one verified flatbuffers table."""

    __slots__ = ("pos", "vt", "vt_size", "size", "what")

    def __init__(self, pos: int, vt: int, vt_size: int, size: int, what: str) -> None:
        self.pos = pos
        self.vt = vt
        self.vt_size = vt_size
        self.size = size
        self.what = what


def _check_view(view: memoryview, nbytes: int) -> memoryview:
    view = memoryview(view)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if view.readonly or len(view) != nbytes:
        raise ValueError(f"readinto needs a writable buffer of {nbytes} bytes, got {len(view)}")
    return view


class _Blob:
    """Data held in memory (``decode_checkpoint(..., external_data=bytes)``)."""

    def __init__(self, data: memoryview) -> None:
        self.view = data
        self.size = len(data)

    def read(self, offset: int, nbytes: int) -> bytes:
        return bytes(self.view[offset : offset + nbytes])

    def readinto(self, offset: int, view: memoryview) -> None:
        view[:] = self.view[offset : offset + len(view)]


def _pread(fd: int, nbytes: int, offset: int) -> bytes:
    if hasattr(os, "pread"):
        return os.pread(fd, nbytes, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # pragma: no cover - Windows has no pread
    return os.read(fd, nbytes)


_READ_CHUNK = 1 << 26


class _FileBlob:
    """An open file of which only the ranges the main file declares are ever read, so a
    huge or sparse ``.data`` costs what the checkpoint needs, not its size."""

    def __init__(self, fd: int, size: int, source: str) -> None:
        self.fd = fd
        self.size = size
        self.source = source

    def _check_open(self) -> None:
        if self.fd < 0:
            raise ValueError(f"{self.source} was closed: read payloads inside open_checkpoint's block")

    def _short(self, offset: int) -> CheckpointFormatError:
        return CheckpointFormatError(self.source, f"truncated while reading (at offset {offset})")

    def read(self, offset: int, nbytes: int) -> bytes:
        self._check_open()
        chunk = _pread(self.fd, nbytes, offset) if nbytes else b""
        if len(chunk) == nbytes:
            return chunk
        out = bytearray(nbytes)
        self.readinto(offset, memoryview(out))
        return bytes(out)

    def readinto(self, offset: int, view: memoryview) -> None:
        """Fill ``view`` (a writable byte buffer) from ``offset``: the file's bytes land in
        the caller's memory directly (``preadv``), with no intermediate buffer."""
        self._check_open()
        done, nbytes = 0, len(view)
        while done < nbytes:
            part = view[done : done + _READ_CHUNK]
            if hasattr(os, "preadv"):
                got = os.preadv(self.fd, [part], offset + done)
            else:  # pragma: no cover - no preadv (macOS < 11, Windows)
                chunk = _pread(self.fd, len(part), offset + done)
                got = len(chunk)
                part[:got] = chunk
            if got <= 0:
                raise self._short(offset + done)
            done += got

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _PagedFile(_FileBlob):
    """The main file, read in pages as the decoder visits its metadata (pages are kept:
    the metadata is small, and tensor bytes beyond a page are read on demand)."""

    PAGE = 1 << 16

    def __init__(self, fd: int, size: int, source: str) -> None:
        super().__init__(fd, size, source)
        self.pages: Dict[int, bytes] = {}

    def __len__(self) -> int:
        return self.size

    def _page(self, index: int) -> bytes:
        page = self.pages.get(index)
        if page is None:
            start = index * self.PAGE
            page = self.read(start, min(self.PAGE, self.size - start))
            self.pages[index] = page
        return page

    def span(self, pos: int, nbytes: int) -> bytes:
        first, last = pos // self.PAGE, (pos + nbytes - 1) // self.PAGE
        if nbytes <= 0:
            return b""
        if first == last:
            page = self._page(first)
            start = pos - first * self.PAGE
            return page[start : start + nbytes]
        if last - first > 4:
            return self.read(pos, nbytes)  # a big payload: not worth caching
        joined = b"".join(self._page(i) for i in range(first, last + 1))
        start = pos - first * self.PAGE
        return joined[start : start + nbytes]

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self.span(key.start, key.stop - key.start)
        page = self._page(key // self.PAGE)
        return page[key % self.PAGE]

    def unpack_from(self, fmt: struct.Struct, pos: int):
        index = pos // self.PAGE
        start = pos - index * self.PAGE
        if start + fmt.size <= self.PAGE:
            return fmt.unpack_from(self._page(index), start)
        return fmt.unpack(self.span(pos, fmt.size))


class Payload:
    """The bytes of one tensor in an open checkpoint (``open_checkpoint``): ``len()`` is
    their size; ``readinto(buffer)`` reads them into a writable buffer of that size (e.g.
    the memory of the tensor that will hold them), ``tobytes()`` returns a copy."""

    __slots__ = ("_source", "_offset", "_nbytes")

    def __init__(self, source: Union[_Blob, _FileBlob], offset: int, nbytes: int) -> None:
        self._source = source
        self._offset = offset
        self._nbytes = nbytes

    def __len__(self) -> int:
        return self._nbytes

    def readinto(self, buffer) -> None:
        if self._nbytes:
            self._source.readinto(self._offset, _check_view(buffer, self._nbytes))

    def tobytes(self) -> bytes:
        return self._source.read(self._offset, self._nbytes) if self._nbytes else b""

    def __repr__(self) -> str:
        return f"Payload({self._nbytes} bytes at offset {self._offset})"


class _Reader:
    """Bounds-checked primitive reads over one buffer; every failure is a format error."""

    def __init__(
        self,
        data: Union[memoryview, _PagedFile],
        source: str,
        ext: Optional[Union[_Blob, _FileBlob]],
        ext_source: str,
        lazy: bool = False,
    ) -> None:
        self.buf = data
        self.n = len(data)
        self.lazy = lazy  # tensor bytes as Payloads (read later) instead of bytes
        if isinstance(data, _PagedFile):
            self.main = data
            self.unpack = data.unpack_from
        else:
            self.main = _Blob(data)
            self.unpack = lambda fmt, pos: fmt.unpack_from(data, pos)
        self.source = source
        self.ext = ext
        self.ext_source = ext_source
        self.ext_allowed = False  # set from ModuleState.has_external_data
        # A well-formed file cannot hold more distinct tables than 4-byte slots, nor more
        # payload than its own size plus the external blob.
        self.tables_left = self.n // 4 + 1
        self.bytes_left = self.n + (ext.size if ext is not None else 0)

    # -- errors -------------------------------------------------------------------------
    def fail(self, reason: str) -> CheckpointFormatError:
        return CheckpointFormatError(self.source, reason)

    def need(self, pos: int, size: int, what: str) -> None:
        if pos < 0 or size < 0 or pos + size > self.n:
            raise self.fail(f"truncated: {what} needs {size} bytes at offset {pos} but the file has {self.n}")

    def spend(self, nbytes: int, what: str) -> None:
        self.bytes_left -= nbytes
        if self.bytes_left < 0:
            raise self.fail(f"{what}: objects overlap (the file references more data than it holds)")

    # -- scalars ------------------------------------------------------------------------
    def u16(self, pos: int, what: str) -> int:
        self.need(pos, 2, what)
        return self.unpack(_U16, pos)[0]

    def i32(self, pos: int, what: str) -> int:
        self.need(pos, 4, what)
        return self.unpack(_I32, pos)[0]

    def u32(self, pos: int, what: str) -> int:
        self.need(pos, 4, what)
        return self.unpack(_U32, pos)[0]

    # -- structure ----------------------------------------------------------------------
    def table(self, pos: int, what: str) -> _Table:
        self.tables_left -= 1
        if self.tables_left < 0:
            raise self.fail(f"{what}: objects overlap (more tables than the file can hold)")
        soff = self.i32(pos, f"{what} table")
        vt = pos - soff
        vt_size = self.u16(vt, f"{what} vtable")
        size = self.u16(vt + 2, f"{what} vtable")
        if vt_size < 4 or vt_size % 2:
            raise self.fail(f"{what}: bad vtable size {vt_size} at offset {vt}")
        self.need(vt, vt_size, f"{what} vtable")
        if size < 4:
            raise self.fail(f"{what}: bad table size {size} at offset {pos}")
        self.need(pos, size, f"{what} table")
        return _Table(pos, vt, vt_size, size, what)

    def field(self, t: _Table, slot: int, size: int, name: str) -> Optional[int]:
        """Absolute position of field ``slot`` or None when the field is absent."""
        voff = 4 + 2 * slot
        if voff + 2 > t.vt_size:
            return None
        off = self.unpack(_U16, t.vt + voff)[0]
        if off == 0:
            return None
        if off < 4 or off + size > t.size:
            raise self.fail(f"{t.what} {name}: field offset {off} lies outside its {t.size}-byte table")
        return t.pos + off

    def scalar(self, t: _Table, slot: int, fmt: struct.Struct, default, name: str):
        p = self.field(t, slot, fmt.size, name)
        if p is None:
            return default
        return self.unpack(fmt, p)[0]

    def deref(self, p: int, what: str) -> int:
        off = self.u32(p, what)
        if off == 0 or off >= 0x80000000:
            raise self.fail(f"{what}: invalid offset {off} at {p}")
        target = p + off
        self.need(target, 4, what)
        return target

    def vector(self, t: _Table, slot: int, elem: int, name: str) -> Optional[Tuple[int, int]]:
        """(start of elements, count) of a vector field, or None when absent."""
        p = self.field(t, slot, 4, name)
        if p is None:
            return None
        what = f"{t.what} {name}"
        target = self.deref(p, what)
        count = self.u32(target, what)
        self.need(target + 4, count * elem, what if elem == 1 else f"{what} ({count} elements)")
        return target + 4, count

    def string_at(self, target: int, what: str) -> str:
        length = self.u32(target, what)
        self.need(target + 4, length + 1, f"{what} ({length}-byte string)")
        if self.buf[target + 4 + length] != 0:
            raise self.fail(f"{what}: string is not null-terminated")
        self.spend(length, what)
        raw = bytes(self.buf[target + 4 : target + 4 + length])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what}: string is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None

    def string(self, t: _Table, slot: int, name: str) -> Optional[str]:
        p = self.field(t, slot, 4, name)
        if p is None:
            return None
        what = f"{t.what} {name}"
        return self.string_at(self.deref(p, what), what)

    def tables(self, t: _Table, slot: int, name: str) -> Optional[List[_Table]]:
        vec = self.vector(t, slot, 4, name)
        if vec is None:
            return None
        start, count = vec
        out = []
        for i in range(count):
            what = f"{t.what} {name}[{i}]"
            out.append(self.table(self.deref(start + 4 * i, what), what))
        return out


# ---------------------------------------------------------------------------------------
# Schema-level decoding
# ---------------------------------------------------------------------------------------
def _tensor(r: _Reader, t: _Table) -> TensorRecord:
    name = r.string(t, 0, "name")
    if name is None:
        raise r.fail(f"{t.what}: tensor has no name")
    t.what = f"tensor {name!r}"
    doc = r.string(t, 1, "doc_string") or ""
    dims_vec = r.vector(t, 2, 8, "dims")
    if dims_vec is None:
        raise r.fail(f"tensor {name!r}: dims are missing")
    start, count = dims_vec
    r.spend(8 * count, f"tensor {name!r} dims")
    dims = r.unpack(struct.Struct(f"<{count}q"), start) if count else ()
    data_type = r.scalar(t, 3, _I32, 0, "data_type")

    string_data: Optional[List[str]] = None
    sv = r.vector(t, 5, 4, "string_data")
    if sv is not None:
        s_start, s_count = sv
        string_data = []
        for i in range(s_count):
            what = f"tensor {name!r} string_data[{i}]"
            string_data.append(r.string_at(r.deref(s_start + 4 * i, what), what))
    if data_type == TensorDataType.STRING:
        return TensorRecord(name, data_type, tuple(dims), b"", doc, string_data if string_data is not None else [])

    ext_offset = r.scalar(t, 6, _I64, -1, "external_data_offset")
    if ext_offset >= 0:
        raw = _external_payload(r, name, data_type, dims, ext_offset)
    else:
        rv = r.vector(t, 4, 1, "raw_data")
        if rv is None:
            raise r.fail(f"tensor {name!r}: has neither raw_data nor external_data_offset")
        r_start, r_count = rv
        r.spend(r_count, f"tensor {name!r} raw_data")
        raw = Payload(r.main, r_start, r_count) if r.lazy else bytes(r.buf[r_start : r_start + r_count])
    return TensorRecord(name, data_type, tuple(dims), raw, doc, string_data)


def _external_payload(r: _Reader, name: str, data_type: int, dims, offset: int) -> Union[bytes, Payload]:
    if not r.ext_allowed:
        raise r.fail(f"tensor {name!r} has external_data_offset {offset} but the module state has no external data")
    if r.ext is None:
        raise r.fail(f"tensor {name!r} lives in external data (offset {offset}) but no external data was given")
    try:
        size = element_size(data_type)
    except ValueError:
        raise r.fail(f"tensor {name!r}: external data of type {dtype_name(data_type)} has no defined size") from None
    if any(d < 0 for d in dims):
        raise r.fail(f"tensor {name!r}: negative dimension in {list(dims)}")
    nbytes = math.prod(dims) * size
    have = r.ext.size
    if offset + nbytes > have:
        raise CheckpointFormatError(
            r.ext_source,
            f"truncated: tensor {name!r} external data needs {nbytes} bytes at offset {offset} but the file has {have}",
        )
    r.spend(nbytes, f"tensor {name!r} external data")
    return Payload(r.ext, offset, nbytes) if r.lazy else r.ext.read(offset, nbytes)


def _tensor_list(r: _Reader, t: _Table, slot: int, name: str) -> List[TensorRecord]:
    tabs = r.tables(t, slot, name)
    return [_tensor(r, tt) for tt in tabs] if tabs else []


def _module_state(r: _Reader, t: _Table) -> ModuleStateRecord:
    is_nominal = bool(r.scalar(t, 2, _BOOL, False, "is_nominal_state"))
    has_ext = bool(r.scalar(t, 3, _BOOL, False, "has_external_data"))
    r.ext_allowed = has_ext
    trainable = _tensor_list(r, t, 0, "requires_grad_params")
    frozen = _tensor_list(r, t, 1, "frozen_params")
    return ModuleStateRecord(trainable, frozen, is_nominal, has_ext)


def _optimizer_group(r: _Reader, t: _Table) -> OptimizerGroupRecord:
    group_name = r.string(t, 0, "group_name") or ""
    t.what = f"optimizer group {group_name!r}"
    step = r.scalar(t, 1, _I64, 0, "step")
    lr = r.scalar(t, 2, _F32, 0.0, "initial_learning_rate")
    states = []
    for st in r.tables(t, 3, "optimizer_states") or []:
        param_name = r.string(st, 0, "param_name") or ""
        st.what = f"optimizer state of {param_name!r}"
        states.append(ParameterOptimizerStateRecord(param_name, _tensor_list(r, st, 1, "momentums")))
    return OptimizerGroupRecord(group_name, step, lr, states)


def _properties(r: _Reader, t: _Table) -> Dict[str, PropertyValue]:
    out: Dict[str, PropertyValue] = {}
    for slot, kind in ((0, "ints"), (1, "floats"), (2, "strings")):
        for pt in r.tables(t, slot, kind) or []:
            name = r.string(pt, 0, "name")
            if name is None:
                raise r.fail(f"{pt.what}: property has no name")
            pt.what = f"property {name!r}"
            if kind == "ints":
                value: PropertyValue = r.scalar(pt, 1, _I64, 0, "value")
            elif kind == "floats":
                value = r.scalar(pt, 1, _F32, 0.0, "value")
            else:
                value = r.string(pt, 1, "value") or ""
            out[name] = value
    return out


def _what_it_is(head) -> str:
    """A guess at what a file that is not a checkpoint is, for the error message."""
    start = bytes(head[:9])
    if start[4:8] == b"ORTM":
        return ": this is an ORT-format model (.ort), not a checkpoint; pass the artifacts' `checkpoint` file"
    if start[:1] == b"\x08":
        return ": this looks like an ONNX model (protobuf), not a checkpoint; pass the artifacts' `checkpoint` file"
    if start[:4] == b"PK\x03\x04":
        return ": this is a zip archive (a PyTorch .pt file?); convert it with `ort-torch-compat from-torch`"
    if start[:1] == b"{" or start[8:9] == b"{":
        return ": this looks like JSON or a safetensors file; convert it with `ort-torch-compat from-torch`"
    return ""


def _root(r: _Reader) -> _Table:
    """Check the header, identifier and version; return the verified root table."""
    if r.n == 0:
        raise r.fail("empty file")
    if r.n < 8:
        raise r.fail(f"truncated: {r.n} bytes is too short for the 8-byte flatbuffers header")
    ident = bytes(r.buf[4:8])
    if ident != FILE_IDENTIFIER:
        raise r.fail(
            f"wrong file identifier {ident!r} (expected {FILE_IDENTIFIER!r}){_what_it_is(r.buf[0 : min(r.n, 9)])}"
        )
    root = r.table(r.deref(0, "root offset"), "checkpoint")
    version = r.scalar(root, 0, _I32, 0, "version")
    if version != SUPPORTED_VERSION:
        raise r.fail(f"Checkpoint version {version} is not supported")
    return root


def _as_view(data: BytesLike) -> memoryview:
    mv = memoryview(data)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def has_external_data(data: BytesLike, *, source: str = "<buffer>") -> bool:
    """Whether the checkpoint's module state sets ``has_external_data``.

    Reads only the header, root table and module-state table, so a caller can decide
    whether the ``.data`` companion is needed before decoding the whole file.
    """
    return _has_external(_Reader(_as_view(data), source, None, ""))


def _has_external(r: "_Reader") -> bool:
    root = _root(r)
    ms = r.field(root, 1, 4, "module_state")
    if ms is None:
        return False
    t = r.table(r.deref(ms, "module_state"), "module_state")
    return bool(r.scalar(t, 3, _BOOL, False, "has_external_data"))


def decode_checkpoint(
    data: BytesLike,
    *,
    source: str = "<buffer>",
    external_data: Optional[BytesLike] = None,
    external_source: Optional[str] = None,
    lazy: bool = False,
) -> CheckpointRecord:
    """Decode checkpoint bytes into a :class:`CheckpointRecord`.

    ``source`` only names the input in error messages (``external_source`` names the
    external blob; it defaults to ``<source>.data``).  ``external_data`` is the content of
    the ``<checkpoint>.data`` companion; it is required when the module state says
    ``has_external_data`` and ignored otherwise, as ORT ignores a stale ``.data`` file.
    Tensors read from it come back with their bytes in ``raw_data`` and the record keeps
    ``has_external_data=True``, so re-encoding reproduces the same layout.  Raises
    :class:`CheckpointFormatError` for anything that is not a valid version-2 checkpoint.
    ``lazy=True``: non-string tensors' ``raw_data`` are :class:`Payload` views of the given
    buffers (valid while they are; nothing is copied until the caller reads them).
    """
    if external_source is None:
        external_source = f"{source}.data" if source != "<buffer>" else "<external buffer>"
    blob = _Blob(_as_view(external_data)) if external_data is not None else None
    return _decode(_as_view(data), source, blob, external_source, lazy)


def _decode(
    data: Union[memoryview, _PagedFile],
    source: str,
    ext: Optional[Union[_Blob, _FileBlob]],
    external_source: str,
    lazy: bool = False,
) -> CheckpointRecord:
    r = _Reader(data, source, ext, external_source, lazy)
    root = _root(r)
    record = CheckpointRecord(version=SUPPORTED_VERSION)
    ms = r.field(root, 1, 4, "module_state")
    if ms is not None:
        record.module_state = _module_state(r, r.table(r.deref(ms, "module_state"), "module_state"))
    groups = r.tables(root, 2, "optimizer_groups")
    if groups is not None:
        record.optimizer_groups = [_optimizer_group(r, g) for g in groups]
    pb = r.field(root, 3, 4, "property_bag")
    if pb is not None:
        record.properties = _properties(r, r.table(r.deref(pb, "property_bag"), "property_bag"))
    return record


def read_checkpoint(path: Union[str, os.PathLike], *, allow_external_symlinks: bool = False) -> CheckpointRecord:
    """Read and decode the checkpoint at ``path`` (plus ``<path>.data`` when it has external data).

    Both files are opened while no save of ``path`` is between its renames, and a save that
    was interrupted is completed or rolled back first (`ort_torch_compat.atomic_files`), so
    the two always come from one save.  A missing ``path`` raises FileNotFoundError and a
    directory IsADirectoryError, naming the path.  The ``.data`` companion must be a regular
    file (a FIFO would block, a device never end) inside the checkpoint's folder: a symlink
    out of it is refused unless ``allow_external_symlinks``; only the byte ranges the main
    file declares are read.  A missing, short or refused ``.data`` raises
    :class:`CheckpointFormatError` naming it: the checkpoint is incomplete.
    """
    files: List[_FileBlob] = []
    try:
        return _open(path, allow_external_symlinks, False, files)
    finally:
        for file in files:
            file.close()


@contextlib.contextmanager
def open_checkpoint(
    path: Union[str, os.PathLike], *, allow_external_symlinks: bool = False
) -> Iterator[CheckpointRecord]:
    """Like :func:`read_checkpoint`, as a context manager whose record holds each non-string
    tensor's bytes as a :class:`Payload`, to be read (``readinto``) inside the block,
    straight into the memory that keeps them: the whole file is never in memory.

    The metadata is decoded and verified before the block starts, so a malformed file
    raises here; a file cut short while its payloads are read raises
    :class:`CheckpointFormatError` from ``readinto``.
    """
    files: List[_FileBlob] = []
    try:
        yield _open(path, allow_external_symlinks, True, files)
    finally:
        for file in files:
            file.close()


def _open(
    path: Union[str, os.PathLike], allow_external_symlinks: bool, lazy: bool, files: List[_FileBlob]
) -> CheckpointRecord:
    """Decode ``path``; the files it opens are appended to ``files`` for the caller to close."""
    path = os.fspath(path)
    source = os.fsdecode(path)
    data_path = source + ".data"
    blob = None
    try:
        with stable_pair(source):
            main = _open_regular_file(source)
            files.append(main)
            if _has_external(_Reader(main, source, None, "")):
                blob = _open_companion(source, data_path, allow_external_symlinks)
                files.append(blob)
        return _decode(main, source, blob, data_path, lazy)
    except JournalError as error:
        raise CheckpointFormatError(source, str(error)) from None


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _open_regular_file(source: str) -> _PagedFile:
    """The main file, opened for paged reads; O_NONBLOCK so that opening a FIFO cannot hang
    before we refuse it."""
    fd = os.open(source, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", source)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointFormatError(source, f"not a regular file ({_kind(st.st_mode)})")
    except BaseException:
        os.close(fd)
        raise
    return _PagedFile(fd, st.st_size, source)


def _open_companion(source: str, data_path: str, allow_external_symlinks: bool) -> _FileBlob:
    try:
        is_link = os.path.islink(data_path)
        if is_link and not allow_external_symlinks:
            folder = os.path.realpath(os.path.dirname(source) or ".")
            target = os.path.realpath(data_path)
            if os.path.commonpath([folder, target]) != folder:
                raise CheckpointFormatError(
                    source,
                    f"its data file {data_path} is a symlink to {target}, outside the checkpoint's folder "
                    "(pass allow_external_symlinks=True to read it)",
                )
            fd = os.open(target, _OPEN_FLAGS | getattr(os, "O_NOFOLLOW", 0))
        else:
            fd = os.open(data_path, _OPEN_FLAGS | (0 if is_link else getattr(os, "O_NOFOLLOW", 0)))
    except FileNotFoundError:
        raise CheckpointFormatError(source, f"has external data but its data file {data_path} does not exist") from None
    except OSError as exc:
        raise CheckpointFormatError(source, f"cannot read its data file {data_path}: {exc.strerror or exc}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CheckpointFormatError(
            source, f"cannot read its data file {data_path}: {_kind(st.st_mode)}, not a regular file"
        )
    return _FileBlob(fd, st.st_size, data_path)
