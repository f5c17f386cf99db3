"""The traced train step (engine/traced_step.py): one TorchScript graph of the forward and
its backward, run where no compiled library does, against the eager step.

ORT_TORCH_COMPAT_COMPILE=off runs the parity suites through it (tests/test_training_parity.py,
tests/test_real_architectures.py); here: the same losses, gradients and parameters as the
eager step (bit for bit where both run the same kernels), dropout's random numbers drawn as
the eager step draws them, an index out of range raised as the eager step raises it with
nothing changed, which shapes get traced, and every way back to eager steps.
"""

from __future__ import annotations

import collections
import logging
import shutil
import time
import types

import numpy as np
import onnx
import pytest
import torch

from ort_torch_compat.api import CheckpointState
from ort_torch_compat.engine import TrainingEngine, compiled, traced_step
from ort_torch_compat.graph import dense_kernel
from ort_torch_compat.legacy import SessionOptions
from ort_torch_compat.testing.scenario import make_batch
from tests.conftest import FIXTURES, assert_bad_labels_change_nothing, load_spec, train_record

pytestmark = pytest.mark.skipif(not traced_step.torchscript_available(), reason="this torch has no TorchScript")


@pytest.fixture
def always_faster(monkeypatch):
    """The runner uses a traced step only where it measured it faster: make that certain
    (and Static Runtime no faster than the interpreter: the interpreter runs it)."""
    _timed(monkeypatch, traced_ms=0.5, static_ms=0.5)


def _timed(monkeypatch, traced_ms: float, static_ms: float, eager_ms: float = 1.0) -> None:
    """The timings' answers: eager `eager_ms`, a traced step `traced_ms` on the interpreter
    and `static_ms` on Static Runtime (time_steps with the eager step first, time_runs without)."""

    def times(steps):
        return [static_ms if step.static else traced_ms for step in steps]

    monkeypatch.setattr(traced_step, "time_steps", lambda module, tensors, steps, rounds: [eager_ms, *times(steps)])
    monkeypatch.setattr(traced_step, "time_runs", lambda module, tensors, steps, rounds: times(steps))


_static_runtime_available = pytest.mark.skipif(
    not hasattr(torch._C, "_jit_to_static_module"), reason="this torch has no Static Runtime"
)


def _engine(directory, setting: str) -> TrainingEngine:
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    options = SessionOptions()
    options.add_session_config_entry(compiled.CONFIG_KEY, setting)
    return TrainingEngine(state._state, str(directory / "training_model.onnx"), session_options=options)


def _feeds(engine: TrainingEngine, spec: dict, step: int) -> list:
    batch = make_batch(spec, step, 0)
    return [torch.from_numpy(batch[name]) for name in engine.input_names(True)]


def _train(engine: TrainingEngine, spec: dict, steps: int) -> list:
    """Outputs, gradients, parameters and buffers after each step (step 2 accumulates)."""
    return train_record(
        engine, lambda step: _feeds(engine, spec, step), steps, accumulate_after_first=True, buffers=True
    )


@pytest.mark.parametrize(
    "config",
    [
        "transformer_ce_adamw_op17",
        "cnn_ce_adamw_op17",  # BatchNorm: running statistics written back
        "lstm_ce_adamw_op17",  # the eager step runs torch's fused LSTM; the trace, its time loop
        "gru_bce_sgd_op17",
        "tensorops_mse_adamw_op17",
        "twoout_mse_adamw_lossinput_addout_op17",  # two outputs, the loss an input of the graph
        "mlp_mse_adamw_nobias_op17",
        "frozen_ce_adamw_op17",  # frozen parameters
    ],
)
def test_traced_steps_give_the_eager_steps_numbers(config, always_faster):
    directory = FIXTURES / config
    spec = load_spec(directory)
    eager, traced = _engine(directory, "eager"), _engine(directory, "off")
    expected, actual = _train(eager, spec, 3), _train(traced, spec, 3)
    assert eager.train_runner.path == "eager" and not eager.train_runner._traced
    assert traced.train_runner.path == "traced"
    for step_expected, step_actual in zip(expected, actual):
        assert len(step_expected) == len(step_actual)
        for e, a in zip(step_expected, step_actual):  # the parity suites' tolerance, 10x tighter
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@_static_runtime_available
@pytest.mark.parametrize(
    "config",
    [
        "transformer_ce_adamw_op17",
        "cnn_ce_adamw_op17",  # BatchNorm: running statistics written back after the run
        "lstm_ce_adamw_op17",
        "twoout_mse_adamw_lossinput_addout_op17",
        "frozen_ce_adamw_op17",
    ],
)
def test_static_runtime_steps_give_the_eager_steps_numbers(config, monkeypatch):
    """Where Static Runtime is faster the traced graph runs on it (no interpreter per call;
    out-variant kernels into planned memory): the eager steps' numbers, step after step."""
    _timed(monkeypatch, traced_ms=0.5, static_ms=0.25)
    directory = FIXTURES / config
    spec = load_spec(directory)
    eager, traced = _engine(directory, "eager"), _engine(directory, "off")
    expected, actual = _train(eager, spec, 4), _train(traced, spec, 4)
    assert next(iter(traced.train_runner._traced.values())).static
    for step_expected, step_actual in zip(expected, actual):
        assert len(step_expected) == len(step_actual)
        for e, a in zip(step_expected, step_actual):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


