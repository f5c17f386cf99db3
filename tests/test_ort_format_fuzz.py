"""Hostile ORT-format files: damaged, truncated, or built to abuse the format's offsets.

Fuzz targets (derandomized in CI; ORT_TORCH_COMPAT_FUZZ_EXAMPLES sets the count for a long
local run): every committed .ort fixture, mutated (bytes overwritten, extreme 32-bit words
written over offsets and vector lengths, cut), read by `load_model(bytes)`; the only allowed
outcomes are a `ModelLoadError` or a model no bigger than a small multiple of the file (no
amplification), within a second.  The training models also build a `Module` and train one
step, or fail with the library's error family (as tests/test_fuzz_models.py for ONNX).

Crafted files (written with the flatbuffers Builder and the slots of ORT's schema): a vector
whose length claims 4 G elements, one initializer referenced 100 000 times (a 400 KB file that
would expand to 100 GB), offsets pointing past the end, a node consuming its own output,
fused nodes, external data, sparse-tensor attributes, unknown attribute kinds.
"""

from __future__ import annotations

import os
import struct
import time
import warnings

import flatbuffers
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ort_torch_compat.api as api
from ort_torch_compat.engine.model_io import load_model
from ort_torch_compat.errors import ModelLoadError, OrtTorchCompatError
from tests.byte_mutations import mutate, mutation
from tests.conftest import FIXTURES

ORT_FORMAT = FIXTURES / "ort_format"
SEEDS = {str(p.relative_to(ORT_FORMAT)): p.read_bytes() for p in sorted(ORT_FORMAT.rglob("*.ort"))}
SEED_NAMES = sorted(SEEDS)
TRAINING_SEEDS = [name for name in SEED_NAMES if name.endswith("/training_model.ort")]
STATES = {
    name: api.CheckpointState.load_checkpoint(FIXTURES / name.split("/")[0] / "checkpoint") for name in TRAINING_SEEDS
}
EXAMPLES = int(os.environ.get("ORT_TORCH_COMPAT_FUZZ_EXAMPLES", "300"))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(SEED_NAMES), st.lists(mutation, min_size=1, max_size=3))
def test_fuzzed_ort_files_load_or_fail_cleanly(seed, steps):
    data = mutate(SEEDS[seed], steps)
    started = time.perf_counter()
    try:
        model = load_model(data, "model")
    except ModelLoadError:
        pass
    else:
        assert model.ByteSize() <= 16 * len(data) + 65536
    assert time.perf_counter() - started < 1.0


def _feeds(module: api.Module) -> list:
    return [
        np.ones(
            [d if isinstance(d, int) and d > 0 else 2 for d in (spec.shape or ())],
            dtype=np.float32 if spec.elem_type == 1 else np.int64,
        )
        for spec in module._engine.train_io.user_inputs
    ]


