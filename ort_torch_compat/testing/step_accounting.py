"""Where a training step's wall time went: on a CPU, waiting for one, or blocked.

Why: "no step over twice the median step (the compiler never stalls the loop)" cannot be
read from step times alone.  ONNX Runtime's own loop has hundreds of such steps in 120 s on
an idle machine and thousands under load, and a compile that stalled the loop would look
like any of them.  The thread's own scheduler accounting tells them apart:

- running: the thread was on a CPU (Linux `/proc/self/task/TID/schedstat`, first field):
  slower code in that step (the traced phase, a garbage collection, a first call);
- queued: it was runnable and waited for a CPU (the same file's second field): the machine's
  other processes, the scheduler's time slices;
- blocked: the rest of the wall time, in a step where the thread gave up its CPU itself
  (a voluntary context switch, `getrusage(RUSAGE_THREAD)`): it waited for the GIL, a lock,
  a pipe or a page from disk.  A loop that waits for the compiler, or for a thread of ours
  that holds the GIL, shows here;
- other: the rest of the wall time with no voluntary switch: time the hypervisor gave
  another guest (steal), interrupts.

The parts are the measuring thread's (the loop's, which calls the step): where a step's
kernels run on more threads, the loop's thread spins or sleeps at their barriers, so a
helper thread that waited for a CPU shows as running or blocked there.

Reading both costs about 1 us a step (two reads of each per step), a few tenths of a
percent of the shortest steps measured here; the benchmark's first-seconds axis and the soak
script pay it for every backend alike.  Where the file is missing (not Linux, or a kernel
without scheduler statistics) the parts are not recorded and only the step times count.
"""

from __future__ import annotations

import os
import resource
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
        if len([int(field) for field in os.pread(descriptor, 128, 0).split()[:2]]) == 2:
            return descriptor
    except (OSError, ValueError):
        pass
    os.close(descriptor)
    return None


class StepClock:
    """Times the steps of one loop, in its thread: `start()` before a step, `stop()` after it
    (the step's seconds).  `seconds`, `running`, `queued` (seconds) and `blocks` (voluntary
    context switches) hold one entry per step; the last three stay empty where the thread's
    scheduler statistics cannot be read."""

    def __init__(self) -> None:
        self.seconds = array("d")
        self.running = array("d")
        self.queued = array("d")
        self.blocks = array("q")
        self._schedstat = _open_schedstat()
        self.accounted = self._schedstat is not None  # whether the steps' parts are recorded
        self._began = 0.0
        self._on_cpu = self._waiting = self._switches = 0

    def _read(self):
        on_cpu, waiting = os.pread(self._schedstat, 128, 0).split()[:2]
        return int(on_cpu), int(waiting), resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw

    def start(self) -> None:
        """A step begins."""
        if self._schedstat is not None:
            self._on_cpu, self._waiting, self._switches = self._read()
        self._began = time.perf_counter()

    def stop(self) -> float:
        """The step begun at the last `start()` has ended: record it; its wall seconds."""
        seconds = time.perf_counter() - self._began
        self.seconds.append(seconds)
        if self._schedstat is not None:
            on_cpu, waiting, switches = self._read()
            self.running.append((on_cpu - self._on_cpu) * 1e-9)
            self.queued.append((waiting - self._waiting) * 1e-9)
            self.blocks.append(switches - self._switches)
        return seconds

    def close(self) -> None:
        """Release the statistics file (the recorded steps stay)."""
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None


def parts(clock: StepClock, index: int) -> Dict[str, float]:
    """Step `index` (0-based) in milliseconds: running, queued and the rest of its wall time,
    and its voluntary context switches."""
    wall = clock.seconds[index]
    running, queued = clock.running[index], clock.queued[index]
    return {
        "running_ms": 1000 * running,
        "queued_ms": 1000 * queued,
        "rest_ms": 1000 * max(wall - running - queued, 0.0),
        "voluntary_switches": int(clock.blocks[index]),
    }


def cause(wall: float, running: float, queued: float, blocks: int) -> str:
    """What the largest part of a step's wall time was (see the module docstring): "running",
    "queued", or for the rest "blocked" (the thread gave up its CPU) or "other"."""
    rest = wall - running - queued
    largest = max(running, queued, rest)
    if largest == running:
        return "running"
    if largest == queued:
        return "queued"
    return "blocked" if blocks > 0 else "other"


def causes(clock: StepClock, indices: Sequence[int]) -> Optional[Dict[str, int]]:
    """How many of the steps `indices` (0-based) had each cause; None where the parts were
    not recorded."""
    if not clock.accounted:
        return None
    counts = dict.fromkeys(CAUSES, 0)
    for index in indices:
        counts[cause(clock.seconds[index], clock.running[index], clock.queued[index], clock.blocks[index])] += 1
    return counts