class _SecondRunFails:
    """A stand-in Static Runtime that runs the graph once, then raises (as torch 2.14's does
    on LoRA-tiny's graph: 'Cannot access data pointer of Tensor that doesn't have storage')."""

    def __init__(self, script_module):
        self.function, self.runs = script_module, 0

    def __call__(self, *inputs):
        self.runs += 1
        if self.runs > 1:
            raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")
        return self.function(*inputs)


@pytest.mark.skipif(dense_kernel._ONEDNN is None, reason="this torch has no oneDNN")
@pytest.mark.parametrize("config", ["transformer_ce_adamw_op17", "mlp_mse_adamw_op17", "frozen_ce_adamw_op17"])
def test_dense_layers_on_onednn_stay_there_in_the_traced_step(config, always_faster, monkeypatch):
    """Where the eager step sends dense layers to oneDNN (every one here: the size threshold
    lowered), the traced step runs the same products (not aten's, which the compiler's trace
    records), with the eager step's numbers."""
    monkeypatch.setattr(dense_kernel, "ONEDNN_MIN_MACS", 0)
    directory = FIXTURES / config
    spec = load_spec(directory)
    eager, traced = _engine(directory, "eager"), _engine(directory, "off")
    expected, actual = _train(eager, spec, 3), _train(traced, spec, 3)
    (step,) = traced.train_runner._traced.values()
    assert "mkldnn::_linear_pointwise" in str(step.function.graph)
    for step_expected, step_actual in zip(expected, actual):
        for e, a in zip(step_expected, step_actual):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@_static_runtime_available
def test_static_runtime_is_checked_past_its_first_runs(monkeypatch, caplog):
    _timed(monkeypatch, traced_ms=0.5, static_ms=0.25)
    scripted = {}
    monkeypatch.setattr(
        traced_step, "_script", lambda graph, script=traced_step._script: scripted.setdefault(0, script(graph))
    )
    monkeypatch.setattr(torch._C, "_jit_to_static_module", lambda c: _SecondRunFails(scripted[0]))
    directory = FIXTURES / "mlp_mse_adamw_op17"
    spec = load_spec(directory)
    engine = _engine(directory, "off")
    with caplog.at_level(logging.INFO, logger="ort_torch_compat.compile"):
        actual = _train(engine, spec, 3)
    step = next(iter(engine.train_runner._traced.values()))
    assert step is not None and not step.static  # the interpreter runs it
    assert "Static Runtime's step is not used" in caplog.text and "doesn't have storage" in caplog.text
    for e, a in zip(_train(_engine(directory, "eager"), spec, 3)[-1], actual[-1]):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@_static_runtime_available
@pytest.mark.parametrize(
    "traced_ms, static_ms, tried",
    [
        (0.5, 0.47, True),  # 6% faster: within timing noise
        (30.0, 1.0, False),  # a 30 ms traced step: kernels dominate, not tried
    ],
)
def test_static_runtime_runs_only_where_clearly_faster(traced_ms, static_ms, tried, monkeypatch):
    _timed(monkeypatch, traced_ms, static_ms, eager_ms=2 * traced_ms)
    built = []
    make = torch._C._jit_to_static_module
    monkeypatch.setattr(torch._C, "_jit_to_static_module", lambda c: built.append(c) or make(c))
    directory = FIXTURES / "mlp_mse_adamw_op17"
    engine = _engine(directory, "off")
    engine.train_step(_feeds(engine, load_spec(directory), 1))
    step = next(iter(engine.train_runner._traced.values()))
    assert step is not None and not step.static and bool(built) is tried


@_static_runtime_available
@pytest.mark.parametrize(
    "static_timings, timings_taken, chosen",
    [
        ([0.47, 0.30], 2, True),  # close, then clearly faster: a burst had hit its first runs
        ([0.47, 0.46, 0.48], 3, False),  # close each time: the interpreter stays
        ([0.60], 1, False),  # slower: not timed again
        ([0.30], 1, True),  # clearly faster at once
    ],
)
def test_static_runtime_is_timed_again_where_close(static_timings, timings_taken, chosen, monkeypatch):
    """The two forms are timed again (up to twice; each form's least over all rounds)
    where Static Runtime is faster than the interpreter but not by the margin."""
    answers = iter(static_timings)
    taken = []

    def time_runs(module, tensors, steps, rounds):
        taken.append(rounds)
        return [next(answers) if step.static else 0.5 for step in steps]

    monkeypatch.setattr(traced_step, "time_steps", lambda module, tensors, steps, rounds: [1.0, *[0.5 for _ in steps]])
    monkeypatch.setattr(traced_step, "time_runs", time_runs)
    directory = FIXTURES / "mlp_mse_adamw_op17"
    engine = _engine(directory, "off")
    engine.train_step(_feeds(engine, load_spec(directory), 1))
    assert len(taken) == timings_taken
    assert next(iter(engine.train_runner._traced.values())).static is chosen


