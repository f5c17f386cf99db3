"""Where a training step's wall time went: on a CPU, waiting for one, or blocked.

Why: "no step over twice the median step (the compiler never stalls the loop)" cannot be
read from step times alone.  ONNX Runtime's own loop has hundreds of such steps in 120 s on
an idle machine and thousands under load, and a compile that stalled the loop would look
like any of them.  The thread's own scheduler accounting tells them apart:

- running: the thread was on a CPU (its CPU-time clock, `time.thread_time_ns`): slower code
  in that step (the traced phase, a garbage collection, a first call);
- queued: it was runnable and waited for a CPU (Linux `/proc/self/task/TID/schedstat`,
  second field): the machine's other processes, the scheduler's time slices;
- blocked: the rest of the wall time, in a step where the thread left its CPU (the same
  file's third field, the times it was given a CPU, went up): neither running nor
  runnable, it slept: on the GIL, a lock, a pipe or a page from disk.  A loop that waits for
  the compiler, or for a thread of ours that holds the GIL, shows here;
- other: the rest of the wall time in a step the thread never left its CPU: time the
  hypervisor gave another guest (steal), interrupts.

The parts are the measuring thread's (the loop's, which calls the step): where a step's
kernels run on more threads, the loop's thread spins or sleeps at their barriers, so a
helper thread that waited for a CPU shows as running or blocked there.

Timing a step this way costs about 3.5 us against 0.25 us for two `perf_counter` calls
(measured here), under 2% of the shortest steps measured here (0.2 ms); the benchmark's
first-seconds axis and the soak script pay it for every backend alike.  Where the file is
missing (not Linux, or a kernel without scheduler statistics) the parts are not recorded and
only the step times count.
"""

from __future__ import annotations

import os
import threading
import time
from array import array
from typing import Dict, Optional, Sequence

CAUSES = ("running", "queued", "blocked", "other")


def _open_schedstat() -> Optional[int]:
    """A descriptor of this thread's schedstat file (re-read with pread), or None."""
    try:
        descriptor = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    except (OSError, AttributeError):
        return None
    try:
        if len([int(field) for field in os.pread(descriptor, 128, 0).split()[:3]]) == 3:  # as `_read` takes them
            return descriptor
    except (OSError, ValueError):
        pass
    os.close(descriptor)
    return None


class StepClock:
    """Times the steps of one loop, in its thread: `start()` before a step, `stop()` after it
    (the step's seconds).  `seconds`, `running`, `queued` (seconds) and `switches` (the times
    the thread was given a CPU again) hold one entry per step; the last three stay empty
    where the thread's scheduler statistics cannot be read."""

    def __init__(self) -> None:
        self.seconds = array("d")
        self.running = array("d")
        self.queued = array("d")
        self.switches = array("q")
        self._schedstat = _open_schedstat()
        self.accounted = self._schedstat is not None  # whether the steps' parts are recorded
        self._began = 0.0
        self._on_cpu = self._waiting = self._slices = 0

    def _read(self):
        # the file's own CPU time is the scheduler's last update (up to a tick old while the
        # thread runs): the thread's CPU clock is exact; the wait and the count are updated
        # whenever the thread gets a CPU
        _, waiting, slices = os.pread(self._schedstat, 128, 0).split()[:3]
        return time.thread_time_ns(), int(waiting), int(slices)

    def start(self) -> None:
        """A step begins."""
        if self._schedstat is not None:
            self._on_cpu, self._waiting, self._slices = self._read()
        self._began = time.perf_counter()

    def stop(self) -> float:
        """The step begun at the last `start()` has ended: record it; its wall seconds."""
        seconds = time.perf_counter() - self._began
        self.seconds.append(seconds)
        if self._schedstat is not None:
            on_cpu, waiting, slices = self._read()
            self.running.append((on_cpu - self._on_cpu) * 1e-9)
            self.queued.append((waiting - self._waiting) * 1e-9)
            self.switches.append(slices - self._slices)
        return seconds

    def close(self) -> None:
        """Release the statistics file (the recorded steps stay)."""
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None


def parts(clock: StepClock, index: int) -> Dict[str, float]:
    """Step `index` (0-based) in milliseconds: running, queued and the rest of its wall time,
    and the times its thread was given a CPU again."""
    wall = clock.seconds[index]
    running, queued = clock.running[index], clock.queued[index]
    return {
        "running_ms": 1000 * running,
        "queued_ms": 1000 * queued,
        "rest_ms": 1000 * max(wall - running - queued, 0.0),
        "switches": int(clock.switches[index]),
    }


def cause(wall: float, running: float, queued: float, switches: int) -> str:
    """What the largest part of a step's wall time was (see the module docstring): "running",
    "queued", or for the rest "blocked" (the thread left its CPU) or "other"."""
    rest = wall - running - queued
    largest = max(running, queued, rest)
    if largest == running:
        return "running"
    if largest == queued:
        return "queued"
    return "blocked" if switches > 0 else "other"


def causes(clock: StepClock, indices: Sequence[int]) -> Optional[Dict[str, int]]:
    """How many of the steps `indices` (0-based) had each cause; None where the parts were
    not recorded."""
    if not clock.accounted:
        return None
    counts = dict.fromkeys(CAUSES, 0)
    for index in indices:
        counts[cause(clock.seconds[index], clock.running[index], clock.queued[index], clock.switches[index])] += 1
    return counts
