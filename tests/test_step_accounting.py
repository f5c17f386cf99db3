"""The step clock (ort_torch_compat/testing/step_accounting.py): what a long step spent its
time on, from the thread's scheduler statistics; and the benchmark's statistics built on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ort_torch_compat.testing import benchmark_report, step_accounting
from ort_torch_compat.testing.step_accounting import StepClock


def _spin(seconds: float) -> None:
    """Use `seconds` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _accounted_clock() -> StepClock:
    clock = StepClock()
    if not clock.accounted:
        clock.close()
        pytest.skip("this thread's scheduler statistics (/proc/self/task/TID/schedstat) cannot be read here")
    return clock


def test_a_step_that_sleeps_is_blocked_and_one_that_computes_is_running():
    clock = _accounted_clock()
    for step in (lambda: _spin(0.001), lambda: time.sleep(0.03), lambda: _spin(0.03)):
        clock.start()
        step()
        clock.stop()
    clock.close()
    assert len(clock.seconds) == len(clock.running) == len(clock.queued) == len(clock.switches) == 3
    slept, spun = step_accounting.parts(clock, 1), step_accounting.parts(clock, 2)
    assert slept["switches"] >= 1 and slept["rest_ms"] >= 25 and slept["running_ms"] < 10
    assert spun["running_ms"] >= 25
    assert step_accounting.causes(clock, [1, 2]) == {"running": 1, "queued": 0, "blocked": 1, "other": 0}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_a_step_sharing_its_cpu_with_two_busy_processes_is_queued():
    """Two spinning processes pinned to this thread's CPU: the scheduler gives each about a
    third of it, so a step needing 30 ms of CPU waits about twice that for it."""
    clock = _accounted_clock()
    cpu = min(os.sched_getaffinity(0))
    previous = os.sched_getaffinity(0)
    pin = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", pin]) for _ in range(2)]
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.5)  # the spinners are pinned and running
        clock.start()
        _spin(0.03)
        clock.stop()
    finally:
        os.sched_setaffinity(0, previous)
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        clock.close()
    parts = step_accounting.parts(clock, 0)
    assert parts["queued_ms"] > parts["running_ms"] >= 25
    assert step_accounting.causes(clock, [0])["queued"] == 1


def test_cause_is_the_largest_part_and_the_rest_is_blocked_only_where_the_thread_left_its_cpu():
    assert step_accounting.cause(1.0, 0.6, 0.3, 0) == "running"
    assert step_accounting.cause(1.0, 0.3, 0.6, 5) == "queued"
    assert step_accounting.cause(1.0, 0.2, 0.1, 1) == "blocked"  # a lock, the GIL, a pipe
    assert step_accounting.cause(1.0, 0.2, 0.1, 0) == "other"  # e.g. the hypervisor ran another guest


def _clock_of(rows) -> StepClock:
    """A clock holding the given (seconds, running, queued, switches) steps."""
    clock = StepClock()
    clock.close()
    for seconds, running, queued, switches in rows:
        clock.seconds.append(seconds)
        clock.running.append(running)
        clock.queued.append(queued)
        clock.switches.append(switches)
    clock.accounted = True
    return clock


def test_window_statistics_say_what_the_long_steps_spent_their_time_on():
    fast = (0.001, 0.001, 0.0, 0)
    rows = [(0.5, 0.5, 0.0, 0)] + [(0.0022, 0.0022, 0.0, 0)] * 3 + [fast] * 6
    rows += [(0.004, 0.001, 0.003, 0), fast, (0.009, 0.001, 0.0, 2), fast, (0.003, 0.001, 0.0, 0), fast]
    clock = _clock_of(rows)
    stats = benchmark_report.window_statistics(clock.seconds, switch=5, clock=clock)
    assert stats["over_2x_median"] == 6  # the three traced steps and three after the switch
    assert [stats[f"over_2x_median_{c}"] for c in step_accounting.CAUSES] == [3, 1, 1, 1]
    assert [stats[f"over_2x_median_from_switch_{c}"] for c in step_accounting.CAUSES] == [0, 1, 1, 1]
    assert stats["max_step"] == 13
    assert stats["max_running_ms"] == pytest.approx(1.0) and stats["max_rest_ms"] == pytest.approx(8.0)
    assert stats["max_queued_ms"] == 0.0 and stats["max_switches"] == 2
    unaccounted = StepClock()
    unaccounted.close()
    unaccounted.accounted = False
    plain = benchmark_report.window_statistics(clock.seconds, switch=5, clock=unaccounted)
    assert not any(key.startswith(("over_2x_median_running", "max_running")) for key in plain)
    assert plain == benchmark_report.window_statistics(clock.seconds, switch=5)


def test_the_local_count_finds_a_step_longer_than_its_neighbours_in_either_phase():
    """A slower phase (traced steps at 2.2x the compiled ones) is no long step beside its
    neighbours; a step twice as long as the steps around it is, before or after the switch."""
    block = benchmark_report.LOCAL_STEPS
    traced, compiled = [0.0022] * (2 * block), [0.001] * (3 * block)
    traced[block + 7] = 0.0045  # a stall among traced steps
    compiled[2 * block + 3] = 0.0021  # one among compiled steps
    times = [0.5] + traced + compiled
    clock = _clock_of([(t, t, 0.0, 0) for t in times])
    stats = benchmark_report.window_statistics(times, switch=len(traced) + 2, clock=clock)
    assert stats["over_2x_median"] == 2 * block + 1  # the global count takes in every traced step
    assert stats["over_2x_local_median"] == 2
    assert stats["over_2x_local_median_running"] == 2 and stats["over_2x_local_median_queued"] == 0


def test_fresh_table_shows_the_causes_and_dashes_for_reports_without_them():
    row = {"steps": 100, "ready_s": 1.0, "median_ms": 0.2, "max_ms": 5.0, "over_2x_median": 3}
    causes = {f"over_2x_median_{c}": n for c, n in zip(step_accounting.CAUSES, (1, 2, 0, 0))}
    longest = {"max_running_ms": 0.5, "max_queued_ms": 4.25, "max_rest_ms": 0.0}
    report = {
        "fresh_seconds": 120,
        "fresh_summary": {"0": {"lora": {"ort": dict(row, **causes, **longest), "ours": dict(row)}}},
    }
    lines = benchmark_report.fresh_table(report, markdown=True).splitlines()
    assert lines[0].endswith(
        "| > 2x median: running / queued / blocked / other | of those, from switch "
        "| > 2x the median of its 100 steps | of those: running / queued / blocked / other "
        "| longest: running / queued / rest ms |"
    )
    assert lines[2].endswith("| 1 / 2 / 0 / 0 | - | - | - | 0.5 / 4.2 / 0.0 |")
    assert lines[3].endswith("| - | - | - | - | - |")
