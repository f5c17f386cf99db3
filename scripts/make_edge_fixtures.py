#!/usr/bin/env python
"""Record onnxruntime-training 1.19.2's behaviour at the edges of its training API.

    python scripts/make_edge_fixtures.py      (needs onnxruntime-training 1.19.2)

Writes tests/fixtures/edges/:
- string_inputs/: artifacts (generate_artifacts, CrossEntropy + AdamW) of a one-layer
  classifier whose features and labels are *string* graph inputs turned into numbers by
  Cast nodes, as text pipelines feed them;
- expected.json: what ORT does in each scenario of ort_torch_compat/testing/edge_cases.py (the messages of
  nominal-state misuse, export and device errors, the class returned for OrtValue inputs,
  a label out of range, training on string inputs, its Cast from string value by value,
  AdamW steps with lr * weight_decay >= 1, the OrtValue kinds of parameter buffers, and
  the gradients a failed step leaves).

tests/test_edges.py compares ort_torch_compat against this file, and against ORT live
when it is importable.  Output is deterministic (fixed seeds); the files are a few KB.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.training import api as ort_api
from onnxruntime.training import artifacts

from ort_torch_compat.testing import edge_cases as cases

MAX_IR_VERSION = 10  # ORT 1.19 refuses the IR versions onnx >= 1.17 writes


def make_string_artifacts(out: Path) -> None:
    """features (string [batch, 2]) -Cast-> float -> Gemm -> logits; label_text (string) -Cast-> labels."""
    rng = np.random.default_rng(15)
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["features"], ["features_float"], to=TensorProto.FLOAT),
            helper.make_node("Gemm", ["features_float", "fc.weight", "fc.bias"], ["logits"], transB=1),
            helper.make_node("Cast", ["label_text"], ["labels"], to=TensorProto.INT64),
        ],
        "string_classifier",
        [
            helper.make_tensor_value_info("features", TensorProto.STRING, ["batch", 2]),
            helper.make_tensor_value_info("label_text", TensorProto.STRING, ["batch"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        [
            numpy_helper.from_array(rng.normal(scale=0.1, size=(3, 2)).astype(np.float32), "fc.weight"),
            numpy_helper.from_array(np.zeros(3, np.float32), "fc.bias"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # CrossEntropyLoss reuses the graph's existing "labels" value instead of adding an int64 input.
    artifacts.generate_artifacts(
        model,
        requires_grad=["fc.weight", "fc.bias"],
        frozen_params=[],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(out),
    )
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        proto = onnx.load(str(out / name))
        proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
        onnx.save(proto, str(out / name))


def cast_table() -> dict:
    """ORT's Cast from string for every text and numeric target in ort_torch_compat/testing/edge_cases.py."""
    table = {}
    for family, targets in cases.CAST_TARGETS.items():
        for target in targets:
            session = onnxruntime.InferenceSession(
                cases.cast_model(getattr(TensorProto, target)).SerializeToString(), providers=["CPUExecutionProvider"]
            )
            row = {}
            for text in cases.CAST_TEXTS[family]:
                try:
                    value = session.run(None, {"s": np.array([text], dtype=object)})[0].tolist()[0]
                    row[text] = cases.json_value(value)
                except Exception:  # noqa: BLE001 - ORT's RUNTIME_EXCEPTION from std::stod / stoll / stoull
                    row[text] = "error"
            table[target] = row
    return table


def main() -> None:
    onnxruntime.set_default_logger_severity(4)  # Cast failures are expected: keep the log quiet
    workdir = Path(tempfile.mkdtemp())
    cwd = os.getcwd()
    os.chdir(workdir)  # generate_artifacts writes temporary files into the current directory
    try:
        make_string_artifacts(cases.STRINGS)
        ort_buffer = lambda array: onnxruntime.OrtValue.ortvalue_from_numpy(array)._ortvalue  # noqa: E731
        expected = {
            "versions": {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "numpy": np.__version__},
            "nominal": cases.nominal_misuse(ort_api, ort_buffer, workdir),
            "export": cases.export_misuse(ort_api, workdir),
            "device": cases.device_misuse(ort_api),
            "output_kinds": cases.output_kinds(ort_api, onnxruntime.OrtValue),
            "label_out_of_range": cases.label_out_of_range(ort_api),
            "string_inputs": {
                kind: cases.string_inputs(ort_api, as_array) for kind, as_array in cases.string_feed_variants().items()
            },
            "cast": cast_table(),
            "adamw_decay": cases.adamw_decay(ort_api, workdir),
            "buffers": cases.buffer_kinds(ort_api, onnxruntime.OrtValue),
            "failed_step": cases.failed_step(ort_api),
        }
    finally:
        os.chdir(cwd)
        shutil.rmtree(workdir, ignore_errors=True)
    cases.EXPECTED.write_text(json.dumps(expected, indent=1, ensure_ascii=True) + "\n")
    print(f"wrote {cases.EXPECTED} and {cases.STRINGS}")


if __name__ == "__main__":
    main()
