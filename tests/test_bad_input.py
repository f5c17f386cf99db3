"""Bad input and faults (issue 8): every misuse fails with a specific exception whose message
names the culprit, and the state stays usable (or the file on disk intact) afterwards.

Groups: artifacts, checkpoint bytes, step inputs, API misuse, saving, security.
ORT 1.19.2's own behaviour is in the ORT training semantics spec (§1.2, §1.10, §7);
where ours differs (earlier or clearer errors, atomic saves) the test says so.
"""

from __future__ import annotations

import errno
import math
import os
import pickle
import struct

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ort_torch_compat.api as api
from ort_torch_compat import capi_session as capi
from ort_torch_compat.codec import CheckpointFormatError, decode_checkpoint, encode_checkpoint
from ort_torch_compat.errors import InvalidInputError, ModelLoadError, ModelMismatchError, ReleasedError
from ort_torch_compat.testing.scenario import make_batch
from tests.conftest import FIXTURES, load_spec

SGD = FIXTURES / "mlp_mse_sgd_op17"  # small MLP, inputs x[4,6] float32, target[4,3] float32
ADAMW = FIXTURES / "mlp_mse_adamw_op17"
CE = FIXTURES / "mlp_ce_adamw_op17"  # int64 class-label input
FROZEN = FIXTURES / "frozen_mse_sgd_op17"  # fc2.* frozen
CNN = FIXTURES / "cnn_mse_sgd_op17"


# ---- helpers ---------------------------------------------------------------------------------
def batch(directory=SGD, k=1):
    spec = load_spec(directory)
    data = make_batch(spec, k, 1)
    return [data[i["name"]] for i in spec["inputs"]]


def build(directory=SGD, checkpoint=None, eval_model=True):
    state = api.CheckpointState.load_checkpoint(checkpoint if checkpoint is not None else directory / "checkpoint")
    module = api.Module(directory / "training_model.onnx", state, directory / "eval_model.onnx" if eval_model else None)
    optimizer = api.Optimizer(directory / "optimizer_model.onnx", module)
    return state, module, optimizer


def assert_usable(module, optimizer, directory=SGD):
    """A valid train step + optimizer step still works and gives a finite loss."""
    module.train()
    before = module.get_contiguous_parameters().numpy().copy()
    loss = module(*batch(directory, 2))
    assert np.isfinite(loss).all()
    optimizer.step()
    module.lazy_reset_grad()
    after = module.get_contiguous_parameters().numpy()
    assert np.isfinite(after).all() and not np.array_equal(before, after)


def edited_checkpoint(directory, edit) -> bytes:
    """The fixture checkpoint decoded, edited by `edit(record)`, encoded again."""
    record = decode_checkpoint((directory / "checkpoint").read_bytes())
    edit(record)
    return encode_checkpoint(record)[0]


def find(tensors, name):
    return next(t for t in tensors if t.name == name)


# =============================================================================================
# 1. Artifacts
# =============================================================================================
@pytest.mark.parametrize("role", ["training", "eval", "optimizer"])
def test_missing_artifact_names_the_file(tmp_path, role):
    missing = tmp_path / "nope.onnx"
    state = api.CheckpointState.load_checkpoint(SGD / "checkpoint")
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        if role == "training":
            api.Module(missing, state)
        elif role == "eval":
            api.Module(SGD / "training_model.onnx", state, missing)
        else:
            api.Optimizer(missing, api.Module(SGD / "training_model.onnx", state))
    _, module, optimizer = build(checkpoint=(SGD / "checkpoint").read_bytes())
    assert_usable(module, optimizer)


def test_missing_checkpoint_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_checkpoint"):
        api.CheckpointState.load_checkpoint(tmp_path / "no_checkpoint")
    with pytest.raises(FileNotFoundError, match="no_checkpoint"):
        capi.load_checkpoint(tmp_path / "no_checkpoint")


def test_directory_instead_of_file(tmp_path):
    state = api.CheckpointState.load_checkpoint(SGD / "checkpoint")
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        api.Module(tmp_path, state)
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        api.Optimizer(tmp_path, api.Module(SGD / "training_model.onnx", state))
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        api.CheckpointState.load_checkpoint(tmp_path)


@pytest.mark.parametrize("content", [b"", b"hello, not an ONNX model\n", "checkpoint", "spec.json", "expected.npz"])
def test_non_onnx_file(tmp_path, content):
    path = tmp_path / "model.onnx"
    path.write_bytes(content if isinstance(content, bytes) else (SGD / content).read_bytes())
    state = api.CheckpointState.load_checkpoint(SGD / "checkpoint")
    with pytest.raises(ModelLoadError, match=r"training model .*model\.onnx") as info:
        api.Module(path, state)
    assert "empty" in str(info.value) or "not an ONNX model" in str(info.value)
    with pytest.raises(ModelLoadError, match="optimizer model"):
        api.Optimizer(path, api.Module(SGD / "training_model.onnx", state))
    with pytest.raises(ModelLoadError, match="training model <training model from buffer>"):
        api.Module(path.read_bytes() or b"", state)


@pytest.mark.parametrize("artifact", ["eval_model.onnx", "optimizer_model.onnx"])
def test_not_a_training_model(artifact):
    state = api.CheckpointState.load_checkpoint(SGD / "checkpoint")
    with pytest.raises(ModelLoadError, match=rf"{artifact}.* is not a training model"):
        api.Module(SGD / artifact, state)
    module = api.Module(SGD / "training_model.onnx", state, SGD / "eval_model.onnx")
    assert_usable(module, api.Optimizer(SGD / "optimizer_model.onnx", module))


