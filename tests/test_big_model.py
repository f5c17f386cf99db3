"""A model over 2 GB (protobuf's limit) through generate_artifacts(path) and one training step
in ort_torch_compat and in onnxruntime-training 1.19.2.

The model is ``y = (x @ W1 + b1) + sum_k Gather(Big_k, rows)``: three frozen 720 MB
initializers (2.16 GB in all) in one external-data file next to the .onnx, and a small
trainable part.  It is written without ever holding the big tensors as a ModelProto (the
external file is streamed), so building it costs ~2.2 GB of disk and no protobuf limit.
generate_artifacts must write a small training model (parameters are graph inputs) and a
checkpoint whose tensors do not fit one flatbuffer (external ``checkpoint.data``), and both
runtimes must load and train them.

Opt-in (disk, memory, minutes): ``ORT_TORCH_COMPAT_BIG_TESTS=1 pytest tests/test_big_model.py -s``.
Measured on a loaded 2-core machine (onnxruntime-training 1.19.2): writing the model 74 s,
generate_artifacts 136 s, ours load + 1 step 22 s, ORT load + 1 step 23 s; 4.8 min in all.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

big = pytest.mark.skipif(
    os.environ.get("ORT_TORCH_COMPAT_BIG_TESTS") != "1",
    reason="over-2-GB model: set ORT_TORCH_COMPAT_BIG_TESTS=1 (needs ~5 GB of disk, ~8 GB RAM)",
)

BIG_ROWS = 36_000_000  # x 5 columns x 4 bytes = 720 MB per tensor
BIG_COUNT = 3
ROWS = np.array([0, 1, BIG_ROWS // 2, BIG_ROWS - 1], np.int64)


def _big_values(k: int, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of Big_k: cheap, deterministic, not constant."""
    rows = np.arange(start, stop, dtype=np.float32)[:, None]
    return ((rows % 97) * 1e-3 + k * 0.1 + np.arange(5, dtype=np.float32)[None, :] * 1e-2).astype(np.float32)


