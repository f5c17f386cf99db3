#!/usr/bin/env python
"""Regenerate the ORT-written checkpoint fixtures under tests/fixtures/codec/.

Why: the codec's byte-exactness claims are only as good as the files they are checked
against, so every fixture here is written by onnxruntime-training 1.19.2 itself (writer A:
``generate_artifacts`` / ``onnxblock.save_checkpoint``; writer B:
``CheckpointState.save_checkpoint``).  ``expected.json`` records what ORT reported about
each file (names, dtypes, shapes, value hashes, properties, optimizer settings) so the
tests can check decoded content without ORT installed.

Run:  python scripts/make_codec_fixtures.py  (needs torch, onnx, onnxruntime-training 1.19.2)
Output is deterministic (fixed seeds, fixed data); files are a few KB each.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.training import artifacts, onnxblock
from onnxruntime.training.api import CheckpointState, LinearLRScheduler, Module, Optimizer

from ort_torch_compat.codec import (
    CheckpointRecord,
    ModuleStateRecord,
    encode_checkpoint,
    state_writer_external_min_bytes,
    state_writer_record,
    tensor_record_from_numpy,
)

onnxruntime.set_default_logger_severity(3)

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "codec"

ONNX_NAME = {
    TensorProto.FLOAT: "FLOAT",
    TensorProto.UINT8: "UINT8",
    TensorProto.INT8: "INT8",
    TensorProto.UINT16: "UINT16",
    TensorProto.INT16: "INT16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.STRING: "STRING",
    TensorProto.BOOL: "BOOL",
    TensorProto.FLOAT16: "FLOAT16",
    TensorProto.DOUBLE: "DOUBLE",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.BFLOAT16: "BFLOAT16",
    TensorProto.FLOAT8E4M3FN: "FLOAT8E4M3FN",
    TensorProto.FLOAT8E5M2: "FLOAT8E5M2",
}


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 3)
        self.fc2 = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def describe_array(name: str, arr: np.ndarray, code: int) -> dict:
    arr = np.asarray(arr)
    entry = {"name": name, "dtype": ONNX_NAME[code], "dims": list(arr.shape)}
    if code == TensorProto.STRING:
        entry["values"] = [s.decode() if isinstance(s, bytes) else str(s) for s in arr.reshape(-1).tolist()]
        return entry
    raw = np.ascontiguousarray(arr).tobytes()
    entry["sha256"] = sha(raw)
    entry["nbytes"] = len(raw)
    if (
        arr.size <= 16
        and arr.dtype.kind in "biuf"
        and arr.dtype.itemsize >= 1
        and code not in (TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2)
    ):
        entry["values"] = arr.reshape(-1).tolist()
    return entry


def describe_proto(p: onnx.TensorProto) -> dict:
    if p.data_type == TensorProto.STRING:
        arr = np.array(list(p.string_data), dtype=object).reshape(tuple(p.dims))
    else:
        arr = np.frombuffer(p.raw_data, dtype=helper.tensor_dtype_to_np_dtype(p.data_type)).reshape(tuple(p.dims))
    d = describe_array(p.name, arr, p.data_type)
    if p.doc_string:
        d["doc_string"] = p.doc_string
    return d


def describe_state(state: CheckpointState) -> dict:
    """What ORT's Python API reports about a loaded state."""
    params = []
    for n, p in state.parameters:  # iteration yields (name, Parameter), sorted by name
        arr = p.data
        code = helper.np_dtype_to_tensor_dtype(arr.dtype)
        e = describe_array(n, arr, code)
        e["requires_grad"] = bool(p.requires_grad)
        params.append(e)
    props = dict(state.properties)  # iteration yields (name, value)
    return {"parameters": params, "properties": props}


def patch_ir(path: Path) -> None:
    m = onnx.load(str(path))
    m.ir_version = 10  # onnx>=1.17 writes IR 11+, which ORT 1.19 refuses
    onnx.save(m, str(path))