def test_training_model_without_loss_output(tmp_path):
    model = onnx.load(str(SGD / "training_model.onnx"))
    keep = [out for out in model.graph.output if out.name.endswith("_grad.accumulation.out")]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    path = tmp_path / "noloss.onnx"
    onnx.save(model, str(path))
    state = api.CheckpointState.load_checkpoint(SGD / "checkpoint")
    with pytest.raises(ModelLoadError, match=r"noloss\.onnx has no loss output"):
        api.Module(path, state)


def test_eval_model_of_other_artifacts():
    """ORT accepts it at construction and fails at the first eval step; we refuse it up front."""
    state = api.CheckpointState.load_checkpoint(SGD / "checkpoint")
    with pytest.raises(ModelMismatchError, match=r"eval model .*cnn_mse_sgd_op17.*does not match.*conv") as info:
        api.Module(SGD / "training_model.onnx", state, CNN / "eval_model.onnx")
    assert "'x'" not in str(info.value).split("neither")[0]  # x is a shared input; not the culprit
    _, module, optimizer = build()
    assert_usable(module, optimizer)


def _edited_eval_model(tmp_path, edit):
    model = onnx.load(str(SGD / "eval_model.onnx"))
    edit({info.name: info for info in model.graph.input})
    path = tmp_path / "eval_model.onnx"
    onnx.save(model, str(path))
    return path


def _set_dims(info, dims):
    shape = info.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_value = d


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (
            lambda i: _set_dims(i["fc1.weight"], [6, 12]),
            r"parameter 'fc1.weight': checkpoint shape \[12, 6\] but eval model .*eval_model.onnx declares \[6, 12\]",
        ),
        (
            lambda i: setattr(i["fc2.bias"].type.tensor_type, "elem_type", onnx.TensorProto.DOUBLE),
            r"parameter 'fc2.bias': checkpoint dtype FLOAT but eval model .*declares DOUBLE",
        ),
        (
            lambda i: setattr(i["target"].type.tensor_type, "elem_type", onnx.TensorProto.INT64),
            r"eval model .*eval_model.onnx does not match the training model: input 'target' is tensor\(int64\)",
        ),
    ],
    ids=["param-shape", "param-dtype", "input-dtype"],
)
def test_eval_model_declaring_other_types(tmp_path, edit, pattern):
    state = api.CheckpointState.load_checkpoint(SGD / "checkpoint")
    with pytest.raises(ModelMismatchError, match=pattern):
        api.Module(SGD / "training_model.onnx", state, _edited_eval_model(tmp_path, edit))
    module = api.Module(SGD / "training_model.onnx", state, SGD / "eval_model.onnx")
    assert_usable(module, api.Optimizer(SGD / "optimizer_model.onnx", module))


def test_eval_model_of_a_classification_head():
    """mlp_ce's eval model takes int64 'labels' where mlp_mse's takes a float 'target'."""
    state = api.CheckpointState.load_checkpoint(SGD / "checkpoint")
    with pytest.raises(ModelMismatchError, match=r"input\(s\) \['labels'\] are neither inputs of the training model"):
        api.Module(SGD / "training_model.onnx", state, CE / "eval_model.onnx")


@pytest.mark.parametrize("op_type", ["LambOptimizer", "AdamOptimizer", "SGDOptimizer"])
def test_optimizer_model_of_unknown_type(tmp_path, op_type):
    model = onnx.load(str(ADAMW / "optimizer_model.onnx"))
    for node in model.graph.node:
        if node.op_type == "AdamWOptimizer":
            node.op_type = op_type
    path = tmp_path / "optimizer_model.onnx"
    onnx.save(model, str(path))
    state = api.CheckpointState.load_checkpoint(ADAMW / "checkpoint")
    module = api.Module(ADAMW / "training_model.onnx", state)
    with pytest.raises(ModelLoadError, match=rf"optimizer model .*optimizer_model\.onnx.*{op_type}"):
        api.Optimizer(path, module)
    assert_usable(module, api.Optimizer(ADAMW / "optimizer_model.onnx", module), ADAMW)


def test_optimizer_model_with_bad_attributes(tmp_path):
    model = onnx.load(str(ADAMW / "optimizer_model.onnx"))
    node = next(n for n in model.graph.node if n.op_type == "AdamWOptimizer")
    node.attribute.append(onnx.helper.make_attribute("adam_mode", 7))
    kept = {}
    for attr in node.attribute:
        kept[attr.name] = attr  # the last one wins
    del node.attribute[:]
    node.attribute.extend(kept.values())
    path = tmp_path / "optimizer_model.onnx"
    onnx.save(model, str(path))
    state = api.CheckpointState.load_checkpoint(ADAMW / "checkpoint")
    with pytest.raises(ModelLoadError, match="adam_mode"):
        api.Optimizer(path, api.Module(ADAMW / "training_model.onnx", state))


def _drop(name):
    def edit(record):
        ms = record.module_state
        ms.trainable[:] = [t for t in ms.trainable if t.name != name]
        ms.frozen[:] = [t for t in ms.frozen if t.name != name]

    return edit


def _extra(record):
    record.module_state.trainable.append(
        type(record.module_state.trainable[0])("extra.weight", 1, (2,), np.zeros(2, np.float32).tobytes())
    )


def _reshape(name, dims):
    def edit(record):
        tensor = find(record.module_state.trainable, name)
        assert math.prod(dims) * 4 == len(tensor.raw_data)
        tensor.dims = dims

    return edit


