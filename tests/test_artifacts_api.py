"""generate_artifacts and onnxblock as an API: arguments, errors, names, custom losses, files.

Models are built with onnx.helper, so these tests need neither torch nor ONNX Runtime
(those marked live compare with onnxruntime-training when it is importable).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_torch_compat import artifacts, onnxblock
from ort_torch_compat.artifacts import ArtifactGenerationError, UnsupportedGradientError
from tests.conftest import ROOT

FILES = ["checkpoint", "eval_model.onnx", "optimizer_model.onnx", "training_model.onnx"]


def tiny_model(extra_nodes=(), opset: int = 17, ir_version: int = 8, hidden_op: str = "Relu") -> onnx.ModelProto:
    """``y = W2 @ op(W1 @ x + b1)`` on x[4, 3]; parameters W1, b1, W2 (and ``extra_nodes`` after it)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
        for n, s in (("W1", (3, 5)), ("b1", (5,)), ("W2", (5, 2)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["m"], name="mm1"),
        helper.make_node("Add", ["m", "b1"], ["a"], name="add1"),
        helper.make_node(hidden_op, ["a"], ["h"], name="act"),
        helper.make_node("MatMul", ["h", "W2"], ["y"] if not extra_nodes else ["z"], name="mm2"),
        *extra_nodes,
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def generate(directory, model=None, **kwargs) -> pathlib.Path:
    onnxblock.reset_name_counter()
    kwargs.setdefault("requires_grad", ["W1", "b1", "W2"])
    kwargs.setdefault("loss", artifacts.LossType.MSELoss)
    kwargs.setdefault("optimizer", artifacts.OptimType.AdamW)
    artifacts.generate_artifacts(model or tiny_model(), artifact_directory=str(directory), **kwargs)
    return pathlib.Path(directory)


def test_import_needs_neither_torch_nor_onnxruntime(tmp_path):
    """The generator runs where only onnx, numpy and flatbuffers are installed (Python 3.12+)."""
    code = (
        "import sys, onnx\n"
        "sys.modules['torch'] = None; sys.modules['onnxruntime'] = None  # importing either now fails\n"
        "import ort_torch_compat.artifacts as a, ort_torch_compat.onnxblock\n"
        "from tests.test_artifacts_api import generate\n"
        f"generate({str(tmp_path)!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnxruntime', 'onnx2torch')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['onnxruntime', 'torch']"  # only our None blockers
    assert sorted(p.name for p in tmp_path.iterdir()) == FILES


def test_files_and_graph_conventions(tmp_path):
    generate(tmp_path, prefix="p_", nominal_checkpoint=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"p_{f}" for f in FILES + ["nominal_checkpoint"])
    training = onnx.load(str(tmp_path / "p_training_model.onnx"))
    inputs = [i.name for i in training.graph.input]
    assert inputs == [
        "x",
        "target",
        "W1",
        "b1",
        "W2",
        "W1_grad.accumulation.buffer",
        "b1_grad.accumulation.buffer",
        "W2_grad.accumulation.buffer",
        "lazy_reset_grad",
    ]
    assert [o.name for o in training.graph.output] == [
        "onnx::reducemean_output::6",
        "W1_grad.accumulation.out",
        "b1_grad.accumulation.out",
        "W2_grad.accumulation.out",
    ]
    accumulators = [n for n in training.graph.node if n.op_type == "InPlaceAccumulatorV2"]
    assert [n.name for n in accumulators] == ["GradientAccumulator1", "GradientAccumulator2", "GradientAccumulator3"]
    assert all(list(n.input)[2] == "lazy_reset_grad" for n in accumulators)
    evaluation = onnx.load(str(tmp_path / "p_eval_model.onnx"))
    assert [i.name for i in evaluation.graph.input] == ["x", "target", "W1", "b1", "W2"]
    optimizer = onnx.load(str(tmp_path / "p_optimizer_model.onnx"))
    assert optimizer.ir_version <= 10 and optimizer.producer_name == "orttraining"
    assert [n.op_type for n in optimizer.graph.node] == ["AdamWOptimizer"]


def test_names_follow_the_process_wide_counter_like_ort(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    generate(first)  # resets the counter first: a fresh process's names
    artifacts.generate_artifacts(
        tiny_model(), requires_grad=["W1"], loss=artifacts.LossType.MSELoss, artifact_directory=str(second)
    )  # no reset: numbering continues
    names = [onnx.load(str(d / "training_model.onnx")).graph.output[0].name for d in (first, second)]
    assert names == ["onnx::reducemean_output::6", "onnx::reducemean_output::15"]


def test_ir_version_capped_for_ort_1_19(tmp_path):
    generate(tmp_path, tiny_model(ir_version=11))
    assert {onnx.load(str(tmp_path / f)).ir_version for f in FILES[1:]} == {10}


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"loss": "mse"}, RuntimeError, "Unknown loss provided"),
        ({"optimizer": "adamw"}, TypeError, "Unknown optimizer provided"),
        ({"frozen_params": ["W1"]}, RuntimeError, "cannot be frozen and require gradient"),
        ({"additional_output_names": "y"}, RuntimeError, "Expected additional output names to be a list"),
        ({"custom_op_library": "/no/such/lib.so"}, RuntimeError, "does not exist"),
        ({"requires_grad": ["W1", "nope"]}, ArtifactGenerationError, r"\['nope'\] are not parameters"),
        ({"model": tiny_model(hidden_op="Acos")}, UnsupportedGradientError, r"no gradient for Acos"),
    ],
)
def test_bad_arguments_fail_before_any_file_is_written(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        generate(tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_parameters_fed_as_graph_inputs_are_named(tmp_path):
    """W1 and b1 are graph inputs (a model exported without its weights): the error names
    them and says what to do, instead of a later "requires_grad is empty"."""
    model = tiny_model()
    for init in [i for i in model.graph.initializer if i.name in ("W1", "b1")]:
        model.graph.input.append(helper.make_tensor_value_info(init.name, TensorProto.FLOAT, list(init.dims)))
        model.graph.initializer.remove(init)
    with pytest.raises(
        ArtifactGenerationError,
        match=r"requires_grad names \['W1', 'b1'\], which are graph inputs "
        r"of the model, not initializers.*export_params=True",
    ):
        generate(tmp_path, model)
    assert list(tmp_path.iterdir()) == []


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        generate(tmp_path / "missing")


def test_every_unsupported_op_is_named_at_once(tmp_path):
    extra = [helper.make_node("Atan", ["z"], ["t"], name="atan1"), helper.make_node("Acos", ["t"], ["y"], name="acos1")]
    with pytest.raises(UnsupportedGradientError) as raised:
        generate(tmp_path, tiny_model(extra, hidden_op="Asin"))
    assert sorted(op for _, op, _, _ in raised.value.ops) == ["Acos", "Asin", "Atan"]
    assert "atan1" in str(raised.value) and "acos1" in str(raised.value)
    assert list(tmp_path.iterdir()) == []


def test_parameter_that_does_not_reach_the_loss(tmp_path):
    model = tiny_model()
    model.graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32), "unused"))
    with pytest.raises(ArtifactGenerationError, match=r"\['unused'\] as they are unreachable"):
        generate(tmp_path, model, requires_grad=["W1", "unused"])
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_layout_and_frozen_parameters(tmp_path):
    from ort_torch_compat.codec import read_checkpoint

    generate(tmp_path, requires_grad=["W2", "W1"], frozen_params=["b1", "not-an-initializer"])
    state = read_checkpoint(str(tmp_path / "checkpoint")).module_state
    assert [t.name for t in state.trainable] == ["W1", "W2"]  # initializer order, as ORT's writer
    assert [t.name for t in state.frozen] == ["b1"]
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert [i.name for i in training.graph.input][2:5] == ["W1", "b1", "W2"]
    assert "b1_grad.accumulation.buffer" not in [i.name for i in training.graph.input]


