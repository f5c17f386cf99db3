"""Fuzz target: the whole public load path of a checkpoint file and its `.data` companion.

Seeded corpus: every checkpoint committed under tests/fixtures/ (ORT-written training
artifacts, writer-A and writer-B files, nominal, many dtypes, properties, optimizer state,
external data).  Each example mutates a seed's main file (bit flips, extreme 32-bit words,
truncation, splices with another seed) and, for external-data seeds, its `.data` (cut,
extended, flipped), writes the pair to disk and loads it with
`CheckpointState.load_checkpoint(path)`.  The only allowed outcomes: CheckpointFormatError
naming the file, or a state whose parameters and properties all read and which saves and
reloads to the same values.  Nothing may hang, over-allocate or raise anything else.

CI runs it derandomized (fixed examples) for a few seconds; set
ORT_TORCH_COMPAT_FUZZ_EXAMPLES=100000 for a long local run (the examples then differ per
count, still deterministic).
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ort_torch_compat.api as api
from ort_torch_compat.codec import CheckpointFormatError
from tests.conftest import FIXTURES

SEEDS = {}
for path in sorted(FIXTURES.rglob("*")):
    if (
        path.is_file()
        and (path.name == "checkpoint" or path.name.endswith("_checkpoint"))
        and path.stat().st_size < 1 << 20
    ):
        companion = path.with_name(path.name + ".data")
        SEEDS[str(path.relative_to(FIXTURES))] = (
            path.read_bytes(),
            companion.read_bytes() if companion.exists() else None,
        )
SEED_NAMES = sorted(SEEDS)
EXAMPLES = int(os.environ.get("ORT_TORCH_COMPAT_FUZZ_EXAMPLES", "250"))
WORDS = [0, 1, 4, 8, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFF0, 0xFFFFFFFF]

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**7), st.integers(0, 7)),
    st.tuples(st.just("word"), st.integers(0, 10**7), st.sampled_from(WORDS)),
    st.tuples(st.just("cut"), st.integers(0, 10**7), st.just(0)),
    st.tuples(st.just("splice"), st.integers(0, 10**7), st.integers(0, 10**7)),
)
data_mutation = st.one_of(
    st.none(),
    st.tuples(st.just("cut"), st.integers(0, 10**6)),
    st.tuples(st.just("extend"), st.integers(1, 64)),
    st.tuples(st.just("flip"), st.integers(0, 10**6)),
)


def mutate(data: bytes, steps, other: bytes) -> bytes:
    buf = bytearray(data)
    for kind, a, b in steps:
        if not buf:
            break
        if kind == "flip":
            buf[a % len(buf)] ^= 1 << b
        elif kind == "word" and len(buf) >= 4:
            at = (a % (len(buf) // 4)) * 4
            struct.pack_into("<I", buf, at, b)
        elif kind == "cut":
            del buf[a % len(buf) :]
        elif kind == "splice" and other:
            start = b % len(other)
            buf[a % len(buf) :] = other[start : start + 256]
    return bytes(buf)


def mutate_data(data: bytes, change) -> bytes:
    if change is None or not data:
        return data
    kind, value = change
    if kind == "cut":
        return data[: value % len(data)]
    if kind == "extend":
        return data + b"\xff" * value
    flipped = bytearray(data)
    flipped[value % len(flipped)] ^= 0x10
    return bytes(flipped)


@settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.sampled_from(SEED_NAMES), st.sampled_from(SEED_NAMES), st.lists(mutation, min_size=1, max_size=3), data_mutation
)
def test_fuzzed_checkpoint_files_load_or_fail_cleanly(seed, other, steps, data_change):
    main, companion = SEEDS[seed]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint"
        path.write_bytes(mutate(main, steps, SEEDS[other][0]))
        if companion is not None:
            Path(f"{path}.data").write_bytes(mutate_data(companion, data_change))
        started = time.perf_counter()
        try:
            state = api.CheckpointState.load_checkpoint(path)
        except CheckpointFormatError as error:
            assert str(error).startswith(f"checkpoint {path}") or f"{path}.data" in str(error), str(error)
            return
        finally:
            assert time.perf_counter() - started < 5
        if state._state.is_nominal:
            values = {}
        else:
            values = {name: parameter.data.tobytes() for name, parameter in state.parameters}
        properties = dict(state.properties)
        api.CheckpointState.save_checkpoint(state, Path(tmp) / "again", include_optimizer_state=True)
        again = api.CheckpointState.load_checkpoint(Path(tmp) / "again")
        assert dict(again.properties) == properties
        if values:
            assert {name: parameter.data.tobytes() for name, parameter in again.parameters} == values
