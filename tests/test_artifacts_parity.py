"""Artifacts made by ort_torch_compat.artifacts, against onnxruntime-training 1.19.2's for the same models.

For every fixture of ``tests/fixtures/artifacts/`` (recorded by
``scripts/make_artifact_fixtures.py``: the exported model, ORT's ``generate_artifacts``
arguments, a summary of ORT's artifacts and ORT's training of them):

* structure: graph inputs/outputs of the training, eval and optimizer models (names, order,
  element types, shapes), the optimizer node and its attributes, and the checkpoint bytes
  equal ORT's;
* ``ort_torch_compat.api`` trains our artifacts to the numbers ORT recorded for its own
  (the scenario of ort_torch_compat/testing/scenario.py, tolerances of test_training_parity.py);
* live, when onnxruntime-training is importable: ORT itself trains our artifacts to those
  numbers.

Our artifacts are generated here, in-process, unless ``ORT_TORCH_COMPAT_GENERATED_ARTIFACTS``
names a directory of artifacts generated elsewhere (CI makes them on Python 3.13 with only
onnx, numpy and flatbuffers installed: ``scripts/generate_fixture_artifacts.py``).
Adding a model is one line in ``ort_torch_compat.testing.artifact_fixtures.CONFIGS`` and a run of
``scripts/make_artifact_fixtures.py``.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest

import ort_torch_compat.api as ours
from ort_torch_compat.testing import fixture_artifacts as generator
from ort_torch_compat.testing.scenario import compare, run_scenario
from tests.test_training_parity import TOLERANCES, _settle_noise_elements

FIXTURES = generator.fixture_dirs()
GENERATED = os.environ.get("ORT_TORCH_COMPAT_GENERATED_ARTIFACTS")
# Keys that hold values (not names or sizes): ORT's dropout masks come from ORT's generator,
# ours from torch's, so for models with an active Dropout only ORT itself can match them.
RANDOM_VALUES = ["step*", "eval/*", "final/*"]


def _load(fixture: pathlib.Path) -> dict:
    return json.loads((fixture / "spec.json").read_text())


def _expected(fixture: pathlib.Path) -> dict:
    with np.load(fixture / "expected.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Our artifacts per fixture name: pre-generated (CI) or generated on first use."""
    made = {}

    def get(fixture: pathlib.Path) -> pathlib.Path:
        if GENERATED:
            directory = pathlib.Path(GENERATED) / fixture.name
            assert directory.is_dir(), f"{directory} was not generated"
            return directory
        if fixture.name not in made:
            made[fixture.name] = generator.generate_for_fixture(fixture, tmp_path_factory.mktemp(fixture.name))
        return made[fixture.name]

    return get


def _numeric_tolerances(spec: dict, expected: dict, actual: dict) -> list:
    _settle_noise_elements(expected, actual, spec)
    return compare(expected, actual, tolerances=TOLERANCES, rtol=1e-4, atol=1e-5)


def _same_values(mine: list, ort: list, symbolic_matches_any: bool) -> bool:
    """Graph inputs/outputs ``[name, elem_type, dims]`` equal; optionally a symbolic dim of ours
    stands for any size (ORT's reference then came from the static export of the model)."""
    if not symbolic_matches_any:
        return mine == ort
    if len(mine) != len(ort):
        return False
    for (name, elem, dims), (ort_name, ort_elem, ort_dims) in zip(mine, ort):
        if (name, elem) != (ort_name, ort_elem) or (dims is None) != (ort_dims is None):
            return False
        if dims is not None and (
            len(dims) != len(ort_dims) or any(d != o and not isinstance(d, str) for d, o in zip(dims, ort_dims))
        ):
            return False
    return True


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_structure_matches_ort(fixture, generated):
    document = _load(fixture)
    ort = document["ort_artifacts"]
    mine = generator.describe_artifacts(generated(fixture))
    assert sorted(mine) == sorted(ort), "a different set of files"
    for name in ort:
        if "sha256" in ort[name]:
            assert mine[name] == ort[name], f"{name}: bytes differ from ORT's artifact writer"
            continue
        for part in ort[name]:
            if part in ("inputs", "outputs"):
                assert _same_values(mine[name][part], ort[name][part], document.get("ort_static_twin", False)), (
                    f"{name} {part} differ from ORT's:\n{mine[name][part]}\n{ort[name][part]}"
                )
            else:
                assert mine[name][part] == ort[name][part], f"{name} {part} differ from ORT's"


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_our_library_trains_our_artifacts_like_ort_trains_its_own(fixture, generated):
    document = _load(fixture)
    spec = document["scenario"]
    expected, actual = _expected(fixture), run_scenario(ours, generated(fixture), spec)
    if document.get("ort_seed") is not None:
        assert compare(expected, actual, ignore=RANDOM_VALUES) == []
        return
    assert _numeric_tolerances(spec, expected, actual) == []


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_ort_trains_our_artifacts_like_its_own(fixture, generated, ort_api):
    from ort_torch_compat.testing import artifact_fixtures

    document = _load(fixture)
    spec = document["scenario"]
    actual = artifact_fixtures.run_ort_scenario(ort_api, generated(fixture), spec, document.get("ort_seed"))
    assert _numeric_tolerances(spec, _expected(fixture), actual) == []


