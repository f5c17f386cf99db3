"""The compile worker for real (engine/compile_worker.py): a child process compiles while
training goes on, the loop switches to the compiled step between two steps with the eager
step's numbers, nothing outlives the process, and the cache can be filled ahead of time.

The midway test compiles the MLP fixture once (15-60 s on a 2-core machine) into a cache
that the ahead-of-time test then finds (run alone, that test compiles it itself).
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from ort_torch_compat.api import CheckpointState
from ort_torch_compat.engine import TrainingEngine, compile_cache, compiled
from ort_torch_compat.legacy import SessionOptions
from ort_torch_compat.testing.scenario import make_batch
from tests.conftest import FIXTURES, ROOT, load_spec

pytestmark = pytest.mark.skipif(compiled.cxx_compiler() is None, reason="needs a C++ compiler")

CONFIG = "mlp_mse_adamw_op17"
COMPILE_LIMIT_S = 420  # far above a cold compile of this graph on a busy 2-core machine


def _engine(setting: str) -> TrainingEngine:
    directory = FIXTURES / CONFIG
    options = SessionOptions()
    options.add_session_config_entry(compiled.CONFIG_KEY, setting)
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    return TrainingEngine(state._state, str(directory / "training_model.onnx"), session_options=options)


def _feeds(engine: TrainingEngine, step: int) -> list:
    batch = make_batch(load_spec(FIXTURES / CONFIG), step, 0)
    return [torch.from_numpy(batch[name]) for name in engine.input_names(True)]


def _params(engine: TrainingEngine) -> list:
    return [engine.state.parameters[name].tensor for name in engine.train_io.param_names()]


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("compile_cache")


def test_a_run_switches_to_the_compiled_step_midway_with_eager_numbers(monkeypatch, shared_cache, tmp_path):
    """Default settings, cold cache: steps run traced (engine/traced_step.py) while the
    worker compiles, then compiled.  Every step (accumulating ones included) is compared with an eager engine
    started from the same parameters: outputs and gradients within the parity tolerance."""
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(shared_cache))
    monkeypatch.setattr(compiled, "_FASTER", float("inf"))  # switch even where compiling gains nothing
    # The user's directory holds another copy of the package (a source checkout, say): the
    # worker (`python -m ...`) must import this one, not that
    decoy = tmp_path / "ort_torch_compat"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy package in the working directory')\n")
    monkeypatch.chdir(tmp_path)
    auto, eager = _engine("auto"), _engine("eager")
    paths, begin, step = [], time.monotonic(), 0
    while paths.count("compiled") < 6:
        assert time.monotonic() - begin < COMPILE_LIMIT_S, f"no switch to the compiled step: {auto.train_runner._state}"
        step += 1
        with torch.no_grad():
            for mine, reference in zip(_params(auto), _params(eager)):
                reference.copy_(mine)
        if step % 3:  # two of three steps overwrite the gradients, every third accumulates
            auto.lazy_reset_grad()
            eager.lazy_reset_grad()
        elif paths:
            for mine, reference in zip(_params(auto), _params(eager)):
                if mine.grad is not None:
                    reference.grad.copy_(mine.grad)
        actual, expected = auto.train_step(_feeds(auto, step)), eager.train_step(_feeds(eager, step))
        paths.append(auto.train_runner.path)
        assert paths[-1] in ("compiling", "compiled"), f"the compile failed: {auto.train_runner._state}"
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
        for mine, reference in zip(_params(auto), _params(eager)):
            if reference.requires_grad:
                torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-4, atol=1e-5)
        with torch.no_grad():  # move the parameters, as an optimizer would
            for tensor in _params(auto):
                if tensor.requires_grad:
                    tensor.sub_(0.01 * tensor.grad)
        time.sleep(0.02)  # leave the worker some CPU on a 2-core machine
    assert paths[0] == "compiling" and paths[-1] == "compiled"  # traced steps while the worker compiles
    assert paths.index("compiled") > 1, "the first steps must not wait for the compiler"
    assert auto.train_runner.compile_seconds is not None
    entries = list((shared_cache / "compiled").iterdir())
    assert [e.name for e in entries] == [auto.train_runner._key]  # one entry, no scratch left


def test_a_worker_compiles_nothing_before_it_is_told_to_go(tmp_path):
    """The worker rebuilds the module and imports the compiler as soon as it has the job,
    then waits for "go" (its parent is tracing the first step meanwhile).  A parent whose
    pipe ends before that gets no compile: a failed answer, nothing in the cache."""
    from ort_torch_compat.engine import compile_key, compile_worker

    engine = _engine("eager")
    tensors = engine.train_tensors(_feeds(engine, 1))
    key = compile_key.graph_key(engine.train_module, tensors)
    worker = compile_worker.CompileWorker(engine.train_runner.recipe, tensors, key, tmp_path, compile_worker.BACKGROUND)
    try:
        worker._go_given.set()  # the writer ends after the job, without a "go" line
        worker._writer.join(timeout=60)
        worker.process.stdin.close()
        result = worker.wait()
    finally:
        worker.stop()
    assert result["status"] == "failed" and "no 'go'" in result["reason"], result
    assert not list(tmp_path.iterdir())  # no entry, no scratch directory
    with pytest.raises(ValueError, match="unknown priority"):
        worker.go("urgent")


_TRAINER = textwrap.dedent("""
    import sys, time
    import torch
    from tests.test_background_compile import _engine, _feeds
    from ort_torch_compat.engine import compile_worker
    engine = _engine("auto")
    for step in (1, 2):
        engine.train_step(_feeds(engine, step))
    print(next(iter(compile_worker._live.values())).process.pid, flush=True)
    if sys.argv[1] == "exit":
        sys.exit(0)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_process_that_ends_mid_compile_leaves_nothing_behind(tmp_path, how):
    """A normal exit (atexit) or SIGKILL of the training process while the worker compiles:
    the worker and its compiler processes end, no scratch directory and no entry remain."""
    environment = dict(os.environ, **{compile_cache.CACHE_ENV: str(tmp_path)})
    trainer = subprocess.Popen(
        [sys.executable, "-c", _TRAINER, how],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        worker = int(trainer.stdout.readline())
        root = tmp_path / "compiled"
        if how == "sigkill":  # wait until the worker is building in a scratch directory
            deadline = time.monotonic() + COMPILE_LIMIT_S
            while not any(p.name.startswith(".") for p in root.glob("*")) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert any(p.name.startswith(".") for p in root.glob("*")), "the worker never started building"
            trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=60)
        assert _wait_gone(worker, 30), "the compile worker outlived the training process"
        time.sleep(0.5)
        assert not root.exists() or list(root.iterdir()) == []
    finally:
        if trainer.poll() is None:
            trainer.kill()


