"""The compiled train step (graph/specialize.py, engine/compiled.py) against the eager one.

The differential suites run eagerly by default (conftest sets ORT_TORCH_COMPAT_COMPILE=off);
`ORT_TORCH_COMPAT_COMPILE=on python -m pytest tests/test_training_parity.py` runs them with
every train step compiled.  Here: the specialized graph computes what the converted module
computes (outputs, gradients, in-place BatchNorm statistics) without a C++ compiler; one
real compilation (cached under .pytest_cache, so only the first run after a change to the
compiler path pays it) matches eager steps and loads from the cache; every fallback warns
once and trains eagerly.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch
from torch import fx, nn

from ort_torch_compat.api import CheckpointState
from ort_torch_compat.engine import (
    TrainingEngine,
    compile_build,
    compile_cache,
    compile_key,
    compile_worker,
    compiled,
    traced_step,
)
from ort_torch_compat.graph.specialize import NotSpecializable, specialize
from ort_torch_compat.legacy import SessionOptions
from ort_torch_compat.testing.scenario import make_batch
from tests.conftest import FIXTURES, ROOT, assert_bad_labels_change_nothing, load_spec, train_record

TEST_CACHE = ROOT / ".pytest_cache" / "ort_torch_compat"


def _engine(config: str, **options) -> tuple:
    directory = FIXTURES / config
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    session_options = SessionOptions()
    for key, value in options.items():
        session_options.add_session_config_entry(key, value)
    engine = TrainingEngine(state._state, str(directory / "training_model.onnx"), session_options=session_options)
    return engine, load_spec(directory)


def _feeds(engine: TrainingEngine, spec: dict, step: int) -> list:
    batch = make_batch(spec, step, 0)
    return [torch.from_numpy(batch[name]) for name in engine.input_names(True)]


def _clones(tensors) -> list:
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


@pytest.mark.parametrize(
    "config",
    [
        "cnn_ce_adamw_op17",
        "transformer_ce_adamw_op17",
        "lstm_ce_adamw_op17",
        "tensorops_mse_adamw_op17",
        "twoout_mse_adamw_lossinput_addout_op17",
    ],
)
def test_specialized_graph_computes_what_the_module_computes(config):
    engine, spec = _engine(config, **{compiled.CONFIG_KEY: "eager"})
    module = engine.train_module
    tensors = _feeds(engine, spec, 1) + engine._train_params
    specialized = specialize(module, tensors)

    expected_inputs = _clones(tensors)
    expected = module(*expected_inputs)
    actual_inputs = _clones(tensors)
    every = actual_inputs + [c.detach().clone() for c in specialized.constants]
    results = specialized.module(*every)
    actual = results[: specialized.num_outputs]
    with torch.no_grad():  # what the compiled step does with the trailing outputs
        for index, value in zip(specialized.mutated, results[specialized.num_outputs :]):
            every[index].copy_(value)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    leaves = [i for i, t in enumerate(tensors) if t.requires_grad]
    grads_expected = torch.autograd.grad(expected[0].sum(), [expected_inputs[i] for i in leaves], allow_unused=True)
    grads_actual = torch.autograd.grad(actual[0].sum(), [actual_inputs[i] for i in leaves], allow_unused=True)
    for a, e in zip(grads_actual, grads_expected):
        assert (a is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    for a, e in zip(actual_inputs, expected_inputs):  # running statistics updated alike
        torch.testing.assert_close(a.detach(), e.detach(), rtol=1e-5, atol=1e-6)
    if config.startswith("cnn"):
        assert specialized.mutated, "BatchNorm's running statistics must come back as outputs"


def test_specializing_leaves_inputs_and_random_state_alone():
    engine, spec = _engine("cnn_ce_adamw_op17", **{compiled.CONFIG_KEY: "eager"})
    tensors = _feeds(engine, spec, 1) + engine._train_params
    before = [t.detach().clone() for t in tensors]
    rng = torch.get_rng_state()
    specialize(engine.train_module, tensors)
    assert all(torch.equal(a, b) for a, b in zip(tensors, before))
    assert torch.equal(torch.get_rng_state(), rng)


def test_random_operators_are_not_specialized():
    directory = FIXTURES / "dropout"
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    engine = TrainingEngine(state._state, str(directory / "training_model.onnx"))
    feeds = [
        torch.randn(*[d or 1 for d in spec.shape])
        if spec.elem_type == 1
        else torch.zeros([d or 1 for d in spec.shape], dtype=torch.int64)
        for spec in engine.train_io.user_inputs
    ]
    with pytest.raises(NotSpecializable, match="random"):
        specialize(engine.train_module, feeds + engine._train_params)


class _Convolutions(nn.Module):
    def forward(self, x, patch_w, patch_b, point_w, group_w, group_b, pad_w, pad_b):
        x = patches = nn.functional.conv2d(x, patch_w, patch_b, stride=4)  # a ViT's patch embedding
        x = nn.functional.conv2d(x, point_w)  # 1x1, no bias
        x = nn.functional.conv2d(x, group_w, group_b, groups=3)  # stays a convolution
        loss = nn.functional.conv2d(x, pad_w, pad_b, padding=1).square().mean()  # stays too
        return loss, patches  # a rewritten convolution as an output


@pytest.mark.parametrize("size", [16, 18])  # 18: the patch convolution drops 2 rows and columns
def test_tiling_convolutions_become_matrix_products(size):
    torch.manual_seed(0)
    module = fx.symbolic_trace(_Convolutions())
    shapes = [(8, 3, 4, 4), (8,), (6, 8, 1, 1), (6, 2, 1, 1), (6,), (4, 6, 3, 3), (4,)]
    tensors = [torch.randn(2, 3, size, size)] + [torch.randn(*shape, requires_grad=True) for shape in shapes]
    plain = specialize(module, tensors)
    products = specialize(module, tensors, convolutions_as_products=True)

    def convolutions(specialized) -> int:
        return sum(node.target is torch.ops.aten.convolution.default for node in specialized.module.graph.nodes)

    assert (convolutions(plain), convolutions(products)) == (4, 2)
    results = []
    for specialized in (plain, products):
        copies = _clones(tensors)
        loss = specialized.module(*copies, *specialized.constants)[0]
        results.append([loss] + list(torch.autograd.grad(loss, copies[1:])))
    for a, e in zip(results[1], results[0]):  # float32 sums in another order: rounding apart
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5 * e.abs().max().item())


class _Products(nn.Module):
    def forward(self, h, r, x, w, head_w, head_b, wide):
        h = torch.tanh(h @ r.t())  # 2 rows: a recurrent step at batch 2
        h = torch.tanh(h @ r.t())
        tokens = x @ w.t()  # 8 rows: stays a product
        pooled = nn.functional.linear(h + tokens[:2], head_w, head_b)  # 2 rows with a bias (addmm)
        big = h[:1] @ wide  # 1 row, too many multiply-adds: stays
        return pooled.square().mean() + tokens.mean() + big.mean(), pooled  # a rewritten product as an output


def test_few_row_products_become_sums():
    torch.manual_seed(0)
    module = fx.symbolic_trace(_Products())
    h, x = torch.randn(2, 6), torch.randn(8, 5)
    r, w, head_w, head_b, wide = (
        torch.randn(*s, requires_grad=True) for s in [(6, 6), (6, 5), (3, 6), (3,), (6, 50000)]
    )
    tensors = [h, r, x, w, head_w, head_b, wide]
    plain = specialize(module, tensors)
    sums = specialize(module, tensors, few_row_products_as_sums=True)

    def products(specialized) -> int:
        targets = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        return sum(node.target in targets for node in specialized.module.graph.nodes)

    assert (products(plain), products(sums)) == (5, 2)
    results = []
    for specialized in (plain, sums):
        copies = _clones(tensors)
        loss = specialized.module(*copies, *specialized.constants)[0]
        wanted = [copies[i] for i in (1, 3, 4, 5, 6)]  # the parameters
        results.append([loss] + list(torch.autograd.grad(loss, wanted)))
    for a, e in zip(results[1], results[0]):  # float32 sums in another order: rounding apart
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5 * e.abs().max().item())


class _Biased(nn.Module):
    def forward(self, x, w, b, v, plane):
        hidden = torch.relu(nn.functional.linear(x, w, b))  # a row of biases: added after the product
        both = torch.addmm(plane, hidden, v)  # a bias per element: stays an addmm
        scaled = torch.addmm(b[:3], hidden, v, beta=1.0, alpha=1.0)  # ONNX Gemm's spelled-out defaults
        halved = torch.addmm(b[:3], hidden, v, beta=0.5)  # a scaled bias: stays
        return both.square().mean() + scaled.mean() + halved.mean(), hidden


def test_bias_rows_are_added_after_the_product():
    torch.manual_seed(0)
    module = fx.symbolic_trace(_Biased())
    x = torch.randn(8, 5)
    w, b, v, plane = (torch.randn(*s, requires_grad=True) for s in [(6, 5), (6,), (6, 3), (8, 3)])
    tensors = [x, w, b, v, plane]
    plain = specialize(module, tensors)
    unfused = specialize(module, tensors, bias_adds_unfused=True)

    def count(specialized, target) -> int:
        return sum(node.target is target for node in specialized.module.graph.nodes)

    aten = torch.ops.aten
    assert (count(plain, aten.addmm.default), count(plain, aten.mm.default)) == (4, 0)
    assert (count(unfused, aten.addmm.default), count(unfused, aten.mm.default)) == (2, 2)
    assert count(unfused, aten.sub.Tensor) == 2  # not an add: Inductor would fuse it back (see the pass)
    results = []
    for specialized in (plain, unfused):
        copies = _clones(tensors)
        loss, hidden = specialized.module(*copies, *specialized.constants)[:2]
        results.append([loss, hidden] + list(torch.autograd.grad(loss, copies[1:])))
    for a, e in zip(results[1], results[0]):  # the bias added after the rounded product: rounding apart
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6 * e.abs().max().item())


class _ReadsValue(nn.Module):
    def forward(self, x, w):
        return x[: int(w.detach()[0].abs().ceil())] * w


def test_control_flow_on_parameter_values_is_not_specialized():
    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    graph.output((graph.call_module("reads", (x, w)),))
    root = nn.Module()
    root.add_module("reads", _ReadsValue())
    module = fx.GraphModule(root, graph)
    with pytest.raises(NotSpecializable, match="data-dependent"):
        specialize(module, [torch.randn(4, 3), torch.full((3,), 2.0, requires_grad=True)])


def test_compile_setting_sources(monkeypatch):
    monkeypatch.delenv(compiled.COMPILE_ENV, raising=False)
    assert compiled.compile_setting() == "auto"
    monkeypatch.setenv(compiled.COMPILE_ENV, "1")
    assert compiled.compile_setting() == "on"
    options = SessionOptions()
    options.graph_optimization_level = 0  # ORT_DISABLE_ALL
    assert compiled.compile_setting(options) == "off"
    options.add_session_config_entry(compiled.CONFIG_KEY, "auto")
    assert compiled.compile_setting(options) == "auto"
    monkeypatch.setenv(compiled.COMPILE_ENV, "fast")
    with pytest.raises(ValueError, match="compile setting"):
        compiled.compile_setting()


def _train(engine: TrainingEngine, spec: dict, steps: int) -> list:
    """Losses, gradients and every parameter (running statistics included) per step."""
    return train_record(engine, lambda step: _feeds(engine, spec, step), steps)


@pytest.mark.skipif(compiled.cxx_compiler() is None, reason="needs a C++ compiler")
def test_compiled_step_matches_eager_and_loads_from_the_cache(monkeypatch):
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(TEST_CACHE))
    monkeypatch.setattr(compiled, "_FASTER", float("inf"))  # "auto" uses it even where it is not faster
    config = "cnn_ce_adamw_op17"  # BatchNorm: in-place running statistics through the compiled step
    eager, spec = _engine(config, **{compiled.CONFIG_KEY: "eager"})
    first, _ = _engine(config, **{compiled.CONFIG_KEY: "on"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", compiled.CompileWarning)
        expected, actual = _train(eager, spec, 3), _train(first, spec, 3)
    assert first.train_runner.path == "compiled"
    for step_expected, step_actual in zip(expected, actual):
        assert len(step_expected) == len(step_actual)
        for e, a in zip(step_expected, step_actual):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)

    # A cached compilation is used from the first step, read without unpickling anything.
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("the cache must not be unpickled"))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("the cache must not be unpickled"))
    warm, _ = _engine(config, **{compiled.CONFIG_KEY: "auto"})
    _train(warm, spec, 1)
    assert warm.train_runner.path == "compiled" and warm.train_runner.compile_seconds is None


@pytest.mark.skipif(compiled.cxx_compiler() is None, reason="needs a C++ compiler")
@pytest.mark.parametrize("faster_in_the_loop", [True, False])
def test_a_step_not_faster_on_one_thread_is_timed_in_the_training_loop(monkeypatch, faster_in_the_loop):
    """The worker times the compiled step on one thread (its core); where it was not faster
    there, "auto" times both forms in the training loop on the caller's threads, five steps
    each in turn, and keeps the compiled one only where it takes at most _FASTER of the
    other's median (EfficientNet-B0-tiny: 0.96x on one thread, 0.61x on two).  Every step,
    whichever form ran it, gives the eager step's numbers."""
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(TEST_CACHE))
    config = "cnn_ce_adamw_op17"
    compiler, spec = _engine(config, **{compiled.CONFIG_KEY: "on"})
    _train(compiler, spec, 1)  # the entry (cached when the tests above ran first)
    monkeypatch.setattr(compiled, "_FASTER", 1e-9)  # the entry's one-thread timing: not faster
    monkeypatch.setattr(compiled.os, "cpu_count", lambda: 2)
    engine, _ = _engine(config, **{compiled.CONFIG_KEY: "auto"})
    runner = engine.train_runner
    timed = []

    def verdict(seconds: list) -> float:  # this machine's timings aside: the trial's outcome is set here
        timed.append(len(seconds))
        if seconds is runner._trial[0]:
            return 0.0 if faster_in_the_loop else 2.0
        return 1.0

    monkeypatch.setattr(compiled, "_median_ms", verdict)
    eager, _ = _engine(config, **{compiled.CONFIG_KEY: "eager"})
    paths = []
    original = runner.compiled_for

    traced_by_step = []

    def recording(tensors, fixed=0):
        step = original(tensors, fixed)
        paths.append("compiled" if step is runner.compiled and step is not None else runner.path)
        traced_by_step.append(len(runner._traced))
        return step

    monkeypatch.setattr(runner, "compiled_for", recording)
    settled = engine._settled_train_step

    def recording_short_way(inputs):  # the steps after the choice skip `compiled_for` (see below)
        step = engine._settled[1]
        outputs = settled(inputs)
        if outputs is not None:
            paths.append("compiled" if step is runner.compiled else runner.path)
        return outputs

    monkeypatch.setattr(engine, "_settled_train_step", recording_short_way)
    expected, actual = (
        train_record(eager, lambda s: _feeds(eager, spec, s), 13, buffers=True),
        train_record(engine, lambda s: _feeds(engine, spec, s), 13, buffers=True),
    )
    for step_expected, step_actual in zip(expected, actual):
        for e, a in zip(step_expected, step_actual):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    assert timed == [5, 5], "the verdict comes after five timed steps of each form"
    # the other form is traced in the first step (load and trace), not in the trial's second
    assert traced_by_step[0] == 1, "the first step traces the form the compiled step is timed against"
    assert paths[:10].count("compiled") == 5, f"the forms take turns: {paths}"
    if faster_in_the_loop:
        assert paths[10:] == ["compiled"] * 3 and runner.path == "compiled"
    else:
        assert "compiled" not in paths[10:] and runner.compiled is None and runner.path in ("traced", "eager")


