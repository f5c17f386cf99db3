"""A flatbuffers builder that keeps large byte vectors out of its buffer.

The checkpoint encoder used ``flatbuffers.Builder``, which copies every tensor's bytes into
one contiguous buffer (grown by doubling), from which the file was then copied once more:
three copies of a model's weights and moments in memory at the peak of a save.  This
builder lays out exactly the same bytes (the same call sequence gives the same output as
``flatbuffers.Builder`` 25.x: same alignment, padding and vtable deduplication), but a byte
vector of at least ``hole_bytes`` is not copied: it becomes a *hole*, a reference to the
caller's buffer at its place in the output.  The result is a list of segments, in file
order, that the writer streams to disk, so the metadata is all that is ever buffered.

Only what the checkpoint encoder needs is here.  Vtables are deduplicated by content (as
the Python builder does; C++ produces the same bytes for ORT's call sequence), and no
byte once written is read back, so the flushed metadata before a hole is final.
"""

from __future__ import annotations

import struct
from typing import List, Optional, Union

__all__ = ["SegmentBuilder", "BuilderSizeError", "MAX_SIZE", "Buffer"]

Buffer = Union[bytes, bytearray, memoryview]

#: flatbuffers' limit (``flatbuffers.Builder.MAX_BUFFER_SIZE``): offsets are 32-bit.
MAX_SIZE = 2**31

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F32 = struct.Struct("<f")
_VTABLE_METADATA_FIELDS = 2


class BuilderSizeError(ValueError):
    """The output would exceed flatbuffers' 2 GiB limit."""


