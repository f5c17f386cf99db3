"""ORT-format (.ort) training artifacts (issue 28).

Fixtures: tests/fixtures/ort_format/<source>/ holds the models of tests/fixtures/<source>/
converted by onnxruntime 1.19.2's `convert_onnx_models_to_ort` with its defaults
(scripts/make_ort_format_fixtures.py: Fixed style at level "all", plus the Runtime style's
`with_runtime_opt` files for the MLP); checkpoint, spec.json and ORT's recorded numbers
(expected.npz) come from the source folder.

* The .ort artifacts train here to ORT's recorded numbers for the .onnx originals, within the
  tolerances of tests/test_training_parity.py, and to the numbers of the .onnx originals here;
  where onnxruntime-training is importable, also to ORT's own numbers on the same .ort files.
  (ORT itself does not give bit-identical numbers for the .ort files: its Fixed-style graphs
  are already fused, e.g. FusedGemm, and AdamW parameters differ from the .onnx run by ~1e-8.)
* Same input/output names; eval and export_model_for_inferencing from an .ort eval model give
  an ONNX model onnxruntime runs with the same outputs; Optimizer from optimizer_model.ort; the
  C-API-shaped TrainingSession (paths and bytes) and `ort-torch-compat export` take .ort.
* The format is told from the contents, not the name; an attribute/subgraph/sparse model
  converts to an ONNX model with the same outputs; runtime-optimization records are refused.
"""

from __future__ import annotations

import pathlib
import shutil

import numpy as np
import onnx
import pytest

import ort_torch_compat.api as ours
from ort_torch_compat import TrainingSession, load_checkpoint, load_checkpoint_from_buffer
from ort_torch_compat.cli import main
from ort_torch_compat.engine.model_io import load_model
from ort_torch_compat.errors import ModelLoadError
from ort_torch_compat.ortformat import is_ort_format, read_ort_model, runtime_optimization_summary
from ort_torch_compat.testing.scenario import EVAL_SEED_KEY, compare, make_batch, run_scenario
from tests.conftest import FIXTURES, load_spec
from tests.test_training_parity import TOLERANCES, _exact_zero_gradients, _settle_noise_elements

ORT_FORMAT = FIXTURES / "ort_format"
SOURCES = sorted(p.name for p in ORT_FORMAT.iterdir() if (FIXTURES / p.name / "spec.json").exists())
MODELS = ("training_model", "eval_model", "optimizer_model")
RTOL, ATOL = 1e-4, 1e-5


def _artifacts(tmp_path: pathlib.Path, source: str, runtime: bool = False) -> pathlib.Path:
    """A folder with the source's checkpoint and the .ort models (renamed to <model>.ort)."""
    folder = tmp_path / source
    folder.mkdir()
    shutil.copy(FIXTURES / source / "checkpoint", folder)
    for model in MODELS:
        name = f"{model}.with_runtime_opt.ort" if runtime else f"{model}.ort"
        shutil.copy(ORT_FORMAT / source / name, folder / f"{model}.ort")
    return folder


def _check_parity(expected: dict, actual: dict, spec: dict) -> list:
    problems = _exact_zero_gradients(expected, actual, spec)
    _settle_noise_elements(expected, actual, spec)
    return problems + compare(expected, actual, rtol=RTOL, atol=ATOL, tolerances=TOLERANCES)


def test_fixtures_cover_the_families():
    assert {
        "cnn_mse_sgd_op17",
        "transformer_ce_adamw_op17",
        "lstm_bce_adamw_op17",
        "gru_ce_sgd_op17",
        "frozen_mse_adamw_op17",
        "mlp_mse_adamw_op17",
    } <= set(SOURCES)