@pytest.mark.skipif(compiled.cxx_compiler() is None, reason="needs a C++ compiler")
def test_compiled_step_takes_non_contiguous_feeds(monkeypatch):
    """The library reads dense row-major memory: a feed that is a strided view (a user's
    transposed or sliced array) is made contiguous first, the parameters' views are not
    copied (they are contiguous by construction)."""
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(TEST_CACHE))
    monkeypatch.setattr(compiled, "_FASTER", float("inf"))
    engine, spec = _engine("cnn_ce_adamw_op17", **{compiled.CONFIG_KEY: "on"})
    feeds = _feeds(engine, spec, 1)
    strided = [f.transpose(-1, -2).contiguous().transpose(-1, -2) if f.dim() >= 2 else f for f in feeds]
    assert any(not f.is_contiguous() for f in strided)
    results = []
    for inputs in (feeds, strided):
        outputs, grads = engine.train_step_with_gradients(inputs)
        engine.lazy_reset_grad()
        results.append((outputs, grads))
    assert engine.train_runner.path == "compiled"
    (expected_outputs, expected_grads), (outputs, grads) = results
    for e, a in zip(expected_outputs, outputs):
        assert torch.equal(a, e)
    for name in grads:
        assert torch.equal(grads[name], expected_grads[name])


