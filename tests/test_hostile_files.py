"""Hostile and corrupt checkpoint files (issue 17): the `.data` companion is read as a regular
file inside the checkpoint's folder, only in the ranges the main file declares; impossible
dims, dtypes and moments give CheckpointFormatError naming the tensor and the file;
bfloat16 / float8 parameters are readable and writable.
"""

from __future__ import annotations

import contextlib
import os
import signal

import ml_dtypes
import numpy as np
import pytest

import ort_torch_compat.api as api
from ort_torch_compat.codec import (
    CheckpointFormatError,
    CheckpointRecord,
    ModuleStateRecord,
    OptimizerGroupRecord,
    ParameterOptimizerStateRecord,
    TensorDataType,
    TensorRecord,
    encode_checkpoint,
    tensor_record_from_numpy,
    write_checkpoint,
)
from ort_torch_compat.errors import ModelMismatchError
from tests.conftest import FIXTURES, load_spec

SGD = FIXTURES / "mlp_mse_sgd_op17"


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail instead of hanging (a FIFO opened for reading blocks forever without O_NONBLOCK)."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def external(tmp_path):
    """A checkpoint with external data in tmp_path/ck (two parameters: 140 bytes of .data)."""
    record = CheckpointRecord(
        module_state=ModuleStateRecord(
            [tensor_record_from_numpy("w", np.arange(30, dtype=np.float32))],
            [tensor_record_from_numpy("b", np.arange(5, dtype=np.float32))],
            has_external_data=True,
        )
    )
    folder = tmp_path / "folder"
    folder.mkdir()
    write_checkpoint(record, folder / "ck", external_min_bytes=0)
    assert (folder / "ck.data").stat().st_size == 140
    return folder / "ck"


def load(path, **kwargs):
    with deadline(20):
        return api.CheckpointState.load_checkpoint(path, **kwargs)


# ---- the .data companion -----------------------------------------------------------------
def test_fifo_companion_is_refused_without_blocking(external):
    os.remove(f"{external}.data")
    os.mkfifo(f"{external}.data")
    with pytest.raises(
        CheckpointFormatError, match=r"cannot read its data file .*ck\.data: a FIFO, not a regular file"
    ):
        load(external)


def test_fifo_main_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "ck")
    with pytest.raises(CheckpointFormatError, match=r"ck: not a regular file \(a FIFO\)"):
        load(tmp_path / "ck")


def test_symlink_out_of_the_folder_is_refused_unless_allowed(external, tmp_path):
    data = (external.parent / "ck.data").read_bytes()
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(data)
    os.remove(f"{external}.data")
    os.symlink(outside, f"{external}.data")
    with pytest.raises(
        CheckpointFormatError,
        match=rf"is a symlink to {outside}, outside the checkpoint's folder "
        r"\(pass allow_external_symlinks=True",
    ):
        load(external)
    state = load(external, allow_external_symlinks=True)
    np.testing.assert_array_equal(state.parameters["w"].data, np.arange(30, dtype=np.float32))


def test_symlink_inside_the_folder_is_followed(external):
    os.rename(f"{external}.data", external.parent / "shared.bin")
    os.symlink("shared.bin", f"{external}.data")
    np.testing.assert_array_equal(load(external).parameters["b"].data, np.arange(5, dtype=np.float32))


@pytest.mark.parametrize("allowed", [False, True])
def test_device_companion_is_refused(external, allowed):
    """/dev/zero would never end: refused as a symlink out of the folder, and as a device."""
    os.remove(f"{external}.data")
    os.symlink("/dev/zero", f"{external}.data")
    reason = "a character device, not a regular file" if allowed else "outside the checkpoint's folder"
    with pytest.raises(CheckpointFormatError, match=reason):
        load(external, allow_external_symlinks=allowed)


def test_only_the_declared_ranges_are_read(external, monkeypatch):
    """A sparse 8 GiB `.data` costs the 140 bytes the checkpoint declares, not 8 GiB."""
    with open(f"{external}.data", "r+b") as handle:
        handle.truncate(8 << 30)
    read = []
    real_pread, real_preadv = os.pread, os.preadv

    def from_data(fd, n):  # count what is asked of the .data file (tensors are read into place with preadv)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".data"):
            read.append(n)

    monkeypatch.setattr(os, "pread", lambda fd, n, offset: from_data(fd, n) or real_pread(fd, n, offset))
    monkeypatch.setattr(
        os,
        "preadv",
        lambda fd, buffers, offset: (
            from_data(fd, sum(len(memoryview(b).cast("B")) for b in buffers)) or real_preadv(fd, buffers, offset)
        ),
    )
    state = load(external)
    assert sum(read) == 140
    np.testing.assert_array_equal(state.parameters["w"].data, np.arange(30, dtype=np.float32))


# ---- impossible tensors ----------------------------------------------------------------------
def _with(tensor: TensorRecord, nominal: bool = False) -> bytes:
    return encode_checkpoint(CheckpointRecord(module_state=ModuleStateRecord([tensor], [], is_nominal=nominal)))[0]


