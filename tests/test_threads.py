"""The per-engine thread policy (engine/threads.py): the caller's torch thread count is never
changed behind its back, an explicit count is honoured, and the measured choice follows
the step times."""

from __future__ import annotations

import os
import time

import pytest
import torch

from ort_torch_compat.api import CheckpointState, Module, Optimizer
from ort_torch_compat.engine import threads
from ort_torch_compat.engine.threads import ThreadPolicy, thread_setting
from ort_torch_compat.legacy import SessionOptions
from ort_torch_compat.testing.scenario import make_batch
from tests.conftest import FIXTURES, load_spec


@pytest.fixture
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


def _module(intra_op_num_threads: int = 0):
    directory = FIXTURES / "mlp_mse_adamw_op17"
    options = SessionOptions()
    options.intra_op_num_threads = intra_op_num_threads
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(directory / "training_model.onnx", state, directory / "eval_model.onnx", session_options=options)
    batch = make_batch(load_spec(directory), 1, 0)
    return module, Optimizer(directory / "optimizer_model.onnx", module), [batch[n] for n in module.input_names()]


def test_an_explicit_count_applies_inside_and_the_callers_count_after(two_threads, monkeypatch):
    module, optimizer, feeds = _module(intra_op_num_threads=1)
    seen = []
    graph = module._engine.train_runner.eager  # what the eager train step calls (engine/graph_module.direct_calls)
    monkeypatch.setattr(
        module._engine.train_runner, "eager", lambda *t: seen.append(torch.get_num_threads()) or graph(*t)
    )
    module(*feeds)
    optimizer.step()
    module.eval()
    module(*feeds)
    assert seen == [1]
    assert torch.get_num_threads() == 2
    assert module._engine.threads.count() == 1


def test_the_measured_choice_follows_step_times(two_threads, monkeypatch):
    monkeypatch.setattr(threads, "_MIN_RETRY_INTERVAL_S", 0.0)
    # re-try after 50 fast steps' time (~0.1 s): the chosen count gets fresh samples between
    # re-tries (with one step's time, a re-try came before any, and the stale fast ones
    # kept it chosen); the loop below waits for the change rather than counting steps, as
    # a loaded machine's sleeps overshoot
    monkeypatch.setattr(threads, "_RETRY_SHARE", 0.1)
    monkeypatch.setattr(threads, "_cores_idle", lambda count: True)  # whatever else this machine runs now
    policy = ThreadPolicy()
    slow_count = [2]

    def body():
        assert torch.get_num_threads() in (1, 2)
        time.sleep(0.02 if torch.get_num_threads() == slow_count[0] else 0.002)

    def step():
        policy.run_measured("train", body)

    for _ in range(10):  # per count: two calls that settle the change, then three samples
        step()
    assert policy.count() == 1
    assert torch.get_num_threads() == 2  # restored after every call
    slow_count[0] = 1  # the machine changed: now the single thread is the slow one
    for _ in range(200):  # ~10 slow steps, then a re-try (two settling calls, three samples)
        step()
        if policy.count() == 2:
            break
    assert policy.count() == 2


def test_a_retry_measures_the_other_count_afresh(two_threads, monkeypatch):
    """One re-try is a burst of fresh samples of the other count: enough to move the choice
    when the machine changed (one sample against two stale ones could not)."""
    monkeypatch.setattr(threads, "_MIN_RETRY_INTERVAL_S", 3600.0)  # only the re-try forced below
    monkeypatch.setattr(threads, "_cores_idle", lambda count: True)
    policy = ThreadPolicy()
    slow_count = [2]
    used: list = []

    def body():
        used.append(torch.get_num_threads())
        time.sleep(0.02 if torch.get_num_threads() == slow_count[0] else 0.002)

    for _ in range(10):  # per count: two settling calls, three samples: 1 wins
        policy.run_measured("train", body)
    assert policy.count() == 1
    slow_count[0] = None  # the machine changed: 2 threads are no longer slow
    monkeypatch.setattr(time, "sleep", lambda s: None)
    policy._retry_at = 0.0  # the re-try is due
    used.clear()
    for _ in range(6):
        policy.run_measured("train", body)
    assert used[:5] == [2] * 5  # the burst: two settling calls, three samples
    assert max(policy._times[("train", 2)][2]) < 0.01  # no stale 20-ms sample left