@pytest.mark.skipif(compiled.cxx_compiler() is None, reason="needs a C++ compiler")
def test_a_settled_training_loop_takes_the_short_way_with_the_full_ways_numbers(monkeypatch):
    """Once the runner has settled on its compiled step, train steps with inputs of the same
    type, dtype, shape and device skip the input checks and runner lookups (the short way,
    training_engine.py `_settled_train_step`); everything else takes the full way.  Every
    step gives the eager step's numbers: strided feeds of the settled shape (made contiguous
    in the library's argument list), steps that accumulate, feeds of another type in
    between, and the steps after the runner stopped trusting its compiled step."""
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(TEST_CACHE))
    monkeypatch.setattr(compiled, "_FASTER", float("inf"))
    config = "cnn_ce_adamw_op17"
    eager, spec = _engine(config, **{compiled.CONFIG_KEY: "eager"})
    engine, _ = _engine(config, **{compiled.CONFIG_KEY: "on"})
    short = []
    original = engine._settled_train_step

    def recording(inputs):
        outputs = original(inputs)
        short.append(outputs is not None)
        return outputs

    monkeypatch.setattr(engine, "_settled_train_step", recording)

    def strided(feeds):
        return [f.transpose(-1, -2).contiguous().transpose(-1, -2) if f.dim() >= 2 else f for f in feeds]

    class Feed(torch.Tensor):  # a tensor of another type: another signature
        pass

    def other_type(feeds):
        return [f.as_subclass(Feed) for f in feeds]

    batches = [None, None, strided, None, other_type, None, None, None]
    records = []
    for engine_ in (eager, engine):
        record = []
        for step, change in enumerate(batches, start=1):
            if step == 8 and engine_ is engine:  # the runner no longer trusts its compiled step: the full way
                retired = engine.train_runner.compiled
                engine.train_runner.disagreed(retired)
            feeds = _feeds(engine_, spec, step)
            outputs = engine_.train_step(change(feeds) if change else feeds)
            if step != 3:  # step 4 adds to step 3's gradients
                engine_.lazy_reset_grad()
            record.append([o.clone() for o in outputs] + [g.clone() for g in engine_.gradients().values()])
        records.append(record)
    for step_expected, step_actual in zip(*records):
        for e, a in zip(step_expected, step_actual):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    # step 1 settles the loop (no short way yet); 5's feeds of another type and 8 take the full way
    assert short == [True, True, True, False, True, True, False], short
    assert engine.train_runner.path != "compiled"  # (a traced step, now settled, may take over)
    assert engine._settled is None or engine._settled[1] is not retired