@_static_runtime_available
def test_a_static_runtime_step_that_fails_later_hands_over_to_the_interpreter(monkeypatch, caplog):
    """A failure past the checks (not seen on any graph; Static Runtime is the less-trodden
    executor): that step runs eagerly and right, then the interpreter's form of the step."""
    _timed(monkeypatch, traced_ms=0.5, static_ms=0.25)
    directory = FIXTURES / "mlp_mse_adamw_op17"
    spec = load_spec(directory)
    engine = _engine(directory, "off")
    engine.train_step(_feeds(engine, spec, 1))
    runner = engine.train_runner
    ((feeds, step),) = runner._traced.items()
    assert step.static

    def broken(*inputs):
        raise RuntimeError("planned memory gone")

    step.function = broken
    with caplog.at_level(logging.INFO, logger="ort_torch_compat.compile"):
        engine.train_step(_feeds(engine, spec, 2))
    assert "planned memory gone" in caplog.text and "on TorchScript's interpreter" in caplog.text
    assert runner._traced[feeds] is step.interpreted and runner.path == "traced"
    losses = [engine.train_step(_feeds(engine, spec, 3))[0]]
    eager = _engine(directory, "eager")
    expected = [eager.train_step(_feeds(eager, spec, number))[0] for number in (1, 2, 3)][-1:]
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    for e, a in zip(eager.store.trainable, engine.store.trainable):  # three steps' gradients, summed
        torch.testing.assert_close(a.grad, e.grad, rtol=1e-5, atol=1e-6)


def _times(traced_ms: float):
    """time_steps' answer: eager 1 ms, then the traced step's time."""
    return lambda module, tensors, steps, rounds: [1.0, traced_ms][: 1 + len(steps)]


def _share(share: float, asked: list = None):
    """atens_share's answer: ATen's kernels take `share` of oneDNN's time (the calls timed
    recorded in `asked`)."""
    return lambda calls: (asked.append(calls) if asked is not None else None) or share


def _onednn_during_steps(monkeypatch) -> list:
    """Record, for every run of a traced graph from now on, whether oneDNN was on during it."""
    script, seen = traced_step._script, []

    def spied(graph):
        function = script(graph)

        def spy(*inputs):
            seen.append(torch._C._get_mkldnn_enabled())
            return function(*inputs)

        return spy

    monkeypatch.setattr(traced_step, "_script", spied)
    return seen


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
@pytest.mark.parametrize("config", ["frozen_ce_adamw_op17", "cnn_ce_adamw_op17"])  # GELU; convolutions
@pytest.mark.parametrize("native_faster", [True, False])
def test_the_faster_of_onednn_and_atens_own_kernels_runs(config, native_faster, monkeypatch):
    """oneDNN's GELU and convolutions cost ~10 us a call before any work: their calls are
    timed with them and with ATen's own kernels and the step runs the faster, oneDNN
    switched back on after each step; the numbers are the eager step's within float32
    rounding either way."""
    monkeypatch.setattr(traced_step, "time_steps", _times(0.5))
    asked = []
    monkeypatch.setattr(traced_step, "atens_share", _share(0.5 if native_faster else 2.0, asked))
    seen = _onednn_during_steps(monkeypatch)
    directory = FIXTURES / config
    spec = load_spec(directory)
    engine = _engine(directory, "off")
    expected, actual = _train(_engine(directory, "eager"), spec, 3), _train(engine, spec, 3)
    assert next(iter(engine.train_runner._traced.values())).onednn is not native_faster
    names = {getattr(operator, "__name__", "").split(".")[0] for operator, _, _ in asked[0]}
    assert names == ({"convolution", "convolution_backward"} if config.startswith("cnn") else {"gelu", "gelu_backward"})
    assert seen[-2:] == [not native_faster] * 2 and torch._C._get_mkldnn_enabled()  # steps 2 and 3
    for step_expected, step_actual in zip(expected, actual):
        for e, a in zip(step_expected, step_actual):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