def make_artifacts(work: Path, optim, nominal: bool) -> tuple[Path, dict]:
    torch.manual_seed(0)
    net = TinyNet()
    x = torch.randn(5, 4)
    model_path = work / "tiny.onnx"
    torch.onnx.export(
        net,
        (x,),
        str(model_path),
        input_names=["input"],
        output_names=["output"],
        opset_version=17,
        dynamo=False,
        do_constant_folding=False,
    )
    model = onnx.load(str(model_path))
    init_order = [i.name for i in model.graph.initializer]
    requires_grad = ["fc1.weight", "fc1.bias", "fc2.weight"]
    frozen = ["fc2.bias"]
    artifacts.generate_artifacts(
        model,
        requires_grad=requires_grad,
        frozen_params=frozen,
        loss=artifacts.LossType.MSELoss,
        optimizer=optim,
        artifact_directory=str(work),
        nominal_checkpoint=nominal,
    )
    for f in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        patch_ir(work / f)
    info = {
        "initializer_order": init_order,
        "torch_params": {
            k: describe_array(k, v.detach().numpy(), TensorProto.FLOAT) for k, v in net.state_dict().items()
        },
        "requires_grad": requires_grad,
        "frozen": frozen,
    }
    return work, info


def train(work: Path, ckpt: Path, steps: int, scheduler_lr: float | None) -> tuple[CheckpointState, dict]:
    state = CheckpointState.load_checkpoint(str(ckpt))
    onnxruntime.set_default_logger_severity(3)  # generate_artifacts turns verbose logging back on
    module = Module(str(work / "training_model.onnx"), state, str(work / "eval_model.onnx"), device="cpu")
    opt = Optimizer(str(work / "optimizer_model.onnx"), module)
    sched = None
    if scheduler_lr is not None:
        sched = LinearLRScheduler(opt, warmup_step_count=1, total_step_count=10, initial_lr=scheduler_lr)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    y = rng.standard_normal((5, 2)).astype(np.float32)
    module.train()
    losses = []
    for _ in range(steps):
        losses.append(float(module(x, y)))
        opt.step()
        if sched is not None:
            sched.step()
        module.lazy_reset_grad()
    info = {
        "steps": steps,
        "losses": losses,
        "learning_rate_after": float(opt.get_learning_rate()),
        "initial_lr": scheduler_lr if scheduler_lr is not None else 0.001,
        "input_names": module.input_names(),
    }
    return state, info


def dtype_protos(loadable_only: bool) -> tuple[list, list]:
    rng = np.random.default_rng(7)
    t = [
        numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "f32"),
        numpy_helper.from_array(np.array([1.5, -2.25, 1e300], dtype=np.float64), "f64"),
        numpy_helper.from_array(np.array(3.25, dtype=np.float32), "scalar_f32"),
        numpy_helper.from_array(np.array([-128, 0, 127], dtype=np.int8), "i8"),
        numpy_helper.from_array(np.array([-32768, 7, 32767], dtype=np.int16), "i16"),
        numpy_helper.from_array(np.array([[-(2**31), 5], [6, 2**31 - 1]], dtype=np.int32), "i32"),
    ]
    f = [
        numpy_helper.from_array(np.array([-(2**63), 2**63 - 1, 42], dtype=np.int64), "i64"),
        numpy_helper.from_array(np.array([0, 1, 255], dtype=np.uint8), "u8"),
        numpy_helper.from_array(np.array([0, 65535], dtype=np.uint16), "u16"),
        numpy_helper.from_array(np.array([0, 2**32 - 1], dtype=np.uint32), "u32"),
        numpy_helper.from_array(np.array([0, 2**64 - 1], dtype=np.uint64), "u64"),
        numpy_helper.from_array(np.array([True, False, True], dtype=np.bool_), "b"),
        numpy_helper.from_array(np.zeros((0, 3), dtype=np.float32), "empty_f32"),
    ]
    if not loadable_only:
        f16 = numpy_helper.from_array(np.array([1.0, -0.5, 65504.0], dtype=np.float16), "f16")
        f16.doc_string = "a half-precision tensor"
        import ml_dtypes

        bf = np.array([1.0, -3.0, 0.1], dtype=ml_dtypes.bfloat16)
        bf16 = helper.make_tensor("bf16", TensorProto.BFLOAT16, [3], bf.view(np.uint16).tobytes(), raw=True)
        f8 = np.array([0.5, -2.0], dtype=ml_dtypes.float8_e4m3fn)
        f8p = helper.make_tensor("f8e4m3", TensorProto.FLOAT8E4M3FN, [2], f8.view(np.uint8).tobytes(), raw=True)
        s = helper.make_tensor("strs", TensorProto.STRING, [2, 2], [b"a", b"", "\u00e9t\u00e9".encode(), b"xyz"])
        s.doc_string = "strings"
        t = t + [f16, bf16]
        f = f + [f8p, s]
    return t, f