@pytest.mark.skipif(compiled.cxx_compiler() is None, reason="needs a C++ compiler")
@pytest.mark.parametrize("gradients", ["flat", "per_parameter"])
def test_compiled_step_accumulates_and_reports_step_gradients_as_eager(monkeypatch, gradients):
    """The compiled step runs without autograd: steps without lazy_reset_grad must add into
    .grad as autograd does, and the per-step gradients (train_step_with_gradients, as DDP and
    federated clients read them) must be this step's.  Both ways gradients leave the library:
    flat into the store's gradient buffer (the engine's fast path), and per parameter
    (CompiledTrainStep.train, where the library's layout is not the store's)."""
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(TEST_CACHE))
    monkeypatch.setattr(compiled, "_FASTER", float("inf"))
    config = "cnn_ce_adamw_op17"  # compiled by the test above when run together
    eager, spec = _engine(config, **{compiled.CONFIG_KEY: "eager"})
    engine, _ = _engine(config, **{compiled.CONFIG_KEY: "on"})
    if gradients == "per_parameter":
        monkeypatch.setattr(engine.store, "flat_groups_of", lambda lists: None)
    for step in (1, 2, 3):  # no lazy_reset_grad: every step accumulates into the first's gradients
        expected_outputs, expected_grads = eager.train_step_with_gradients(_feeds(eager, spec, step))
        outputs, grads = engine.train_step_with_gradients(_feeds(engine, spec, step))
        assert engine.train_runner.path == "compiled"
        for e, a in zip(expected_outputs, outputs):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
        assert grads.keys() == expected_grads.keys()
        for name in grads:
            torch.testing.assert_close(grads[name], expected_grads[name], rtol=1e-4, atol=1e-5)
        for name, grad in engine.gradients().items():
            torch.testing.assert_close(grad, eager.gradients()[name], rtol=1e-4, atol=1e-5)
    assert step > 1 and any(not torch.equal(grads[n], engine.gradients()[n]) for n in grads), "no accumulation seen"
    assert engine.store.grads_bound == (gradients == "flat")


