"""ORT-format (.ort) training artifacts for tests/test_ort_format.py (issue 28).

    python scripts/make_ort_format_fixtures.py        # needs onnxruntime-training 1.19.2

For each source fixture below, the three models of tests/fixtures/<source>/ are copied to a
scratch folder and converted by ORT's own converter with its defaults:

    python -m onnxruntime.tools.convert_onnx_models_to_ort SCRATCH

No option is needed: the default runs both optimization styles.  `Fixed` writes
`<model>.ort`, optimized at level "all" (contrib fusions such as FusedGemm, Gelu,
LayerNormalization; ORT stores nodes by index, fused ones last, so not in topological order);
`Runtime` writes `<model>.with_runtime_opt.ort`, optimized at level "basic" plus
runtime-optimization records for what a minimal build may apply later.  Records are kept only
for QDQ node groups (QDQSelectorActionTransformer); none of our training artifacts gets any
(measured by this script: it prints the records of every file and fails if an artifact has some).

Written to tests/fixtures/ort_format/<source>/: training_model.ort, eval_model.ort,
optimizer_model.ort (Fixed) and the `with_runtime_opt` variants for SOURCES_WITH_RUNTIME;
the test takes checkpoint, spec.json and ORT's recorded numbers (expected.npz) from the source
(no checkpoint copies here: tests/test_fuzz_load.py seeds from every committed checkpoint).

tests/fixtures/ort_format/attributes/: model.onnx with attributes of every kind ONNX ops use,
If subgraphs, a sparse initializer and a string constant, and its conversion without
optimizations (ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL=disable) as model.ort.

tests/fixtures/ort_format/qdq_runtime_records/model.with_runtime_opt.ort: a small
QuantizeLinear/DequantizeLinear -> Conv model whose Runtime-style conversion does carry
records, to test that such files are refused by name.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "ort_format"
# CNN with BatchNorm + SGD, transformer + AdamW, LSTM, GRU + SGD, frozen parameters, MLP.
SOURCES = [
    "mlp_mse_adamw_op17",
    "cnn_mse_sgd_op17",
    "transformer_ce_adamw_op17",
    "lstm_bce_adamw_op17",
    "gru_ce_sgd_op17",
    "frozen_mse_adamw_op17",
]
SOURCES_WITH_RUNTIME = ["mlp_mse_adamw_op17"]
MODELS = ["training_model", "eval_model", "optimizer_model"]


def convert(folder: pathlib.Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "onnxruntime.tools.convert_onnx_models_to_ort", str(folder)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def records(path: pathlib.Path) -> dict:
    from ort_torch_compat.ortformat import runtime_optimization_summary

    return runtime_optimization_summary(path.read_bytes())


def make_artifacts(source: str, scratch: pathlib.Path) -> None:
    work = scratch / source
    work.mkdir()
    for model in MODELS:
        shutil.copy(FIXTURES / source / f"{model}.onnx", work)
    convert(work)
    target = OUT / source
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for model in MODELS:
        for suffix in (".ort", ".with_runtime_opt.ort"):
            path = work / f"{model}{suffix}"
            found = records(path)
            print(f"{source}/{path.name}: {path.stat().st_size} bytes, runtime optimization records: {found or 'none'}")
            if found:
                raise SystemExit(f"{path}: unexpected runtime optimization records {found}")
            if suffix == ".ort" or source in SOURCES_WITH_RUNTIME:
                shutil.copy(path, target)


def make_qdq(scratch: pathlib.Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = rng.integers(-20, 20, size=(4, 3, 3, 3)).astype(np.int8)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.uint8), "z"),
        numpy_helper.from_array(weight, "w_q"),
        numpy_helper.from_array(np.array(0.02, np.float32), "ws"),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
        numpy_helper.from_array(np.array(0.1, np.float32), "ys"),
        numpy_helper.from_array(np.array(128, np.uint8), "yz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "ws", "wz"], ["w_dq"]),
        helper.make_node("Conv", ["x_dq", "w_dq"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["y_q"]),
        helper.make_node("DequantizeLinear", ["y_q", "ys", "yz"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    work = scratch / "qdq"
    work.mkdir()
    onnx.save(model, work / "model.onnx")
    convert(work)
    path = work / "model.with_runtime_opt.ort"
    found = records(path)
    print(f"qdq/{path.name}: {path.stat().st_size} bytes, runtime optimization records: {found}")
    if not found:
        raise SystemExit("the QDQ model got no runtime optimization records; the refusal test needs some")
    target = OUT / "qdq_runtime_records"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, target)


def make_attributes(scratch: pathlib.Path) -> None:
    """A forward model with attributes of every kind ONNX ops use (float, int, string, tensor,
    graph, floats, ints, strings), If subgraphs reading outer-scope values, a sparse initializer
    and a string tensor; converted without optimizations so that the .ort holds the same nodes."""
    import os

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def branch(name: str, op: str) -> onnx.GraphProto:
        node = helper.make_node(op, ["h", "bias"], [f"{name}_out"])
        return helper.make_graph(
            [node], name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2, 3])]
        )

    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "sp"),
        numpy_helper.from_array(np.array([1, 4], np.int64), "sp_idx"),
        [2, 3],
    )
    nodes = [
        helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.2),
        helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0]),
        helper.make_node("Transpose", ["t"], ["h0"], perm=[1, 0]),
        helper.make_node("Add", ["h0", "sp"], ["h"]),
        helper.make_node("Constant", [], ["bias"], value=numpy_helper.from_array(np.full((2, 3), 0.5, np.float32))),
        helper.make_node("Constant", [], ["scales"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["shape"], value_ints=[3, 2]),
        helper.make_node("Constant", [], ["label"], value_string="ort"),
        helper.make_node("Mul", ["h", "scales"], ["m"]),
        helper.make_node("ReduceSum", ["m"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node(
            "If", ["cond"], ["branch"], then_branch=branch("then", "Add"), else_branch=branch("else", "Sub")
        ),
        helper.make_node("Reshape", ["branch", "shape"], ["reshaped"]),
        helper.make_node("Cast", ["reshaped"], ["out"], to=TensorProto.DOUBLE),
        helper.make_node(
            "LSTM", ["seq", "W", "R"], ["", "lstm_h"], hidden_size=2, activations=["Sigmoid", "Tanh", "Tanh"]
        ),
        helper.make_node("Identity", ["label"], ["label_out"]),
    ]
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(rng.standard_normal((1, 8, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal((1, 8, 2)).astype(np.float32), "R"),
    ]
    graph = helper.make_graph(
        nodes,
        "attributes",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("seq", TensorProto.FLOAT, ["steps", 1, 3]),
        ],
        [
            helper.make_tensor_value_info("out", TensorProto.DOUBLE, [3, 2]),
            helper.make_tensor_value_info("lstm_h", TensorProto.FLOAT, [1, 1, 2]),
            helper.make_tensor_value_info("label_out", TensorProto.STRING, []),
        ],
        inits,
        sparse_initializer=[sparse],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    work = scratch / "attributes"
    work.mkdir()
    onnx.save(model, work / "model.onnx")
    environment = dict(os.environ, ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL="disable")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime.tools.convert_onnx_models_to_ort",
            str(work),
            "--optimization_style",
            "Fixed",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        env=environment,
    )
    target = OUT / "attributes"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(work / "model.onnx", target)
    shutil.copy(work / "model.disable.ort", target / "model.ort")
    print(f"attributes/model.ort: {(target / 'model.ort').stat().st_size} bytes")


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = pathlib.Path(scratch_name)
        for source in SOURCES:
            make_artifacts(source, scratch)
        make_qdq(scratch)
        make_attributes(scratch)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
