"""How many intra-op threads an engine's steps use, chosen per engine and per call.

Why: PyTorch's CPU kernels run on OpenMP, whose worker threads wait for each other at the
end of every parallel region, spinning (GOMP_SPINCOUNT) before they sleep.  On an idle
machine more threads help the large kernels (convolutions, big GEMMs) and hurt the small
ones (a 65x128 GEMM is done before the workers wake up).  On a busy machine (a desktop
app, a federated-learning client, a CI runner) a worker that loses its core stalls every
region while the others spin for it: ResNet-18 steps cost 15x the CPU time with 2 threads
than with 1 when two other processes keep the 2 cores busy.  OMP_WAIT_POLICY=PASSIVE
removes the spinning, but OpenMP reads it once, when torch loads, and it would change the
user's own torch code too.

What: each call into the engine (train step, eval step, optimizer step) runs under
`torch.set_num_threads(n)` and restores the caller's count on return, so the user's own
torch code keeps its setting.  `n` is
- the explicit count, when one is given (`intra_op_num_threads` in the session options or
  ORT_TORCH_COMPAT_THREADS), or
- measured ("auto", the default): the train steps try 1 thread and the caller's count
  (and half of it on larger machines), keep the fastest by the median wall time of the last
  few steps, and re-try the others from time to time, spending at most ~2% of the training
  time on re-tries, so the choice follows the machine's load.  The first calls after the
  count changes are not measured: they time the change, not the count (LoRA-tiny's compiled
  step, 2 cores: the first call on 2 threads after 1-thread ones 0.36-0.41 ms against
  ~0.2 ms later, the first on 1 thread after 2-thread ones 0.16-0.34 against 0.14), and
  samples taken in alternation were all such calls: the choice flipped between the counts,
  and once kept 2 threads (0.20 ms a step against 0.14) for 5 s.  So one count is measured
  to the end before the other.  In the steady state the chosen count gives way where the
  median of its last 9 steps passes the other's older median by a quarter (a median of 3
  against it flipped the choice every few seconds where a tenth of the steps took 1.3x it),
  and the count it left is re-tried soon, not after the usual interval.
While a compile worker runs (compiled.py; the runner's path is then `COMPILING`), the eager
steps use one thread fewer than the caller's count, unmeasured: the worker has a core, and
an OpenMP region that waits for a thread sharing its core stalls for a scheduler slice
(measured: 200 ms steps among 0.5 ms ones on 2 cores).  For the same reason the first
call, the first measurements and every re-try of more threads than one wait while the
cores they need look busy (one thread meanwhile; how that is read: below).  While the runner
times its compiled step against the other form (`TRIAL`, compiled.py), every step uses the
caller's count, unmeasured, where its cores look idle, and one thread
where it does not (EfficientNet-B0-tiny's trial steps: 0.3-0.4 s on two threads with two
busy processes on 2 cores, 0.14 s on one; with three training processes on the 2 cores, single
steps of 3 and 10 s fell in the trials of ResNet-18 and EfficientNet-B0).
Whether cores are idle is read from the kernel's CPU counters (/proc/stat) over the time
since the last question (at least a quarter of a second; the first window starts when the
engine is made), less this process's own CPU time: what other processes use now.  The
1-minute load average, used before and still where there are no such counters, lags by a
minute: after a busy minute had ended (the benchmark's previous process, a finished compile)
it kept a fresh process on one thread for the whole of its 300 steps (measured on the AMD
host: the small transformer 8.2 ms a step against 4.6 on two threads, ResNet-18-tiny 57
against 33, ORT 4.5-6.4 and 46-52).
Results may differ in the last bits between thread counts (reductions split differently),
within float32 rounding; fix the count for bit-for-bit reproducible runs.
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import torch

THREADS_ENV = "ORT_TORCH_COMPAT_THREADS"
_SAMPLES = 3  # measurements per candidate before it counts; the median of the last ones decides
_KEPT_SAMPLES = 9  # a count's recent measurements kept: the chosen one's median is checked at every step
_FLIP_MARGIN = 1.25  # the chosen count gives way where its median passes the other's by this factor
_SETTLE_CALLS = 2  # calls not measured after the count changes (and at a code path's first call)
_REVISIT_S = 0.5  # a flip in the steady state re-tries the count it left this soon
_RETRY_SHARE = 0.02  # at most this share of the training time goes to re-trying a slower count
_MIN_RETRY_INTERVAL_S = 5.0
COMPILING = "compiling"  # the runner's path while its compile worker holds a core
TRIAL = "trial"  # the runner's path while it times its compiled step against the other form
T = TypeVar("T")


def thread_setting(session_options: object = None) -> Optional[int]:
    """An explicit thread count (session options' intra_op_num_threads > 0, else the
    ORT_TORCH_COMPAT_THREADS environment variable), or None for the measured choice."""
    requested = getattr(session_options, "intra_op_num_threads", 0) or 0
    if not requested:
        raw = os.environ.get(THREADS_ENV, "").strip().lower()
        if raw not in ("", "auto", "0"):
            try:
                requested = int(raw)
            except ValueError:
                raise ValueError(f"{THREADS_ENV} must be a positive integer or 'auto', got {raw!r}") from None
    if not isinstance(requested, int) or isinstance(requested, bool) or requested < 0:
        raise ValueError(f"intra_op_num_threads must be a non-negative integer, got {requested!r}")
    return requested or None


_LOAD_READ_INTERVAL_S = 1.0  # the kernel updates the load average every 5 s: read it at most this often
_load_reading: List = [
    float("-inf"),
    None,
    1,
]  # monotonic time of the last read, load average (None: unreadable), cores


_LOAD_WINDOW_S = 60.0  # the 1-minute load average decays as exp(-t / 60 s)
_STAT_PATH = "/proc/stat"
_MIN_STAT_WINDOW_S = 0.25  # shorter windows hold too few clock ticks (100 a second per CPU)
# the last reading of the CPU counters: (monotonic time, idle ticks, all ticks, this process's
# CPU seconds), or None before the first
_stat_reading: List[Optional[Tuple[float, int, int, float]]] = [None]
_finished_work: List[Tuple[float, float]] = []  # (monotonic end, share of the load average then)


def finished_background_work(seconds: float) -> None:
    """This process's compile worker ended after running `seconds` on one core: the load
    average keeps counting it for a minute or more (a worker of 85 s left ~0.75 of a core in
    it, and more than one thread was tried only ~25 s later), so `_cores_idle` subtracts its
    share, decaying as the kernel's average does."""
    share = 1.0 - math.exp(-max(seconds, 0.0) / _LOAD_WINDOW_S)
    _finished_work.append((time.monotonic(), share))
    _load_reading[0] = float("-inf")  # read again at the next question