@pytest.mark.skipif(compiled.cxx_compiler() is None, reason="needs a C++ compiler")
def test_a_failed_compiled_step_leaves_the_gradients_as_they_were(monkeypatch):
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(TEST_CACHE))
    monkeypatch.setattr(compiled, "_FASTER", float("inf"))
    engine, spec = _engine("cnn_ce_adamw_op17", **{compiled.CONFIG_KEY: "on"})
    engine.train_step(_feeds(engine, spec, 1))
    engine.lazy_reset_grad()
    before = {name: grad.clone() for name, grad in engine.gradients().items()}
    step = engine.train_runner.compiled

    def failing(tensors, contiguous_tail=0):
        raise RuntimeError("the library failed (test)")

    monkeypatch.setattr(step, "run", failing)
    with pytest.raises(Exception, match="the library failed"):
        engine.train_step(_feeds(engine, spec, 2))
    for name, grad in engine.gradients().items():
        assert torch.equal(grad, before[name])
    monkeypatch.undo()
    engine.train_step(_feeds(engine, spec, 2))  # still a reset pending: the step overwrites
    expected, _ = _engine("cnn_ce_adamw_op17", **{compiled.CONFIG_KEY: "eager"})
    expected.train_step(_feeds(expected, spec, 1))
    expected.lazy_reset_grad()
    expected.train_step(_feeds(expected, spec, 2))
    for name, grad in engine.gradients().items():
        torch.testing.assert_close(grad, expected.gradients()[name], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(compiled.cxx_compiler() is None, reason="needs a C++ compiler")
def test_an_out_of_range_label_raises_as_eager_does_and_changes_nothing(monkeypatch):
    """TorchInductor checks an index with a C++ assertion that cannot be caught: a label out
    of range ended the process (`terminate called ... index out of bounds`).  The compiled
    step flags it instead (graph/index_guard.py), writes nothing back, and the eager step
    raises the error ORT's users get; the next valid batch runs compiled again."""
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(TEST_CACHE))
    monkeypatch.setattr(compiled, "_FASTER", float("inf"))
    engine, spec = _engine("cnn_ce_adamw_op17", **{compiled.CONFIG_KEY: "on"})
    engine.train_step(_feeds(engine, spec, 1))
    assert engine.train_runner.path == "compiled" and engine.train_runner.compiled.index_flag
    before = {name: grad.clone() for name, grad in engine.gradients().items()}
    assert_bad_labels_change_nothing(engine, lambda: _feeds(engine, spec, 2))
    engine.lazy_reset_grad()
    engine.train_step(_feeds(engine, spec, 2))
    assert engine.train_runner.path == "compiled"
    assert not all(torch.equal(grad, before[name]) for name, grad in engine.gradients().items())


@pytest.mark.parametrize("config", ["transformer_ce_adamw_op17", "cnn_ce_sgd_op17"])
def test_optimizer_over_flat_gradient_buffers_equals_per_parameter(config):
    """Once gradients live in the store's flat buffers (compiled and CUDA-graph steps), the
    optimizer steps each dtype group as one tensor; element for element that is the same
    arithmetic as the per-parameter lists: bit-identical parameters and moments."""
    from ort_torch_compat.engine.optimizer_engine import OptimizerEngine

    runs = []
    for bound in (False, True):
        engine, spec = _engine(config, **{compiled.CONFIG_KEY: "eager"})
        optimizer = OptimizerEngine(str(FIXTURES / config / "optimizer_model.onnx"), engine)
        for step in (1, 2, 3):
            engine.train_step(_feeds(engine, spec, step))
            if bound:
                engine.store.bind_flat_grads(copy=True)
            assert engine.store.grads_bound == bound
            optimizer.step()
            engine.lazy_reset_grad()
        moments = engine.state.optimizer.moments
        runs.append(
            [p.detach().clone() for p in engine.store.trainable]
            + [m.clone() for name in sorted(moments) for m in moments[name].values()]
        )
    assert len(runs[0]) == len(runs[1])
    for unbound, bound in zip(*runs):
        assert torch.equal(unbound, bound)


def test_without_a_compiler_steps_run_eagerly_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compiled, "cxx_compiler", lambda: None)
    monkeypatch.setattr(compiled, "_reported", set())
    monkeypatch.setattr(traced_step, "torchscript_available", lambda: False)  # else traced (test_traced_step.py)
    eager, spec = _engine("mlp_mse_adamw_op17", **{compiled.CONFIG_KEY: "eager"})
    engine, _ = _engine("mlp_mse_adamw_op17", **{compiled.CONFIG_KEY: "on"})
    with pytest.warns(compiled.CompileWarning, match="no C\\+\\+ compiler") as caught:
        actual = _train(engine, spec, 2)
    assert len([w for w in caught if issubclass(w.category, compiled.CompileWarning)]) == 1
    assert engine.train_runner.path == "eager"
    for step_expected, step_actual in zip(_train(eager, spec, 2), actual):
        for e, a in zip(step_expected, step_actual):
            assert torch.equal(a, e)


