"""When a train step runs compiled: the setting, and the runner that switches between two steps.

Why (measured; numbers in docs/design.md): the converted graph runs one torch module per
ONNX node, and its backward one autograd node per aten op, with a kernel launch per
elementwise op.  TorchInductor's C++ code for the same forward and backward fuses the
elementwise chains, folds the shape arithmetic and drops the per-node dispatch.  Compiling
costs tens of seconds to minutes (a C++ compiler runs), so the result is cached
(compile_key.py: the key; compile_cache.py: the trusted store; compile_build.py: compile,
check and time; compiled_step.py: run the libraries), and a warm start stays cheap.

When (session options config entry "ort_torch_compat.compile" or ORT_TORCH_COMPAT_COMPILE):
"eager" (every step through the converted module with autograd); "off" (no compiler: the
steps run traced, see below); "on" (compile at the first train step, which waits for it);
"auto", the default: use a cached compilation from the first step on, otherwise start a
background process at the first step (compile_worker.py: it starts up beside the trace and
compiles once the traced step is built) while the steps run traced, and switch to the compiled step between
two steps once it is ready, checked and faster (the worker times it on one thread; where
it was not faster there and the machine has more cores, both forms are timed in the
training loop first: `_trial_step`).
Ahead of time, `precompile.py` (`ort-torch-compat compile`) fills the cache.
Only CPU training steps are compiled, for the first batch's shapes; CUDA steps are
replayed as CUDA graphs instead (cuda_graphs.py), and eval steps run eagerly.

Traced steps (traced_step.py; every setting but "eager", CPU): a step the compiled library
does not run (another input signature, compilation off, refused or still running) runs as
one TorchScript graph of its forward and backward, traced in this process at the first
step of the signature (about a second on the tiny real architectures), checked against
the eager step and used where faster.  The first signature is traced at its first step,
others when they come back (a shape seen once runs eagerly), at most `_MAX_TRACED`.

A step that traced ends with one full garbage collection (`step_finished`).  Tracing,
converting and starting the worker leave tens of thousands of new long-lived Python
objects; CPython runs a full collection once the objects moved to its oldest generation since
the last one reach a quarter of those in it, and a training loop's own promotions took the
count over that line a few thousand steps later: one step of the loop then stopped for the
whole collection (about 330 thousand objects after `import torch` and a model; 240 ms of CPU
in a 20-ms step of the hand-made MLP with two busy processes, at the same step in every run).
Collected at the end of a step that already took a second or more to trace, the count starts
from zero, and the loop's own promotions do not reach the line (none in 120 s).
"""

from __future__ import annotations

import gc
import logging
import os
import pathlib
import shutil
import threading
import time
import warnings
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import fx

from . import compile_cache, compile_key, compile_worker, compiled_step, threads, traced_step
from .compile_cache import cache_root
from .threads import COMPILING, TRIAL

if TYPE_CHECKING:
    from .graph_module import ModuleRecipe


COMPILE_ENV = "ORT_TORCH_COMPAT_COMPILE"

CONFIG_KEY = "ort_torch_compat.compile"  # session options config entry (add_session_config_entry)

SETTINGS = ("eager", "off", "on", "auto")

_ALIASES = {"0": "off", "false": "off", "no": "off", "1": "on", "true": "on", "yes": "on"}
_FASTER = 0.95  # the compiled step is used when it takes at most this share of the eager step's time
_MAX_TRACED = 8  # input signatures with a traced step, per runner
_TRIAL_STEPS = 5  # train steps of each form timed where the one-thread timing found the compiled step slower
# a traced step taking more than this share of the eager step's time saved little of the framework's per-call
# cost: the step's time is in its kernels (EfficientNet-B0-tiny 1.00, ResNet-18 1.13; MobileNetV2 0.80, BERT 0.27)
_KERNEL_BOUND = 0.9

log = logging.getLogger("ort_torch_compat.compile")


def _median_ms(seconds: list) -> float:
    return 1000.0 * threads.median(seconds)


class CompileWarning(RuntimeWarning):
    """A train step runs without compilation; the message says why."""


