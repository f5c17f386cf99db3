#!/usr/bin/env python
"""Record what onnxruntime-training 1.19.2 does in the edge cases of issue 17.

    python scripts/make_reliability_fixtures.py   (needs onnxruntime-training 1.19.2)

Writes tests/fixtures/reliability/ort_semantics.json (a few KB): duplicate parameter and
property names in a checkpoint, SoftmaxCrossEntropyLoss without ``ignore_index``, models
with opset 999 / IR version 99 / a duplicate graph output / initializer dims that do not
match their data, and step inputs ORT crashes on or misreads (0-row batch, big-endian and
object arrays, mismatched batch sizes).  Cases that may crash ORT run in a child process
each; a crash is recorded as ``{"crash": "SIGFPE"}``.  The scenarios live in
ort_torch_compat/testing/reliability_cases.py so tests/test_reliability.py runs the same code through this
library (and live through ORT when it is importable).
"""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import tempfile

from ort_torch_compat.testing import REPO

OUT = REPO / "tests" / "fixtures" / "reliability" / "ort_semantics.json"

CHILD = """
import json, sys, pathlib, tempfile
import onnxruntime
onnxruntime.set_default_logger_severity(4)
import onnxruntime.training.api as api
from ort_torch_compat.testing import reliability_cases as cases
kind, name, extra = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "input":
    result = cases.train_on(api, name, extra == "train")
else:
    result = cases.train_with_edited_model(api, name, pathlib.Path(tempfile.mkdtemp()))
print(json.dumps(result))
"""


def in_child(*args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=300)
    if result.returncode < 0:
        return {"crash": signal.Signals(-result.returncode).name}
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    import onnxruntime
    import onnxruntime.training.api as api

    from ort_torch_compat.testing import reliability_cases as cases

    onnxruntime.set_default_logger_severity(4)
    out: dict = {"onnxruntime": onnxruntime.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp)
        out["duplicate parameters"] = {}
        for name, data in cases.duplicate_checkpoints().items():
            (directory / "ck").write_bytes(data)
            out["duplicate parameters"][name] = cases.loaded_parameters(api, directory / "ck")
        out["duplicate properties"] = {}
        for name, data in cases.duplicate_property_checkpoints().items():
            (directory / "ck").write_bytes(data)
            out["duplicate properties"][name] = cases.loaded_properties(api, directory / "ck")

    def run(model, scores, labels):
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": scores, "y": labels})[0]

    out["SoftmaxCrossEntropyLoss"] = cases.sce_results(run)
    out["CrossEntropy training step"] = cases.ce_training_step(api)
    out["models"] = {name: in_child("model", name, "") for name in cases.MODEL_EDITS}
    out["inputs"] = {
        f"{name} ({mode})": in_child("input", name, mode) for name in cases.bad_inputs() for mode in ("train", "eval")
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
