"""Real architectures (ort_torch_compat/testing/real_arch_models.py) exported with the dynamo
exporter (``torch.onnx.export(dynamo=True, optimize=False)``, opset 18): artifacts from our
``generate_artifacts`` (on every Python) and, where onnxruntime-training is installed, from
ORT's; 3 AdamW steps in ort_torch_compat against a float64 eager-PyTorch referee and, where ORT
is installed, against ORT itself on both generators' artifacts (ort_torch_compat/testing/real_arch_dynamo.py,
the architecture sweep's case for the recipes).  All 13 recipes, at opsets 18 and 17, run by hand:
``python scripts/real_arch_dynamo.py`` (docs/architecture-sweep.md, "The project's real
architectures, dynamo-exported").
"""

from __future__ import annotations

import pathlib

import pytest

from ort_torch_compat.testing import architecture_sweep as sweep
from ort_torch_compat.testing import real_arch_artifacts as arts

pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")

# small recipes: LoRA (frozen base weights, trainable adapters), an LSTM, a ViT
RECIPES = [("lora", None), ("lstm", None), ("vit", "transformers")]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("name,package", RECIPES, ids=[n for n, _ in RECIPES])
def test_dynamo_exported_recipe_trains_like_ort_and_the_float64_referee(name, package, tmp_path, monkeypatch):
    from ort_torch_compat.testing import real_arch_dynamo

    monkeypatch.setenv("ORT_TORCH_COMPAT_COMPILE", "off")  # 4 forwards: compiling would not pay
    if package:
        pytest.importorskip(package)
    record = real_arch_dynamo.run_recipe(name, "dyn18", pathlib.Path(tmp_path))
    problems = {k: v for k, v in record["stages"].items() if not k.startswith("ort_")}
    assert not problems, problems
    # optimize=False: every parameter that should train is an initializer with its torch name
    assert record["trainable"] > 0 and not record["trainable_missing"], record["trainable_missing"]
    assert record["deviation"]["ours"] <= sweep.REF_TOL, record["losses"]
    if record["losses"].get("ort"):
        assert record["class"] == "MATCH", (record["why"], record["losses"])
        assert record["deviation"]["ours_on_ort"] <= sweep.REF_TOL, record["losses"]
        assert record["ort_on_ours_pair_deviation"] <= sweep.PAIR_TOL, record["losses"]
    else:  # onnxruntime-training not installed (Python 3.12+): ours against the referee alone
        assert record["class"] == "ORT-FAIL", record["why"]


def test_variant_tags_of_the_fixtures_are_unchanged():
    """The committed fixtures (tests/fixtures/real_arch) are named by the TorchScript/ORT tags."""
    assert arts.Variant(17).tag == "op17_train_frozen_adamw"
    assert arts.Variant(14, "eval", "initializer", "sgd").tag == "op14_eval_initializer_sgd"
    assert arts.Variant(18, exporter="dynamo", generator="ours").tag == "op18_train_frozen_adamw_dynamo_ours"
    with pytest.raises(ValueError):
        arts.Variant(exporter="onnx")