def test_stale_scratch_directories_are_swept(tmp_path):
    key = "0" * 32
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = tmp_path / (compile_cache._scratch_prefix(key, os.getpid()) + "abc")
    gone = tmp_path / (compile_cache._scratch_prefix(key, dead.pid) + "abc")
    other_host = tmp_path / f".{key}-elsewhere-{dead.pid}-abc"
    for directory in (mine, gone, other_host):
        directory.mkdir()
    compile_cache.sweep_scratch(tmp_path)
    assert mine.exists() and other_host.exists() and not gone.exists()


def test_compile_ahead_of_time_then_the_first_step_runs_compiled(monkeypatch, shared_cache):
    """`ort-torch-compat compile` fills the cache with the key a training run computes (or
    finds the entry the midway test's run made): a run's first step is compiled."""
    environment = dict(os.environ, **{compile_cache.CACHE_ENV: str(shared_cache)})
    shapes = {i["name"]: "x".join(str(d) for d in i["shape"]) for i in load_spec(FIXTURES / CONFIG)["inputs"]}
    command = [sys.executable, "-m", "ort_torch_compat", "compile", str(FIXTURES / CONFIG)]
    command += [arg for name, shape in shapes.items() for arg in ("--input", f"{name}={shape}")]
    first = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=COMPILE_LIMIT_S)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(("compiled the train step", "already compiled"))
    again = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.startswith("already compiled"), again.stdout + again.stderr

    monkeypatch.setenv(compile_cache.CACHE_ENV, str(shared_cache))
    monkeypatch.setattr(compiled, "_FASTER", float("inf"))
    engine = _engine("auto")
    engine.train_step(_feeds(engine, 1))
    assert engine.train_runner.path == "compiled" and engine.train_runner.compile_seconds is None
    assert str(shared_cache / "compiled" / engine.train_runner._key) in first.stdout


def test_compile_names_inputs_it_does_not_know(tmp_path):
    environment = dict(os.environ, **{compile_cache.CACHE_ENV: str(tmp_path)})
    result = subprocess.run(
        [sys.executable, "-m", "ort_torch_compat", "compile", str(FIXTURES / CONFIG), "--input", "nope=2x3"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "unknown input(s) ['nope']" in result.stderr and "give a shape for" in result.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "ort_torch_compat", "compile", str(FIXTURES / CONFIG), "--input", "2x3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert usage.returncode == 2 and "NAME=SHAPE" in usage.stderr
    assert not pathlib.Path(tmp_path, "compiled").exists() or not list(pathlib.Path(tmp_path, "compiled").iterdir())