def test_typed_field_initializers_are_written_like_raw_ones(tmp_path):
    raw = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    typed = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], list(range(6)))
    typed.doc_string = raw.doc_string = "kept"
    onnxblock.save_checkpoint(([raw], []), tmp_path / "a")
    onnxblock.save_checkpoint(([typed], []), tmp_path / "b")
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_load_checkpoint_to_model_round_trip(tmp_path):
    generate(tmp_path)
    model = tiny_model()
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
    onnxblock.load_checkpoint_to_model(tmp_path / "checkpoint", model)
    assert all(
        np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
        for a, b in zip(model.graph.initializer, tiny_model().graph.initializer)
    )


def sum_of_losses(api=onnxblock, half_mse: bool = True):
    """A custom loss through composition, ``mean|y - t| + 0.5 * mean((y - t)^2)``, on ``api``
    (ours, or onnxruntime-training's onnxblock: the same code runs on both).

    ``half_mse=False`` drops the 0.5: with it (a float[1] Constant times a scalar loss)
    onnxruntime-training 1.19.2's own gradient builder fails ("ReduceSum axis must be in
    [-rank, rank-1]. input rank was 0"), so the comparison with ORT uses the plain sum.
    """

    class SumOfLosses(api.Block):
        def __init__(self):
            super().__init__()
            self.l1 = api.loss.L1Loss()
            self.mse = api.loss.MSELoss()
            self.add = api.blocks.Add()
            self.mul = api.blocks.Mul()
            self.half = api.blocks.Constant(0.5)

        def build(self, output_name):
            mse = self.mse(output_name, "target")
            return self.add(self.l1(output_name, "target"), self.mul(self.half(), mse) if half_mse else mse)

    return SumOfLosses()