def test_onednn_stays_where_atens_kernels_are_not_clearly_faster(monkeypatch):
    monkeypatch.setattr(traced_step, "time_steps", _times(0.5))
    monkeypatch.setattr(traced_step, "atens_share", _share(0.94))  # 6% faster: within timing noise
    directory = FIXTURES / "frozen_ce_adamw_op17"
    engine = _engine(directory, "off")
    engine.train_step(_feeds(engine, load_spec(directory), 1))
    assert next(iter(engine.train_runner._traced.values())).onednn


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
def test_onednn_is_back_on_after_a_step_that_raised(monkeypatch):
    monkeypatch.setattr(traced_step, "time_steps", _times(0.5))
    monkeypatch.setattr(traced_step, "atens_share", _share(0.5))
    directory = FIXTURES / "cnn_ce_adamw_op17"
    spec = load_spec(directory)
    seen = _onednn_during_steps(monkeypatch)
    engine = _engine(directory, "off")
    engine.train_step(_feeds(engine, spec, 1))
    del seen[:]
    assert_bad_labels_change_nothing(engine, lambda: _feeds(engine, spec, 2))
    assert seen and not any(seen) and torch._C._get_mkldnn_enabled()


def test_traced_runs_without_grad_and_restores_the_callers_mode(monkeypatch):
    """The traced step runs with autograd off (its parameters require grad) and gives the
    caller's grad mode back, on or off, also after a run that raised."""
    monkeypatch.setattr(traced_step, "time_steps", _times(0.5))
    script, seen = traced_step._script, []

    def spied(graph):
        function = script(graph)
        return lambda *inputs: seen.append(torch.is_grad_enabled()) or function(*inputs)

    monkeypatch.setattr(traced_step, "_script", spied)
    directory = FIXTURES / "cnn_ce_adamw_op17"
    spec = load_spec(directory)
    engine = _engine(directory, "off")
    engine.train_step(_feeds(engine, spec, 1))
    assert engine.train_runner.path == "traced" and torch.is_grad_enabled()
    for enabled in (False, True):
        del seen[:]
        with torch.set_grad_enabled(enabled):
            engine.train_step(_feeds(engine, spec, 2))
            assert torch.is_grad_enabled() is enabled
            assert_bad_labels_change_nothing(engine, lambda: _feeds(engine, spec, 3))
            assert torch.is_grad_enabled() is enabled
        assert len(seen) >= 2 and not any(seen)


@pytest.mark.parametrize("config", ["frozen_ce_adamw_op17", "gru_ce_adamw_op17"])
def test_one_way_timed_without_onednn_or_its_operators(config, monkeypatch):
    """A user who switched oneDNN off keeps it off; a graph without the operators ATen sends
    to oneDNN (a GRU) is not timed both ways."""
    timed, asked = [], []
    monkeypatch.setattr(
        traced_step, "time_steps", lambda module, tensors, steps, rounds: timed.append(steps) or [1.0, 0.5]
    )
    monkeypatch.setattr(traced_step, "atens_share", _share(0.5, asked))
    seen = _onednn_during_steps(monkeypatch)
    directory = FIXTURES / config
    engine = _engine(directory, "off")
    with torch.backends.mkldnn.flags(enabled=config.startswith("gru")):
        engine.train_step(_feeds(engine, load_spec(directory), 1))
        engine.train_step(_feeds(engine, load_spec(directory), 2))
        assert len(timed[0]) == 1 and seen[-1] is torch._C._get_mkldnn_enabled()
    assert engine.train_runner.path == "traced" and not asked