def test_fixtures_exist():
    assert len(FIXTURES) >= 20, "run scripts/make_artifact_fixtures.py"


def test_live_ort_own_artifacts_miss_a_broadcast_reduction_ours_do_not(tmp_path, ort_api):
    """docs/artifacts.md's ORT bug: a causal decoder with symbolic batch and sequence dims, whose
    sliced position embedding is added to the token embeddings.  Central finite differences
    (ORT running the eval model) agree with ORT running our gradient graph; ORT's own
    artifacts give another gradient for the position embedding."""
    import onnx
    import onnxruntime
    import torch

    from ort_torch_compat.testing import artifact_fixtures as fixtures
    from ort_torch_compat.testing import prepare_for_artifacts
    from ort_torch_compat.testing.scenario import make_batch

    onnxruntime.set_default_logger_severity(3)
    config = fixtures.Config("decoder", "ce", "sgd", 17, {"dynamic_axes": True}, "_dyn")
    torch.manual_seed(3)
    model, args, in_names, out_names, _, training, _ = fixtures.build_model("decoder", "ce")
    exported = fixtures.export_model(config, model, args, in_names, out_names, training, dynamic=True)
    params = [i.name for i in exported.graph.initializer if i.name in dict(model.named_parameters())]
    arguments = {
        "requires_grad": params,
        "frozen_params": [],
        "loss": "CrossEntropyLoss",
        "optimizer": "SGD",
        "kwargs": {},
    }
    ours_dir, ort_dir = tmp_path / "ours", tmp_path / "ort"
    ours_dir.mkdir()
    ort_dir.mkdir()
    (tmp_path / "fixture").mkdir()
    onnx.save(exported, str(tmp_path / "fixture" / "model.onnx"))
    (tmp_path / "fixture" / "spec.json").write_text(json.dumps({"generate_artifacts": arguments}))
    generator.generate_for_fixture(tmp_path / "fixture", ours_dir)
    fixtures.ort_generate(prepare_for_artifacts.prepare_model(exported), arguments, ort_dir)

    spec = {
        "seed": 1,
        "inputs": [
            {"name": "x", "shape": [2, 6], "kind": "int", "high": 11},
            {"name": "labels", "shape": [12], "kind": "int", "high": 5},
        ],
    }
    batch = make_batch(spec, 1, 1)

    def position_gradient(directory):
        state = ort_api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
        module = ort_api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
        module(batch["x"], batch["labels"])
        return np.array(state.parameters["pos"].grad), {p: np.array(state.parameters[p].data) for p in params}

    ours, values = position_gradient(ours_dir)
    theirs, _ = position_gradient(ort_dir)
    session = onnxruntime.InferenceSession(str(ours_dir / "eval_model.onnx"), providers=["CPUExecutionProvider"])

    def loss(pos):
        return float(session.run(None, {**batch, **values, "pos": pos})[0])

    eps, indices = 1e-2, [(0, 0, 0), (0, 1, 3), (0, 2, 2), (0, 5, 7)]
    numeric = []
    for index in indices:
        up, down = values["pos"].copy(), values["pos"].copy()
        up[index] += eps
        down[index] -= eps
        numeric.append((loss(up) - loss(down)) / (2 * eps))
    np.testing.assert_allclose([ours[i] for i in indices], numeric, atol=2e-4)
    assert max(abs(theirs[i] - n) for i, n in zip(indices, numeric)) > 1e-3, "ORT's own artifacts are right now"
