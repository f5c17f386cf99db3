"""Compiling a train step in a child process, while training goes on.

Why a process: compiling (tracing, TorchInductor's code generation, then a C++
compiler) takes 15 s to minutes of mostly-Python work.  A thread would hold the GIL for most
of it and stretch every train step by up to the interpreter's switch interval; a child
process only shares the cores.

Priority (`FOREGROUND`, `BACKGROUND`, `IDLE`): the worker leads its own session, and where
the kernel groups processes by session for scheduling (`/proc/sys/kernel/sched_autogroup_enabled`,
on in most Linux desktops and on this project's hosts), a session's processes together get as
much CPU as another session's: a process's `nice` counts only against its own session's
processes.  So a `BACKGROUND` worker (`nice` 10, the default "auto") gets a share of its own
beside the training process's session: on a busy machine it still compiles in about the idle
time (BERT-tiny ~10 s with two busy processes on 2 cores), which pays back at once where the
compiled step is 2x the traced one.  An `IDLE` worker (a step whose time is in its kernels:
tracing saved less than a tenth of it, and compiling gains mostly from more threads, which a busy
machine does not give) also lowers its session's own `nice` to 19 (`/proc/self/autogroup`), so
it takes only CPU that nothing else wants: measured on EfficientNet-B0-tiny with two busy
processes on 2 cores, a `BACKGROUND` worker held a core for its 70-80 s compile and the
training steps meanwhile took 1.5x ORT's (docs/performance.md).  `FOREGROUND` ("on": the
training process waits for the worker) keeps `nice` 0.

The parent sends the child, through its stdin, a pickle it made itself (never one read from
a file): the `ModuleRecipe` of the train module (the ONNX model and build flags, because a
converted module holds closures that do not pickle), the example tensors of the first batch
and the cache key.  The child rebuilds the module, checks that it hashes to the same key
(the same graph) and imports the compiler's modules; then it waits for a second message,
"go" with its final priority (`CompileWorker.go`), and specializes, compiles, checks and
times the module (`compile_build.build_entry`) and publishes the entry atomically
(`compile_cache.publish`).  It answers with one JSON line on stdout.  The parent polls it
between train steps (`CompileWorker.done`, one `waitpid`).  Why two messages: under "auto"
the parent starts the worker at the first step and then traces that step, which decides the
priority (`IDLE` or `BACKGROUND`); the child's start-up (importing torch, the library and
TorchInductor, rebuilding the module: 6-7 s of one core on the AVX2-only AMD host) runs
meanwhile, beside the trace, instead of after it.

Nothing outlives the parent: the child leads its own process group (the C++ compiler runs
in it), the parent kills that group and removes the child's scratch directory at exit
(`atexit`), and the child watches its stdin: end of file means the parent is gone (even
killed with SIGKILL), and it removes its scratch directory and kills its group.  Scratch
directories left by a machine crash are removed by the next compile (`compile_cache`).
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from . import compile_cache

if TYPE_CHECKING:
    import torch

    from .graph_module import ModuleRecipe

FOREGROUND, BACKGROUND, IDLE = "foreground", "background", "idle"  # the worker's priority (see above)
_NICE = {FOREGROUND: 0, BACKGROUND: 10, IDLE: 19}
_AUTOGROUP = "/proc/self/autogroup"  # the session's scheduling group ("nice N" to set its nice)
_live: Dict[str, "CompileWorker"] = {}  # cache key -> worker: engines of one graph share one compile


class CompileWorker:
    """One child process compiling one graph for one input signature into the cache."""

    def __init__(
        self, recipe: "ModuleRecipe", tensors: Sequence["torch.Tensor"], key: str, root: pathlib.Path, priority: str
    ):
        self.key = key
        self.root = root
        job = {
            "recipe": recipe,
            "key": key,
            "root": str(pathlib.Path(root).absolute()),  # the worker runs in another directory
            "tensors": [t.detach().to("cpu").clone().requires_grad_(t.requires_grad) for t in tensors],
        }
        payload = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        package_root = str(pathlib.Path(__file__).resolve().parents[2])  # a source checkout works too
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, environment.get("PYTHONPATH")) if p)
        environment["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # no pool of compiler subprocesses
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            # the priority on the command line: lowered before the child imports torch to read the job
            [sys.executable, "-m", "ort_torch_compat.engine.compile_worker", priority],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=environment,
            # `-m` puts the working directory first on sys.path: in the package's own root the
            # worker imports this copy of the library, not one that the user's directory holds
            cwd=package_root,
            start_new_session=True,
        )
        self._result: Optional[Dict] = None
        self._go: Optional[bytes] = None  # the "go" line, once `go` has been called
        self._go_given = threading.Event()
        # Writing blocks until the child has imported torch and reads: a thread does it (it
        # holds no GIL while blocked), then the "go" line when it is given.  stdin then stays
        # open: its end tells the child we are gone.
        self._writer = threading.Thread(
            target=self._send, args=(payload,), daemon=True, name="ort_torch_compat compile job"
        )
        self._writer.start()

    def _send(self, payload: bytes) -> None:
        try:
            self.process.stdin.write(payload)
            self.process.stdin.flush()
            self._go_given.wait()
            if self._go is not None:
                self.process.stdin.write(self._go)
                self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the child died first: its exit status and stderr say why

    def go(self, priority: str) -> None:
        """Let the child compile, at `priority` (it lowers its own, never raises it); the
        first call counts (engines of one graph share one worker)."""
        if priority not in _NICE:
            raise ValueError(f"unknown priority {priority!r}: expected one of {sorted(_NICE)}")
        if not self._go_given.is_set():
            self._go = f"go {priority}\n".encode("ascii")
            self._go_given.set()

    def done(self) -> bool:
        """Whether the child has finished (cheap: one waitpid)."""
        return self._result is not None or self.process.poll() is not None

    def wait(self) -> Dict:
        """Block until the child has finished; its result (see `result`)."""
        self.process.wait()
        return self.result()

    def result(self) -> Dict:
        """{"status": "compiled" | "refused" | "failed", "reason": ...} of a finished child."""
        if self._result is None:
            self._go_given.set()  # a writer still waiting for "go" ends
            self._writer.join(timeout=5)
            output = self.process.stdout.read().decode("utf-8", "replace").strip().splitlines()
            try:
                self._result = json.loads(output[-1])
            except (IndexError, ValueError):
                self._stderr.seek(0)
                tail = self._stderr.read().decode("utf-8", "replace").strip().splitlines()[-3:]
                self._result = {
                    "status": "failed",
                    "reason": f"the compile worker exited with status "
                    f"{self.process.returncode}: {' / '.join(tail)[-300:] or 'no message'}",
                }
            self._close()
        return self._result

    def stop(self) -> None:
        """Kill the child and its compiler processes; remove what it left in the cache root."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.process.wait()
        compile_cache.remove_scratch_of(self.root, self.key, self.process.pid)
        self._close()

    def _close(self) -> None:
        _live.pop(self.key, None)
        self._go_given.set()
        for stream in (self.process.stdin, self.process.stdout, self._stderr):
            try:
                stream.close()
            except (OSError, ValueError):
                pass