class SegmentBuilder:
    """Back-to-front flatbuffers builder whose output is ``segments()`` (file order)."""

    def __init__(self, hole_bytes: int = 1 << 16) -> None:
        self.hole_bytes = hole_bytes
        self.buf = bytearray(1024)
        self.head = len(self.buf)
        self.flushed = 0  # bytes (metadata and holes) already moved to `_tail`
        self._tail: List[Buffer] = []  # back to front
        self.minalign = 1
        self.vtables: dict = {}
        self.current_vtable: Optional[List[int]] = None
        self.object_end = 0
        self.nested = False
        self.vector_num_elems = 0

    # -- buffer ------------------------------------------------------------------------------
    def offset(self) -> int:
        """Bytes written so far (flatbuffers' ``Offset()``: distance from the end)."""
        return self.flushed + len(self.buf) - self.head

    def _room(self, needed: int) -> None:
        if self.offset() + needed > MAX_SIZE:
            raise BuilderSizeError("flatbuffers: cannot grow buffer beyond 2 gigabytes")
        while self.head < needed:
            old = len(self.buf)
            grown = bytearray(old * 2)
            grown[old:] = self.buf
            self.buf = grown
            self.head += old

    def prep(self, size: int, additional: int, reserve: bool = True) -> None:
        """Align so that ``size`` is aligned after ``additional`` more bytes (flatbuffers' Prep).

        ``reserve=False`` makes room for the padding and ``size`` only: the ``additional``
        bytes are a hole that never enters the buffer."""
        if size > self.minalign:
            self.minalign = size
        align = (-(self.offset() + additional)) & (size - 1)
        self._room(align + size + (additional if reserve else 0))
        if not reserve and self.offset() + align + additional + size > MAX_SIZE:
            raise BuilderSizeError("flatbuffers: cannot grow buffer beyond 2 gigabytes")
        self.pad(align)

    def pad(self, n: int) -> None:
        if n > 0:
            self.head -= n
            self.buf[self.head : self.head + n] = bytes(n)

    def place(self, fmt: struct.Struct, value) -> None:
        self.head -= fmt.size
        fmt.pack_into(self.buf, self.head, value)

    def prepend(self, fmt: struct.Struct, value) -> None:
        self.prep(fmt.size, 0)
        self.place(fmt, value)

    def prepend_int64(self, value: int) -> None:
        self.prepend(_I64, value)

    def _relative(self, off: int) -> int:
        self.prep(4, 0)
        if not off <= self.offset():
            raise ValueError("flatbuffers: Offset arithmetic error.")
        return self.offset() - off + 4

    def prepend_uoffset(self, off: int) -> None:
        self.place(_U32, self._relative(off))

    # -- vectors and strings -------------------------------------------------------------------
    def start_vector(self, elem_size: int, count: int, alignment: int) -> int:
        self._not_nested()
        self.nested = True
        self.vector_num_elems = count
        self.prep(4, elem_size * count)
        self.prep(alignment, elem_size * count)
        return self.offset()

    def end_vector(self) -> int:
        if not self.nested:
            raise ValueError("flatbuffers: end_vector outside a vector")
        self.nested = False
        self.place(_U32, self.vector_num_elems)
        self.vector_num_elems = 0
        return self.offset()

    def create_string(self, text: str) -> int:
        self._not_nested()
        self.nested = True
        data = text.encode("utf-8")
        self.prep(4, len(data) + 1)
        self.place(_U8, 0)
        self.head -= len(data)
        self.buf[self.head : self.head + len(data)] = data
        self.vector_num_elems = len(data)
        return self.end_vector()

    def create_byte_vector(self, data: Buffer) -> int:
        """A ``[ubyte]`` vector; ``data`` (a byte buffer) is referenced, not copied, when it is
        at least ``hole_bytes`` long, so it must not change until the output is written."""
        self._not_nested()
        self.nested = True
        n = len(data)
        if n >= self.hole_bytes:
            self.prep(4, n, reserve=False)
            self._tail.append(bytes(self.buf[self.head :]))
            self._tail.append(data)
            self.flushed += len(self.buf) - self.head + n
            self.head = len(self.buf)  # room for the length prefix: the buffer is >= 1024 bytes
        else:
            self.prep(4, n)
            self.head -= n
            self.buf[self.head : self.head + n] = data
        self.vector_num_elems = n
        return self.end_vector()

    # -- tables --------------------------------------------------------------------------------
    def start_object(self, fields: int) -> None:
        self._not_nested()
        self.current_vtable = [0] * fields
        self.object_end = self.offset()
        self.nested = True

    def slot(self, index: int) -> None:
        self.current_vtable[index] = self.offset()

    def add_scalar(self, index: int, fmt: struct.Struct, value, default) -> None:
        if value != default:
            self.prepend(fmt, value)
            self.slot(index)

    def add_bool(self, index: int, value: bool, default: bool = False) -> None:
        self.add_scalar(index, _U8, int(bool(value)), int(default))

    def add_int32(self, index: int, value: int, default: int = 0) -> None:
        self.add_scalar(index, _I32, value, default)

    def add_int64(self, index: int, value: int, default: int = 0) -> None:
        self.add_scalar(index, _I64, value, default)

    def add_float32(self, index: int, value: float, default: float = 0.0) -> None:
        self.add_scalar(index, _F32, value, default)

    def add_offset(self, index: int, off: int) -> None:
        if off != 0:
            self.prepend_uoffset(off)
            self.slot(index)

    def end_object(self) -> int:
        if not self.nested or self.current_vtable is None:
            raise ValueError("flatbuffers: end_object outside an object")
        self.nested = False
        # The object's soffset to its vtable, patched below (flatbuffers' WriteVtable).
        self.place_soffset_placeholder()
        object_offset = self.offset()
        key = []
        trim = True
        for elem in reversed(self.current_vtable):
            if elem == 0:
                if trim:
                    continue
            else:
                elem = object_offset - elem
                trim = False
            key.append(elem)
        object_size = object_offset - self.object_end
        key.append(object_size)
        key_t = tuple(key)
        found = self.vtables.get(key_t)
        if found is None:
            trailing = 0
            trim = True
            for elem in reversed(self.current_vtable):
                off = 0
                if elem == 0:
                    if trim:
                        trailing += 1
                        continue
                else:
                    off = object_offset - elem
                    trim = False
                self.prepend(_U16, off)
            self.prepend(_U16, object_size)
            self.prepend(_U16, (len(self.current_vtable) - trailing + _VTABLE_METADATA_FIELDS) * 2)
            start = len(self.buf) - (object_offset - self.flushed)
            _I32.pack_into(self.buf, start, self.offset() - object_offset)
            self.vtables[key_t] = self.offset()
        else:
            start = len(self.buf) - (object_offset - self.flushed)
            self.head = start
            _I32.pack_into(self.buf, start, found - object_offset)
        self.current_vtable = None
        return object_offset

    def place_soffset_placeholder(self) -> None:
        self.prep(4, 0)
        self.place(_I32, 0)

    def finish(self, root: int, file_identifier: bytes) -> None:
        self.prep(self.minalign, 8)
        self.prep(4, 4)
        for byte in reversed(file_identifier):
            self.place(_U8, byte)
        self.prepend_uoffset(root)

    # -- output --------------------------------------------------------------------------------
    def segments(self) -> List[Buffer]:
        """The finished file as buffers in file order (holes are the callers' own buffers)."""
        out: List[Buffer] = [bytes(self.buf[self.head :])]
        out.extend(reversed(self._tail))
        return [segment for segment in out if len(segment)]

    def _not_nested(self) -> None:
        if self.nested:
            raise ValueError("flatbuffers: object serialization must not be nested")