def compile_setting(session_options: object = None) -> str:
    """The effective setting: the session options' "ort_torch_compat.compile" config entry,
    else "off" when their graph_optimization_level is ORT_DISABLE_ALL (0), else
    ORT_TORCH_COMPAT_COMPILE, else "auto"."""
    raw = None
    try:
        raw = session_options.get_session_config_entry(CONFIG_KEY)
    except (AttributeError, RuntimeError, KeyError):
        pass
    if raw is None and int(getattr(session_options, "graph_optimization_level", 99)) == 0:
        raw = "off"
    if raw is None:
        raw = os.environ.get(COMPILE_ENV, "auto")
    value = _ALIASES.get(str(raw).strip().lower(), str(raw).strip().lower())
    if value not in SETTINGS:
        raise ValueError(f"compile setting must be one of {SETTINGS} (or 0/1), got {raw!r}")
    return value


def cxx_compiler() -> Optional[str]:
    """The C++ compiler TorchInductor would use, or None."""
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def _signature(tensors: Sequence[torch.Tensor]) -> Tuple:
    return tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)


_reported: set = set()


def _report(label: str, reason: str) -> None:
    """One warning per model and reason per process."""
    if (label, reason) not in _reported:
        _reported.add((label, reason))
        warnings.warn(f"{label}: train steps run without compilation: {reason}", CompileWarning, stacklevel=4)