class _InlineWorker:
    """The compile worker's job run in this process (so monkeypatches reach it) when told to
    `go` (`started` lists the priorities it was given then); `done()` answers False
    `pending` times first, as a worker that is still compiling would."""

    pending = 0
    started: list = []

    def __init__(self, recipe, tensors, key, root, priority):
        self._job = (recipe, tensors, key, root)
        self._polls = _InlineWorker.pending
        self._result = None

    def go(self, priority):
        assert self._result is None, "told to go twice"
        _InlineWorker.started.append(priority)
        recipe, tensors, key, root = self._job
        self._result = compile_build.build_entry(recipe.build(), tensors, key, root)

    def done(self):
        self._polls -= 1
        return self._polls < 0

    def wait(self):
        return self._result

    def result(self):
        return self._result


@pytest.fixture
def inline_worker(monkeypatch):
    monkeypatch.setattr(compile_worker, "start", _InlineWorker)
    monkeypatch.setattr(_InlineWorker, "started", [])
    monkeypatch.setattr(_InlineWorker, "pending", 0)
    return _InlineWorker


def test_a_refused_graph_is_remembered(monkeypatch, tmp_path, inline_worker):
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compiled, "_reported", set())
    monkeypatch.setattr(compiled, "cxx_compiler", lambda: "c++")
    monkeypatch.setattr(traced_step, "torchscript_available", lambda: False)  # specialize: the compiler's only

    def refuse(module, tensors, **options):
        raise NotSpecializable("the graph draws random numbers (test)")

    monkeypatch.setattr("ort_torch_compat.graph.specialize.specialize", refuse)
    engine, spec = _engine("mlp_mse_adamw_op17", **{compiled.CONFIG_KEY: "on"})
    with pytest.warns(compiled.CompileWarning, match="random numbers"):
        _train(engine, spec, 1)
    metas = [json.loads(p.read_text()) for p in pathlib.Path(tmp_path).glob("compiled/*/meta.json")]
    assert [meta["refused"] for meta in metas] == ["the graph draws random numbers (test)"]

    monkeypatch.setattr(compiled, "_reported", set())
    monkeypatch.setattr("ort_torch_compat.graph.specialize.specialize", lambda *a, **k: pytest.fail("traced again"))
    again, _ = _engine("mlp_mse_adamw_op17", **{compiled.CONFIG_KEY: "on"})
    with pytest.warns(compiled.CompileWarning, match="random numbers"):
        _train(again, spec, 1)
    assert again.train_runner.path == "eager"


def test_cache_key_follows_shapes_and_graph_not_parameter_values():
    engine, spec = _engine("mlp_mse_adamw_op17", **{compiled.CONFIG_KEY: "eager"})
    tensors = _feeds(engine, spec, 1) + engine._train_params
    key = compile_key.graph_key(engine.train_module, tensors)
    assert compile_key.graph_key(engine.train_module, [t.detach() * 2 for t in tensors[:1]] + tensors[1:]) == key
    assert compile_key.graph_key(engine.train_module, [tensors[0][:1]] + tensors[1:]) != key
    other, other_spec = _engine("mlp_l1_adamw_op17", **{compiled.CONFIG_KEY: "eager"})
    other_tensors = _feeds(other, other_spec, 1) + other._train_params
    assert compile_key.graph_key(other.train_module, other_tensors) != key
    np.testing.assert_equal(len(key), 32)


def test_cache_key_reads_the_library_sources_contents_not_where_they_lie(monkeypatch, tmp_path):
    """The same sources from two directories give one key, in whichever order their paths
    sort (a compile worker that imported the library from elsewhere built 'another graph')."""
    engine, spec = _engine("mlp_mse_adamw_op17", **{compiled.CONFIG_KEY: "eager"})
    tensors = _feeds(engine, spec, 1) + engine._train_params
    key = compile_key.graph_key(engine.train_module, tensors)
    sources = [pathlib.Path(path) for path in compile_key._COMPILER_SOURCES]
    for first, second in (("a", "b"), ("b", "a")):  # the first two files' paths sort one way, then the other
        copies = []
        for index, source in enumerate(sources):
            copy = tmp_path / first / source.name if index == 0 else tmp_path / second / source.name
            copy.parent.mkdir(exist_ok=True)
            copy.write_bytes(source.read_bytes())
            copies.append(str(copy))
        monkeypatch.setattr(compile_key, "_COMPILER_SOURCES", tuple(copies))
        compile_key._file_digest.cache_clear()
        assert compile_key.graph_key(engine.train_module, tensors) == key
    pathlib.Path(copies[1]).write_bytes(sources[1].read_bytes() + b"# changed\n")
    compile_key._file_digest.cache_clear()
    assert compile_key.graph_key(engine.train_module, tensors) != key  # a changed source still changes it
    compile_key._file_digest.cache_clear()


def _traced_step_timed_as(monkeypatch, eager_ms: float, traced_ms: float) -> None:
    """The traced step's build reports these timings (the steps are the real ones)."""
    build_traced_step = traced_step.build_traced_step
    monkeypatch.setattr(traced_step, "build_traced_step", lambda *a: (build_traced_step(*a)[0], eager_ms, traced_ms))


