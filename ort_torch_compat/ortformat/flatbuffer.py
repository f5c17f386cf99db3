"""A bounds-checked reader of flatbuffers tables (the wire format of ORT-format models).

The `flatbuffers` runtime's `Table` trusts every offset in the buffer: a damaged file makes it
read past the end (an IndexError far from the cause) or, with a huge vector length, loop for a
very long time.  This reader checks every offset and length against the buffer before using
it, and charges everything it hands out against a budget proportional to the buffer's size, so
that a file whose offsets share one large object many times cannot expand into a huge model.
Every problem is a `FlatbufferError` saying where it was found.

Layout (https://flatbuffers.dev/internals/): a table starts with an int32 offset back to its
vtable; the vtable holds uint16 sizes then one uint16 per field (0: absent) giving the field's
position inside the table.  Strings, vectors and sub-tables are reached by a uint32 offset from
the place the offset is stored, always forwards; a vector or string starts with its uint32
element count.
"""

from __future__ import annotations

import struct
from typing import List, Optional

_U8 = struct.Struct("<B")
_I8 = struct.Struct("<b")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F32 = struct.Struct("<f")
SCALARS = {"u8": _U8, "i8": _I8, "u16": _U16, "i32": _I32, "u32": _U32, "i64": _I64, "f32": _F32}


class FlatbufferError(ValueError):
    """The buffer is not a well-formed flatbuffer (offset or length out of range, budget spent)."""


class Buffer:
    """The bytes of one flatbuffer plus the work budget that all tables read from it share."""

    def __init__(self, data: bytes, budget_factor: int = 8, budget_floor: int = 1 << 16):
        self.data = bytes(data)
        self.size = len(self.data)
        # Elements and bytes handed out in all: a well-formed file reads each item about once,
        # so a few times its size is generous; sharing tricks hit the ceiling instead of memory.
        self.budget = budget_factor * self.size + budget_floor

    def charge(self, amount: int, what: str) -> None:
        self.budget -= amount
        if self.budget < 0:
            raise FlatbufferError(
                f"{what}: the file refers to more data than it holds (shared or repeated objects beyond any real model)"
            )

    def check(self, position: int, length: int, what: str) -> None:
        if position < 0 or length < 0 or position + length > self.size:
            raise FlatbufferError(
                f"{what}: {length} byte(s) at offset {position} lie outside the {self.size}-byte file"
            )

    def scalar(self, kind: str, position: int, what: str):
        packer = SCALARS[kind]
        self.check(position, packer.size, what)
        return packer.unpack_from(self.data, position)[0]

    def follow(self, position: int, what: str) -> int:
        """The position a uint32 offset stored at `position` points to."""
        target = position + self.scalar("u32", position, what)
        self.check(target, 4, what)
        return target

    def root(self, what: str) -> "Table":
        return Table(self, self.follow(0, what), what)


class Table:
    """One flatbuffers table: fields are read by their vtable slot (4, 6, 8, ... as in the
    generated bindings), each one bounds-checked."""

    __slots__ = ("buf", "pos", "what", "_vtable", "_vtable_size", "_table_size")

    def __init__(self, buf: Buffer, pos: int, what: str):
        self.buf, self.pos, self.what = buf, pos, what
        buf.charge(1, what)
        vtable = pos - buf.scalar("i32", pos, f"{what} (table header)")
        self._vtable_size = buf.scalar("u16", vtable, f"{what} (vtable)")
        self._table_size = buf.scalar("u16", vtable + 2, f"{what} (vtable)")
        if self._vtable_size < 4 or self._vtable_size % 2:
            raise FlatbufferError(f"{what}: vtable size {self._vtable_size} is invalid")
        buf.check(vtable, self._vtable_size, f"{what} (vtable)")
        buf.check(pos, max(self._table_size, 4), f"{what} (table)")
        self._vtable = vtable

    def _field(self, slot: int, size: int) -> Optional[int]:
        """Absolute position of the field in `slot`, or None when absent."""
        if slot >= self._vtable_size:
            return None
        offset = self.buf.scalar("u16", self._vtable + slot, f"{self.what} (vtable)")
        if offset == 0:
            return None
        if offset + size > self._table_size:
            raise FlatbufferError(f"{self.what}: field at slot {slot} lies outside its table")
        return self.pos + offset

    def has(self, slot: int) -> bool:
        return self._field(slot, 1) is not None

    def scalar(self, slot: int, kind: str, default=0):
        position = self._field(slot, SCALARS[kind].size)
        if position is None:
            return default
        return self.buf.scalar(kind, position, f"{self.what} field {slot}")

    def _target(self, slot: int) -> Optional[int]:
        position = self._field(slot, 4)
        if position is None:
            return None
        return self.buf.follow(position, f"{self.what} field {slot}")

    def table(self, slot: int, what: str) -> Optional["Table"]:
        target = self._target(slot)
        return None if target is None else Table(self.buf, target, what)

    def _bytes_at(self, start: int, what: str) -> bytes:
        length = self.buf.scalar("u32", start, what)
        self.buf.check(start + 4, length, what)
        self.buf.charge(length, what)
        return self.buf.data[start + 4 : start + 4 + length]

    def bytes(self, slot: int, what: str) -> Optional[bytes]:
        """A string field as bytes (ONNX string attributes and tensors hold bytes), or None."""
        target = self._target(slot)
        return None if target is None else self._bytes_at(target, what)

    def string(self, slot: int, what: str, default: str = "") -> str:
        raw = self.bytes(slot, what)
        if raw is None:
            return default
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FlatbufferError(f"{what} {raw[:40]!r} is not valid UTF-8 text") from error

    def _vector(self, slot: int, element_size: int, what: str):
        target = self._target(slot)
        if target is None:
            return None, 0
        count = self.buf.scalar("u32", target, what)
        if count * element_size > self.buf.size - target - 4:
            raise FlatbufferError(
                f"{what}: a vector of {count} element(s) of {element_size} byte(s) at offset "
                f"{target} does not fit in the {self.buf.size}-byte file"
            )
        self.buf.charge(count * max(element_size, 1), what)
        return target + 4, count

    def scalars(self, slot: int, kind: str, what: str) -> list:
        packer = SCALARS[kind]
        start, count = self._vector(slot, packer.size, what)
        if start is None:
            return []
        return list(struct.unpack_from(f"<{count}{packer.format[-1]}", self.buf.data, start))

    def raw(self, slot: int, what: str) -> Optional[bytes]:
        """A [ubyte] vector as bytes, or None when absent."""
        start, count = self._vector(slot, 1, what)
        return None if start is None else self.buf.data[start : start + count]

    def tables(self, slot: int, what: str) -> List["Table"]:
        start, count = self._vector(slot, 4, what)
        if start is None:
            return []
        return [Table(self.buf, self.buf.follow(start + 4 * i, f"{what}[{i}]"), f"{what}[{i}]") for i in range(count)]

    def strings(self, slot: int, what: str) -> List[bytes]:
        start, count = self._vector(slot, 4, what)
        if start is None:
            return []
        return [self._bytes_at(self.buf.follow(start + 4 * i, f"{what}[{i}]"), f"{what}[{i}]") for i in range(count)]

    def texts(self, slot: int, what: str) -> List[str]:
        out = []
        for i, raw in enumerate(self.strings(slot, what)):
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise FlatbufferError(f"{what}[{i}] {raw[:40]!r} is not valid UTF-8 text") from error
        return out