@pytest.mark.parametrize("source", SOURCES)
def test_ort_models_read_with_the_same_interface(source):
    for model in MODELS:
        path = ORT_FORMAT / source / f"{model}.ort"
        data = path.read_bytes()
        assert is_ort_format(data)
        assert runtime_optimization_summary(data) == {}
        converted = load_model(path, model)
        original = onnx.load(FIXTURES / source / f"{model}.onnx")
        dropped = []
        for field in ("input", "output"):
            pairs = list(zip(getattr(converted.graph, field), getattr(original.graph, field)))
            assert [v.name for v in getattr(converted.graph, field)] == [v.name for v in getattr(original.graph, field)]
            for ours_value, theirs in pairs:
                if not theirs.type.HasField("tensor_type"):  # AdamW's tensor sequences
                    assert ours_value.type == theirs.type
                    continue
                ours_type, their_type = ours_value.type.tensor_type, theirs.type.tensor_type
                assert ours_type.elem_type == their_type.elem_type
                if ours_type.HasField("shape"):
                    assert ours_type.shape == their_type.shape
                else:  # ORT drops a shape its inference disagrees with (SGD's update_completed: {} vs {1})
                    dropped.append(ours_value.name)
        assert len(dropped) <= 1
        try:  # ORT's own gradient ops in the default domain (AveragePoolGrad) fail onnx's checker
            onnx.checker.check_model(original)
        except onnx.checker.ValidationError:
            pass
        else:
            if not dropped:  # the checker wants a shape on every main-graph input and output
                onnx.checker.check_model(converted)
        assert converted.ir_version == original.ir_version
        assert {(o.domain, o.version) for o in original.opset_import} <= {
            (o.domain, o.version) for o in converted.opset_import
        }
        assert converted == load_model(data, model)  # from bytes: the same model


VARIANTS = [(source, False) for source in SOURCES] + [
    (source, True) for source in SOURCES if (ORT_FORMAT / source / "training_model.with_runtime_opt.ort").exists()
]


@pytest.mark.parametrize(
    "source,runtime", VARIANTS, ids=[f"{s}-{'with_runtime_opt' if r else 'fixed'}" for s, r in VARIANTS]
)
def test_ort_artifacts_train_to_the_numbers_of_the_onnx_originals(source, runtime, tmp_path):
    spec = load_spec(FIXTURES / source)
    expected = dict(np.load(FIXTURES / source / "expected.npz", allow_pickle=False))
    actual = run_scenario(ours, _artifacts(tmp_path, source, runtime), spec, model_suffix=".ort")
    from_onnx = run_scenario(ours, FIXTURES / source, spec)
    names = [k for k in from_onnx if k.startswith("names/")]
    assert all(np.array_equal(actual[k], from_onnx[k]) for k in names)
    problems = compare(from_onnx, dict(actual), rtol=RTOL, atol=ATOL, tolerances=TOLERANCES)
    problems += _check_parity(expected, actual, spec)
    assert not problems, "\n".join(problems[:40])


@pytest.mark.parametrize("source", SOURCES)
def test_ort_artifacts_match_onnxruntime_on_the_same_files(source, tmp_path, ort_api):
    spec = load_spec(FIXTURES / source)
    folder = _artifacts(tmp_path, source)
    reference = run_scenario(ort_api, folder, spec, model_suffix=".ort")
    actual = run_scenario(ours, folder, spec, model_suffix=".ort")
    problems = _check_parity(reference, actual, spec)
    assert not problems, "\n".join(problems[:40])


@pytest.mark.parametrize("source", ["cnn_mse_sgd_op17", "transformer_ce_adamw_op17"])
def test_export_from_an_ort_eval_model_runs_in_onnxruntime(source, tmp_path):
    spec = load_spec(FIXTURES / source)
    folder = _artifacts(tmp_path, source)
    state = ours.CheckpointState.load_checkpoint(folder / "checkpoint")
    module = ours.Module(folder / "training_model.ort", state, folder / "eval_model.ort")
    optimizer = ours.Optimizer(folder / "optimizer_model.ort", module)
    batch = make_batch(spec, 1, 1)
    module.train()
    module(*[batch[i["name"]] for i in spec["inputs"]])
    optimizer.step()
    module.eval()
    eval_names = spec.get("eval_inputs", [i["name"] for i in spec["inputs"]])
    eval_batch = make_batch(spec, EVAL_SEED_KEY, 0)
    ours_out = module(*[eval_batch[n] for n in eval_names])
    ours_out = [np.asarray(o) for o in (ours_out if isinstance(ours_out, (list, tuple)) else [ours_out])]
    outputs = module.output_names()
    exported = tmp_path / "inference.onnx"
    module.export_model_for_inferencing(exported, outputs)
    model = onnx.load(exported)
    onnx.checker.check_model(model)
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    feeds = {i.name: eval_batch[i.name] for i in session.get_inputs()}
    ort_out = session.run(outputs, feeds)
    for a, b in zip(ours_out, ort_out):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_format_is_told_from_the_contents_not_the_name(tmp_path):
    source = ORT_FORMAT / "mlp_mse_adamw_op17" / "eval_model.ort"
    disguised = tmp_path / "eval_model.onnx"
    shutil.copy(source, disguised)
    onnx_named_ort = tmp_path / "eval_model.ort"
    shutil.copy(FIXTURES / "mlp_mse_adamw_op17" / "eval_model.onnx", onnx_named_ort)
    assert load_model(disguised, "eval model") == load_model(source, "eval model")
    assert load_model(onnx_named_ort, "eval model") == onnx.load(FIXTURES / "mlp_mse_adamw_op17" / "eval_model.onnx")


