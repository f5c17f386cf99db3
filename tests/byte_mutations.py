"""Byte-level damage for the fuzz tests of model readers (tests/test_fuzz_models.py,
tests/test_ort_format_fuzz.py): a byte overwritten, a 32-bit word written, the file cut."""

from __future__ import annotations

from typing import Sequence

from hypothesis import strategies as st

WORDS = [0, 1, 4, 8, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFF0, 0xFFFFFFFF]

mutation = st.one_of(
    st.tuples(st.just("byte"), st.integers(0, 10**7), st.integers(0, 255)),
    st.tuples(st.just("word"), st.integers(0, 10**7), st.sampled_from(WORDS)),
    st.tuples(st.just("cut"), st.integers(0, 10**7), st.just(0)),
)


def mutate(data: bytes, steps: Sequence[tuple]) -> bytes:
    """`data` with each (kind, position, value) of `steps` applied (positions wrap around)."""
    buf = bytearray(data)
    for kind, position, value in steps:
        position %= len(buf)
        if kind == "byte":
            buf[position] = value
        elif kind == "word":
            buf[position : position + 4] = value.to_bytes(4, "little")
        else:
            del buf[position:]
        if not buf:
            break
    return bytes(buf)
