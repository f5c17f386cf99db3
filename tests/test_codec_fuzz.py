"""Property and fuzz tests of the checkpoint codec.

1. Mutated ORT-written files (bit flips, lying lengths/offsets, truncation, splices,
   random bytes) must only ever raise CheckpointFormatError, and decode fast.
2. Whatever does decode re-encodes to a stable byte sequence.
3. Random records survive encode -> decode unchanged (inline and external).

Hypothesis runs derandomized (fixed examples, no example database) so CI is repeatable.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ort_torch_compat.codec import (
    CheckpointFormatError,
    CheckpointRecord,
    ModuleStateRecord,
    OptimizerGroupRecord,
    ParameterOptimizerStateRecord,
    TensorDataType,
    TensorRecord,
    decode_checkpoint,
    element_size,
    encode_checkpoint,
)

FIX = Path(__file__).parent / "fixtures" / "codec"
SEEDS = {p.name: p.read_bytes() for p in sorted(FIX.iterdir()) if p.suffix not in (".json", ".data")}
SEED_NAMES = sorted(SEEDS)
EXT_NAME = "state_external_checkpoint"
EXT = (FIX / (EXT_NAME + ".data")).read_bytes()
EXT_FOR = {EXT_NAME: EXT}

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=600,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
INTERESTING_U32 = [0, 1, 2, 3, 4, 7, 8, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFF0, 0xFFFFFFFF]


def check(data: bytes, ext: bytes | None = None) -> None:
    """Decoding ends quickly with a record or a CheckpointFormatError, nothing else."""
    t0 = time.perf_counter()
    try:
        rec = decode_checkpoint(data, external_data=ext)
    except CheckpointFormatError as exc:
        assert str(exc).startswith("checkpoint <buffer>: ") or str(exc).startswith("checkpoint <external buffer>: ")
        rec = None
    assert time.perf_counter() - t0 < 1.0
    if rec is None:
        return
    try:
        main, data_blob = encode_checkpoint(rec)
    except ValueError:
        # only possible for an inline tensor whose bytes disagree with its dims inside a
        # module state flagged external: the writer-B rule would have to move it out
        assert rec.module_state is not None and rec.module_state.has_external_data
        return
    again = decode_checkpoint(main, external_data=data_blob)
    assert encode_checkpoint(again) == (main, data_blob)


seed_name = st.sampled_from(SEED_NAMES)


@FUZZ
@given(seed_name, st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=8))
def test_bit_flips(name, positions):
    data = bytearray(SEEDS[name])
    for p in positions:
        bit = p % (len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
    check(bytes(data), EXT_FOR.get(name))


@FUZZ
@given(seed_name, st.integers(min_value=0, max_value=10**6), st.sampled_from(INTERESTING_U32), st.integers(0, 3))
def test_lying_words(name, pos, value, mode):
    """Overwrite an aligned 16/32-bit word (offsets, lengths, vtable entries) with an extreme value."""
    data = bytearray(SEEDS[name])
    if mode == 3:
        p = (pos % (len(data) // 2)) * 2
        struct.pack_into("<H", data, p, value & 0xFFFF)
    else:
        p = (pos % (len(data) // 4)) * 4
        v = value if mode == 0 else (value + struct.unpack_from("<I", data, p)[0]) & 0xFFFFFFFF
        struct.pack_into("<I", data, p, v)
    check(bytes(data), EXT_FOR.get(name))


@FUZZ
@given(seed_name, st.integers(min_value=0, max_value=10**6), st.binary(max_size=64))
def test_truncate_and_extend(name, cut, tail):
    data = SEEDS[name]
    check(data[: cut % (len(data) + 1)] + tail, EXT_FOR.get(name))


@FUZZ
@given(seed_name, seed_name, st.tuples(*[st.integers(0, 10**6)] * 4))
def test_splices(a, b, cuts):
    da, db = SEEDS[a], SEEDS[b]
    i, j, k, l_ = (c % (len(d) + 1) for c, d in zip(cuts, (da, db, db, da)))
    j, k = min(j, k), max(j, k)
    check(da[:i] + db[j:k] + da[max(i, l_) :], EXT_FOR.get(a))


@FUZZ
@given(st.binary(min_size=0, max_size=600), st.booleans())
def test_random_bytes(body, with_header):
    data = (struct.pack("<I", 8 + (len(body) % 64) * 4) + b"ODTC" + body) if with_header else body
    check(data)


@FUZZ
@given(st.integers(0, 10**6), st.binary(max_size=16), st.integers(0, 10**6))
def test_external_blob_mutations(cut, junk, flip):
    ext = bytearray(EXT[: cut % (len(EXT) + 1)] + junk)
    if ext:
        ext[flip % len(ext)] ^= 0x40
    check(SEEDS[EXT_NAME], bytes(ext))


# ---------------------------------------------------------------------------------------
# Random records round-trip
# ---------------------------------------------------------------------------------------
FIXED_CODES = [c for c in TensorDataType if c not in (TensorDataType.UNDEFINED, TensorDataType.STRING)]
names = st.text(min_size=0, max_size=12)
f32 = st.floats(width=32, allow_nan=False)
i64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def tensors(draw, consistent: bool = False) -> TensorRecord:
    name = draw(names)
    dims = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    if draw(st.integers(0, 9)) == 0:
        strings = draw(st.lists(st.text(max_size=6), min_size=int(np.prod(dims)), max_size=int(np.prod(dims))))
        return TensorRecord(name, int(TensorDataType.STRING), dims, b"", draw(names), strings)
    code = int(draw(st.sampled_from(FIXED_CODES)))
    if consistent or draw(st.booleans()):
        raw = draw(
            st.binary(
                min_size=int(np.prod(dims)) * element_size(code), max_size=int(np.prod(dims)) * element_size(code)
            )
        )
    else:
        dims = tuple(draw(st.lists(i64, max_size=3)))  # the codec keeps whatever the record holds
        raw = draw(st.binary(max_size=40))
    return TensorRecord(name, code, dims, raw, draw(names))


@st.composite
def records(draw) -> CheckpointRecord:
    external = draw(st.booleans())
    ms = draw(
        st.none()
        | st.builds(
            ModuleStateRecord,
            st.lists(tensors(consistent=external), max_size=4),
            st.lists(tensors(consistent=external), max_size=3),
            st.booleans(),
            st.just(external),
        )
    )
    groups = draw(
        st.none()
        | st.lists(
            st.builds(
                OptimizerGroupRecord,
                names,
                i64,
                f32,
                st.lists(st.builds(ParameterOptimizerStateRecord, names, st.lists(tensors(), max_size=2)), max_size=3),
            ),
            max_size=2,
        )
    )
    props = draw(st.none() | st.dictionaries(names, i64 | f32 | st.text(max_size=8), max_size=6))
    return CheckpointRecord(2, ms, groups, props)


@settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=500,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(records(), st.sampled_from([None, 0, 4, 16]))
def test_random_records_roundtrip(rec, min_bytes):
    if min_bytes is not None and rec.module_state is not None and not rec.module_state.has_external_data:
        for t in rec.module_state.trainable + rec.module_state.frozen:
            if t.data_type != TensorDataType.STRING and len(t.raw_data) != int(np.prod(t.dims)) * element_size(
                t.data_type
            ):
                min_bytes = None  # inconsistent tensors can only be stored inline
                break
    main, ext = encode_checkpoint(rec, external_min_bytes=min_bytes)
    back = decode_checkpoint(main, external_data=ext)
    want = rec
    if min_bytes is not None and rec.module_state is not None:
        want = CheckpointRecord(
            rec.version,
            ModuleStateRecord(rec.module_state.trainable, rec.module_state.frozen, rec.module_state.is_nominal, True),
            rec.optimizer_groups,
            rec.properties,
        )
    assert back == want
    # and the decoded record reproduces the same bytes
    assert encode_checkpoint(back, external_min_bytes=min_bytes) == (main, ext)