def test_redundant_views_are_dropped_and_nothing_else_changes():
    """Reshapes to the shape a tensor has, transposes of transposes, detaches, reshape
    chains (one that ends at the tensor's own shape: gone), an expand to the shape a
    permuted tensor has and a view call repeated with the same arguments go; a reshape of a
    transposed (not dense) tensor, views with other arguments and every computing call stay."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def function(x, w):
        y = torch.mm(x.view(4, 6).view(4, 6), w.t().t().t())  # view to its own shape, t(t(t(w)))
        z = y.view(2, 2, 5).view(4, 5).reshape(20).view(2, 10)  # a chain on a dense tensor
        back = y.view(2, 10).view(4, 5)  # a chain back to y's own shape: y
        s = x.t().reshape(24)  # not dense: copies, stays
        p = x.view(2, 2, 6).permute(1, 0, 2)
        q = p.expand(2, 2, 6) * 2  # an expand to p's own shape, p not dense
        r = x.view(2, 2, 6).permute(1, 0, 2).sum() + x.view(2, 12).sum() + x.view(3, 8).sum()  # repeats
        return z.detach().sum() + s.sum() + back.sum() + q.sum() + r, y.expand(4, 5)

    inputs = (torch.randn(4, 6), torch.randn(5, 6))
    graph = make_fx(function)(*inputs)
    calls = lambda: [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]  # noqa: E731
    before, expected = calls(), function(*inputs)
    removed = traced_step.drop_redundant_views(graph)
    after = calls()
    assert removed == len(before) - len(after)
    views = {"aten.view.default", "aten._unsafe_view.default", "aten.t.default", "aten.expand.default"}
    views |= {"aten.detach.default", "aten.alias.default", "aten.permute.default"}
    assert [c for c in after if c in views] == [
        "aten.t.default",  # one of w's three transposes
        "aten.view.default",  # z: y's reshape chain, in one view
        "aten.t.default",  # x.t() ...
        "aten._unsafe_view.default",  # ... and its reshape's copy (a clone before it)
        "aten.view.default",  # x.view(2, 2, 6), once
        "aten.permute.default",  # its permute, once
        "aten.view.default",  # x.view(2, 12)
        "aten.view.default",  # x.view(3, 8)
    ]
    assert [c for c in after if c not in views] == [c for c in before if c not in views]  # the computing calls
    for a, e in zip(graph(*inputs), expected):
        assert torch.equal(a, e)


def test_calls_nothing_reads_are_dropped_unless_they_mutate_or_draw():
    """drop_unread_calls: computing calls whose results nothing reads go (with the calls
    only they read); an in-place call and a random draw nothing reads stay (a dropped draw
    would shift every later one), and the values and the generator's state after a run are
    the same."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def function(x, w, counter):
        unread = torch.mm(x, w).tanh()  # two calls, nothing reads them
        x.mul(2).sigmoid()  # two more
        counter.add_(1)  # in place: stays
        torch.rand(3)  # a draw: stays
        return (x * 3).sum(), torch.rand(2), unread.shape[0]

    inputs = (torch.randn(4, 5), torch.randn(5, 6), torch.zeros(1))
    graph = make_fx(function)(*inputs)
    calls = lambda: [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]  # noqa: E731
    before = calls()
    assert traced_step.drop_unread_calls(graph) == 4
    after = calls()
    removed = collections.Counter(before) - collections.Counter(after)
    assert removed == collections.Counter(
        ["aten.mm.default", "aten.tanh.default", "aten.mul.Tensor", "aten.sigmoid.default"]
    )
    assert after.count("aten.add_.Tensor") == 1 and after.count("aten.rand.default") == 2
    torch.manual_seed(0)
    expected = function(*[t.clone() for t in inputs])
    torch.manual_seed(0)
    actual = graph(*[t.clone() for t in inputs])
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])


def _assert_bitwise_on_every_runner(graph, inputs, expected) -> None:
    """`graph` run as fx code, by TorchScript's interpreter and (where this torch has it) by
    Static Runtime gives `expected` bit for bit, dtypes and shapes included."""
    scripted = traced_step._script(graph)
    runs = [graph(*inputs), scripted(*inputs)]
    if hasattr(torch._C, "_jit_to_static_module"):
        runs.append(torch._C._jit_to_static_module(scripted._c)(*inputs))
    for run in runs:
        for a, e in zip(run, expected):
            assert a.dtype == e.dtype and a.shape == e.shape and torch.equal(a, e)


def test_means_run_as_sums_divided_with_bitwise_the_same_values():
    """means_as_sums: a mean over dimensions of a float32 or float64 CPU tensor becomes the
    sum over them divided by their size (what ATen's CPU mean does inside); a mean with a
    dtype and the mean of a whole tensor stay; every value is bitwise the same, on the
    interpreter and Static Runtime."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def function(x, y):
        return (
            x.mean(1),
            x.mean([0, 2], keepdim=True),
            x.mean(-1),
            y.mean(0),
            x.mean(1, dtype=torch.float64),
            x.mean(),
        )

    generator = torch.Generator().manual_seed(0)
    inputs = (torch.randn(3, 7, 33, generator=generator) * 3 + 1, torch.randn(5, 6, dtype=torch.float64))
    graph = make_fx(function)(*inputs)
    expected = graph(*inputs)
    assert traced_step.means_as_sums(graph) == 4
    calls = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert calls.count("aten.mean.dim") == 1 and calls.count("aten.mean.default") == 1  # the dtype's, the whole
    assert calls.count("aten.sum.dim_IntList") == 4 and calls.count("aten.div.Scalar") == 4
    _assert_bitwise_on_every_runner(graph, inputs, expected)


def test_row_gathers_run_as_embedding_lookups_with_bitwise_the_same_values():
    """gathers_as_embeddings: rows of a 2-D float table gathered by one index tensor become
    `embedding`, their gradient into a fresh zero tensor `embedding_dense_backward`, with
    repeated rows summed as before (bitwise); a gather from a bool table and one along
    another axis stay; on the interpreter and Static Runtime."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def function(table, rows, grad, mask, picks):
        gathered = torch.ops.aten.index(table, [rows])
        zeros = torch.ops.aten.new_zeros(grad, [table.shape[0], table.shape[1]])
        gradient = torch.ops.aten.index_put(zeros, [rows], grad, True)
        return gathered, gradient, torch.ops.aten.index(mask, [picks]), table[:, picks[0]]

    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 50, (3, 7), generator=generator)
    rows[1, 2] = rows[0, 0]  # a repeated row: its gradients summed
    rows[2, 5] = rows[0, 0]
    inputs = (
        torch.randn(50, 12, generator=generator),
        rows,
        torch.randn(3, 7, 12, generator=generator) * 10,
        torch.rand(9, 1, generator=generator) > 0.5,
        torch.tensor([[0, 3, 3]]),
    )
    graph = make_fx(function)(*inputs)
    expected = graph(*inputs)
    assert traced_step.gathers_as_embeddings(graph) == 2
    calls = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert calls.count("aten.embedding.default") == 1 and calls.count("aten.embedding_dense_backward.default") == 1
    assert "aten.index_put.default" not in calls and "aten.new_zeros.default" not in calls
    assert calls.count("aten.index.Tensor") == 2  # the bool table's, the gather along axis 1
    _assert_bitwise_on_every_runner(graph, inputs, expected)