def test_custom_loss_block_composes(tmp_path):
    """The eval model computes the composed loss (checked with onnx's reference evaluator)."""
    from onnx.reference import ReferenceEvaluator

    generate(tmp_path, loss=sum_of_losses())
    rng = np.random.default_rng(3)
    x, target = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    params = {i.name: numpy_helper.to_array(i) for i in tiny_model().graph.initializer}
    (loss,) = ReferenceEvaluator(onnx.load(str(tmp_path / "eval_model.onnx"))).run(
        None, {"x": x, "target": target, **params}
    )
    (y,) = ReferenceEvaluator(tiny_model()).run(None, {"x": x})
    np.testing.assert_allclose(loss, np.abs(y - target).mean() + 0.5 * ((y - target) ** 2).mean(), rtol=1e-6)


def test_optimizer_blocks_carry_their_hyperparameters(tmp_path):
    generate(
        tmp_path, optimizer=onnxblock.optim.AdamW(bias_correction=False, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.1)
    )
    node = onnx.load(str(tmp_path / "optimizer_model.onnx")).graph.node[0]
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attributes == pytest.approx(
        {"alpha": 0.8, "beta": 0.99, "epsilon": 1e-7, "weight_decay": 0.1, "correct_bias": 0, "adam_mode": 1}
    )
    generate(tmp_path, optimizer=artifacts.OptimType.SGD)
    graph = onnx.load(str(tmp_path / "optimizer_model.onnx")).graph
    assert [i.name for i in graph.input] == ["learning_rate", "step", "params", "gradients", "first_order_moments"]
    assert [(n.op_type, list(n.input)) for n in graph.node] == [
        ("SGDOptimizerV2", ["learning_rate", "params", "gradients"])
    ]


def test_base_cannot_nest_and_blocks_need_a_base():
    with onnxblock.empty_base():
        with pytest.raises(RuntimeError, match="already exists"):
            with onnxblock.base(tiny_model()):
                pass
    with pytest.raises(RuntimeError, match="No base model"):
        onnxblock.blocks.Add()("a", "b")
    with pytest.raises(RuntimeError, match="build the training model first"):
        onnxblock.TrainingBlock.parameters(SumOfLossesTraining())


class SumOfLossesTraining(onnxblock.TrainingBlock):
    def build(self, output_name):
        return sum_of_losses()(output_name)


def _ort_spec(directory: pathlib.Path) -> dict:
    return {
        "lr": 0.05,
        "seed": 5,
        "steps": 3,
        "accumulate_step": 2,
        "inputs": [
            {"name": "x", "shape": [4, 3], "kind": "normal"},
            {"name": "target", "shape": [4, 2], "kind": "normal"},
        ],
        "trainable_params": ["W1", "b1", "W2"],
        "frozen_params": [],
    }


def test_live_custom_loss_trains_like_ort_onnxblock(tmp_path, ort_api):
    """The same custom Block class, built with ORT's onnxblock and with ours, trains identically on ORT."""
    from onnxruntime.training import artifacts as ort_artifacts
    from onnxruntime.training import onnxblock as ort_onnxblock

    from ort_torch_compat.testing import prepare_for_artifacts
    from ort_torch_compat.testing.scenario import compare, run_scenario

    ours_dir, ort_dir = tmp_path / "ours", tmp_path / "ort"
    ours_dir.mkdir()
    ort_dir.mkdir()
    generate(ours_dir, loss=sum_of_losses(half_mse=False))
    ort_artifacts.generate_artifacts(
        tiny_model(),
        requires_grad=["W1", "b1", "W2"],
        loss=sum_of_losses(ort_onnxblock, half_mse=False),
        optimizer=ort_artifacts.OptimType.AdamW,
        artifact_directory=str(ort_dir),
    )
    for path in ort_dir.glob("*.onnx"):
        prepare_for_artifacts.patch_ir_version_file(path)
    spec = _ort_spec(ort_dir)
    expected = run_scenario(ort_api, ort_dir, spec)
    actual = run_scenario(ort_api, ours_dir, spec)
    names = ["names/*"]  # ORT's counter in this process is not at 0: only the loss name differs
    assert compare(expected, actual, rtol=1e-4, atol=1e-5, ignore=names) == []
    assert (ours_dir / "checkpoint").read_bytes() == (ort_dir / "checkpoint").read_bytes()