def write_fixture(name: str, src: Path) -> Path:
    dst = OUT / name
    shutil.copyfile(src, dst)
    if Path(str(src) + ".data").exists() and name.endswith("external_checkpoint"):
        shutil.copyfile(str(src) + ".data", str(dst) + ".data")
    return dst


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    expected: dict = {"onnxruntime": __import__("onnxruntime").__version__, "fixtures": {}}
    E = expected["fixtures"]
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)

        # ---- writer A: generate_artifacts (AdamW) incl. nominal ----
        wa = tmp / "adamw"
        wa.mkdir()
        _, ainfo = make_artifacts(wa, artifacts.OptimType.AdamW, nominal=True)
        write_fixture("artifact_checkpoint", wa / "checkpoint")
        write_fixture("artifact_nominal_checkpoint", wa / "nominal_checkpoint")
        E["artifact_checkpoint"] = {"writer": "A", "model": ainfo, "is_nominal": False}
        E["artifact_nominal_checkpoint"] = {"writer": "A", "model": ainfo, "is_nominal": True}
        nominal_state = CheckpointState.load_checkpoint(str(wa / "nominal_checkpoint"))
        E["artifact_nominal_checkpoint"]["ort_len_parameters"] = len(nominal_state.parameters)

        # ---- writer A: onnxblock.save_checkpoint with many dtypes (plus nominal) ----
        tr, fr = dtype_protos(loadable_only=False)
        onnxblock.save_checkpoint((tr, fr), str(tmp / "dtypes"))
        onnxblock.save_checkpoint((tr, fr), str(tmp / "dtypes_nominal"), nominal_checkpoint=True)
        write_fixture("artifact_dtypes_checkpoint", tmp / "dtypes")
        write_fixture("artifact_dtypes_nominal_checkpoint", tmp / "dtypes_nominal")
        E["artifact_dtypes_checkpoint"] = {
            "writer": "A",
            "is_nominal": False,
            "trainable": [describe_proto(p) for p in tr],
            "frozen": [describe_proto(p) for p in fr],
        }
        E["artifact_dtypes_nominal_checkpoint"] = {
            "writer": "A",
            "is_nominal": True,
            "trainable": [describe_proto(p) for p in tr],
            "frozen": [describe_proto(p) for p in fr],
        }

        # ---- writer B: properties of all three types ----
        st = CheckpointState.load_checkpoint(str(wa / "checkpoint"))
        props = {
            "epoch": 3,
            "zero_int": 0,
            "neg": -(2**40),
            "flag": True,
            "big": 2**63 - 1,
            "lr": 0.1,
            "zero_float": 0.0,
            "negf": -1.5e-3,
            "tag": "run-\u00e9",
            "empty": "",
            "huge_int": 2**70,
            "a_first": "alpha",
        }
        for k, v in props.items():
            st.properties[k] = v
        CheckpointState.save_checkpoint(st, str(tmp / "props"))
        write_fixture("state_properties_checkpoint", tmp / "props")
        E["state_properties_checkpoint"] = {
            "writer": "B",
            "properties_set": {k: repr(v) for k, v in props.items()},
            **describe_state(CheckpointState.load_checkpoint(str(tmp / "props"))),
        }

        # ---- writer B: re-saving the artifact checkpoint unchanged ----
        st = CheckpointState.load_checkpoint(str(wa / "checkpoint"))
        CheckpointState.save_checkpoint(st, str(tmp / "resaved"))
        write_fixture("state_resaved_checkpoint", tmp / "resaved")
        E["state_resaved_checkpoint"] = {"writer": "B", **describe_state(st)}

        # ---- writer B: AdamW optimizer state after 2 steps (scheduler sets initial_lr) ----
        state, tinfo = train(wa, wa / "checkpoint", steps=2, scheduler_lr=0.05)
        state.properties["epoch"] = 1
        CheckpointState.save_checkpoint(state, str(tmp / "adamw_ckpt"), include_optimizer_state=True)
        CheckpointState.save_checkpoint(state, str(tmp / "adamw_noopt"), include_optimizer_state=False)
        write_fixture("state_adamw_checkpoint", tmp / "adamw_ckpt")
        write_fixture("state_adamw_noopt_checkpoint", tmp / "adamw_noopt")
        E["state_adamw_checkpoint"] = {"writer": "B", "optimizer": "AdamW", "train": tinfo, **describe_state(state)}
        E["state_adamw_noopt_checkpoint"] = {"writer": "B", **describe_state(state)}

        # ---- writer B: SGD optimizer state after 2 steps (no scheduler: default lr) ----
        ws = tmp / "sgd"
        ws.mkdir()
        make_artifacts(ws, artifacts.OptimType.SGD, nominal=False)
        state, tinfo = train(ws, ws / "checkpoint", steps=2, scheduler_lr=None)
        CheckpointState.save_checkpoint(state, str(tmp / "sgd_ckpt"), include_optimizer_state=True)
        write_fixture("state_sgd_checkpoint", tmp / "sgd_ckpt")
        E["state_sgd_checkpoint"] = {"writer": "B", "optimizer": "SGD", "train": tinfo, **describe_state(state)}

        # ---- writer B: all dtypes ORT can load ----
        tr, fr = dtype_protos(loadable_only=True)
        onnxblock.save_checkpoint((tr, fr), str(tmp / "loadable"))
        st = CheckpointState.load_checkpoint(str(tmp / "loadable"))
        st.properties["note"] = "dtypes"
        CheckpointState.save_checkpoint(st, str(tmp / "dtypes_b"))
        write_fixture("state_dtypes_checkpoint", tmp / "dtypes_b")
        E["state_dtypes_checkpoint"] = {"writer": "B", **describe_state(st)}

        # ---- writer B: external data (the flag sticks when loaded from an external file) ----
        rng = np.random.default_rng(3)
        ours = state_writer_record(
            trainable=[
                tensor_record_from_numpy("w", rng.standard_normal((3, 5)).astype(np.float32)),
                tensor_record_from_numpy("odd", np.array([1, 2, 3], dtype=np.uint8)),
                tensor_record_from_numpy("d", np.array([0.25, -8.0], dtype=np.float64)),
            ],
            frozen=[
                tensor_record_from_numpy("b1", np.array([True], dtype=np.bool_)),
                tensor_record_from_numpy("cnt", np.array([7, -9, 11], dtype=np.int64)),
                tensor_record_from_numpy("h", np.array([1, 2, 3], dtype=np.int16)),
                tensor_record_from_numpy("i8", np.array([-5], dtype=np.int8)),
                tensor_record_from_numpy("u64", np.array([2**64 - 1, 3], dtype=np.uint64)),
            ],
            has_external_data=True,
            properties={"kind": "external"},
        )
        main_bytes, ext_bytes = encode_checkpoint(ours, external_min_bytes=state_writer_external_min_bytes(True))
        (tmp / "ours_ext").write_bytes(main_bytes)
        (tmp / "ours_ext.data").write_bytes(ext_bytes)
        st = CheckpointState.load_checkpoint(str(tmp / "ours_ext"))
        CheckpointState.save_checkpoint(st, str(tmp / "ext_b"))
        write_fixture("state_external_checkpoint", tmp / "ext_b")
        same = (tmp / "ext_b").read_bytes() == main_bytes and (tmp / "ext_b.data").read_bytes() == ext_bytes
        if not same:
            raise SystemExit("ORT's re-save of our external checkpoint differs from our encoding")
        E["state_external_checkpoint"] = {"writer": "B", "ort_resave_equals_our_encoding": same, **describe_state(st)}

        # ---- writer B: a state with no parameters (ModuleState omitted) ----
        # (state_writer_record would omit the empty ModuleState; ORT must do that on its own)
        empty = CheckpointRecord(
            version=2, module_state=ModuleStateRecord([], []), optimizer_groups=[], properties={"only": 1}
        )
        (tmp / "ours_empty").write_bytes(encode_checkpoint(empty)[0])
        st = CheckpointState.load_checkpoint(str(tmp / "ours_empty"))
        CheckpointState.save_checkpoint(st, str(tmp / "noparams"))
        write_fixture("state_noparams_checkpoint", tmp / "noparams")
        if (tmp / "noparams").read_bytes() != encode_checkpoint(state_writer_record([], [], properties={"only": 1}))[0]:
            raise SystemExit("ORT's no-params layout differs from state_writer_record")
        E["state_noparams_checkpoint"] = {"writer": "B", **describe_state(st)}

    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    for p in sorted(OUT.iterdir()):
        print(f"{p.stat().st_size:8d}  {p.name}")


if __name__ == "__main__":
    main()