def _read_stat() -> Optional[Tuple[int, int, int]]:
    """(idle ticks, all ticks, CPUs) of the machine's CPUs from /proc/stat (Linux); None where
    it cannot be read.  Idle counts waiting for I/O too; all counts stolen time (a hypervisor's
    other guests), which is no more ours than another process's."""
    try:
        with open(_STAT_PATH, "rb") as stat:
            lines = stat.read().split(b"\n")
        fields = lines[0].split()
        if len(fields) < 6 or fields[0] != b"cpu":
            return None
        ticks = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    cpus = sum(1 for line in lines[1:] if line.startswith(b"cpu"))
    return ticks[3] + ticks[4], sum(ticks), max(cpus, 1)


def _others_busy(now: float) -> Optional[Tuple[float, int]]:
    """(cores that other processes kept busy since the last reading, CPUs), from the CPU
    counters less this process's own CPU time (all its threads; not its children's: a compile
    worker counts as another process); None where the counters cannot be read or the window
    is shorter than `_MIN_STAT_WINDOW_S` (the reading it started from is kept)."""
    previous = _stat_reading[0]
    if previous is not None and now - previous[0] < _MIN_STAT_WINDOW_S:
        return None  # checked first: no read of the counters that would be thrown away
    reading = _read_stat()
    if reading is None:
        return None
    idle, total, cpus = reading
    own = time.process_time()
    _stat_reading[0] = (now, idle, total, own)
    if previous is None or total <= previous[2]:
        return None
    seconds = now - previous[0]
    busy = (1.0 - (idle - previous[1]) / (total - previous[2])) * cpus  # cores, everyone's
    return max(busy - (own - previous[3]) / seconds, 0.0), cpus


def start_load_window() -> None:
    """Read the CPU counters, so that the first question of `_cores_idle` has a window
    (called when an engine's policy is made)."""
    if _stat_reading[0] is None:
        _others_busy(time.monotonic())


