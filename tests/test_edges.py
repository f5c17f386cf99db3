"""ONNX Runtime's behaviour at the edges of its training API, reproduced (ort_torch_compat/testing/edge_cases.py).

The reference is onnxruntime-training 1.19.2 run live when it is importable, else what
scripts/make_edge_fixtures.py recorded from it (tests/fixtures/edges/expected.json).
Messages must begin with ORT's words; our hint may follow as a new sentence.
"""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

import ort_torch_compat.api as ours
from ort_torch_compat import TrainingSession, load_checkpoint
from ort_torch_compat.engine.string_inputs import cast_strings
from ort_torch_compat.errors import InvalidArgumentError, InvalidInputError, ModelLoadError
from ort_torch_compat.optim.adamw import adamw_step
from ort_torch_compat.testing import edge_cases as cases

try:
    import onnxruntime
    from onnxruntime.training import api as ort_api
except ImportError:
    onnxruntime = ort_api = None

EXPECTED = cases.load_expected()
our_buffer = ours.OrtValue.ortvalue_from_numpy


@pytest.fixture
def work(tmp_path):
    return tmp_path


def ort_reference(section: str, live):
    """ORT's result for `section`: live when onnxruntime-training is importable, else the fixture."""
    if ort_api is None:
        return EXPECTED[section]
    onnxruntime.set_default_logger_severity(4)
    return live()


def assert_same_outcome(ours_result: dict, ort_result: dict, key: str, compare_message: bool = True) -> None:
    assert ours_result["raised"] == ort_result["raised"], (key, ours_result, ort_result)
    if not ort_result["raised"]:
        return
    assert ort_result["builtins"][0] in ours_result["builtins"], (key, ours_result, ort_result)
    if compare_message:
        message, expected = ours_result["message"], ort_result["message"]
        assert message.startswith(expected), (key, message, expected)
        assert message[len(expected) :][:1] in ("", " ", "."), (key, message)


# ---- nominal state: ORT's messages, verbatim --------------------------------------------------------
def test_nominal_state_misuse_raises_orts_messages(work):
    ort_buffer = lambda array: onnxruntime.OrtValue.ortvalue_from_numpy(array)._ortvalue  # noqa: E731
    (work / "ort").mkdir()
    (work / "ours").mkdir()
    expected = ort_reference("nominal", lambda: cases.nominal_misuse(ort_api, ort_buffer, work / "ort"))
    result = cases.nominal_misuse(ours, our_buffer, work / "ours")
    assert set(result) == set(expected)
    for key in expected:
        assert_same_outcome(result[key], expected[key], key)


def test_nominal_messages_through_the_c_api_session():
    d = cases.NOMINAL
    session = TrainingSession(
        load_checkpoint(d / "nominal_checkpoint"),
        d / "training_model.onnx",
        d / "eval_model.onnx",
        d / "optimizer_model.onnx",
    )
    with pytest.raises(RuntimeError, match=r"^The optimizer state cannot be constructed\. Please load the model"):
        session.optimizer_step()
    with pytest.raises(RuntimeError, match=r"^Cannot copy parameters from a nominal checkpoint state\. Please load"):
        session.copy_parameters_to_buffer(False)
    with pytest.raises(RuntimeError, match=r"^Cannot export the model with a nominal state\."):
        session.export_model_for_inferencing("never.onnx", ["y"])


# ---- export_model_for_inferencing ---------------------------------------------------------------------
def test_export_errors_are_orts_and_list_the_exportable_names(work):
    expected = ort_reference("export", lambda: cases.export_misuse(ort_api, work))
    result = cases.export_misuse(ours, work)
    for key in expected:
        # ORT's TypeError text is pybind11's signature listing, not a message of ORT's: only the type is compared.
        assert_same_outcome(result[key], expected[key], key, compare_message=key != "bare_string")
    unknown = result["unknown_name"]["message"]
    assert "'logits'" in unknown and "onnx::loss::2" in unknown