def test_auto_compiles_in_the_background_from_the_first_step(monkeypatch, tmp_path, inline_worker):
    """ "auto" starts the worker at the first step (in the background) and trains eagerly
    until it is done; "on" waits for it; a failed compile leaves eager steps and one warning."""
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compiled, "_reported", set())
    monkeypatch.setattr(compiled, "cxx_compiler", lambda: "c++")
    _traced_step_timed_as(monkeypatch, eager_ms=2.0, traced_ms=1.0)

    def failing_compile(spec, tensors, directory):
        raise OSError("compiler crashed (test)")

    monkeypatch.setattr(compile_build, "_compile", failing_compile)
    inline_worker.pending = 2
    engine, spec = _engine("mlp_mse_adamw_op17", **{compiled.CONFIG_KEY: "auto"})
    states = []
    with pytest.warns(compiled.CompileWarning, match="compiler crashed") as caught:
        for step in range(1, 6):
            engine.train_step(_feeds(engine, spec, step))
            states.append(engine.train_runner._state)
    assert inline_worker.started == [compile_worker.BACKGROUND]  # one worker, in the background, at the first step
    assert states == ["compiling", "compiling", "compiling", "eager", "eager"]
    assert len([w for w in caught if issubclass(w.category, compiled.CompileWarning)]) == 1
    assert not list(pathlib.Path(tmp_path).glob("compiled/*"))  # a failure caches nothing: retried next run

    monkeypatch.setattr(compiled, "_reported", set())
    engine, spec = _engine("mlp_mse_adamw_op17", **{compiled.CONFIG_KEY: "on"})
    with pytest.warns(compiled.CompileWarning, match="compiler crashed"):
        _train(engine, spec, 1)
    assert inline_worker.started == [compile_worker.BACKGROUND, compile_worker.FOREGROUND]  # "on" waits for it


@pytest.mark.parametrize(
    "eager_ms, traced_ms, priority, path",
    [
        (2.0, 1.0, compile_worker.BACKGROUND, "traced"),
        (1.0, 0.99, compile_worker.IDLE, "traced"),  # faster, but by less than a tenth (EfficientNet-B0-tiny)
        (1.0, 1.0, compile_worker.IDLE, "eager"),
    ],
)
def test_the_worker_of_a_step_tracing_does_not_speed_up_compiles_at_the_lowest_priority(
    monkeypatch, tmp_path, inline_worker, eager_ms, traced_ms, priority, path
):
    """Under "auto", a step whose traced form saves less than a tenth of the eager step's
    time spends it in kernels (EfficientNet-B0-tiny): its worker runs IDLE, taking no CPU
    that the training loop or other processes want; otherwise BACKGROUND."""
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compiled, "_reported", set())
    monkeypatch.setattr(compiled, "cxx_compiler", lambda: "c++")
    _traced_step_timed_as(monkeypatch, eager_ms, traced_ms)
    inline_worker.pending = 10
    engine, spec = _engine("mlp_mse_adamw_op17", **{compiled.CONFIG_KEY: "auto"})
    for step in (1, 2):
        engine.train_step(_feeds(engine, spec, step))
    assert inline_worker.started == [priority]
    assert engine.train_runner._state == "compiling"
    assert engine.train_runner._traced and (path == "traced") == any(engine.train_runner._traced.values())