def write_big_model(directory: pathlib.Path) -> pathlib.Path:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((3, 5)).astype(np.float32), "W1")
    b1 = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b1")
    rows = numpy_helper.from_array(ROWS, "rows")
    data_file = directory / "weights.bin"
    bigs = []
    offset = 0
    chunk = 4_000_000
    with open(data_file, "wb") as handle:
        for k in range(BIG_COUNT):
            for start in range(0, BIG_ROWS, chunk):
                handle.write(_big_values(k, start, min(BIG_ROWS, start + chunk)).tobytes())
            length = BIG_ROWS * 5 * 4
            tensor = TensorProto(
                name=f"Big{k}", data_type=TensorProto.FLOAT, dims=[BIG_ROWS, 5], data_location=TensorProto.EXTERNAL
            )
            for key, value in (("location", data_file.name), ("offset", str(offset)), ("length", str(length))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            bigs.append(tensor)
            offset += length
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m"]), helper.make_node("Add", ["m", "b1"], ["h0"])]
    for k in range(BIG_COUNT):
        nodes.append(helper.make_node("Gather", [f"Big{k}", "rows"], [f"g{k}"], axis=0))
        nodes.append(helper.make_node("Add", [f"h{k}", f"g{k}"], [f"h{k + 1}" if k + 1 < BIG_COUNT else "y"]))
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])],
        [w1, b1, rows, *bigs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = directory / "model.onnx"
    onnx.save(model, str(path))  # the big tensors are references only
    return path


def _train_one_step(api, directory: pathlib.Path, x, target):
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    module.train()
    loss = float(np.asarray(module(x, target)))
    optimizer.step()
    module.lazy_reset_grad()
    after = {name: np.array(state.parameters[name].data) for name in ("W1", "b1")}
    big_row = np.array(state.parameters["Big1"].data[BIG_ROWS // 2])
    del optimizer, module, state
    return loss, after, big_row


@big
def test_generate_artifacts_for_a_model_over_2_gb(tmp_path):
    from ort_torch_compat import api as ours
    from ort_torch_compat import artifacts

    free = shutil.disk_usage(tmp_path).free
    if free < 6 * 2**30:
        pytest.skip(f"needs ~6 GB free in {tmp_path}, has {free / 2**30:.1f}")
    source = tmp_path / "model"
    source.mkdir()
    timings = {}
    start = time.perf_counter()
    model_path = write_big_model(source)
    timings["write model"] = time.perf_counter() - start
    assert (source / "weights.bin").stat().st_size > 2**31
    out = tmp_path / "artifacts"
    out.mkdir()
    start = time.perf_counter()
    artifacts.generate_artifacts(
        str(model_path),
        requires_grad=["W1", "b1"],
        frozen_params=[f"Big{k}" for k in range(BIG_COUNT)],
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(out),
    )
    timings["generate_artifacts"] = time.perf_counter() - start
    files = {p.name: p.stat().st_size for p in out.iterdir()}
    assert {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"} <= set(files)
    assert files["training_model.onnx"] < 2**20, files  # the parameters live in the checkpoint
    assert sum(files.values()) > 2**31, files  # ... all of them

    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    target = np.zeros((4, 5), np.float32)
    start = time.perf_counter()
    loss, after, big_row = _train_one_step(ours, out, x, target)
    timings["ours: load + 1 step"] = time.perf_counter() - start
    assert np.isfinite(loss)
    np.testing.assert_array_equal(big_row, _big_values(1, BIG_ROWS // 2, BIG_ROWS // 2 + 1)[0])
    try:
        from onnxruntime.training import api as ort
    except ImportError:
        print(timings)
        return
    start = time.perf_counter()
    ort_loss, ort_after, _ = _train_one_step(ort, out, x, target)
    timings["ORT: load + 1 step"] = time.perf_counter() - start
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print({k: round(v, 1) for k, v in timings.items()}, files, f"peak RSS {peak:.1f} GB")
    assert loss == pytest.approx(ort_loss, rel=1e-5)
    for name in after:
        np.testing.assert_allclose(after[name], ort_after[name], rtol=1e-5, atol=1e-6)


def test_path_models_check_through_one_shared_tensor_file(tmp_path, monkeypatch):
    """The same model, 1000x smaller, with every initializer sent to onnxblock's shared temp
    file (threshold 0): the artifacts equal those made from the ModelProto, and the temp
    directory is gone afterwards."""
    from ort_torch_compat import artifacts, onnxblock
    from ort_torch_compat.onnxblock import blocks

    monkeypatch.setattr(sys.modules[__name__], "BIG_ROWS", 36_000)
    monkeypatch.setattr(sys.modules[__name__], "ROWS", np.array([0, 1, 18_000, 35_999], np.int64))
    monkeypatch.setattr(blocks, "_EXTERNAL_MIN_BYTES", 0)
    source = tmp_path / "model"
    source.mkdir()
    model_path = write_big_model(source)
    made = []
    original = blocks._ExternalTensors.__init__

    def recording(self):
        original(self)
        made.append(self)

    monkeypatch.setattr(blocks._ExternalTensors, "__init__", recording)
    outputs = {}
    for form in ("path", "proto"):
        out = tmp_path / form
        out.mkdir()
        onnxblock.reset_name_counter()
        artifacts.generate_artifacts(
            str(model_path) if form == "path" else onnx.load(str(model_path)),
            requires_grad=["W1", "b1"],
            frozen_params=[f"Big{k}" for k in range(BIG_COUNT)],
            loss=artifacts.LossType.MSELoss,
            optimizer=artifacts.OptimType.AdamW,
            artifact_directory=str(out),
        )
        outputs[form] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert len(made) == 1 and not os.path.exists(made[0].path)  # used for the path form only, then removed
    assert outputs["path"] == outputs["proto"]
