"""A fast subset of the architecture sweep (ort_torch_compat/testing/architecture_sweep.py, docs/architecture-sweep.md):
three small architectures we did not design, each exported by the TorchScript exporter (opset 17)
and the dynamo exporter (opset 18), artifacts from our generate_artifacts trained 3 AdamW steps by
ort_torch_compat, against a float64 eager-PyTorch run of the same steps; where
onnxruntime-training is installed, ORT's own artifacts trained by ORT too, which must agree with ours.

The whole sweep (80+ architectures) runs by hand: ``python scripts/architecture_sweep.py --all --out results.json``.
"""

from __future__ import annotations

import pathlib

import pytest

from ort_torch_compat.testing import architecture_sweep as sweep

CASES = [("hf_bert", "transformers"), ("hf_llama", "transformers"), ("tv_squeezenet1_1", "torchvision")]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("exporter", ["ts17", "dyn18"])
@pytest.mark.parametrize("arch,package", CASES, ids=[a for a, _ in CASES])
def test_architecture_trains_like_the_float64_referee(arch, package, exporter, tmp_path, monkeypatch):
    monkeypatch.setenv("ORT_TORCH_COMPAT_COMPILE", "eager")  # 4 forwards: compiling or tracing would not pay
    pytest.importorskip(package)
    if exporter.startswith("dyn"):
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    record = sweep.run_case(arch, exporter, pathlib.Path(tmp_path))
    problems = {k: v for k, v in record["stages"].items() if not k.startswith("ort_")}
    assert not problems, problems
    assert record["trainable"] > 0
    assert record["deviation"]["ours"] <= sweep.REF_TOL, record["losses"]
    if "ort" in record["losses"] and record["losses"]["ort"]:
        assert record["class"] == "MATCH", (record["why"], record["losses"])
        assert record["deviation"]["ours_on_ort"] <= sweep.REF_TOL
    else:
        assert record["class"] == "ORT-FAIL", record["why"]


def test_classification_rules():
    base = {"stages": {}, "deviation": {"ort": 1e-7, "ours": 1e-7}, "pair_deviation": 1e-7}
    assert sweep.classify(base)["class"] == "MATCH"
    assert sweep.classify(dict(base, pair_deviation=1e-2, deviation={"ort": 1e-2, "ours": 1e-7}))["class"] == "ORT-OFF"
    assert sweep.classify(dict(base, pair_deviation=1e-2, deviation={"ort": 1e-7, "ours": 1e-2}))["class"] == "OURS-OFF"
    refused = dict(base, stages={"ours_generate": "UnsupportedGradientError: no gradient for Foo"})
    assert sweep.classify(refused)["class"] == "REFUSED-BY-OUR-GENERATOR"
    ort_fails = dict(base, stages={"ort_generate": "RuntimeError: x"}, deviation={"ort": None, "ours": 1e-7})
    assert sweep.classify(ort_fails)["class"] == "ORT-FAIL"
    assert sweep.classify(dict(ort_fails, deviation={"ort": None, "ours": 1e-1}))["class"] == "OURS-OFF"