def _retype(name):
    def edit(record):
        tensor = find(record.module_state.trainable, name)
        tensor.data_type = 11  # DOUBLE: reinterpret as float64 with half the elements
        tensor.dims = (len(tensor.raw_data) // 8,)

    return edit


@pytest.mark.parametrize(
    "edit, error, pattern",
    [
        (
            _drop("fc2.weight"),
            ModelMismatchError,
            r"trains parameter\(s\) \['fc2.weight'\].*checkpoint does not contain",
        ),
        (_extra, ModelMismatchError, r"checkpoint parameter\(s\) \['extra.weight'\] are not inputs of training model"),
        (
            _reshape("fc1.weight", (6, 12)),
            ModelMismatchError,
            r"parameter 'fc1.weight': checkpoint shape \[6, 12\] but",
        ),
        (_reshape("fc1.bias", (3, 4)), ModelMismatchError, r"parameter 'fc1.bias': checkpoint shape \[3, 4\] but"),
        (_retype("fc1.bias"), ModelMismatchError, r"parameter 'fc1.bias': checkpoint dtype DOUBLE but .* FLOAT"),
    ],
    ids=["missing", "extra", "wrong-shape", "wrong-rank", "wrong-dtype"],
)
def test_checkpoint_parameters_do_not_match_model(edit, error, pattern):
    state = api.CheckpointState.load_checkpoint(edited_checkpoint(SGD, edit))
    with pytest.raises(error, match=pattern):
        api.Module(SGD / "training_model.onnx", state)
    _, module, optimizer = build()
    assert_usable(module, optimizer)


def test_checkpoint_missing_a_frozen_parameter():
    """A frozen parameter missing from the checkpoint looks like a user input (as in ORT, which
    then fails with 'feed names has N elements'); the step's error names it."""
    state = api.CheckpointState.load_checkpoint(edited_checkpoint(FROZEN, _drop("fc2.weight")))
    module = api.Module(FROZEN / "training_model.onnx", state)
    assert "fc2.weight" in module.input_names()
    with pytest.raises(InvalidInputError, match=r"train step expects 3 input\(s\) .*'fc2.weight'.*got 2"):
        module(*batch(FROZEN))


def test_checkpoint_with_unsupported_dtype_is_a_format_error():
    def to_string(record):
        tensor = find(record.module_state.trainable, "fc1.bias")
        tensor.data_type, tensor.raw_data, tensor.string_data = 8, b"", ["a"] * math.prod(tensor.dims)

    with pytest.raises(CheckpointFormatError, match=r"checkpoint <buffer>: .*STRING"):
        api.CheckpointState.load_checkpoint(edited_checkpoint(SGD, to_string))


# =============================================================================================
# 2. Checkpoint bytes (through the public API; the codec's own fuzzing is in test_codec_fuzz.py)
# =============================================================================================
GOOD = (SGD / "checkpoint").read_bytes()


def load_bytes_and_file(data: bytes, tmp_path, name="checkpoint"):
    """Both entry points must fail alike; return the errors (bytes, file)."""
    path = tmp_path / name
    path.write_bytes(data)
    errors = []
    for source in (data, path):
        with pytest.raises(CheckpointFormatError) as info:
            api.CheckpointState.load_checkpoint(source)
        errors.append(str(info.value))
    assert errors[0].startswith("checkpoint <buffer>: ")
    assert errors[1].startswith(f"checkpoint {path}: ")
    return errors


def test_empty_checkpoint(tmp_path):
    for message in load_bytes_and_file(b"", tmp_path):
        assert "empty file" in message


def test_checkpoint_truncated_anywhere(tmp_path):
    """Every prefix (so every section boundary) of the file is refused, never decoded wrongly."""
    full = {name: p.data for name, p in api.CheckpointState.load_checkpoint(GOOD).parameters}
    for length in range(len(GOOD)):
        try:
            state = api.CheckpointState.load_checkpoint(GOOD[:length])
        except CheckpointFormatError as error:
            assert str(error).startswith("checkpoint <buffer>: ")
            continue
        # only the final string's padding byte may go: the content must be the same
        assert length >= len(GOOD) - 3, length
        assert {name: p.data.tobytes() for name, p in state.parameters} == {k: v.tobytes() for k, v in full.items()}
    messages = load_bytes_and_file(GOOD[: len(GOOD) // 2], tmp_path)
    assert all("truncated: " in m and "but the file has 648" in m for m in messages), messages


def test_wrong_file_identifier(tmp_path):
    data = GOOD[:4] + b"XXXX" + GOOD[8:]
    for message in load_bytes_and_file(data, tmp_path):
        assert "wrong file identifier" in message and "ODTC" in message


def test_random_bytes(tmp_path):
    rng = np.random.default_rng(8)
    for size in (1, 7, 8, 64, 4096):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        load_bytes_and_file(data, tmp_path)
        load_bytes_and_file(data[:4] + b"ODTC" + data[8:] if size >= 8 else data, tmp_path)


def test_unsupported_version(tmp_path):
    record = decode_checkpoint(GOOD)
    record.version = 3
    data = encode_checkpoint(record)[0]
    for message in load_bytes_and_file(data, tmp_path):
        assert "Checkpoint version 3 is not supported" in message


def _raw_length_offset(data: bytes, name: str) -> int:
    """File offset of the u32 length prefix of tensor `name`'s raw_data vector."""
    raw = find(decode_checkpoint(data).module_state.trainable, name).raw_data
    needle = struct.pack("<I", len(raw)) + raw
    offset = data.find(needle)
    assert offset > 0 and data.find(needle, offset + 1) < 0
    return offset


@pytest.mark.parametrize("value", [0, 13, 0x7FFFFFFF, 0xFFFFFFFF])
def test_lying_tensor_length(tmp_path, value):
    """A flipped raw_data length: either out of bounds or disagreeing with the dims; never a
    huge allocation or a silently wrong tensor."""
    offset = _raw_length_offset(GOOD, "fc2.bias")
    data = GOOD[:offset] + struct.pack("<I", value) + GOOD[offset + 4 :]
    for message in load_bytes_and_file(data, tmp_path):
        assert "tensor 'fc2.bias'" in message and ("truncated" in message or "needs 32 bytes" in message), message


def test_flipped_dimension(tmp_path):
    raw = find(decode_checkpoint(GOOD).module_state.trainable, "fc1.weight")
    dims = struct.pack(f"<I{len(raw.dims)}q", len(raw.dims), *raw.dims)
    offset = GOOD.find(dims)
    assert offset > 0
    data = bytearray(GOOD)
    data[offset + 4] ^= 0x40  # 12 -> 76 rows
    for message in load_bytes_and_file(bytes(data), tmp_path):
        assert "fc1.weight" in message, message


@pytest.fixture
def external_checkpoint(tmp_path):
    """A checkpoint saved with external data (checkpoint + checkpoint.data)."""
    state = api.CheckpointState.load_checkpoint(GOOD)
    state._state.has_external_data = True
    path = tmp_path / "checkpoint"
    api.CheckpointState.save_checkpoint(state, path)
    assert (tmp_path / "checkpoint.data").stat().st_size > 0
    api.CheckpointState.load_checkpoint(path)  # sanity: it loads
    return path


def test_external_data_missing(external_checkpoint):
    os.remove(f"{external_checkpoint}.data")
    pattern = rf"^checkpoint {external_checkpoint}: .*data file {external_checkpoint}\.data does not exist"
    with pytest.raises(CheckpointFormatError, match=pattern):
        api.CheckpointState.load_checkpoint(external_checkpoint)
    with pytest.raises(CheckpointFormatError, match="external data"):  # bytes alone cannot resolve it
        api.CheckpointState.load_checkpoint(external_checkpoint.read_bytes())


@pytest.mark.parametrize("keep", [0, 0.5, -1])
def test_external_data_short(external_checkpoint, keep):
    data_path = f"{external_checkpoint}.data"
    blob = open(data_path, "rb").read()
    size = len(blob) - 1 if keep == -1 else int(len(blob) * keep)
    with open(data_path, "wb") as handle:
        handle.write(blob[:size])
    with pytest.raises(
        CheckpointFormatError, match=rf"^checkpoint {data_path}: truncated: tensor '.*' external data needs"
    ):
        api.CheckpointState.load_checkpoint(external_checkpoint)


def test_external_data_is_a_directory(external_checkpoint):
    data_path = f"{external_checkpoint}.data"
    os.remove(data_path)
    os.mkdir(data_path)
    with pytest.raises(CheckpointFormatError, match=rf"cannot read its data file {data_path}"):
        api.CheckpointState.load_checkpoint(external_checkpoint)


def _mutations():
    """Bit flips, byte overwrites, truncation, insertion and deletion of the fixture's bytes."""
    position = st.integers(0, len(GOOD) - 1)
    flip = st.tuples(st.just("flip"), position, st.integers(0, 7))
    put = st.tuples(st.just("put"), position, st.integers(0, 255))
    put32 = st.tuples(st.just("put32"), position, st.sampled_from([0, 1, 0x7FFF, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFFFFFF0]))
    cut = st.tuples(st.just("cut"), position, st.just(0))
    insert = st.tuples(st.just("insert"), position, st.integers(0, 255))
    return st.lists(st.one_of(flip, put, put32, cut, insert), min_size=1, max_size=4)


def _apply(data: bytearray, mutation) -> bytearray:
    kind, pos, value = mutation
    pos %= max(len(data), 1)
    if not data:
        return data
    if kind == "flip":
        data[pos] ^= 1 << value
    elif kind == "put":
        data[pos] = value
    elif kind == "put32":
        data[pos : pos + 4] = struct.pack("<I", value)
    elif kind == "cut":
        del data[pos:]
    elif kind == "insert":
        data.insert(pos, value)
    return data


@settings(
    derandomize=True, database=None, deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow]
)
@given(_mutations())
def test_mutated_checkpoint_through_public_api(mutations):
    """Any mutation either loads (a valid file) or raises CheckpointFormatError, nothing else."""
    data = bytearray(GOOD)
    for mutation in mutations:
        data = _apply(data, mutation)
    try:
        state = api.CheckpointState.load_checkpoint(bytes(data))
    except CheckpointFormatError as error:
        assert str(error).startswith("checkpoint <buffer>: ")
        return
    for name, parameter in state.parameters:  # what did decode is readable
        parameter.data


# =============================================================================================
# 3. Step inputs
# =============================================================================================
@pytest.fixture
def trained():
    return build()


def test_too_few_and_too_many_inputs(trained):
    state, module, optimizer = trained
    x, target = batch()
    with pytest.raises(InvalidInputError, match=r"train step expects 2 input\(s\) \['x', 'target'\], got 1"):
        module(x)
    with pytest.raises(InvalidInputError, match=r"train step expects 2 input\(s\) \['x', 'target'\], got 3"):
        module(x, target, target)
    with pytest.raises(InvalidInputError, match=r"train step expects 2 input\(s\).*got 0"):
        module()
    module.eval()
    with pytest.raises(InvalidInputError, match=r"eval step expects 2 input\(s\) \['x', 'target'\], got 1"):
        module(x)
    assert_usable(module, optimizer)


def test_wrong_dtype(trained):
    _, module, optimizer = trained
    x, target = batch()
    with pytest.raises(
        InvalidInputError,
        match=r"unexpected input data type for 'target'. Actual: tensor\(double\), "
        r"expected: tensor\(float\); cast it, e.g. target.astype\(numpy.float32\)",
    ):
        module(x, target.astype(np.float64))
    with pytest.raises(InvalidInputError, match=r"unexpected input data type for 'x'. Actual: tensor\(int64\)"):
        module(x.astype(np.int64), target)
    with pytest.raises(InvalidInputError, match=r"input 0: expected a numpy array, OrtValue or torch tensor, got list"):
        module(x.tolist(), target)
    assert_usable(module, optimizer)


def test_wrong_label_dtype_for_classification():
    _, module, optimizer = build(CE)
    x, labels = batch(CE)
    assert labels.dtype == np.int64
    with pytest.raises(InvalidInputError, match=r"'labels'. Actual: tensor\(int32\), expected: tensor\(int64\)"):
        module(x, labels.astype(np.int32))
    assert_usable(module, optimizer, CE)


def test_labels_with_an_extra_axis_say_how_to_reshape():
    _, module, optimizer = build(CE)
    x, labels = batch(CE)
    with pytest.raises(
        InvalidInputError,
        match=r"input 'labels': \[4, 1\], expected \[4\]: 2 dimension\(s\) where the "
        r"model declares 1; reshape it, e.g. labels.reshape\(4\)",
    ):
        module(x, labels.reshape(-1, 1))
    assert_usable(module, optimizer, CE)


@pytest.mark.parametrize(
    "shape, expected",
    [((4, 6, 1), r"\[4, 6, 1\]"), ((24,), r"\[24\]"), ((4, 5), r"\[4, 5\]"), ((), r"\[\]")],
    ids=["rank+1", "rank-1", "fixed-dim", "scalar"],
)
def test_wrong_rank_or_shape(trained, shape, expected):
    _, module, optimizer = trained
    x, target = batch()
    bad = np.zeros(shape, np.float32)
    with pytest.raises(InvalidInputError, match=rf"got invalid dimensions for input 'x': {expected}, expected \["):
        module(bad, target)
    assert_usable(module, optimizer)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_inputs_train_like_ort(value):
    """No check (as ORT): the loss and, after the optimizer step, the parameters become NaN.
    Restoring the parameters from a buffer makes the module usable again."""
    state, module, optimizer = build()
    good = module.get_contiguous_parameters().numpy().copy()
    x, target = batch()
    x[0, 0] = value
    loss = module(x, target)
    assert not np.isfinite(loss)
    assert not np.isfinite(state.parameters["fc1.weight"].grad).all()
    optimizer.step()
    assert np.isnan(state.parameters["fc1.weight"].data).any()
    module.lazy_reset_grad()
    module.copy_buffer_to_parameters(api.OrtValue.ortvalue_from_numpy(good))
    assert_usable(module, optimizer)


def test_meta_tensor_input_is_refused(trained):
    _, module, optimizer = trained
    x, target = batch()
    with pytest.raises(InvalidInputError, match=r"input 'x' is a meta tensor"):
        module(torch.empty(4, 6, device="meta"), torch.from_numpy(target))
    assert_usable(module, optimizer)


def test_cpu_tensors_for_cpu_module(trained):
    _, module, optimizer = trained
    x, target = (torch.from_numpy(a) for a in batch())
    loss = module(x, target)
    assert isinstance(loss, torch.Tensor) and loss.device.type == "cpu"
    noncontiguous = x.t().contiguous().t()
    assert not noncontiguous.is_contiguous()
    assert torch.allclose(module(noncontiguous, target), loss)  # no optimizer step in between: same loss
    assert_usable(module, optimizer)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_inputs_on_another_device():
    """Inputs on another device are copied to the module's device (ORT copies feeds as well)."""
    state, module, optimizer = build()
    x, target = (torch.from_numpy(a) for a in batch())
    reference = module(x, target)
    module.lazy_reset_grad()
    moved = module(x.cuda(), target.cuda())  # CUDA inputs for a CPU module
    assert moved.device.type == "cpu" and torch.allclose(moved, reference)
    state_gpu = api.CheckpointState.load_checkpoint(GOOD)
    cuda_module = api.Module(SGD / "training_model.onnx", state_gpu, device="cuda")
    loss = cuda_module(x, target)  # CPU inputs for a CUDA module
    assert loss.device.type == "cuda" and torch.allclose(loss.cpu(), reference, atol=1e-5)


# =============================================================================================
# 4. API misuse
# =============================================================================================
@pytest.mark.parametrize(
    "warmup, total",
    [(0, 0), (0, 5), (5, 0), (5, 2), (2, 2), (-1, -5), (-3, 4), (3, -4), (0, -1)],
)
@pytest.mark.parametrize("corrected", [False, True])
def test_scheduler_edge_cases_never_divide_by_zero(warmup, total, corrected):
    """ORT accepts any int counts; the factor's max(1, .) guards keep lr finite and >= 0."""
    _, module, optimizer = build()
    scheduler = api.LinearLRScheduler(optimizer, warmup, total, 0.1, corrected=corrected)
    rates = [optimizer.get_learning_rate()]
    for _ in range(4):
        module(*batch())
        optimizer.step()
        module.lazy_reset_grad()
        scheduler.step()
        rates.append(optimizer.get_learning_rate())
    assert all(math.isfinite(r) and 0.0 <= r <= 0.1 + 1e-7 for r in rates), rates


def test_scheduler_matches_ort_formula_on_edges():
    """Effective W = total_step_count and T = warmup_step_count (ORT 1.19's swap)."""
    _, _, optimizer = build()
    api.LinearLRScheduler(optimizer, 5, 0, 0.1)  # W=0, T=5, s=0: (5-0)/5 = 1
    assert optimizer.get_learning_rate() == pytest.approx(0.1)
    api.LinearLRScheduler(optimizer, 0, 0, 0.1)  # W=T=0: max(0, 0/1) = 0
    assert optimizer.get_learning_rate() == 0.0


@pytest.mark.parametrize("value", [2.5, "3", None, np.float32(1.0)])
def test_scheduler_counts_must_be_ints(value):
    _, _, optimizer = build()
    lr = optimizer.get_learning_rate()
    with pytest.raises(TypeError, match=rf"warmup_step_count must be an int, got {type(value).__name__}"):
        api.LinearLRScheduler(optimizer, value, 10, 0.1)
    with pytest.raises(TypeError, match=r"total_step_count must be an int"):
        api.LinearLRScheduler(optimizer, 1, value, 0.1)
    assert optimizer.get_learning_rate() == lr  # nothing changed
    api.LinearLRScheduler(optimizer, np.int64(2), 10, 0.1)  # numpy ints are fine


@pytest.mark.parametrize("value", ["abc", "0.1", None, [0.1], np.array([0.1]), object()])
def test_learning_rate_must_be_numeric(value):
    _, module, optimizer = build()
    optimizer.set_learning_rate(0.25)
    with pytest.raises(TypeError, match=r"learning rate must be a number, got " + type(value).__name__):
        optimizer.set_learning_rate(value)
    with pytest.raises(TypeError, match=r"initial learning rate must be a number"):
        api.LinearLRScheduler(optimizer, 1, 2, value)
    assert optimizer.get_learning_rate() == 0.25  # unchanged
    assert_usable(module, optimizer)


@pytest.mark.parametrize("value", [True, 1, np.float64(0.5), np.float32(0.5), torch.tensor(0.5), np.array(0.5)])
def test_learning_rate_accepts_numbers(value):
    _, _, optimizer = build()
    optimizer.set_learning_rate(value)
    assert optimizer.get_learning_rate() == float(np.float32(float(value)))


def test_session_learning_rate_and_scheduler_type_errors():
    state = capi.load_checkpoint(SGD / "checkpoint")
    session = capi.TrainingSession(state, SGD / "training_model.onnx", optimizer_model=SGD / "optimizer_model.onnx")
    session.set_learning_rate(0.5)
    with pytest.raises(TypeError, match=r"learning rate must be a number, got str 'fast'"):
        session.set_learning_rate("fast")
    with pytest.raises(TypeError, match=r"initial_lr must be a number, got NoneType"):
        session.register_linear_lr_scheduler(1, 4, None)
    assert session.get_learning_rate() == 0.5  # the failed registration changed nothing
    with pytest.raises(Exception, match="No learning rate scheduler was registered"):
        session.scheduler_step()
    session.register_linear_lr_scheduler(0, 0, 0.1)
    session.scheduler_step()
    assert session.get_learning_rate() == 0.0


@pytest.mark.parametrize(
    "buffer, trainable_only, pattern",
    [
        (np.zeros(3, np.float32), True, r"Parameters buffer size incorrect. Expected:\d+, Actual:3"),
        (np.zeros(3, np.float32), False, r"Parameters buffer size incorrect. Expected:\d+, Actual:3"),
        ("size+1", True, r"Parameters buffer size incorrect. Expected:(\d+), Actual:\d+"),
        ("float64", True, r"Tensor type mismatch.*float32, got torch.float64"),
        ("int32", True, r"Tensor type mismatch.*float32, got torch.int32"),
        ([0.0, 1.0], True, r"buffer: expected a numpy array, OrtValue or torch tensor, got list"),
    ],
)
def test_copy_buffer_to_parameters_wrong_size_or_dtype(trained, buffer, trainable_only, pattern):
    state, module, optimizer = trained
    size = module.get_parameters_size(trainable_only)
    if isinstance(buffer, str) and buffer == "size+1":
        buffer = np.zeros(size + 1, np.float32)
    elif isinstance(buffer, str):
        buffer = np.zeros(size, buffer)
    before = module.get_contiguous_parameters().numpy().copy()
    with pytest.raises(InvalidInputError, match=pattern):
        module.copy_buffer_to_parameters(buffer, trainable_only)
    np.testing.assert_array_equal(module.get_contiguous_parameters().numpy(), before)  # untouched
    module.copy_buffer_to_parameters(np.full(size, 0.01, np.float32), trainable_only)
    assert_usable(module, optimizer)


def test_session_buffer_errors():
    state = capi.load_checkpoint(SGD / "checkpoint")
    session = capi.TrainingSession(state, SGD / "training_model.onnx")
    size = session.get_parameters_size(False)
    with pytest.raises(
        InvalidInputError, match=rf"Parameters buffer size incorrect. Expected:{size}, Actual:{size - 1}"
    ):
        session.copy_parameters_to_buffer(False, buffer=np.zeros(size - 1, np.float32))
    with pytest.raises(InvalidInputError, match="Data types must match"):
        session.copy_parameters_to_buffer(False, buffer=np.zeros(size, np.float64))
    with pytest.raises(InvalidInputError, match=r"Incorrect buffer size received: 5 elements"):
        session.from_buffer(np.zeros(5, np.float32))


def test_unknown_parameter_and_property_names(trained):
    state, module, optimizer = trained
    with pytest.raises(KeyError, match="Parameter fc9.weight not found."):
        state.parameters["fc9.weight"]
    with pytest.raises(KeyError, match="Parameter fc9.weight not found."):
        state.parameters["fc9.weight"] = np.zeros(3, np.float32)
    with pytest.raises(KeyError, match="Parameter fc9.weight not found."):
        state.get_parameter_type_and_shape("fc9.weight")
    with pytest.raises(KeyError, match="Property epoch not found."):
        state.properties["epoch"]
    with pytest.raises(KeyError, match="Property epoch not found."):
        state.get_property("epoch")
    assert "fc9.weight" not in state.parameters and "epoch" not in state.properties
    assert_usable(module, optimizer)


@pytest.mark.parametrize("value", [None, [1], (1,), {"a": 1}, b"bytes", np.zeros(2), 1 + 2j, object()])
def test_property_values_of_unsupported_types(tmp_path, value):
    state = api.CheckpointState.load_checkpoint(GOOD)
    state.properties["epoch"] = 3
    with pytest.raises(TypeError, match=rf"Property 'bad' has unsupported type {type(value).__name__}"):
        state.properties["bad"] = value
    with pytest.raises(TypeError, match=r"Property 'epoch' has unsupported type"):
        state.properties["epoch"] = value
    assert state.properties["epoch"] == 3 and "bad" not in state.properties
    api.CheckpointState.save_checkpoint(state, tmp_path / "ckpt")
    assert api.CheckpointState.load_checkpoint(tmp_path / "ckpt").properties["epoch"] == 3


@pytest.mark.parametrize("name", [1, None, b"epoch", ("a",)])
def test_property_names_must_be_strings(name):
    state = api.CheckpointState.load_checkpoint(GOOD)
    with pytest.raises(TypeError, match=r"Property names must be str, got " + type(name).__name__):
        state.properties[name] = 1
    with pytest.raises(TypeError, match=r"Property names must be str"):
        state.add_property(name, 1)
    assert len(state.properties) == 0


def test_parameter_assignment_wrong_shape_or_dtype(trained):
    state, module, optimizer = trained
    shape = state.parameters["fc1.bias"].data.shape
    with pytest.raises(RuntimeError, match=r"Parameter data shape mismatch. Expected: \{12\}, Got: \{13\}"):
        state.parameters["fc1.bias"] = np.zeros(13, np.float32)
    with pytest.raises(RuntimeError, match=r"Parameter data type mismatch. Expected: float32, Got: float64"):
        state.parameters["fc1.bias"] = np.zeros(shape, np.float64)
    assert_usable(module, optimizer)


def test_released_session_refuses_every_call():
    state = capi.load_checkpoint(SGD / "checkpoint")
    with capi.TrainingSession(
        state, SGD / "training_model.onnx", SGD / "eval_model.onnx", SGD / "optimizer_model.onnx"
    ) as session:
        session.train_step(batch())
    assert session.released
    for call, args in [
        ("train_step", (batch(),)),
        ("eval_step", (batch(),)),
        ("optimizer_step", ()),
        ("get_learning_rate", ()),
        ("set_learning_rate", (0.1,)),
        ("lazy_reset_grad", ()),
        ("copy_parameters_to_buffer", ()),
        ("get_parameters_size", ()),
        ("training_model_input_names", ()),
    ]:
        with pytest.raises(
            ReleasedError,
            match=rf"TrainingSession\(train_model='.*training_model.onnx'\) has been "
            rf"released.*{call}\(\) cannot be called",
        ):
            getattr(session, call)(*args)
    with pytest.raises(ReleasedError):
        session.state
    session.release()  # idempotent
    # the state outlives the session: still saveable and usable by a new session
    again = capi.TrainingSession(state, SGD / "training_model.onnx", optimizer_model=SGD / "optimizer_model.onnx")
    assert np.isfinite(again.train_step(batch())[0])
    again.optimizer_step()


# =============================================================================================
# 5. Saving: the previous file survives every failure, no temp file is left behind
# =============================================================================================
@pytest.fixture
def saved(tmp_path):
    """(state whose parameters differ from the file, path of the previous file, its bytes)."""
    state, module, optimizer = build(checkpoint=GOOD)
    path = tmp_path / "checkpoint"
    api.CheckpointState.save_checkpoint(state, path)
    previous = path.read_bytes()
    module(*batch())
    optimizer.step()
    return state, path, previous


def assert_previous_survives(path, previous, state):
    assert path.read_bytes() == previous
    assert sorted(os.listdir(path.parent)) == [path.name], os.listdir(path.parent)
    api.CheckpointState.save_checkpoint(state, path)  # a later save still works
    assert path.read_bytes() != previous
    assert sorted(os.listdir(path.parent)) == [path.name]
    api.CheckpointState.load_checkpoint(path)


def test_save_into_missing_directory(tmp_path):
    state = api.CheckpointState.load_checkpoint(GOOD)
    target = tmp_path / "no" / "such" / "dir" / "checkpoint"
    with pytest.raises(FileNotFoundError, match=rf"{target}"):
        api.CheckpointState.save_checkpoint(state, target)
    with pytest.raises(FileNotFoundError, match=rf"{target}"):
        capi.save_checkpoint(state, target)
    assert not (tmp_path / "no").exists()


def test_save_onto_a_directory(tmp_path):
    state = api.CheckpointState.load_checkpoint(GOOD)
    (tmp_path / "sub").mkdir()
    with pytest.raises(IsADirectoryError, match=rf"{tmp_path / 'sub'}"):
        api.CheckpointState.save_checkpoint(state, tmp_path / "sub")
    assert os.listdir(tmp_path / "sub") == [] and sorted(os.listdir(tmp_path)) == ["sub"]


def test_save_read_only_directory(saved, monkeypatch):
    """Creating the temp file is refused (a read-only directory; simulated since tests run as root)."""
    state, path, previous = saved
    real_open = os.open

    def refuse(file, flags, *args, **kwargs):
        if os.fspath(file).startswith(str(path.parent)) and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", file)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(PermissionError, match=rf"cannot write checkpoint {path}"):
        api.CheckpointState.save_checkpoint(state, path)
    monkeypatch.undo()
    assert_previous_survives(path, previous, state)


def test_save_rename_refused(saved, monkeypatch):
    """The final rename is refused (read-only target): the temp file is removed, the error names the path."""
    state, path, previous = saved

    def refuse(src, dst, *args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError, match=rf"cannot save checkpoint {path}: Operation not permitted"):
        api.CheckpointState.save_checkpoint(state, path)
    monkeypatch.undo()
    assert_previous_survives(path, previous, state)


class _FailingFile:
    """Wraps the temp file: `write` writes half of the data, then raises `error`."""

    def __init__(self, real, error):
        self._real, self._error = real, error

    def write(self, data):
        self._real.write(bytes(data[: len(data) // 2]))
        self._real.flush()
        raise self._error

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()


@pytest.mark.parametrize(
    "error, expected, pattern",
    [
        (OSError(errno.ENOSPC, "No space left on device"), OSError, "cannot save checkpoint .*No space left on device"),
        (KeyboardInterrupt(), KeyboardInterrupt, None),
        (MemoryError(), MemoryError, None),
    ],
    ids=["disk-full", "interrupted", "out-of-memory"],
)
def test_save_fails_mid_write(saved, monkeypatch, error, expected, pattern):
    state, path, previous = saved
    real_fdopen = os.fdopen

    def failing_fdopen(fd, *args, **kwargs):
        return _FailingFile(real_fdopen(fd, *args, **kwargs), error)

    monkeypatch.setattr(os, "fdopen", failing_fdopen)
    with pytest.raises(expected, match=pattern) as info:
        api.CheckpointState.save_checkpoint(state, path)
    monkeypatch.undo()
    if expected is OSError:
        assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert_previous_survives(path, previous, state)


def test_save_with_external_data_disk_full_keeps_previous_pair(external_checkpoint, monkeypatch):
    state = api.CheckpointState.load_checkpoint(external_checkpoint)
    previous = external_checkpoint.read_bytes(), open(f"{external_checkpoint}.data", "rb").read()
    state.parameters["fc1.bias"] = np.full(12, 7.0, np.float32)
    real_fdopen = os.fdopen
    opened = []

    def second_write_fails(fd, *args, **kwargs):  # .data is written first, then the main file
        opened.append(fd)
        handle = real_fdopen(fd, *args, **kwargs)
        return handle if len(opened) == 1 else _FailingFile(handle, OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(os, "fdopen", second_write_fails)
    with pytest.raises(OSError, match="No space left on device"):
        api.CheckpointState.save_checkpoint(state, external_checkpoint)
    monkeypatch.undo()
    assert sorted(os.listdir(external_checkpoint.parent)) == ["checkpoint", "checkpoint.data"]
    assert (external_checkpoint.read_bytes(), open(f"{external_checkpoint}.data", "rb").read()) == previous


def test_save_fsync_fails(saved, monkeypatch):
    """A delayed write error reported by fsync (e.g. ENOSPC / EIO on a network disk)."""
    state, path, previous = saved
    real_fsync = os.fsync
    calls = []

    def failing_fsync(fd):
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match=rf"cannot save checkpoint {path}: Input/output error"):
        api.CheckpointState.save_checkpoint(state, path)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert calls
    assert_previous_survives(path, previous, state)


def test_save_with_optimizer_state_after_failure_is_complete(saved, monkeypatch, tmp_path):
    """After a failed save, saving with the optimizer state gives a file that restores everything."""
    state, path, previous = saved
    monkeypatch.setattr(os, "replace", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
    with pytest.raises(OSError):
        api.CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    monkeypatch.undo()
    assert path.read_bytes() == previous
    api.CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    restored = api.CheckpointState.load_checkpoint(path)
    for name, parameter in state.parameters:
        np.testing.assert_array_equal(restored.parameters[name].data, parameter.data)


# =============================================================================================
# 6. Security: loading never unpickles
# =============================================================================================
def test_loading_never_unpickles(monkeypatch, tmp_path):
    def forbidden(*args, **kwargs):
        raise AssertionError("unpickling during checkpoint/model loading")

    class ForbiddenUnpickler:
        def __init__(self, *args, **kwargs):
            forbidden()

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", ForbiddenUnpickler)
    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(torch.serialization, "load", forbidden)
    real_np_load = np.load
    monkeypatch.setattr(np, "load", lambda *a, **k: real_np_load(*a, **{**k, "allow_pickle": False}))

    for directory in (SGD, ADAMW, FROZEN):
        state = api.CheckpointState.load_checkpoint(directory / "checkpoint")
        module = api.Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")
        optimizer = api.Optimizer(directory / "optimizer_model.onnx", module)
        assert_usable(module, optimizer, directory)
        api.CheckpointState.save_checkpoint(state, tmp_path / "ckpt", include_optimizer_state=True)
        again = capi.load_checkpoint_from_buffer((tmp_path / "ckpt").read_bytes())
        capi.TrainingSession(
            again, directory / "training_model.onnx", optimizer_model=directory / "optimizer_model.onnx"
        )


def test_a_pickle_is_not_a_checkpoint(tmp_path):
    """A pickle file (even a malicious one) is rejected as a format error, never executed."""

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    data = pickle.dumps(Boom())
    path = tmp_path / "checkpoint"
    path.write_bytes(data)
    with pytest.raises(CheckpointFormatError, match=rf"checkpoint {path}: "):
        api.CheckpointState.load_checkpoint(path)
    state = api.CheckpointState.load_checkpoint(GOOD)
    with pytest.raises(ModelLoadError, match="not an ONNX model"):
        api.Module(path, state)
    assert not (tmp_path / "pwned").exists()
