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
  time on re-tries, so the choice follows the machine's load.
While a compile worker runs (compiled.py; the runner's path is then `COMPILING`), the eager
steps use one thread fewer than the caller's count, unmeasured: the worker has a core, and
an OpenMP region that waits for a thread sharing its core stalls for a scheduler slice
(measured: 200 ms steps among 0.5 ms ones on 2 cores).  For the same reason the first
call, the first measurements and every re-try of more threads than one wait while the
load average says the cores they need are busy (one thread meanwhile).
Results may differ in the last bits between thread counts (reductions split differently),
within float32 rounding; fix the count for bit-for-bit reproducible runs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from typing import Callable, ContextManager, Dict, Iterator, List, Optional, Tuple

import torch

THREADS_ENV = "ORT_TORCH_COMPAT_THREADS"
_SAMPLES = 3  # measurements per candidate before it counts; the median of the last ones decides
_RETRY_SHARE = 0.02  # at most this share of the training time goes to re-trying a slower count
_MIN_RETRY_INTERVAL_S = 5.0
COMPILING = "compiling"  # the runner's path while its compile worker holds a core


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


def _cores_idle(count: int) -> bool:
    """Whether `count` more cores look idle: the 1-minute load average (which counts this
    process's running thread) leaves them free.  True where the load cannot be read."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return True
    return load + count <= (os.cpu_count() or 1) + 0.5


def _median(samples: List[float]) -> float:
    return sorted(samples)[len(samples) // 2]


def _candidates(ceiling: int) -> List[int]:
    return sorted({1, ceiling} | ({ceiling // 2} if ceiling >= 4 else set()))


@contextlib.contextmanager
def _with_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count is `count` inside, the caller's again after."""
    previous = torch.get_num_threads()
    if count != previous:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count != previous:
            torch.set_num_threads(previous)


class ThreadPolicy:
    """The thread count of one engine's calls (see the module docstring)."""

    def __init__(self, fixed: Optional[int] = None):
        self.fixed = fixed
        # per (code path, ceiling): {count: recent step seconds}
        self._times: Dict[Tuple[str, int], Dict[int, List[float]]] = {}
        self._seen: set = set()
        self._retry_at = 0.0
        self._chosen: Dict[Tuple[str, int], int] = {}
        self._last: Dict[Tuple[str, int], int] = {}  # per (code path, ceiling): the count of the last measured call
        self._path = ""  # the code path measured last (eval and optimizer steps follow its choice)

    def count(self) -> int:
        """The count an unmeasured call runs with: the fixed one, the measured choice, or the caller's."""
        ceiling = torch.get_num_threads()
        if self.fixed is not None:
            return self.fixed
        if self._path == COMPILING:  # the optimizer and eval steps leave the worker its core too
            return max(1, ceiling - 1)
        key = (self._path, ceiling)
        return self._chosen.get(key, self._last.get(key, ceiling))

    def scope(self) -> ContextManager[None]:
        """Run the body with this engine's count; restore the caller's count after."""
        return _with_threads(self.count())

    @contextlib.contextmanager
    def measured_scope(self, path: str) -> Iterator[None]:
        """`scope`, plus: time the body and let the measurement steer the next choice."""
        ceiling = torch.get_num_threads()
        if self.fixed is not None or ceiling <= 1:
            with self.scope():
                yield
            return
        self._path = path
        if path == COMPILING:
            with self.scope():
                yield
            return
        key = (path, ceiling)
        count = self._next(key, ceiling)
        self._last[key] = count  # what the optimizer and eval steps use until a choice is made
        with _with_threads(count):
            begin = time.perf_counter()
            yield
            seconds = time.perf_counter() - begin
        self._record(key, count, seconds)  # failed calls are no measurement

    # ---- the measured choice ----------------------------------------------------------
    def _next(self, key: Tuple[str, int], ceiling: int) -> int:
        times = self._times.setdefault(key, {c: [] for c in _candidates(ceiling)})
        # More than one thread only while the cores it needs look idle, from the first call
        # on: on a busy machine OpenMP barriers wait for scheduler slices (measured with two
        # busy processes on 2 cores: first steps of 0.5-0.65 s with 2 threads).
        if key not in self._seen:  # the first call warms caches and allocators: not a fair sample
            return ceiling if _cores_idle(ceiling - 1) else 1
        unmeasured = [c for c, samples in times.items() if len(samples) < _SAMPLES]
        if unmeasured:
            ready = [c for c in unmeasured if c == 1 or _cores_idle(c - 1)]
            return min(ready, key=lambda c: (len(times[c]), -c)) if ready else 1
        best = self._chosen[key]
        if time.monotonic() >= self._retry_at:
            others = [c for c in times if c != best]
            retry = min(others, key=lambda c: _median(times[c]))
            if retry > best and not _cores_idle(retry - best):
                self._retry_at = time.monotonic() + _MIN_RETRY_INTERVAL_S  # busy now: ask again later
                return best
            return retry
        return best

    def _record(self, key: Tuple[str, int], count: int, seconds: float) -> None:
        if key not in self._seen:
            self._seen.add(key)
            return
        times = self._times[key]
        times[count] = (times[count] + [seconds])[-_SAMPLES:]
        if all(len(samples) >= _SAMPLES for samples in times.values()):
            best = min(times, key=lambda c: _median(times[c]))
            retried = key in self._chosen and count != self._chosen[key]
            self._chosen[key] = best
            if retried or self._retry_at == 0.0:
                self._retry_at = time.monotonic() + max(_MIN_RETRY_INTERVAL_S, seconds / _RETRY_SHARE)


def threaded(policy_of: Callable[[object], ThreadPolicy], measure: Optional[Callable[[object], str]] = None):
    """Method decorator: run the method under its engine's thread policy; with `measure`
    (the code path's name, from the instance), time it to steer the measured choice."""

    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            policy = policy_of(self)
            if measure is None or policy.fixed is not None or torch.get_num_threads() <= 1:
                # Not measured: `scope`, minus two generator context managers per call when
                # the count is already the caller's (most calls; they cost ~3 us).
                count = policy.count()
                if count == torch.get_num_threads():
                    return method(self, *args, **kwargs)
                with _with_threads(count):
                    return method(self, *args, **kwargs)
            with policy.measured_scope(measure(self)):
                return method(self, *args, **kwargs)

        return wrapper

    return decorate