@pytest.mark.parametrize(
    "dims, reason",
    [
        ((2**40, 2**40, 0), r"dims \[1099511627776, 1099511627776, 0\] overflow a 64-bit size"),
        ((0, 2**62), r"dims \[0, 4611686018427387904\] overflow a 64-bit size"),
        ((1,) * 65, "rank 65 exceeds 64"),
        ((-1, 0), "negative dimension"),
    ],
)
def test_impossible_dims_are_format_errors(tmp_path, dims, reason):
    data = _with(TensorRecord("w", int(TensorDataType.FLOAT), dims, b""))
    (tmp_path / "ck").write_bytes(data)
    for source, name in ((data, "<buffer>"), (tmp_path / "ck", str(tmp_path / "ck"))):
        with pytest.raises(CheckpointFormatError, match=rf"checkpoint {name}: .*tensor 'w': {reason}"):
            api.CheckpointState.load_checkpoint(source)


@pytest.mark.parametrize("code", [99, int(TensorDataType.UNDEFINED), int(TensorDataType.STRING)])
def test_unknown_dtype_in_a_nominal_checkpoint_names_the_parameter(code):
    data = _with(TensorRecord("fc1.weight", code, (), b"", string_data=[] if code == 8 else None), nominal=True)
    with pytest.raises(CheckpointFormatError, match=r"checkpoint <buffer>: parameter 'fc1.weight': TensorDataType"):
        api.CheckpointState.load_checkpoint(data)


def _with_moment(shape, dtype=np.float32, nominal=False):
    param = tensor_record_from_numpy("w", np.ones((2, 3), np.float32))
    if nominal:
        param = TensorRecord("w", int(TensorDataType.FLOAT), (), b"")
    moment = tensor_record_from_numpy("momentum0", np.zeros(shape, dtype))
    return encode_checkpoint(
        CheckpointRecord(
            module_state=ModuleStateRecord([param], [], is_nominal=nominal),
            optimizer_groups=[OptimizerGroupRecord("group0", 1, 0.001, [ParameterOptimizerStateRecord("w", [moment])])],
        )
    )[0]


@pytest.mark.parametrize("shape, dtype", [((3, 2), np.float32), ((7,), np.float32), ((2, 3), np.float64)])
def test_moment_unlike_its_parameter_is_refused_at_load(shape, dtype):
    with pytest.raises(
        CheckpointFormatError,
        match=r"optimizer state 'momentum0' of parameter 'w' is .* but the "
        r"parameter is torch.float32 \[2, 3\]",
    ):
        api.CheckpointState.load_checkpoint(_with_moment(shape, dtype))


def test_moment_of_a_nominal_parameter_is_checked_when_the_optimizer_is_created():
    record = CheckpointRecord(
        module_state=ModuleStateRecord(
            [TensorRecord(n, int(TensorDataType.FLOAT), (), b"") for n in load_spec(SGD)["trainable_params"]],
            [],
            is_nominal=True,
        ),
        optimizer_groups=[
            OptimizerGroupRecord(
                "group0",
                1,
                0.001,
                [
                    ParameterOptimizerStateRecord(
                        "fc1.bias", [tensor_record_from_numpy("momentum0", np.zeros(3, np.float32))]
                    )
                ],
            )
        ],
    )
    state = api.CheckpointState.load_checkpoint(encode_checkpoint(record)[0])
    module = api.Module(SGD / "training_model.onnx", state)
    with pytest.raises(
        ModelMismatchError,
        match=r"optimizer state 'momentum0' of parameter 'fc1.bias' is torch.float32 "
        r"\[3\] but the parameter is torch.float32 \[12\]",
    ):
        api.Optimizer(SGD / "optimizer_model.onnx", module)


# ---- dtypes numpy has no type for ----------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype",
    [
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2fnuz,
    ],
)
def test_bfloat16_and_float8_parameters_read_and_write(dtype):
    values = np.array([[0.5, -1.0, 2.0], [0.0, 1.5, -0.25]], dtype=dtype)
    data = _with(tensor_record_from_numpy("w", values))
    state = api.CheckpointState.load_checkpoint(data)
    got = state.parameters["w"].data
    assert got.dtype == np.dtype(dtype) and got.tobytes() == values.tobytes()
    assert state.get_parameter("w").tobytes() == values.tobytes()
    assert state.get_parameter_type_and_shape("w") == (np.dtype(dtype), (2, 3))
    state.parameters["w"] = values[::-1].copy()
    assert state.parameters["w"].data.tobytes() == values[::-1].tobytes()
    scalar = api.CheckpointState.load_checkpoint(_with(tensor_record_from_numpy("s", np.array(1.5, dtype=dtype))))
    assert scalar.parameters["s"].data.shape == () and float(scalar.parameters["s"].data) == 1.5