def start(
    recipe: "ModuleRecipe", tensors: Sequence["torch.Tensor"], key: str, root: pathlib.Path, priority: str
) -> CompileWorker:
    """The worker compiling `key`, started at `priority` (FOREGROUND, BACKGROUND or IDLE):
    it compiles once told to `go`; one already running in this process for `key` is shared."""
    if key not in _live:
        _live[key] = CompileWorker(recipe, tensors, key, root, priority)
    return _live[key]


@atexit.register
def _stop_all() -> None:
    for worker in list(_live.values()):
        worker.stop()


# ---- the child ----------------------------------------------------------------------------
def _watch_parent(root: pathlib.Path, key: str) -> None:
    """Block on stdin; at its end (the parent exited or was killed) clean up and end the group."""
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except OSError:
        pass
    compile_cache.remove_scratch_of(root, key, os.getpid())
    os.killpg(os.getpgrp(), signal.SIGKILL)


def lower_priority(priority: str, current: str = FOREGROUND) -> None:
    """Lower this process's priority from `current`'s to `priority`'s `nice` (never raise
    it); for `IDLE` its session's scheduling group's too, where the kernel has such groups
    (else nothing more to do)."""
    if _NICE[priority] > _NICE[current]:
        os.nice(_NICE[priority] - _NICE[current])
    if priority == IDLE:
        try:
            with open(_AUTOGROUP, "w") as group:
                group.write(str(_NICE[IDLE]))
        except OSError:  # no autogroups (kernel option off, or another cgroup schedules it)
            pass


def _child(priority: str) -> Dict:
    # First: reading the job imports torch and the library (1-3 s of CPU), which at `nice` 0 in
    # a session of its own took a core from a busy machine's training loop (the MLP's second
    # step, 224 ms with two busy processes, two thirds of it waiting for a CPU)
    lower_priority(priority)
    job = pickle.load(sys.stdin.buffer)  # sent by our parent through a pipe, never read from a file
    root, key = pathlib.Path(job["root"]), job["key"]
    import torch

    from . import compile_build, compile_key

    torch.set_num_threads(1)
    tensors: List[torch.Tensor] = job["tensors"]
    module = job["recipe"].build()
    rebuilt_key = compile_key.graph_key(module, tensors)
    if rebuilt_key != key:
        return {
            "status": "failed",
            "reason": f"the compile worker built another graph (key {rebuilt_key}, "
            f"expected {key}): the library's files changed while training ran?",
        }
    compile_build.import_compiler()
    words = sys.stdin.buffer.readline().decode("ascii", "replace").split()
    if len(words) != 2 or words[0] != "go" or words[1] not in _NICE:
        # end of file: the parent is gone (nothing was written yet)
        return {"status": "failed", "reason": f"the compile worker got no 'go' (got {' '.join(words)[:40]!r})"}
    lower_priority(words[1], priority)
    threading.Thread(target=_watch_parent, args=(root, key), daemon=True).start()
    return compile_build.build_entry(module, tensors, key, root)


def main() -> int:
    """Entry point of `python -m ort_torch_compat.engine.compile_worker` (started by `CompileWorker`)."""
    try:
        priority = sys.argv[1] if len(sys.argv) > 1 else FOREGROUND
        if priority not in _NICE:
            raise ValueError(f"unknown priority {priority!r}: expected one of {sorted(_NICE)}")
        result = _child(priority)
    except Exception as error:  # noqa: BLE001  (reported to the parent, which trains on eagerly)
        result = {
            "status": "failed",
            "reason": f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}",
        }
    try:
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    except OSError:  # the parent is gone: no one reads the answer
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