@settings(max_examples=max(EXAMPLES // 3, 1), deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(TRAINING_SEEDS), st.lists(mutation, min_size=1, max_size=3))
def test_fuzzed_ort_training_models_build_or_fail_cleanly(seed, steps):
    data = mutate(SEEDS[seed], steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            module = api.Module(data, STATES[seed])
        except OrtTorchCompatError:
            return
        try:
            module(*_feeds(module))
        except OrtTorchCompatError:
            return


# -- crafted files ------------------------------------------------------------------------------
# Slots (vtable offset = 4 + 2 * slot) of ORT 1.19's ort.fbs, as in its generated bindings.
class _Build:
    def __init__(self):
        self.b = flatbuffers.Builder(1024)

    def string(self, text):
        return self.b.CreateString(text)

    def strings(self, texts):
        offsets = [self.string(t) for t in texts]
        return self.offsets(offsets)

    def offsets(self, offsets):
        self.b.StartVector(4, len(offsets), 4)
        for offset in reversed(offsets):
            self.b.PrependUOffsetTRelative(offset)
        return self.b.EndVector()

    def int64s(self, values):
        self.b.StartVector(8, len(values), 8)
        for value in reversed(values):
            self.b.PrependInt64(value)
        return self.b.EndVector()

    def table(self, fields):
        """fields: (slot, kind, value) with kind "off", "i32", "i64", "f32", "u8"."""
        self.b.StartObject(16)
        for slot, kind, value in fields:
            if kind == "off":
                self.b.PrependUOffsetTRelativeSlot(slot, value, 0)
            elif kind == "i32":
                self.b.PrependInt32Slot(slot, value, 0)
            elif kind == "i64":
                self.b.PrependInt64Slot(slot, value, 0 if value != 0 else 1)
            elif kind == "u8":
                self.b.PrependUint8Slot(slot, value, 0)
        return self.b.EndObject()

    def tensor(self, name, dims, raw, external=None):
        fields = [(0, "off", self.string(name)), (2, "off", self.int64s(dims)), (3, "i32", 1)]
        if raw is not None:
            fields.append((4, "off", self.b.CreateByteVector(raw)))
        if external is not None:
            fields.append((6, "i64", external))
        return self.table(fields)

    def node(self, op, inputs, outputs, attributes=(), fused=False):
        fields = [
            (0, "off", self.string(f"n_{op}")),
            (5, "off", self.string(op)),
            (8, "off", self.strings(inputs)),
            (9, "off", self.strings(outputs)),
        ]
        if attributes:
            fields.append((10, "off", self.offsets(list(attributes))))
        if fused:
            fields.append((6, "i32", 1))
        return self.table(fields)

    def finish(self, nodes=(), initializers=(), inputs=("x",), outputs=("y",), version="6"):
        graph = self.table(
            [
                (0, "off", self.offsets(list(initializers))),
                (2, "off", self.offsets(list(nodes))),
                (5, "off", self.strings(inputs)),
                (6, "off", self.strings(outputs)),
            ]
        )
        opset = self.table([(0, "off", self.string("")), (1, "i64", 17)])
        model = self.table([(0, "i64", 8), (1, "off", self.offsets([opset])), (7, "off", graph)])
        session = self.table([(0, "off", self.string(version)), (1, "off", model)])
        self.b.Finish(session, file_identifier=b"ORTM")
        return bytes(self.b.Output())


def _refused(data: bytes, match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        load_model(data, "model")


def test_a_well_formed_crafted_file_loads():
    build = _Build()
    weight = build.tensor("w", [2], np.array([1.0, 2.0], np.float32).tobytes())
    node = build.node("Add", ["x", "w"], ["y"])
    model = load_model(build.finish([node], [weight]), "model")
    assert [n.op_type for n in model.graph.node] == ["Add"]
    assert list(model.graph.initializer[0].dims) == [2]


def test_one_initializer_referenced_many_times_is_not_expanded():
    build = _Build()
    weight = build.tensor("w", [16384], bytes(65536))
    data = build.finish([build.node("Identity", ["x"], ["y"])], [weight] * 100_000)
    assert len(data) < 600_000  # would expand to 6.5 GB of initializers
    started = time.perf_counter()
    _refused(data, "refers to more data than it holds")
    assert time.perf_counter() - started < 5


def test_absurd_vector_length_is_refused():
    build = _Build()
    data = bytearray(build.finish([build.node("Identity", ["x"], ["y"])]))
    at = data.find(b"Identity") - 4  # the string's length word
    data[at : at + 4] = struct.pack("<I", 0xFFFFFFF0)
    _refused(bytes(data), "outside the")


@pytest.mark.parametrize("word", [0x7FFFFFFF, 0xFFFFFFFF, 0x100])
def test_offsets_out_of_range_are_refused(word):
    build = _Build()
    data = bytearray(build.finish([build.node("Identity", ["x"], ["y"])]))
    data[0:4] = struct.pack("<I", word)  # the root offset
    _refused(bytes(data), "ORT-format model")


def test_a_node_consuming_its_own_output_is_a_cycle():
    build = _Build()
    data = build.finish([build.node("Add", ["x", "y"], ["y"])])
    _refused(data, "cycle")


def test_fused_nodes_external_data_and_sparse_attributes_are_refused():
    build = _Build()
    _refused(build.finish([build.node("Relu", ["x"], ["y"], fused=True)]), "fused node")
    build = _Build()
    weight = build.tensor("w", [2], None, external=0)
    _refused(build.finish([build.node("Add", ["x", "w"], ["y"])], [weight]), "external_data_offset")
    for kind, match in ((11, "sparse-tensor attribute"), (12, "sparse-tensor attribute"), (99, "unknown attribute")):
        build = _Build()
        attribute = build.table([(0, "off", build.string("a")), (2, "i32", kind)])
        _refused(build.finish([build.node("Relu", ["x"], ["y"], [attribute])]), match)


def test_tensor_data_must_match_dims():
    build = _Build()
    weight = build.tensor("w", [3], bytes(8))
    _refused(build.finish([build.node("Add", ["x", "w"], ["y"])], [weight]), r"declares dims \[3\]")
    build = _Build()
    weight = build.tensor("w", [-1], b"")
    _refused(build.finish([build.node("Add", ["x", "w"], ["y"])], [weight]), "negative dimension")
    build = _Build()
    weight = build.tensor("w", [1 << 40, 1 << 40], b"")
    _refused(build.finish([build.node("Add", ["x", "w"], ["y"])], [weight]), "declares dims")


def test_damaged_text_is_refused():
    build = _Build()
    data = bytearray(build.finish([build.node("Identity", ["x"], ["y"])]))
    at = data.find(b"Identity")
    data[at] = 0xFF
    _refused(bytes(data), "not valid UTF-8")


def _nested_if(build: _Build, depth: int):
    """An If node whose then-branch holds an If node ... `depth` levels deep."""
    inner = build.table(
        [(2, "off", build.offsets([build.node("Identity", ["x"], ["y"])])), (6, "off", build.strings(["y"]))]
    )
    for _ in range(depth):
        attribute = build.table([(0, "off", build.string("then_branch")), (2, "i32", 5), (7, "off", inner)])
        node = build.node("If", ["c"], ["y"], [attribute])
        inner = build.table([(2, "off", build.offsets([node])), (6, "off", build.strings(["y"]))])
    return node


def test_subgraph_nesting_is_bounded():
    build = _Build()
    model = load_model(build.finish([_nested_if(build, 3)]), "model")
    assert model.graph.node[0].attribute[0].g.node[0].op_type == "If"
    build = _Build()
    _refused(build.finish([_nested_if(build, 40)]), "nested more than 24 deep")


def test_attribute_kinds_no_converter_writes_and_map_types_convert():
    """FLOATS, TENSORS and GRAPHS attributes, string tensors, map and sequence types and
    symbolic dims (the standard ops of our fixtures use none of these, ORT's schema has them)."""
    build = _Build()
    b = build.b
    b.StartVector(4, 2, 4)
    for value in (1.5, 2.5):  # prepended: the vector reads [2.5, 1.5]
        b.PrependFloat32(value)
    floats = b.EndVector()
    floats_attribute = build.table([(0, "off", build.string("fs")), (2, "i32", 6), (8, "off", floats)])
    text = build.table(
        [
            (0, "off", build.string("s")),
            (2, "off", build.int64s([2])),
            (3, "i32", 8),
            (5, "off", build.strings(["a", "bc"])),
        ]
    )
    number = build.tensor("n", [1], np.array([7.0], np.float32).tobytes())
    tensors_attribute = build.table(
        [(0, "off", build.string("ts")), (2, "i32", 9), (11, "off", build.offsets([text, number]))]
    )
    branch = build.table(
        [(2, "off", build.offsets([build.node("Identity", ["x"], ["z"])])), (6, "off", build.strings(["z"]))]
    )
    graphs_attribute = build.table(
        [(0, "off", build.string("gs")), (2, "i32", 10), (12, "off", build.offsets([branch, branch]))]
    )
    node = build.node("Custom", ["x"], ["y"], [floats_attribute, tensors_attribute, graphs_attribute])
    # y: map(int64 -> sequence(tensor(float)[N, 3]))
    dims = [
        build.table([(0, "off", build.table([(0, "u8", 2), (2, "off", build.string("N"))]))]),
        build.table([(0, "off", build.table([(0, "u8", 1), (1, "i64", 3)]))]),
    ]
    shape = build.table([(0, "off", build.offsets(dims))])
    tensor_type = build.table([(0, "i32", 1), (1, "off", shape)])
    tensor_info = build.table([(1, "u8", 1), (2, "off", tensor_type)])
    sequence_info = build.table([(1, "u8", 2), (2, "off", build.table([(0, "off", tensor_info)]))])
    map_info = build.table([(1, "u8", 3), (2, "off", build.table([(0, "i32", 7), (1, "off", sequence_info)]))])
    value = build.table([(0, "off", build.string("y")), (2, "off", map_info)])
    graph = build.table(
        [
            (1, "off", build.offsets([value])),
            (2, "off", build.offsets([node])),
            (5, "off", build.strings(["x"])),
            (6, "off", build.strings(["y"])),
        ]
    )
    opset = build.table([(0, "off", build.string("")), (1, "i64", 17)])
    model = build.table([(0, "i64", 8), (1, "off", build.offsets([opset])), (7, "off", graph)])
    b.Finish(build.table([(0, "off", build.string("6")), (1, "off", model)]), file_identifier=b"ORTM")
    converted = load_model(bytes(b.Output()), "model")
    attributes = {a.name: a for a in converted.graph.node[0].attribute}
    assert list(attributes["fs"].floats) == [2.5, 1.5]
    assert list(attributes["ts"].tensors[0].string_data) == [b"a", b"bc"]
    assert attributes["ts"].tensors[1].raw_data == np.array([7.0], np.float32).tobytes()
    assert [g.node[0].op_type for g in attributes["gs"].graphs] == ["Identity", "Identity"]
    output = converted.graph.output[0].type.map_type
    assert output.key_type == 7
    element = output.value_type.sequence_type.elem_type.tensor_type
    assert element.elem_type == 1
    assert [(d.dim_param, d.dim_value) for d in element.shape.dim] == [("N", 0), ("", 3)]