def test_negative_token_ids_train_as_onnx_gather_takes_them(always_faster):
    """ONNX's Gather takes negative indices (counted from the end); the traced step's
    embedding lookup refuses them: that step runs eagerly, with the numbers of the same
    rows fed as positive ids, and the traced step is retired."""
    directory = FIXTURES / "transformer_ce_adamw_op17"
    spec = load_spec(directory)
    engine, eager = _engine(directory, "off"), _engine(directory, "eager")
    vocabulary = 11  # emb.weight's rows (spec: ids in [0, 11))

    def feeds(engine, step, negative):
        values = _feeds(engine, spec, step)
        return [values[0] - vocabulary if negative else values[0], *values[1:]]

    actual = train_record(engine, lambda step: feeds(engine, step, negative=step == 2), 3)
    expected = train_record(eager, lambda step: feeds(eager, step, negative=False), 3)
    assert engine.train_runner.path == "eager"  # retired at step 2
    for step_expected, step_actual in zip(expected, actual):
        for e, a in zip(step_expected, step_actual):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_float_sums_run_as_subtractions_with_bitwise_the_same_values():
    """sums_on_out_variants: the sum of two floating-point tensors becomes `sub` with alpha -1
    (Static Runtime's out variant); integer and bool sums, a bool plus a float tensor (ATen's
    sub refuses bools), sums with a number and sums with an alpha stay; every value is bitwise the same, on the interpreter and Static Runtime."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def function(x, y, i, b):
        return x + y, torch.add(x, y, alpha=2.0), x + 1.5, i + i, b + b, (x * y + y).sum(), b + y

    inputs = (torch.randn(4, 6), torch.randn(6), torch.arange(6), torch.rand(6) > 0.5)
    graph = make_fx(function)(*inputs)
    expected = graph(*inputs)
    assert traced_step.sums_on_out_variants(graph) == 2
    calls = [(str(n.target), dict(n.kwargs)) for n in graph.graph.nodes if n.op == "call_function"]
    assert calls.count(("aten.sub.Tensor", {"alpha": -1})) == 2
    assert [c for c, _ in calls].count("aten.add.Tensor") == 5  # alpha 2, the number, int, bool, bool + float
    _assert_bitwise_on_every_runner(graph, inputs, expected)


@pytest.mark.parametrize("budget_s, rounds_run", [(60.0, 3), (0.0, 1)])
def test_step_timing_warms_each_step_and_keeps_the_least(budget_s, rounds_run, monkeypatch):
    """time_steps: each timed run right after an untimed one of the same step, the least
    of the rounds; rounds after the first only within the time budget."""
    from ort_torch_compat.engine import step_check

    monkeypatch.setattr(step_check, "_TIMING_BUDGET_S", budget_s)
    directory = FIXTURES / "mlp_mse_adamw_op17"
    engine = _engine(directory, "eager")
    tensors = [*_feeds(engine, load_spec(directory), 1), *engine._train_params]
    calls, costs = [], iter([5.0, 1.0, 3.0, 2.0, 4.0, 6.0])  # ms of CPU each timed run of the fake step

    class Fake:
        def train(self, copies):
            calls.append("fake")
            spend = next(costs) / 1000 if len(calls) % 2 == 0 else 0.0  # the untimed run costs nothing
            begin = time.thread_time()
            while time.thread_time() - begin < spend:
                pass

    eager_ms, fake_ms = step_check.time_steps(engine.train_runner.module, tensors, [Fake()], 3)
    assert len(calls) == 2 * rounds_run
    assert fake_ms == pytest.approx(1.0 if rounds_run == 3 else 5.0, abs=0.5)
    assert eager_ms > 0


@pytest.mark.parametrize("static", [False, pytest.param(True, marks=_static_runtime_available)])
def test_dropout_draws_the_eager_steps_random_numbers(static, monkeypatch):
    """Random operators stay in the traced graph and draw from torch's generator in the
    eager step's order, on the interpreter and on Static Runtime: the same seed gives the
    same masks, losses and gradients."""
    _timed(monkeypatch, traced_ms=0.5, static_ms=0.25 if static else 0.5)
    directory = FIXTURES / "dropout"
    runs = []
    for setting in ("eager", "off"):
        engine = _engine(directory, setting)
        feeds = [
            torch.randn(*[d or 2 for d in spec.shape], generator=torch.Generator().manual_seed(5))
            if spec.elem_type == 1
            else torch.zeros([d or 2 for d in spec.shape], dtype=torch.int64)
            for spec in engine.train_io.user_inputs
        ]
        torch.manual_seed(123)
        losses = [engine.train_step(feeds)[0].clone() for _ in range(4)]
        runs.append((losses, [t.grad.clone() for t in engine.store.trainable], torch.get_rng_state()))
        assert engine.train_runner.path == setting.replace("off", "traced")
        if setting == "off":
            assert next(iter(engine.train_runner._traced.values())).static is static
    (eager_losses, eager_grads, eager_rng), (losses, grads, rng) = runs
    assert len({float(loss) for loss in eager_losses}) > 1  # the masks differ step to step
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, losses))
    assert all(torch.equal(a, b) for a, b in zip(eager_grads, grads))
    assert torch.equal(eager_rng, rng)  # tracing, checking and timing drew nothing of the user's


def test_an_out_of_range_label_raises_as_eager_does_and_changes_nothing(always_faster):
    directory = FIXTURES / "cnn_ce_adamw_op17"
    spec = load_spec(directory)
    engine = _engine(directory, "off")
    engine.train_step(_feeds(engine, spec, 1))
    step = engine.train_runner.compiled_for(
        [*_feeds(engine, spec, 2), *engine._train_params], len(engine._train_params)
    )
    assert isinstance(step, traced_step.TracedTrainStep)
    assert_bad_labels_change_nothing(engine, lambda: _feeds(engine, spec, 2))
    engine.lazy_reset_grad()
    engine.train_step(_feeds(engine, spec, 2))
    assert (
        engine.train_runner.compiled_for([*_feeds(engine, spec, 3), *engine._train_params], len(engine._train_params))
        is step
    )  # a user's bad batch does not retire the traced step


def _dynamic_batch_mlp(directory) -> TrainingEngine:
    """mlp_mse_adamw_op17 with its batch dimension declared dynamic."""
    model = onnx.load(str(FIXTURES / "mlp_mse_adamw_op17" / "training_model.onnx"))
    for value in model.graph.input[:2]:  # x, target
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    del model.graph.value_info[:]
    onnx.save(model, str(directory / "training_model.onnx"))
    shutil.copy(FIXTURES / "mlp_mse_adamw_op17" / "checkpoint", directory / "checkpoint")
    return _engine(directory, "off")


def test_which_shapes_are_traced(always_faster, monkeypatch, tmp_path):
    """The first batch's shapes at their first step; another shape when it comes back (one
    seen once runs eagerly); at most _MAX_TRACED shapes."""
    monkeypatch.setattr(compiled, "_MAX_TRACED", 2)
    engine = _dynamic_batch_mlp(tmp_path)
    runner = engine.train_runner
    build, traced = runner._build_traced, []
    monkeypatch.setattr(
        runner, "_build_traced", lambda tensors, fixed: traced.append(len(tensors[0])) or build(tensors, fixed)
    )
    rng = np.random.default_rng(0)
    for batch_size in (2, 2, 3, 4, 3, 3, 4, 4, 2, 5, 5):
        feeds = [rng.standard_normal((batch_size, 6), np.float32), rng.standard_normal((batch_size, 3), np.float32)]
        engine.train_step([torch.from_numpy(f) for f in feeds])
    assert traced == [2, 3]  # 4 and 5 came back after the cap was reached
    assert sum(step is not None for step in runner._traced.values()) == 2


def test_a_step_that_traced_ends_with_one_full_collection(always_faster, monkeypatch, tmp_path):
    """After the steps that traced (the first batch's shapes at step 1, a returning shape at
    step 5), and after no other: tracing leaves tens of thousands of long-lived objects, and
    without the collection then a full one stops the loop some thousand steps later."""
    collected_after = []
    step = [0]
    monkeypatch.setattr(compiled, "gc", types.SimpleNamespace(collect=lambda: collected_after.append(step[0])))
    engine = _dynamic_batch_mlp(tmp_path)
    rng = np.random.default_rng(0)
    for batch_size in (2, 2, 2, 3, 3, 2, 3):
        step[0] += 1
        feeds = [rng.standard_normal((batch_size, 6), np.float32), rng.standard_normal((batch_size, 3), np.float32)]
        engine.train_step([torch.from_numpy(f) for f in feeds])
    assert collected_after == [1, 5]
    directory = FIXTURES / "mlp_mse_adamw_op17"
    eager = _engine(directory, "eager")  # nothing traced: nothing collected
    for step[0] in range(1, 4):
        eager.train_step(_feeds(eager, load_spec(directory), step[0]))
    assert collected_after == [1, 5]


def test_a_slower_traced_step_is_not_used(monkeypatch):
    _timed(monkeypatch, traced_ms=1.5, static_ms=1.5)
    directory = FIXTURES / "mlp_mse_adamw_op17"
    engine = _engine(directory, "off")
    engine.train_step(_feeds(engine, load_spec(directory), 1))
    assert engine.train_runner.path == "eager" and list(engine.train_runner._traced.values()) == [None]


def test_a_graph_torchscript_refuses_trains_eagerly(monkeypatch, caplog):
    def refuse(graph):
        raise RuntimeError("Unknown builtin op: aten::made_up")

    monkeypatch.setattr(traced_step, "_script", refuse)
    directory = FIXTURES / "mlp_mse_adamw_op17"
    spec = load_spec(directory)
    eager, engine = _engine(directory, "eager"), _engine(directory, "off")
    with caplog.at_level(logging.INFO, logger="ort_torch_compat.compile"):
        assert _train(engine, spec, 2) and engine.train_runner.path == "eager"
    assert "cannot trace" in caplog.text and "made_up" in caplog.text
    for e, a in zip(_train(eager, spec, 2)[-1], _train(_engine(directory, "off"), spec, 2)[-1]):
        assert torch.equal(a, e)


def test_a_traced_step_that_fails_where_eager_does_not_is_retired(always_faster, caplog):
    directory = FIXTURES / "mlp_mse_adamw_op17"
    spec = load_spec(directory)
    engine = _engine(directory, "off")
    engine.train_step(_feeds(engine, spec, 1))
    step = next(iter(engine.train_runner._traced.values()))
    assert engine._settled[1] is step  # the next steps of this signature take the short way
    good = step.function

    def broken(*inputs):
        raise RuntimeError("interpreter failure")

    step.function = broken
    with caplog.at_level(logging.INFO, logger="ort_torch_compat.compile"):
        engine.train_step(_feeds(engine, spec, 2))  # runs eagerly, and right
    assert "interpreter failure" in caplog.text
    step.function = good
    assert engine.train_runner.path == "eager" and list(engine.train_runner._traced.values()) == [None]
    engine.train_step(_feeds(engine, spec, 3))  # the retired step is not run again, not even the short way
    assert engine._settled is None and step.function is good


def test_eager_setting_traces_nothing(monkeypatch):
    monkeypatch.setattr(traced_step, "build_traced_step", lambda *a: pytest.fail("traced under 'eager'"))
    directory = FIXTURES / "transformer_ce_adamw_op17"
    engine = _engine(directory, "eager")
    engine.train_step(_feeds(engine, load_spec(directory), 1))
    assert engine.train_runner.path == "eager"
    assert compiled.compile_setting(_options("eager")) == "eager"


def _options(setting: str) -> SessionOptions:
    options = SessionOptions()
    options.add_session_config_entry(compiled.CONFIG_KEY, setting)
    return options


def test_the_drop_in_module_trains_traced_with_eagers_losses(always_faster, monkeypatch):
    """The plain loop through the drop-in API: module call, optimizer step, lazy reset.  The
    traced step takes its weights' transposes as inputs (fixed_views.py), made in the first
    step and kept (the optimizer's in-place updates seen through them)."""
    from ort_torch_compat.api import Module, Optimizer
    from ort_torch_compat.engine.fixed_views import FixedViews

    made = []
    replay = FixedViews._made
    monkeypatch.setattr(FixedViews, "_made", staticmethod(lambda t, calls: made.append(calls) or replay(t, calls)))
    directory = FIXTURES / "transformer_ce_adamw_op17"
    spec = load_spec(directory)
    losses = {}
    for setting in ("eager", "off"):
        monkeypatch.setenv(compiled.COMPILE_ENV, setting)
        state = CheckpointState.load_checkpoint(directory / "checkpoint")
        module = Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")
        optimizer = Optimizer(directory / "optimizer_model.onnx", module)
        losses[setting] = []
        for step in range(1, 6):
            batch = make_batch(spec, step, 0)
            losses[setting].append(np.asarray(module(*[batch[name] for name in module.input_names()])).copy())
            optimizer.step()
            module.lazy_reset_grad()
            if step == 1:
                after_first = len(made)  # the build's checks run on copies of the parameters
        assert module._engine.train_runner.path == setting.replace("off", "traced")
    for a, b in zip(losses["eager"], losses["off"]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    traced = [s for s in module._engine.train_runner._traced.values() if s is not None]
    assert len(traced) == 1 and traced[0].fixed_views is not None
    transposes = [calls for _, calls in traced[0].fixed_views.recipes if calls[-1][0] is torch.ops.aten.t.default]
    assert len(transposes) >= 4  # the dense layers' weights
    assert after_first > 0 and len(made) == after_first  # not made again in steps 2-5