def _changing_body(used: list, seconds: dict, after_change: float):
    """A step that takes `seconds[count]`, or `after_change` on the first two calls after
    the thread count changed (as OpenMP's wake-up or wind-down makes them)."""

    def body():
        count = torch.get_num_threads()
        used.append(count)
        changed = len(used) < 2 or count != used[-2] or (len(used) > 2 and count != used[-3])
        time.sleep(after_change if changed else seconds[count])

    return body


def test_the_calls_right_after_a_change_of_count_are_not_measured(two_threads, monkeypatch):
    """Measured on LoRA-tiny's compiled step: the first steps after the count changes take
    1.2-3x the count's own time; sampled in alternation, every sample was such a step."""
    monkeypatch.setattr(threads, "_MIN_RETRY_INTERVAL_S", 3600.0)
    monkeypatch.setattr(threads, "_cores_idle", lambda count: True)
    policy, used = ThreadPolicy(), []
    body = _changing_body(used, {1: 0.002, 2: 0.012}, after_change=0.06)
    for _ in range(10):
        policy.run_measured("train", body)
    assert used == [2] * 5 + [1] * 5  # one count to the end, then the other
    assert policy.count() == 1
    assert max(max(samples) for samples in policy._times[("train", 2)].values()) < 0.04  # no change timed


def test_a_flip_in_the_steady_state_retries_the_count_it_left_soon(two_threads, monkeypatch):
    """A passing disturbance makes the chosen count slower than the other's older median:
    the choice flips, and the count it left is re-tried after _REVISIT_S, not after the
    usual interval (measured: 2 threads kept 5 s, LoRA-tiny 0.20 ms a step against 0.14)."""
    monkeypatch.setattr(threads, "_MIN_RETRY_INTERVAL_S", 3600.0)
    monkeypatch.setattr(threads, "_REVISIT_S", 0.0)
    monkeypatch.setattr(threads, "_cores_idle", lambda count: True)
    policy, used = ThreadPolicy(), []
    seconds = {1: 0.002, 2: 0.012}
    body = _changing_body(used, seconds, after_change=0.002)
    for _ in range(10):
        policy.run_measured("train", body)
    assert policy.count() == 1
    seconds[1] = 0.05  # a disturbance: the single thread is slow for a moment
    for _ in range(3):
        policy.run_measured("train", body)
    assert policy.count() == 2  # flipped on 2's older median
    seconds[1] = 0.002  # it passed
    for _ in range(8):
        policy.run_measured("train", body)
    assert policy.count() == 1  # re-tried at once (the usual interval is an hour here)


def test_while_a_compile_worker_runs_the_steps_leave_it_a_core(two_threads):
    policy = ThreadPolicy()
    for _ in range(5):
        assert policy.run_measured(threads.COMPILING, torch.get_num_threads) == 1
        assert policy.run(torch.get_num_threads) == 1  # the optimizer step after it
    assert torch.get_num_threads() == 2 and policy._times == {}  # nothing measured, the caller's count back


def test_the_trial_times_both_forms_on_every_thread_only_while_the_cores_are_idle(two_threads, monkeypatch):
    load = [0.5]
    policy, _, _ = _policy_on_two_cores(monkeypatch, load)
    assert policy.run_measured(threads.TRIAL, torch.get_num_threads) == 2
    assert policy.run(torch.get_num_threads) == 2  # the optimizer step after it
    load[0] = 2.6  # two busy processes: a second thread would wait for their scheduler slices
    assert policy.run_measured(threads.TRIAL, torch.get_num_threads) == 1
    assert policy.run(torch.get_num_threads) == 1
    assert torch.get_num_threads() == 2 and policy._times == {}  # nothing measured, the caller's count back