def test_live_save_checkpoint_matches_ort_for_typed_fields(tmp_path, ort_api):
    from onnxruntime.training import onnxblock as ort_onnxblock

    typed = [
        helper.make_tensor("a", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0]),
        helper.make_tensor("b", TensorProto.INT64, [3], [1, -2, 3]),
        helper.make_tensor("c", TensorProto.DOUBLE, [], [0.5]),
    ]
    typed[0].doc_string = "doc"
    ort_onnxblock.save_checkpoint((typed[:1], typed[1:]), str(tmp_path / "ort"))
    onnxblock.save_checkpoint((typed[:1], typed[1:]), tmp_path / "ours")
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "ort").read_bytes()


def test_reference_summary_is_json(tmp_path):
    """describe_artifacts (used to compare with ORT's recorded artifacts) is plain JSON."""
    from ort_torch_compat.testing.fixture_artifacts import describe_artifacts

    generate(tmp_path)
    summary = describe_artifacts(tmp_path)
    assert json.loads(json.dumps(summary)) == summary


def test_live_same_signature_and_enums_as_ort(ort_api):
    import inspect

    from onnxruntime.training import artifacts as ort_artifacts

    ours_sig, ort_sig = (
        inspect.signature(artifacts.generate_artifacts),
        inspect.signature(ort_artifacts.generate_artifacts),
    )
    assert [(p.name, p.default, p.kind) for p in ours_sig.parameters.values()] == [
        (p.name, p.default, p.kind) for p in ort_sig.parameters.values()
    ]
    for ours_enum, ort_enum in (
        (artifacts.LossType, ort_artifacts.LossType),
        (artifacts.OptimType, ort_artifacts.OptimType),
    ):
        assert [(m.name, m.value) for m in ours_enum] == [(m.name, m.value) for m in ort_enum]
    for name in (
        "blocks",
        "loss",
        "optim",
        "Block",
        "ForwardBlock",
        "TrainingBlock",
        "load_checkpoint_to_model",
        "save_checkpoint",
        "base",
        "custom_op_library",
        "empty_base",
    ):
        assert hasattr(onnxblock, name), name


def test_no_loss_block_when_the_model_computes_its_loss(tmp_path):
    """``loss=None``: the model's first output is the loss (ORT's PassThrough block)."""
    model = tiny_model([helper.make_node("ReduceMean", ["z"], ["y"], keepdims=0, name="mean")])
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, []))
    generate(tmp_path, model, loss=None, additional_output_names=["h"])
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert [o.name for o in training.graph.output][:2] == ["y", "h"]
    assert [i.name for i in training.graph.input][:1] == ["x"]  # no target input


def _train_once(api, directory: pathlib.Path, loss: str) -> float:
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    target = np.array([0, 1, 1, 0], np.int64) if loss == "CrossEntropyLoss" else np.ones((4, 2), np.float32)
    value = float(np.asarray(module(x, target)))
    optimizer.step()
    return value


@pytest.mark.parametrize("layout", ["plain", "external_one_file", "external_per_tensor"])
@pytest.mark.parametrize("loss", ["MSELoss", "CrossEntropyLoss", "BCEWithLogitsLoss", "L1Loss"])
def test_a_model_path_with_or_without_external_data(tmp_path, loss, layout):
    """generate_artifacts(path): the path form exists for models over 2 GB.  The model given
    by path must survive the checker's temporary external-data copy (it used to point at the
    deleted temp file), whatever the file layout; the artifacts train here and in ORT."""
    source = tmp_path / "model"
    source.mkdir()
    model_path = source / "model.onnx"
    if layout == "plain":
        onnx.save(tiny_model(), str(model_path))
    else:
        onnx.save(
            tiny_model(),
            str(model_path),
            save_as_external_data=True,
            size_threshold=0,
            all_tensors_to_one_file=layout == "external_one_file",
            location="weights.bin",
        )
    out = tmp_path / "artifacts"
    out.mkdir()
    generate(out, str(model_path), loss=getattr(artifacts.LossType, loss))
    assert sorted(p.name for p in out.iterdir()) == FILES
    from ort_torch_compat import api as ours

    value = _train_once(ours, out, loss)
    assert np.isfinite(value)
    try:
        from onnxruntime.training import api as ort
    except ImportError:
        return
    assert _train_once(ort, out, loss) == pytest.approx(value, rel=1e-5, abs=1e-6)