def test_capi_session_takes_ort_paths_and_bytes(tmp_path):
    source = "cnn_mse_sgd_op17"
    spec = load_spec(FIXTURES / source)
    folder = _artifacts(tmp_path, source)
    batch = make_batch(spec, 1, 1)
    inputs = [batch[i["name"]] for i in spec["inputs"]]
    losses = []
    for from_bytes in (False, True):
        if from_bytes:
            state = load_checkpoint_from_buffer((folder / "checkpoint").read_bytes())
            models = [(folder / f"{m}.ort").read_bytes() for m in MODELS]
        else:
            state = load_checkpoint(folder / "checkpoint")
            models = [folder / f"{m}.ort" for m in MODELS]
        with TrainingSession(state, *models) as session:
            losses.append(np.asarray(session.train_step(inputs)[0]))
            session.optimizer_step()
            losses.append(np.asarray(session.eval_step([batch[n] for n in spec["eval_inputs"]])[0]))
    expected = dict(np.load(FIXTURES / source / "expected.npz"))["step1/call1/loss"]
    np.testing.assert_allclose(losses[0], expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(losses[0], losses[2])
    np.testing.assert_array_equal(losses[1], losses[3])


def test_cli_export_takes_an_ort_only_folder(tmp_path, capsys):
    folder = _artifacts(tmp_path, "mlp_mse_adamw_op17")
    out = tmp_path / "inference.onnx"
    assert main(["export", str(folder), str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    onnx.checker.check_model(onnx.load(out))
    from ort_torch_compat.cli import _model_file

    assert _model_file(str(folder), None, "training") == str(folder / "training_model.ort")  # export and compile
    assert _model_file(str(folder), "other.onnx", "training") == str(folder / "other.onnx")
    shutil.copy(FIXTURES / "mlp_mse_adamw_op17" / "training_model.onnx", folder)
    assert _model_file(str(folder), None, "training") == str(folder / "training_model.onnx")  # .onnx first
    (folder / "eval_model.ort").unlink()
    assert main(["export", str(folder), str(tmp_path / "again.onnx")]) == 1
    assert "eval_model.onnx' does not exist (nor its .ort form)" in capsys.readouterr().err


def test_every_attribute_kind_subgraphs_and_sparse_initializers_convert():
    converted = load_model(ORT_FORMAT / "attributes" / "model.ort", "model")
    original = onnx.load(ORT_FORMAT / "attributes" / "model.onnx")
    onnx.checker.check_model(converted)
    kinds = {a.type for n in converted.graph.node for a in n.attribute}
    assert {
        onnx.AttributeProto.FLOAT,
        onnx.AttributeProto.INT,
        onnx.AttributeProto.STRING,
        onnx.AttributeProto.GRAPH,
        onnx.AttributeProto.INTS,
        onnx.AttributeProto.STRINGS,
    } <= kinds
    assert [s.values.name for s in converted.graph.sparse_initializer] == ["sp"]
    assert converted.graph.sparse_initializer[0].indices.data_type == onnx.TensorProto.INT64  # ORT stores int8
    # ORT turns Constant nodes into initializers (the tensor, floats, ints and string kinds)
    constants = {t.name: t for t in converted.graph.initializer}
    assert onnx.numpy_helper.to_array(constants["scales"]).tolist() == [1.0, 2.0, 3.0]
    assert constants["label"].string_data == [b"ort"]
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    for sign in (1.0, -1.0):  # both If branches
        feeds = {"x": sign * rng.random((2, 3), dtype=np.float32), "seq": rng.random((4, 1, 3), dtype=np.float32)}
        want = ort.InferenceSession(original.SerializeToString()).run(None, feeds)
        got = ort.InferenceSession(converted.SerializeToString()).run(None, feeds)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_runtime_optimization_records_are_refused_by_name():
    path = ORT_FORMAT / "qdq_runtime_records" / "model.with_runtime_opt.ort"
    assert runtime_optimization_summary(path.read_bytes()) == {"QDQSelectorActionTransformer": ["Conv"]}
    with pytest.raises(ModelLoadError, match="QDQSelectorActionTransformer") as error:
        load_model(path, "training model")
    assert str(path) in str(error.value) and "optimization_style Fixed" in str(error.value)


def test_unsupported_format_version_is_refused(tmp_path):
    data = bytearray((ORT_FORMAT / "mlp_mse_adamw_op17" / "optimizer_model.ort").read_bytes())
    at = data.find(b"\x01\x00\x00\x006\x00")  # the version string "6"
    assert at > 0
    data[at + 4] = ord("4")
    path = tmp_path / "old.ort"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="ORT format version '4' is not supported"):
        load_model(path, "optimizer model")


@pytest.mark.parametrize("cut", [8, 16, 100, 1000, 9000])
def test_truncated_ort_file_is_a_model_load_error(cut, tmp_path):
    data = (ORT_FORMAT / "mlp_mse_adamw_op17" / "training_model.ort").read_bytes()
    path = tmp_path / "training_model.ort"
    path.write_bytes(data[:cut])
    state = ours.CheckpointState.load_checkpoint(FIXTURES / "mlp_mse_adamw_op17" / "checkpoint")
    with pytest.raises(ModelLoadError) as error:
        ours.Module(path, state)
    assert str(path) in str(error.value)


def test_reader_does_not_import_torch_or_onnxruntime():
    import subprocess
    import sys

    code = (
        "import sys; from ort_torch_compat.ortformat import read_ort_model; "
        f"m = read_ort_model(open({str(ORT_FORMAT / 'mlp_mse_adamw_op17' / 'eval_model.ort')!r}, 'rb').read()); "
        "assert m.graph.node; bad = [n for n in ('torch', 'onnxruntime') if n in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(FIXTURES.parent.parent))


def test_read_ort_model_needs_the_identifier():
    with pytest.raises(ValueError, match="ORTM"):
        read_ort_model(b"\x08\x08" + b"\x00" * 20)


def test_generate_artifacts_ort_format_writes_ort_models_that_train_like_the_onnx_ones(tmp_path):
    pytest.importorskip("onnxruntime.tools.convert_onnx_models_to_ort")
    from tests.test_artifacts_api import generate, tiny_model

    folder = generate(tmp_path, tiny_model(), ort_format=True)
    for model in MODELS:
        assert is_ort_format((folder / f"{model}.ort").read_bytes())
        assert (folder / f"{model}.onnx").exists()
    rng = np.random.default_rng(0)
    x, y = rng.random((4, 3), dtype=np.float32), rng.random((4, 2), dtype=np.float32)
    results = []
    for suffix in (".onnx", ".ort"):
        state = ours.CheckpointState.load_checkpoint(folder / "checkpoint")
        module = ours.Module(folder / f"training_model{suffix}", state, folder / f"eval_model{suffix}")
        optimizer = ours.Optimizer(folder / f"optimizer_model{suffix}", module)
        losses = []
        for _ in range(3):
            losses.append(float(np.asarray(module(x, y))))
            optimizer.step()
            module.lazy_reset_grad()
        results.append((losses, module.get_contiguous_parameters().numpy().copy()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5, atol=1e-6)


def test_generate_artifacts_ort_format_without_onnxruntime_says_what_is_missing(tmp_path, monkeypatch):
    import sys

    from tests.test_artifacts_api import generate

    monkeypatch.setitem(sys.modules, "onnxruntime.tools.convert_onnx_models_to_ort", None)
    with pytest.raises(ImportError, match="ort_format=True needs ONNX Runtime's ONNX-to-ORT converter"):
        generate(tmp_path, ort_format=True)
    assert list(tmp_path.iterdir()) == []