@pytest.mark.skipif(not hasattr(os, "nice"), reason="POSIX priorities")
@pytest.mark.parametrize(
    "priority, started",
    [(compile_worker.BACKGROUND, None), (compile_worker.IDLE, None), (compile_worker.IDLE, compile_worker.BACKGROUND)],
)
def test_a_worker_lowers_its_priority_and_an_idle_one_its_sessions_too(priority, started):
    """The worker leads its own session; with the kernel's per-session scheduling groups
    (autogroups) only the group's nice ranks it against other sessions, so IDLE sets that
    too (where the kernel has them), BACKGROUND only its own nice.  A worker started at
    BACKGROUND and told to go at IDLE ends where one started at IDLE does."""
    probe = (
        "import os, sys\n"
        "from ort_torch_compat.engine import compile_worker\n"
        + (
            f"compile_worker.lower_priority({started!r})\ncompile_worker.lower_priority(sys.argv[1], {started!r})\n"
            if started
            else "compile_worker.lower_priority(sys.argv[1])\n"
        )
        + "group = open('/proc/self/autogroup').read().split()[-1] if os.path.exists('/proc/self/autogroup') else '-'\n"
        "print(os.nice(0), group)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, priority], cwd=ROOT, capture_output=True, text=True, start_new_session=True
    )
    assert out.returncode == 0, out.stderr
    nice, group = out.stdout.split()
    base = os.nice(0)
    assert int(nice) == min(19, base + {compile_worker.BACKGROUND: 10, compile_worker.IDLE: 19}[priority])
    if os.path.exists("/proc/self/autogroup") and priority == compile_worker.BACKGROUND:
        assert group == "0"  # its new session's group keeps the default
    if (
        os.path.exists("/proc/self/autogroup")
        and priority == compile_worker.IDLE
        and os.access("/proc/self/autogroup", os.W_OK)
    ):
        assert group == "19"


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads a process's nice from /proc")
def test_the_worker_lowers_its_priority_before_it_reads_the_job():
    """Reading the job imports torch and the library (seconds of CPU): the worker's priority
    comes on its command line and is lowered first, while no job has been written yet."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "ort_torch_compat.engine.compile_worker", compile_worker.BACKGROUND],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        expected = min(19, os.nice(0) + 10)
        deadline, nice = time.monotonic() + 30, None
        while nice != expected and time.monotonic() < deadline and worker.poll() is None:
            with open(f"/proc/{worker.pid}/stat") as stat:
                nice = int(stat.read().rsplit(")", 1)[1].split()[16])  # field 19 of the file
            time.sleep(0.01)
        assert nice == expected and worker.poll() is None  # lowered, still waiting for its job
    finally:
        output, _ = worker.communicate(b"", timeout=60)  # no job: it answers and exits
    assert json.loads(output.decode().strip().splitlines()[-1])["status"] == "failed"


def test_a_worker_refuses_an_unknown_priority():
    done = subprocess.run(
        [sys.executable, "-m", "ort_torch_compat.engine.compile_worker", "urgent"],
        cwd=ROOT,
        input=b"",
        capture_output=True,
        timeout=60,
    )
    answer = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert answer["status"] == "failed" and "unknown priority 'urgent'" in answer["reason"]


def test_auto_traces_the_first_step_before_starting_the_worker(monkeypatch, tmp_path, inline_worker):
    """Under "auto" the first step (cold cache) builds its traced step first and starts the
    worker after it (started together they shared the cores through the trace); under "on"
    the worker, waited for, comes first (a trace before it would be thrown away)."""
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compiled, "_reported", set())
    monkeypatch.setattr(compiled, "cxx_compiler", lambda: "c++")
    events = []
    build_traced_step = traced_step.build_traced_step

    def tracing(*args):
        events.append("trace")
        return build_traced_step(*args)

    def failing_compile(spec, tensors, directory):
        events.append("worker")
        raise OSError("compiler crashed (test)")

    monkeypatch.setattr(traced_step, "build_traced_step", tracing)
    monkeypatch.setattr(compile_build, "_compile", failing_compile)
    for setting, expected in (("auto", ["trace", "worker"]), ("on", ["worker", "trace"])):
        events.clear()
        monkeypatch.setattr(compiled, "_reported", set())
        engine, spec = _engine("mlp_mse_adamw_op17", **{compiled.CONFIG_KEY: setting})
        with pytest.warns(compiled.CompileWarning, match="compiler crashed"):  # at the 2nd step under "auto"
            for step in (1, 2):
                engine.train_step(_feeds(engine, spec, step))
        assert events == expected, setting
        assert engine.train_runner.path == "traced"


def test_pooled_intermediates_for_small_graphs_and_a_retry_without_when_the_planner_recurses(monkeypatch, tmp_path):
    """Inductor's memory planner recursed past Python's limit on EfficientNet-B0's step
    (5317 nodes): large graphs are built without pooling, and a graph whose pooled build
    fails that way is built again without it (any other failure is the build's failure)."""
    import torch._inductor

    calls = []

    def aot_compile(graph, inputs, options):
        calls.append(options["memory_planning"])
        if options["memory_planning"] and failure is not None:
            try:
                raise failure
            except Exception as inner:
                raise RuntimeError("InductorError: wrapped") from inner

    monkeypatch.setattr(torch._inductor, "aot_compile", aot_compile)
    small, large = fx.symbolic_trace(lambda x: x + 1), fx.symbolic_trace(lambda x: (x + 1) * 2)
    monkeypatch.setattr(compile_build, "_POOLED_NODES", len(small.graph.nodes))

    failure = None
    compile_build._build_library(tmp_path, "step", small, [torch.ones(1)])
    compile_build._build_library(tmp_path, "step", large, [torch.ones(1)])
    assert calls == [True, False]
    calls.clear()
    failure = RecursionError("maximum recursion depth exceeded")
    compile_build._build_library(tmp_path, "step", small, [torch.ones(1)])
    assert calls == [True, False]
    calls.clear()
    failure = ValueError("another failure")
    with pytest.raises(RuntimeError, match="wrapped"):
        compile_build._build_library(tmp_path, "step", small, [torch.ones(1)])
    assert calls == [True]


@pytest.mark.skipif(compiled.cxx_compiler() is None, reason="needs a C++ compiler")
def test_kernels_too_small_to_split_over_threads_get_no_openmp_region(monkeypatch, tmp_path):
    """With `cpp.dynamic_threads` Inductor gives every C++ kernel an OpenMP parallel region,
    and libgomp ends each region's barrier with a futex system call even on one thread
    (LoRA-tiny's compiled step: 44 a step, a fifth of its time).  The build keeps regions
    for kernels with work enough to split: here a sum over 8 elements gets none, an
    elementwise loop over 65536 one."""
    from torch._inductor.codegen.cpp import CppKernel

    if "decide_parallel_depth" not in CppKernel.__dict__:
        pytest.skip("this torch's C++ backend decides parallel loops elsewhere")

    def step(small, large):
        return ((large.sin() * small.sin().sum()).cos(),)

    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # built for >= 4 threads, also on a 1-CPU machine
    small, large = torch.randn(8), torch.randn(1 << 16)
    compile_build._build_library(tmp_path, "step", fx.symbolic_trace(step), [small, large])
    # the kernels' source: *.kernel.cpp beside the wrapper's, or inside it (torch 2.6's AOTInductor)
    sources = "".join(path.read_text() for path in tmp_path.glob("*.cpp"))
    assert "cpp_fused" in sources and sources.count("#pragma omp parallel") == 1, sources
    assert CppKernel.__dict__["decide_parallel_depth"].__name__ == "decide_parallel_depth"  # restored