def _cores_idle(count: int) -> bool:
    """Whether `count` more cores look idle: this process's asking thread, plus what the
    other processes kept busy since the last question (`_others_busy`; where that cannot be
    read, the 1-minute load average less what finished compile workers of this process
    still weigh in it), leaves them free.  True where neither can be read.  A busy machine
    asks this every step while a re-try waits (2-3 us of system calls a step): the reading
    is kept for `_LOAD_READ_INTERVAL_S`."""
    now = time.monotonic()
    if now - _load_reading[0] >= _LOAD_READ_INTERVAL_S:
        measured = _others_busy(now)
        if measured is not None:
            others, cpus = measured
            _load_reading[:] = [now, 1.0 + others, cpus]  # counted as the load average counts: with our thread
        else:
            try:
                load = os.getloadavg()[0]
            except OSError:
                load = None
            if load is not None and _finished_work:
                _finished_work[:] = [(end, share) for end, share in _finished_work if now - end < 5 * _LOAD_WINDOW_S]
                load -= sum(share * math.exp(-(now - end) / _LOAD_WINDOW_S) for end, share in _finished_work)
            _load_reading[:] = [now, load, os.cpu_count() or 1]
    _, load, cores = _load_reading
    return load is None or load + count <= cores + 0.5


def median(samples: List[float]) -> float:
    """The middle sample (the upper one of an even count)."""
    return sorted(samples)[len(samples) // 2]


def _candidates(ceiling: int) -> List[int]:
    return sorted({1, ceiling} | ({ceiling // 2} if ceiling >= 4 else set()))


class ThreadPolicy:
    """The thread count of one engine's calls (see the module docstring)."""

    def __init__(self, fixed: Optional[int] = None):
        self.fixed = fixed
        # per (code path, ceiling): {count: recent step seconds, the newest last}
        self._times: Dict[Tuple[str, int], Dict[int, List[float]]] = {}
        self._settling: Dict[Tuple[str, int], int] = {}  # per key: calls left before measurements count again
        self._complete: set = set()  # keys whose every candidate has _SAMPLES recent samples
        self._retry_at = 0.0
        self._chosen: Dict[Tuple[str, int], int] = {}
        self._rival: Dict[Tuple[str, int], float] = {}  # per key: the best median of the counts not chosen
        self._last: Dict[Tuple[str, int], int] = {}  # per (code path, ceiling): the count of the last measured call
        self._path = ""  # the code path measured last (eval and optimizer steps follow its choice)
        if fixed is None:
            start_load_window()

    def count(self) -> int:
        """The count an unmeasured call runs with: the fixed one, the measured choice, or the caller's."""
        ceiling = torch.get_num_threads()
        if self.fixed is not None:
            return self.fixed
        if self._path == COMPILING:  # the optimizer and eval steps leave the worker its core too
            return max(1, ceiling - 1)
        if self._path == TRIAL:  # both forms timed on every thread the caller allows, cores permitting
            return ceiling if _cores_idle(ceiling - 1) else 1
        key = (self._path, ceiling)
        return self._chosen.get(key, self._last.get(key, ceiling))

    def run(self, function: Callable[..., T], *args, **kwargs) -> T:
        """`function(*args, **kwargs)` with this engine's count; the caller's count after."""
        return _call_with_threads(self.count(), function, args, kwargs)

    def run_measured(self, path: str, function: Callable[..., T], *args, **kwargs) -> T:
        """`run`, plus: time the call and let the measurement steer the next choice.  Written
        without context managers: it wraps every train step (two generator-based context
        managers and a per-call list rebuild cost ~10 us a step, 5% of a tiny model's step)."""
        ceiling = torch.get_num_threads()
        if self.fixed is not None or ceiling <= 1:
            return self.run(function, *args, **kwargs)
        self._path = path
        if path in (COMPILING, TRIAL):
            return self.run(function, *args, **kwargs)
        key = (path, ceiling)
        count = self._next(key, ceiling)
        if self._last.get(key) != count:  # the calls right after a change time the change
            self._settling[key] = _SETTLE_CALLS
        self._last[key] = count  # what the optimizer and eval steps use until a choice is made
        if count != ceiling:
            torch.set_num_threads(count)
        try:
            begin = time.perf_counter()
            result = function(*args, **kwargs)
            seconds = time.perf_counter() - begin
        finally:
            if count != ceiling:
                torch.set_num_threads(ceiling)
        self._record(key, count, seconds)  # failed calls are no measurement
        return result

    # ---- the measured choice ----------------------------------------------------------
    def _next(self, key: Tuple[str, int], ceiling: int) -> int:
        if key in self._complete and time.perf_counter() < self._retry_at:
            return self._chosen[key]  # the steady state
        # More than one thread only while the cores it needs look idle, from the first call
        # on: on a busy machine OpenMP barriers wait for scheduler slices (measured with two
        # busy processes on 2 cores: first steps of 0.5-0.65 s with 2 threads).
        if key not in self._times:  # the first call warms caches and allocators: not measured
            self._times[key] = {c: [] for c in _candidates(ceiling)}
            return ceiling if _cores_idle(ceiling - 1) else 1
        times = self._times[key]
        if key not in self._complete:
            unmeasured = [c for c, samples in times.items() if len(samples) < _SAMPLES]
            ready = [c for c in unmeasured if c == 1 or _cores_idle(c - 1)]
            if self._last.get(key) in ready:  # one count to the end, then the next
                return self._last[key]
            return min(ready, key=lambda c: (len(times[c]), -c)) if ready else 1
        best = self._chosen[key]
        others = [c for c in times if c != best]
        retry = min(others, key=lambda c: median(times[c]))
        if retry > best and not _cores_idle(retry - best):
            self._retry_at = time.perf_counter() + _MIN_RETRY_INTERVAL_S  # busy now: ask again later
            return best
        # A re-try is a burst of fresh samples (the count's old ones are dropped): one sample
        # against the median of three could not move the choice, and an old choice's stale
        # samples could keep a slower count chosen (measured: an LSTM left on 2 threads, 40%
        # slower, after one noisy step of the single thread).
        times[retry] = []
        self._complete.discard(key)
        return retry

    def _record(self, key: Tuple[str, int], count: int, seconds: float) -> None:
        settling = self._settling.get(key, 0)
        if settling:
            self._settling[key] = settling - 1
            return
        times = self._times[key]
        samples = times[count]
        samples.append(seconds)
        if len(samples) > _KEPT_SAMPLES:
            del samples[0]
        if key not in self._complete:
            if any(len(s) < _SAMPLES for s in times.values()):
                return
            self._complete.add(key)
            retried = key in self._chosen and count != self._chosen[key]
            self._choose(key)
            if retried or self._retry_at == 0.0:  # a re-try's burst: _SETTLE_CALLS + _SAMPLES calls
                burst = (_SETTLE_CALLS + _SAMPLES) * seconds
                self._retry_at = time.perf_counter() + max(_MIN_RETRY_INTERVAL_S, burst / _RETRY_SHARE)
        elif median(samples) > _FLIP_MARGIN * self._rival[key]:  # the chosen count got slower (the load changed)
            self._choose(key)
            if self._chosen[key] != count:  # on the other's older median: re-try the count left soon
                self._retry_at = min(self._retry_at, time.perf_counter() + _REVISIT_S)

    def _choose(self, key: Tuple[str, int]) -> None:
        """Choose the count with the lowest median of its last _SAMPLES steps (a re-tried
        count has no more); remember the runner-up's median."""
        medians = sorted((median(samples[-_SAMPLES:]), count) for count, samples in self._times[key].items())
        self._chosen[key] = medians[0][1]
        self._rival[key] = medians[1][0]


def _call_with_threads(count: int, function: Callable[..., T], args, kwargs) -> T:
    """`function(*args, **kwargs)` with torch's intra-op thread count `count`, the caller's after."""
    previous = torch.get_num_threads()
    if count == previous:
        return function(*args, **kwargs)
    torch.set_num_threads(count)
    try:
        return function(*args, **kwargs)
    finally:
        torch.set_num_threads(previous)


def threaded(policy_of: Callable[[object], ThreadPolicy], measure: Optional[Callable[[object], str]] = None):
    """Method decorator: run the method under its engine's thread policy; with `measure`
    (the code path's name, from the instance), time it to steer the measured choice."""

    def decorate(method):
        if measure is None:

            @functools.wraps(method)
            def wrapper(self, *args, **kwargs):
                return policy_of(self).run(method, self, *args, **kwargs)

        else:

            @functools.wraps(method)
            def wrapper(self, *args, **kwargs):
                return policy_of(self).run_measured(measure(self), method, self, *args, **kwargs)

        return wrapper

    return decorate