def _policy_on_two_cores(monkeypatch, load: list) -> tuple:
    """A measured policy on a 2-core machine whose load average is `load[0]`, and a train
    step that records its thread count (two threads are the slow count)."""
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads, "_read_stat", lambda: None)  # no CPU counters: the load average decides
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load[0], load[0], load[0]))
    monkeypatch.setattr(threads, "_LOAD_READ_INTERVAL_S", 0.0)  # read the load at every question
    monkeypatch.setattr(threads, "_finished_work", [])  # no compile worker of an earlier test counted
    policy = ThreadPolicy()
    used: list = []

    def body():
        used.append(torch.get_num_threads())
        time.sleep(0.01 if torch.get_num_threads() == 2 else 0.001)

    def step():
        policy.run_measured("train", body)

    return policy, used, step


def test_a_retry_of_more_threads_waits_for_idle_cores(two_threads, monkeypatch):
    monkeypatch.setattr(threads, "_MIN_RETRY_INTERVAL_S", 0.0)
    # a re-try is due at every step (no interval that a slow sample on a busy host could
    # stretch past the steps below): only the load puts it off
    monkeypatch.setattr(threads, "_RETRY_SHARE", 1e12)
    load = [0.0]
    policy, used, step = _policy_on_two_cores(monkeypatch, load)
    for _ in range(10):  # per count: two settling calls, three samples: 1 wins
        step()
    load[0] = 2.0  # both cores busy (this process's thread and another process)
    used.clear()
    for _ in range(4):
        step()
    assert used == [1, 1, 1, 1]  # the re-try of 2 threads is put off
    load[0] = 0.5
    for _ in range(2):
        step()
    assert 2 in used[4:]  # and made once a core is idle


def test_a_busy_machine_gets_one_thread_until_cores_are_idle(two_threads, monkeypatch):
    """The first call and the first measurements of more threads wait for idle cores too
    (with two busy processes on 2 cores, a first step with 2 threads took 0.5-0.65 s)."""
    load = [3.0]  # this process and two busy ones
    policy, used, step = _policy_on_two_cores(monkeypatch, load)
    for _ in range(6):
        step()
        used.append(policy.run(torch.get_num_threads))  # the optimizer step after it: no choice yet, the same count
    assert used == [1] * 12
    load[0] = 1.0  # the other processes ended
    used.clear()
    for _ in range(6):
        step()
    # the larger count is measured now (two settling calls, three samples), then the choice runs
    assert used == [2] * 5 + [1]
    assert torch.get_num_threads() == 2  # the caller's count, restored


def test_thread_setting_sources(monkeypatch):
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    assert thread_setting() is None
    options = SessionOptions()
    options.intra_op_num_threads = 3
    assert thread_setting(options) == 3
    monkeypatch.setenv(threads.THREADS_ENV, "2")
    assert thread_setting() == 2 and thread_setting(options) == 3
    monkeypatch.setenv(threads.THREADS_ENV, "auto")
    assert thread_setting() is None
    monkeypatch.setenv(threads.THREADS_ENV, "many")
    with pytest.raises(ValueError, match=threads.THREADS_ENV):
        thread_setting()


def test_the_load_average_is_read_at_most_once_a_second(monkeypatch):
    """A waiting re-try asks whether cores are idle every step: the reading is reused."""
    reads = []
    monkeypatch.setattr(threads, "_read_stat", lambda: None)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: reads.append(1) or (5.0, 5.0, 5.0))
    monkeypatch.setattr(threads, "_load_reading", [float("-inf"), None, 1])
    assert not any(threads._cores_idle(1) for _ in range(100))
    assert len(reads) == 1
    monkeypatch.setattr(threads, "_LOAD_READ_INTERVAL_S", 0.0)
    threads._cores_idle(1)
    assert len(reads) == 2


def test_a_finished_compile_worker_no_longer_counts_as_load(monkeypatch):
    """The 1-minute load average counts a compile worker for a minute after it ended: its
    share (1 - exp(-seconds / 60) of a core when it ended, decaying as the kernel's average)
    is not load.  Measured before: an EfficientNet-B0 run went on one thread for ~25 s
    after an 85 s compile, at 85 ms a step where two threads take 49."""
    clock = [1000.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads, "_read_stat", lambda: None)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.0, 2.0, 2.0))  # training + the worker's last minute
    monkeypatch.setattr(threads, "_load_reading", [float("-inf"), None, 1])
    monkeypatch.setattr(threads, "_finished_work", [])
    assert not threads._cores_idle(1)
    threads.finished_background_work(85.0)  # ~0.76 of a core in the average when it ended
    assert threads._cores_idle(1)
    clock[0] += 120.0  # two minutes on, the kernel's average has forgotten the worker: this one is still 2.0
    assert not threads._cores_idle(1)
    threads.finished_background_work(2.0)  # a short one weighs little
    assert not threads._cores_idle(1)