class TrainStepRunner:
    """Runs train steps: the converted train module with autograd, or its compiled or traced
    form when the setting and the cache allow.

    `runner.compiled_for([*feeds, *params])` says which runs a step: the compiled or traced
    step it returns (whose `train` or `run` computes what `module(*feeds, *params)`
    computes, plus the gradients), or None for `runner.eager`.  `recipe`
    rebuilds the module in the compile worker's process; `eager` (default: the module)
    computes the same as the module and runs the steps that are not compiled (the engine
    passes `graph_module.direct_calls(module)`)."""

    def __init__(
        self,
        module: fx.GraphModule,
        recipe: "ModuleRecipe",
        device: torch.device,
        session_options: object = None,
        eager: Optional[Callable] = None,
    ):
        self.module = module
        self.eager = module if eager is None else eager
        self.recipe = recipe
        self.label = recipe.label
        self.setting = compile_setting(session_options)
        self.compiled: Optional[compiled_step.CompiledTrainStep] = None
        self.compile_seconds: Optional[float] = None  # cold compile time, when this process compiled
        self._signature: Optional[Tuple] = None
        self._state = "eager" if self.setting in ("eager", "off") or device.type != "cpu" else "first"
        self._trace = self.setting != "eager" and device.type == "cpu" and traced_step.torchscript_available()
        self._traced: Dict[Tuple, Optional[traced_step.TracedTrainStep]] = {}  # feeds' signature -> step or None
        self._seen: Dict[Tuple, int] = {}  # feeds' signature -> steps seen without a traced step
        self._kernel_bound = False  # the first signature's traced step saved under a tenth of the eager time
        self._worker: Optional[compile_worker.CompileWorker] = None
        self._preload: Optional[threading.Thread] = None
        self._entry = None  # what the preload thread verified: an Entry, None, or False (see _open_entry)
        self._started = 0.0
        self._key = ""
        # the trial (see `_load`): step seconds of the compiled step and of the other form,
        # and which of the two runs the step in flight, since when
        self._trial: Tuple[list, list] = ([], [])
        self._trial_running: Optional[Tuple[int, float]] = None
        self._collect = False  # a traced step was built in the step in flight: collect garbage after it

    @property
    def path(self) -> str:
        """Which code runs the train step now, for the thread policy: "compiled" or "eager"
        (measured apart), or `threads.COMPILING` (eager, while the worker holds a core)."""
        if self._state in ("compiling", "loading"):
            return COMPILING
        if self._state == "trial":
            return TRIAL
        if self._state == "compiled":
            return "compiled"
        return "traced" if any(self._traced.values()) else "eager"

    def is_settled(self, step: compiled_step.FlatGradientStep) -> bool:
        """Whether `step` is the compiled or a traced step of a runner whose state no longer
        moves on by itself (compiled, or eager: no worker, no trial), so it runs every step of
        the signature it was chosen for until `disagreed` retires it."""
        return self._state in ("compiled", "eager") and (step is self.compiled or step in self._traced.values())

    def compiled_for(self, tensors: Sequence[torch.Tensor], fixed: int = 0) -> Optional[compiled_step.FlatGradientStep]:
        """The compiled or traced step that runs the train step on `tensors`, or None where
        it runs eagerly; moves the setting's state on (first step, worker done, libraries
        loaded) between two steps.  The last `fixed` tensors (the parameters, whose shapes
        never change) are left out of the per-step signature check."""
        feeds = _signature(tensors[: len(tensors) - fixed])
        if self._signature is None:
            self._signature = _signature(tensors)
        if self._state == "compiled":
            if feeds == self._signature[: len(self._signature) - fixed]:
                return self.compiled
            return self._traced_for(feeds, tensors)
        if self._state == "trial":
            return self._trial_step(feeds, tensors, fixed)
        if self._state == "first":
            if self._first(tensors):  # no cache entry: compile
                if self.setting == "auto":
                    # The worker first: its start-up (imports, the module rebuilt) runs beside
                    # the trace; it compiles once the traced step has set its priority.  (The
                    # whole compile beside the trace had slowed it: LSTM-tiny's first step
                    # 3.0-4.5 s against 2.1 s alone.)
                    self._start(tensors)
                    threads_before = torch.get_num_threads()
                    if self._state == "compiling" and threads_before > 1:  # as in every step while
                        torch.set_num_threads(threads_before - 1)  # the worker holds a core (threads.py)
                    try:
                        step = self._traced_for(feeds, tensors)
                    finally:
                        torch.set_num_threads(threads_before)
                        if self._state == "compiling":
                            self._worker.go(self._worker_priority())
                    return step
                self._start(tensors)  # "on": waited for, so nothing to trace first
            elif self._state == "trial":
                # A cached entry to be timed against the traced step: traced now, in the first
                # step, not in the trial's second (EfficientNet-B0-tiny: a 10-14 s step 2)
                self._traced_for(feeds, tensors)
        elif self._state == "compiling" and self._worker.done():
            self._finish()
        elif self._state == "loading" and not self._preload.is_alive():
            self._take(self._entry)  # between two steps: no eager step is in flight
        if self._state == "compiled" and _signature(tensors) == self._signature:
            return self.compiled
        if self._state == "trial":
            return self._trial_step(feeds, tensors, fixed)
        return self._traced_for(feeds, tensors)

    def step_finished(self) -> None:
        """The train step that `compiled_for` chose for has run (the engine calls this after
        each successful step): during the trial, its time counts for the form that ran it;
        after a step that traced, one full garbage collection (see the module docstring)."""
        if self._collect:
            self._collect = False
            gc.collect()
        if self._trial_running is not None:
            form, began = self._trial_running
            self._trial[form].append(time.perf_counter() - began)
            self._trial_running = None

    def _trial_step(self, feeds: Tuple, tensors: Sequence[torch.Tensor], fixed: int):
        """During the trial: the compiled step and the other form (traced or eager) in turn on
        the first signature, timed by `step_finished`; after `_TRIAL_STEPS` of each, the
        faster from then on (the compiled one where it takes at most `_FASTER` of the other's
        median time)."""
        self._trial_running = None
        compiled_times, other_times = self._trial
        if min(len(compiled_times), len(other_times)) >= _TRIAL_STEPS:
            compiled_ms, other_ms = _median_ms(compiled_times), _median_ms(other_times)
            faster = compiled_ms <= _FASTER * other_ms
            self._state, self.compiled = ("compiled", self.compiled) if faster else ("eager", None)
            log.info(
                "%s: the compiled train step is %s with %d thread(s) (%.1f ms vs %.1f ms)",
                self.label,
                "faster: running it" if faster else "not faster either",
                torch.get_num_threads(),
                compiled_ms,
                other_ms,
            )
        first = feeds == self._signature[: len(self._signature) - fixed]
        if self._state == "compiled" and first:
            return self.compiled
        if self._state != "trial" or not first:  # decided, or another signature (not timed)
            return self._traced_for(feeds, tensors)
        form = 0 if len(compiled_times) <= len(other_times) else 1
        step = self.compiled if form == 0 else self._traced_for(feeds, tensors)
        self._trial_running = (form, time.perf_counter())
        return step

    def _traced_for(self, feeds: Tuple, tensors: Sequence[torch.Tensor]) -> Optional[traced_step.TracedTrainStep]:
        """The traced step of this feeds' signature: traced now where it is the first
        signature or one seen before (see the module's docstring), else None (eager)."""
        step = self._traced.get(feeds, False)
        if step is not False or not self._trace:
            return step or None
        seen = self._seen[feeds] = self._seen.get(feeds, 0) + 1
        first = feeds == self._signature[: len(feeds)]  # the runner's first step's feeds
        if not (first or seen > 1) or len(self._traced) >= _MAX_TRACED:
            return None
        self._traced[feeds] = step = self._build_traced(tensors, len(tensors) - len(feeds))
        return step

    def _build_traced(self, tensors: Sequence[torch.Tensor], fixed: int) -> Optional[traced_step.TracedTrainStep]:
        """The traced step for `tensors`, whose last `fixed` are the engine's parameters."""
        began = time.perf_counter()
        self._collect = True
        try:
            step, eager_ms, traced_ms = traced_step.build_traced_step(self.module, tensors, fixed)
        except Exception as error:  # noqa: BLE001  (anything here only means: eager steps)
            log.info(
                "%s: train steps of this shape run eagerly: cannot trace them (%s: %s)",
                self.label,
                type(error).__name__,
                str(error).splitlines()[0][:300] if str(error) else "",
            )
            return None
        log.info(
            "%s: traced the train step in %.2f s (%.2f ms a step%s, eager %.2f ms)",
            self.label,
            time.perf_counter() - began,
            traced_ms,
            ("" if step.onednn else " with ATen's kernels instead of oneDNN's")
            + (" on Static Runtime" if step.static else ""),
            eager_ms,
        )
        if not self._traced:  # the first signature's: what the compile worker's priority follows
            self._kernel_bound = traced_ms > _KERNEL_BOUND * eager_ms
        return step if traced_ms < eager_ms else None

    def disagreed(self, step: compiled_step.FlatGradientStep) -> None:
        """`step` could not run a step that the eager step then ran: do not use it again."""
        for feeds, traced in self._traced.items():
            if traced is step:  # Static Runtime's step: its interpreter's form takes over
                self._traced[feeds] = getattr(step, "interpreted", None)
                log.info(
                    "%s: the traced step failed where the eager one did not (%s): running %s",
                    self.label,
                    step.error,
                    "on TorchScript's interpreter" if self._traced[feeds] else "eagerly",
                )
        if step is self.compiled:
            self._state, self.compiled, self._trial_running = "eager", None, None
            _report(self.label, "the compiled step refused inputs the eager step accepted")

    def _first(self, tensors: Sequence[torch.Tensor]) -> bool:
        """At the first step: load the cached entry, or report why none is used.  True where
        there is no entry yet, so the step is to be compiled: the caller starts the worker."""
        self._state = "eager"
        try:
            self._key = compile_key.graph_key(self.module, tensors)
        except Exception as error:  # noqa: BLE001  (anything here only means: no compiled step)
            _report(self.label, f"cannot key the compile cache ({type(error).__name__}: {error})")
            return False
        entry = self._open_entry()
        if entry is None:
            return True
        if entry is False:
            return False
        if "refused" in entry.meta:
            _report(self.label, str(entry.meta["refused"]))
        else:
            self._load(entry.directory, entry.meta)
        return False

    def _open_entry(self):
        """The verified cache entry of this key, None where there is none (or an untrusted one
        was removed: it is rebuilt), False where the cache cannot be used (reported)."""
        root = cache_root()
        try:
            if os.path.lexists(root):
                compile_cache.check_root(root)
        except compile_cache.CacheProblem as problem:
            _report(self.label, f"{problem}; train steps run eagerly")
            return False
        try:
            return compile_cache.open_entry(root, self._key)
        except compile_cache.CacheProblem as problem:
            if not compile_cache.discard(root, self._key):
                _report(self.label, f"{problem}; train steps run eagerly")
                return False
            _report(self.label, f"{problem}; the entry was removed and is compiled again")
            return None

    def _start(self, tensors: Sequence[torch.Tensor]) -> None:
        """Compile in a child process: in the background under "auto", waited for under "on"."""
        if cxx_compiler() is None:
            _report(self.label, "no C++ compiler found (g++, c++ or clang++; or set CXX)")
            return
        root = cache_root()
        log.info("%s: compiling the train step (cached in %s)", self.label, root)
        self._started = time.perf_counter()
        try:
            self._worker = compile_worker.start(self.recipe, tensors, self._key, root, self._start_priority())
        except (OSError, ValueError, TypeError, AttributeError, RuntimeError) as error:  # pickling, spawning
            _report(self.label, f"cannot start the compile worker ({type(error).__name__}: {error})")
            return
        self._state = "compiling"
        if self.setting == "on":
            self._worker.go(self._worker_priority())
            self._worker.wait()
            self._finish()

    def _start_priority(self) -> str:
        """The worker's priority while it starts up: FOREGROUND under "on" (waited for), else
        BACKGROUND, lowered at `go` where the traced step says IDLE."""
        return compile_worker.FOREGROUND if self.setting == "on" else compile_worker.BACKGROUND

    def _worker_priority(self) -> str:
        """ "on" waits for the worker (FOREGROUND); under "auto" it compiles beside the training
        loop: at the lowest priority (IDLE) where the traced step saved less than a tenth of
        the eager step's time (`_KERNEL_BOUND`: the step's time is in its kernels, and
        compiling gains mostly from threads on idle cores), else BACKGROUND (see compile_worker.py)."""
        if self.setting == "on":
            return compile_worker.FOREGROUND
        return compile_worker.IDLE if self._kernel_bound else compile_worker.BACKGROUND

    def _finish(self) -> None:
        """Take the finished worker's result: load the entry, or say why there is none."""
        result, self._worker = self._worker.result(), None
        self._state = "eager"
        threads.finished_background_work(time.perf_counter() - self._started)
        if result.get("status") != "compiled":
            _report(self.label, str(result.get("reason", "compilation failed")))
            return
        self.compile_seconds = time.perf_counter() - self._started
        log.info("%s: compiled in %.1f s", self.label, self.compile_seconds)
        if self.setting == "on":
            self._take(self._open_entry())
            return
        # The entry is verified (SHA-256 of the library: hashlib releases the GIL) and the
        # library mapped and relocated (ctypes releases the GIL in dlopen) by a thread; the
        # step that switches over then finds it loaded and pays ~0.1 ms (verified inline,
        # the step before the switch took about 19 ms).
        self._entry = None
        self._preload = threading.Thread(target=self._verify_and_preload, daemon=True, name="ort_torch_compat preload")
        self._preload.start()
        self._state = "loading"

    def _verify_and_preload(self) -> None:
        entry = self._open_entry()
        if entry and "refused" not in entry.meta:
            compiled_step.preload_libraries(entry.directory)
        self._entry = entry

    def _take(self, entry) -> None:
        """Load the entry the finished worker published, or say why there is none."""
        self._state = "eager"
        if not entry or "refused" in entry.meta:
            if entry is None:
                _report(self.label, f"the compiled step vanished from {cache_root() / self._key}")
            return
        self._load(*entry)

    def _load(self, directory: pathlib.Path, meta: Dict) -> None:
        """Use the entry's compiled step from now on, or stay eager (once: never re-tried per step)."""
        from ..graph.specialize import lifted_constants

        self._state, self._entry = "eager", None
        try:
            compiled_step.check_layout(meta)
        except ValueError as error:
            _report(self.label, f"cannot load the compiled step from {directory} ({error})")
            return
        # The entry's timing ran on one thread (the worker's core): where the process may use
        # more, the two forms can compare otherwise (EfficientNet-B0-tiny: 0.96x eager on one
        # thread, 0.61x on two), so they are timed here, in the training loop, first.
        slower = self.setting == "auto" and meta["compiled_ms"] > _FASTER * meta["eager_ms"]
        if slower and (os.cpu_count() or 1) < 2:
            log.info(
                "%s: the compiled train step is not faster (%.1f ms vs %.1f ms eager): running eagerly",
                self.label,
                meta["compiled_ms"],
                meta["eager_ms"],
            )
            return
        try:
            spec_constants = lifted_constants(self.module)
            trace_constants = [compiled_step.decode_tensor(record) for record in meta["trace_constants"]]
            self.compiled = compiled_step.CompiledTrainStep(directory, meta, spec_constants + trace_constants)
            self._state = "trial" if slower else "compiled"
        except Exception as error:  # noqa: BLE001
            _report(self.label, f"cannot load the compiled step from {directory} ({type(error).__name__}: {error})")