def test_export_errors_are_runtime_errors_naming_the_output():
    state = ours.CheckpointState.load_checkpoint(cases.EXAMPLE / "checkpoint")
    module = ours.Module(cases.EXAMPLE / "training_model.onnx", state, cases.EXAMPLE / "eval_model.onnx")
    with pytest.raises(InvalidArgumentError, match=r"inference graph output could not be found.*\['logits'\]") as info:
        module.export_model_for_inferencing("never.onnx", ["output"])
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)
    with pytest.raises(RuntimeError, match="Got an empty vector"):
        module.export_model_for_inferencing("never.onnx", [])
    with pytest.raises(TypeError, match="list of str"):
        module.export_model_for_inferencing("never.onnx", "logits")
    assert not os.path.exists("never.onnx")


# ---- device strings ---------------------------------------------------------------------------------------
def test_unknown_device_types_get_orts_message():
    expected = ort_reference("device", lambda: cases.device_misuse(ort_api))
    result = cases.device_misuse(ours)
    for device in cases.DEVICES:
        # "cuda:x": ORT's text is Python's int() parse error; the type (ValueError) is what callers catch.
        assert_same_outcome(result[device], expected[device], device, compare_message=device != "cuda:x")
    assert 'Use "cpu", "cuda" or "cuda:N"' in result["gpu"]["message"]
    assert "index" in result["cuda:x"]["message"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_says_so():
    state = ours.CheckpointState.load_checkpoint(cases.EXAMPLE / "checkpoint")
    with pytest.raises(InvalidArgumentError, match=r"device 'cuda': CUDA is not available"):
        ours.Module(cases.EXAMPLE / "training_model.onnx", state, device="cuda")


# ---- outputs in the caller's kind -------------------------------------------------------------------------
@pytest.mark.skipif(onnxruntime is None, reason="onnxruntime's OrtValue exists only where onnxruntime is installed")
def test_onnxruntime_ortvalue_inputs_give_onnxruntime_ortvalues():
    expected = ort_reference("output_kinds", lambda: cases.output_kinds(ort_api, onnxruntime.OrtValue))
    result = cases.output_kinds(ours, onnxruntime.OrtValue)
    assert {k: result[k] for k in ("ortvalues", "mixed", "eval_ortvalues")} == {
        k: expected[k] for k in ("ortvalues", "mixed", "eval_ortvalues")
    }
    assert math.isclose(result["loss"], expected["loss"], rel_tol=1e-5)
    # `.numpy()` of a temporary OrtValue is a view: it must stay valid after the OrtValue is gone.
    state, module, _ = _example()
    x, y = cases.example_batch()
    loss = module(onnxruntime.OrtValue.ortvalue_from_numpy(x), onnxruntime.OrtValue.ortvalue_from_numpy(y)).numpy()
    gc.collect()
    churn = [torch.full((), 7.0) + i for i in range(2000)]  # noqa: F841 - reuse the freed memory, if any
    assert loss == module(x, y)
    d = cases.EXAMPLE
    with TrainingSession(load_checkpoint(d / "checkpoint"), d / "training_model.onnx") as session:
        x, y = cases.example_batch()
        outputs = session.train_step(
            [onnxruntime.OrtValue.ortvalue_from_numpy(x), onnxruntime.OrtValue.ortvalue_from_numpy(y)]
        )
        assert isinstance(outputs[0], onnxruntime.OrtValue)


def test_our_ortvalue_inputs_still_give_our_ortvalues():
    result = cases.output_kinds(ours, ours.OrtValue)
    assert result["ortvalues"] == result["eval_ortvalues"] == "ort_torch_compat.values.OrtValue"
    assert result["mixed"] == "numpy.ndarray"


# ---- a forward pass that fails inside torch ----------------------------------------------------------------
def _example():
    state = ours.CheckpointState.load_checkpoint(cases.EXAMPLE / "checkpoint")
    module = ours.Module(cases.EXAMPLE / "training_model.onnx", state, cases.EXAMPLE / "eval_model.onnx")
    return state, module, ours.Optimizer(cases.EXAMPLE / "optimizer_model.onnx", module)


def test_orts_behaviour_for_a_label_out_of_range_is_recorded():
    """ORT reads outside the logits without an error and moves the gradients (a documented difference)."""
    expected = ort_reference("label_out_of_range", lambda: cases.label_out_of_range(ort_api))
    assert expected == {"raised": False, "gradients_unchanged": False}


@pytest.mark.parametrize("reset", [True, False], ids=["after_lazy_reset", "accumulating"])
def test_failed_train_step_names_the_input_and_leaves_the_state_usable(reset):
    state, module, optimizer = _example()
    x, y = cases.example_batch()
    module(x, y)
    grads = {name: p.grad.copy() for name, p in state.parameters}
    if reset:
        module.lazy_reset_grad()
    bad = y.copy()
    bad[2] = 5
    with pytest.raises(
        InvalidInputError,
        match=r"train step failed in operator SoftmaxCrossEntropyLoss, which reads "
        r"input 'labels'.*Target 5 is out of bounds",
    ) as info:
        module(x, bad)
    assert isinstance(info.value.__cause__, IndexError)
    assert all(np.array_equal(p.grad, grads[name]) for name, p in state.parameters)
    if reset:  # the pending lazy reset survives the failure, as in ORT (test_failed_step_leaves_orts_state)
        module(x, y)
        assert all(np.array_equal(p.grad, grads[name]) for name, p in state.parameters)
    optimizer.step()  # the gradients of the last good step, as if the failed call never happened

    _, twin, twin_optimizer = _example()
    twin(x, y)
    if reset:
        twin.lazy_reset_grad()
    twin_optimizer.step()
    assert all(np.array_equal(p.data, twin._state.parameters[n].data) for n, p in state.parameters)
    module(x, y)  # and training goes on


def test_failed_step_leaves_orts_state():
    expected = ort_reference("failed_step", lambda: cases.failed_step(ort_api))
    assert expected["raised"] and expected["gradients_unchanged"] and expected["next_step_overwrites"]
    assert cases.failed_step(ours) == expected | {"builtins": cases.failed_step(ours)["builtins"]}


def test_failed_eval_step_names_the_input():
    _, module, _ = _example()
    x, y = cases.example_batch()
    module.eval()
    with pytest.raises(InvalidInputError, match=r"eval step failed .* input 'labels'"):
        module(x, np.array([0, 1, -7, 1]))


def test_failed_step_off_the_cpu_names_the_inputs_without_a_replay():
    from ort_torch_compat.engine.step_failure import raise_explained

    class Refuses(torch.nn.Module):
        def forward(self, *args):
            raise AssertionError("a replay must not run on an accelerator")

    meta = [torch.empty(2, device="meta"), torch.empty(2, device="meta")]
    with pytest.raises(InvalidInputError, match=r"train step failed on meta \(inputs 'features', 'labels'\)"):
        try:
            raise RuntimeError("device-side assert triggered")
        except RuntimeError as error:
            raise_explained(error, Refuses(), meta, ["features", "labels"], "train step")


def test_failed_step_through_the_c_api_session_leaves_it_usable():
    d = cases.EXAMPLE
    with TrainingSession(
        load_checkpoint(d / "checkpoint"), d / "training_model.onnx", optimizer_model=d / "optimizer_model.onnx"
    ) as session:
        x, y = cases.example_batch()
        with pytest.raises(InvalidInputError, match="'labels'"):
            session.train_step([x, np.full(4, 9)])
        session.optimizer_step()  # zero gradients of a fresh session: no TypeError on None
        session.train_step([x, y])


# ---- string inputs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(cases.string_feed_variants()))
def test_string_inputs_train_like_ort(kind):
    as_array = cases.string_feed_variants()[kind]
    expected = ort_reference("string_inputs", lambda: {kind: cases.string_inputs(ort_api, as_array)})[kind]
    result = cases.string_inputs(ours, as_array)
    assert result["input_names"] == expected["input_names"]
    np.testing.assert_allclose(result["losses"], expected["losses"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result["eval_loss"], expected["eval_loss"], rtol=1e-5, atol=1e-6)
    for name, values in expected["parameters"].items():
        np.testing.assert_allclose(result["parameters"][name], values, rtol=1e-4, atol=2e-5)
    # ORT: "Non-zero status code returned while running Cast node. Name:'' Status Message: stod"; ours names the input.
    assert_same_outcome(result["unparsable"], expected["unparsable"], "unparsable", compare_message=False)
    assert "input 'features'" in result["unparsable"]["message"] and "'abc'" in result["unparsable"]["message"]


def _cast_reference() -> dict:
    if onnxruntime is None:
        return EXPECTED["cast"]
    onnxruntime.set_default_logger_severity(4)
    table = {}
    for family, targets in cases.CAST_TARGETS.items():
        for target in targets:
            session = onnxruntime.InferenceSession(
                cases.cast_model(getattr(onnx.TensorProto, target)).SerializeToString(),
                providers=["CPUExecutionProvider"],
            )
            row = {}
            for text in cases.CAST_TEXTS[family]:
                try:
                    row[text] = cases.json_value(
                        session.run(None, {"s": np.array([text], dtype=object)})[0].tolist()[0]
                    )
                except Exception:  # noqa: BLE001
                    row[text] = "error"
            table[target] = row
    return table


def test_strings_parse_like_orts_cast():
    reference = _cast_reference()
    for family, targets in cases.CAST_TARGETS.items():
        for target in targets:
            for text in cases.CAST_TEXTS[family]:
                try:
                    value = cases.json_value(
                        cast_strings(np.array([text], dtype=object), getattr(onnx.TensorProto, target)).tolist()[0]
                    )
                except ValueError:
                    value = "error"
                assert value == reference[target][text], (target, text, value, reference[target][text])


def test_failed_step_names_the_string_input_behind_a_cast():
    state = ours.CheckpointState.load_checkpoint(cases.STRINGS / "checkpoint")
    module = ours.Module(cases.STRINGS / "training_model.onnx", state)
    with pytest.raises(InvalidInputError, match=r"SoftmaxCrossEntropyLoss, which reads input 'label_text'"):
        module(np.array(cases.STRING_FEATURES), np.array(["0", "5", "1", "1"]))


def test_string_input_read_by_another_operator_is_refused_naming_it():
    model = onnx.load(str(cases.STRINGS / "training_model.onnx"))
    model.graph.node.append(onnx.helper.make_node("Identity", ["label_text"], ["label_copy"]))
    state = ours.CheckpointState.load_checkpoint(cases.STRINGS / "checkpoint")
    with pytest.raises(ModelLoadError, match=r"string input 'label_text' is read by ai.onnx::Identity"):
        ours.Module(model.SerializeToString(), state)


def test_string_and_numeric_inputs_are_not_interchangeable():
    state = ours.CheckpointState.load_checkpoint(cases.STRINGS / "checkpoint")
    module = ours.Module(cases.STRINGS / "training_model.onnx", state)
    labels = np.array(cases.STRING_LABELS)
    with pytest.raises(InvalidInputError, match=r"'features'.*expected: tensor\(string\)"):
        module(np.ones((4, 2), np.float32), labels)
    _, example, _ = _example()
    with pytest.raises(
        InvalidInputError,
        match=r"'features'. Actual: tensor\(string\) \(a numpy <U3 array\), expected: tensor\(float\)",
    ):
        example(np.array([["1.0", "2.0"]]), np.array([0]))


# ---- AdamW with lr * weight_decay >= 1 -----------------------------------------------------------------------
def test_adamw_steps_with_large_weight_decay_match_ort(work):
    expected = ort_reference("adamw_decay", lambda: cases.adamw_decay(ort_api, work))
    result = cases.adamw_decay(ours, work)
    for key, reference in expected.items():
        assert result[key]["raised"] is reference["raised"] is False, key
        for name, values in reference["parameters"].items():
            np.testing.assert_allclose(result[key]["parameters"][name], values, rtol=1e-4, atol=2e-5, err_msg=key)
    assert all(v == 0.0 for values in result["mode1_lr0.5_wd2"]["parameters"].values() for v in values)


@pytest.mark.parametrize("lr, weight_decay", [(0.5, 2.0), (0.25, 4.0), (0.5, 3.0)])
def test_adamw_kernel_takes_orts_formula_when_decay_reaches_one(lr, weight_decay):
    torch.manual_seed(0)
    results = []
    for fused in (None, False):
        params, grads = [torch.randn(7)], [torch.randn(7)]
        moments = [torch.zeros(7)], [torch.zeros(7)]
        adamw_step(
            params,
            grads,
            *moments,
            lr=lr,
            step=1,
            alpha=0.9,
            beta=0.999,
            epsilon=1e-6,
            weight_decay=weight_decay,
            adam_mode=1,
            correct_bias=True,
            fused=fused,
        )
        results.append(params[0])
        torch.manual_seed(0)
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_adamw_falls_back_where_torch_has_no_fused_kernel(monkeypatch):
    """torch < 2.4 has `_fused_adamw_` but no CPU kernel for it: the reference kernel runs instead."""
    from ort_torch_compat.optim import adamw

    def no_cpu_kernel(*args, **kwargs):
        raise NotImplementedError("Could not run 'aten::_fused_adamw_' with arguments from the 'CPU' backend.")

    torch.manual_seed(0)
    params, grads = [torch.randn(5)], [torch.randn(5)]
    expected = [params[0].clone()]
    settings = dict(
        lr=0.01, step=1, alpha=0.9, beta=0.999, epsilon=1e-6, weight_decay=0.1, adam_mode=1, correct_bias=True
    )
    adamw_step(expected, grads, [torch.zeros(5)], [torch.zeros(5)], fused=False, **settings)
    monkeypatch.setattr(torch, "_fused_adamw_", no_cpu_kernel)
    adamw.fused_available.cache_clear()
    try:
        adamw_step(params, grads, [torch.zeros(5)], [torch.zeros(5)], **settings)
    finally:
        adamw.fused_available.cache_clear()
    torch.testing.assert_close(params[0], expected[0], rtol=0, atol=0)


# ---- `run -m` finds packages in the current directory ---------------------------------------------------------
def test_run_module_finds_a_package_in_the_current_directory(tmp_path):
    package = tmp_path / "mypackage"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(
        "import sys\nimport onnxruntime.training.api as api\n"
        "open('ran.txt', 'w').write(api.Module.__module__ + ' ' + ' '.join(sys.argv[1:]))\n"
    )
    # As under the `ort-torch-compat` console script, the current directory is not on sys.path.
    launcher = (
        "import os, sys\n"
        "sys.path[:] = [p for p in sys.path if p not in ('', '.', os.getcwd())]\n"
        "from ort_torch_compat.cli import main\n"
        "sys.exit(main(['run', '-m', 'mypackage.train', '--epochs', '3']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(cases.ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", launcher], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran.txt").read_text() == "ort_torch_compat.api.module --epochs 3"


# ---- parameter buffers ---------------------------------------------------------------------------------------
def test_copy_buffer_to_parameters_takes_any_ortvalue():
    """ORT's takes only the pybind C.OrtValue (a documented quirk, not reproduced)."""
    expected = ort_reference("buffers", lambda: cases.buffer_kinds(ort_api, onnxruntime.OrtValue))
    assert expected["contiguous_class"] == "OrtValue" and expected["copy_from_ortvalue"]["builtins"][0] == "TypeError"
    assert cases.buffer_kinds(ours, ours.OrtValue)["copy_from_ortvalue"] == {"raised": False}
    if onnxruntime is not None:
        assert cases.buffer_kinds(ours, onnxruntime.OrtValue)["copy_from_ortvalue"] == {"raised": False}