def _machine(monkeypatch, load_average: float) -> dict:
    """A 2-CPU machine whose CPU counters, clock and this process's CPU time the test moves
    (`advance`), and whose 1-minute load average is `load_average` throughout."""
    machine = {"now": 1000.0, "idle": 0, "total": 0, "own": 0.0}

    def advance(seconds: float, others: float, own: float = 1.0) -> None:
        """`seconds` pass with `others` cores busy with other processes and `own` with ours."""
        ticks = 100 * seconds
        machine["now"] += seconds
        machine["total"] += int(round(2 * ticks))
        machine["idle"] += int(round(max(2.0 - others - own, 0.0) * ticks))
        machine["own"] += own * seconds

    machine["advance"] = advance
    monkeypatch.setattr(threads.time, "monotonic", lambda: machine["now"])
    monkeypatch.setattr(threads.time, "process_time", lambda: machine["own"])
    monkeypatch.setattr(threads, "_read_stat", lambda: (machine["idle"], machine["total"], 2))
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load_average,) * 3)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads, "_load_reading", [float("-inf"), None, 1])
    monkeypatch.setattr(threads, "_stat_reading", [None])
    monkeypatch.setattr(threads, "_finished_work", [])
    return machine


def test_idle_cores_are_what_other_processes_leave_now_not_the_load_average(monkeypatch):
    """A busy minute that has ended (the load average still 2.6) does not keep a process on
    one thread: the CPU counters since the last question say what the others use now.
    Before, a fresh process after the benchmark's previous one ran its 300 steps on one
    thread (ResNet-18-tiny 57 ms a step against 33 on two)."""
    machine = _machine(monkeypatch, load_average=2.6)
    threads.start_load_window()  # made with the engine: the first question has a window
    machine["advance"](0.5, others=0.0)
    assert threads._cores_idle(1)
    machine["advance"](1.0, others=1.0)  # another process took the second core
    assert not threads._cores_idle(1)
    machine["advance"](1.0, others=0.0, own=2.0)  # our own two threads on both cores: nobody else's
    assert threads._cores_idle(1)
    machine["advance"](1.0, others=0.6)  # most of a core taken: not idle
    assert not threads._cores_idle(1)
    machine["advance"](1.0, others=0.3)  # a little: idle (the load average's own half-core margin)
    assert threads._cores_idle(1)


def test_a_window_too_short_for_the_counters_asks_the_load_average(monkeypatch):
    machine = _machine(monkeypatch, load_average=2.6)
    threads.start_load_window()
    machine["advance"](0.1, others=0.0)  # ten ticks a CPU: too few
    assert not threads._cores_idle(1)  # the load average's answer
    monkeypatch.setattr(threads, "_LOAD_READ_INTERVAL_S", 0.0)
    machine["advance"](0.5, others=0.0)  # the window still starts at the first reading
    assert threads._cores_idle(1)


def test_the_cpu_counters_are_parsed_from_proc_stat(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  100 5 50 800 40 1 2 3 0 0\ncpu0 50 2 25 400 20 1 1 2 0 0\ncpu1 50 3 25 400 20 0 1 1 0 0\nintr 1 2\n"
    )
    monkeypatch.setattr(threads, "_STAT_PATH", str(stat))
    assert threads._read_stat() == (840, 1001, 2)  # idle + iowait; all eight, steal included
    stat.write_text("garbage\n")
    assert threads._read_stat() is None
    monkeypatch.setattr(threads, "_STAT_PATH", str(tmp_path / "missing"))
    assert threads._read_stat() is None


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux's CPU counters")
def test_this_machines_cpu_counters_read():
    idle, total, cpus = threads._read_stat()
    assert 0 <= idle <= total and cpus >= 1
