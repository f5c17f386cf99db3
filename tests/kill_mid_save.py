"""Kill a checkpoint save at every file-system boundary, then load (run by test_crash_safe_saves.py).

Runs as its own process (no torch: the codec and atomic_files are stdlib + numpy) and forks
one child per case.  A child saves checkpoint NEW over OLD with `os.replace`, `os.rename`,
`os.unlink`, `os.fsync`, `os.link` and file-creating `os.open` calls counted; just before or
just after call k it sends itself SIGKILL or SIGINT.  The driver then loads the path and
classifies what it finds: "old", "new", "absent" (no checkpoint at all), or a failure
("mixed", "lost" or an error).  After a SIGKILL that left a journal, the recovery itself is
killed at each of its boundaries too.  Before any recovery, the two files as ONNX Runtime
would read them (it knows no journal) must also be the old pair, the new pair or no
checkpoint (the main file is absent while the renames run), never a mix.  Finally a clean save must leave the directory holding
the checkpoint files only (abandoned temp files removed).

Usage: python tests/kill_mid_save.py WORKDIR  -> prints one JSON object: {"cases": n, "failures": [...]}
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys

import numpy as np

from ort_torch_compat.codec import (
    CheckpointRecord,
    ModuleStateRecord,
    OptimizerGroupRecord,
    ParameterOptimizerStateRecord,
    decode_checkpoint,
    read_checkpoint,
    tensor_record_from_numpy,
    write_checkpoint,
)

COUNTED = ("replace", "rename", "unlink", "fsync", "link", "open")


def record(value: float, step: int) -> CheckpointRecord:
    """Parameters go to `.data`, the optimizer step and moments stay in the main file, so
    an old main file with a new `.data` (or the reverse) is told apart from both."""
    params = [tensor_record_from_numpy(n, np.full(s, value, np.float32)) for n, s in (("a", 5), ("b", (3, 4)))]
    moments = [
        ParameterOptimizerStateRecord(n, [tensor_record_from_numpy("momentum0", np.full(3, step, np.float32))])
        for n in ("a", "b")
    ]
    return CheckpointRecord(
        module_state=ModuleStateRecord(params, [], has_external_data=True),
        optimizer_groups=[OptimizerGroupRecord("group0", step, 0.5, moments)],
    )


OLD, NEW, NEWER = record(1.0, 1), record(2.0, 2), record(3.0, 3)
INLINE_OLD = record(1.0, 1)
INLINE_OLD.module_state.has_external_data = False


def save(rec: CheckpointRecord, path: str) -> None:
    write_checkpoint(rec, path, external_min_bytes=0 if rec.module_state.has_external_data else None)


def instrument(stop_at: int, sig: int, before: bool, counter: list, journal: str = "", marker: str = "") -> None:
    """Count the calls; at call ``stop_at`` send ``sig``.  If ``journal`` exists at that moment
    (the save is between its journal and its last rename), create ``marker``."""

    def send():
        if journal and os.path.lexists(journal):
            with open(marker, "w"):
                pass
        os.kill(os.getpid(), sig)

    for name in COUNTED:
        real = getattr(os, name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            if _name == "open" and not (args[1] & os.O_CREAT):
                return _real(*args, **kwargs)
            counter[0] += 1
            hit = counter[0] == stop_at
            if hit and before:
                send()
            try:
                return _real(*args, **kwargs)
            finally:  # also after a call that failed (unlinking a file that is not there)
                if hit and not before:
                    send()

        setattr(os, name, wrapper)


def in_child(
    action,
    stop_at: int = 0,
    sig: int = signal.SIGKILL,
    before: bool = True,
    count_file: str = "",
    journal: str = "",
    marker: str = "",
) -> int:
    """Run `action` in a forked child, interrupted at boundary `stop_at`; return its exit code
    (0 completed, 130 KeyboardInterrupt, -9 killed)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            counter = [0]
            instrument(stop_at, sig, before, counter, journal, marker)
            action()
            if count_file:
                with open(count_file, "w") as handle:
                    handle.write(str(counter[0]))
        except KeyboardInterrupt:
            code = 130
        except BaseException:  # noqa: BLE001 - reported as exit code 3
            import traceback

            traceback.print_exc()
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def count_boundaries(workdir: str, action, setup) -> int:
    setup()
    count_file = os.path.join(workdir, "..count")
    assert in_child(action, count_file=count_file) == 0
    with open(count_file) as handle:
        count = int(handle.read())
    os.unlink(count_file)
    return count


def classify(path: str, as_ort: bool = False) -> str:
    """What a load finds.  ``as_ort``: what ONNX Runtime would read, which knows no journal
    (the two files as they are, before any recovery)."""
    try:
        if as_ort:
            with open(path, "rb") as main:
                blob = main.read()
            companion = None
            if os.path.exists(path + ".data"):
                with open(path + ".data", "rb") as data:
                    companion = data.read()
            got = decode_checkpoint(blob, external_data=companion)
        else:
            got = read_checkpoint(path)
    except FileNotFoundError:
        return "absent"
    except Exception as error:  # noqa: BLE001 - every other outcome is a failure to report
        return f"error: {type(error).__name__}: {error}"
    for name, want in (("old", OLD), ("new", NEW), ("old", INLINE_OLD)):
        if got == want:
            return name
    return "mixed"


def load(path: str) -> None:
    """What a later process does: load the checkpoint (a rolled-back first save leaves none)."""
    try:
        read_checkpoint(path)
    except FileNotFoundError:
        pass


def listing(workdir: str):
    return sorted(os.listdir(workdir))


def main(root: str) -> dict:
    # A kill loses no page cache, so fsync only has to stay a counted boundary; the real
    # call would make this test wait on the disk for nothing.
    os.fsync = lambda fd: None
    # Ctrl-C raises KeyboardInterrupt in the children, however this process was started: a
    # process started in the background by a non-interactive shell (`cmd &`, nohup, some CI
    # runners) inherits SIGINT ignored, and Python then installs no handler for it, so the
    # SIGINT cases would see saves run to the end instead of being interrupted.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    failures, cases = [], 0
    scenarios = {"pair->pair": OLD, "file->pair": INLINE_OLD, "none->pair": None}
    for scenario, old in scenarios.items():
        workdir = os.path.join(root, scenario.replace(">", ""))
        path = os.path.join(workdir, "checkpoint")

        def setup():
            shutil.rmtree(workdir, ignore_errors=True)
            os.makedirs(workdir)
            if old is not None:
                save(old, path)

        allowed = {"old", "new"} if old is not None else {"absent", "new"}
        total = count_boundaries(workdir, lambda: save(NEW, path), setup)
        for sig in (signal.SIGKILL, signal.SIGINT):
            for stop_at in range(1, total + 1):
                for before in (True, False):
                    cases += 1
                    case = f"{scenario} {signal.Signals(sig).name} {'before' if before else 'after'} call {stop_at}/{total}"
                    setup()
                    seen = os.path.join(root, "journal.seen")
                    if os.path.exists(seen):
                        os.unlink(seen)
                    code = in_child(
                        lambda: save(NEW, path),
                        stop_at,
                        sig,
                        before,
                        journal=os.path.join(workdir, ".checkpoint.journal"),
                        marker=seen,
                    )
                    in_critical_section = os.path.exists(seen)
                    leftovers = [n for n in listing(workdir) if n not in ("checkpoint", "checkpoint.data")]
                    journal_left = ".checkpoint.journal" in leftovers
                    ort_view = classify(path, as_ort=True)
                    if ort_view not in allowed | {"absent"}:
                        failures.append(f"{case}: ONNX Runtime would load {ort_view}")
                    if sig == signal.SIGINT and (code != 130 or leftovers):
                        failures.append(f"{case}: exit {code}, left {leftovers}")
                    if sig == signal.SIGINT and in_critical_section and classify(path) != "new":
                        failures.append(f"{case}: Ctrl-C during the renames was not deferred until the save completed")
                    if sig == signal.SIGKILL and journal_left:
                        # kill the recovery too, at each of its own boundaries
                        snapshot = os.path.join(root, "snapshot")
                        shutil.rmtree(snapshot, ignore_errors=True)
                        shutil.copytree(workdir, snapshot, symlinks=True)

                        def restore():
                            shutil.rmtree(workdir)
                            shutil.copytree(snapshot, workdir, symlinks=True)

                        recovery = count_boundaries(workdir, lambda: load(path), restore)
                        for again in range(1, recovery + 1):
                            cases += 1
                            restore()
                            in_child(lambda: load(path), again, signal.SIGKILL, True)
                            ort_view = classify(path, as_ort=True)
                            if ort_view not in allowed | {"absent"}:
                                failures.append(
                                    f"{case}, recovery killed before call {again}: ORT would load {ort_view}"
                                )
                            outcome = classify(path)
                            if outcome not in allowed:
                                failures.append(f"{case}, recovery killed before call {again}: {outcome}")
                        restore()
                    outcome = classify(path)
                    if outcome not in allowed or (code == 0 and outcome != "new"):
                        failures.append(f"{case}: exit {code}, loaded {outcome}")
                    # the next save completes, and removes every abandoned temp file
                    save(NEWER, path)
                    if listing(workdir) != ["checkpoint", "checkpoint.data"] or read_checkpoint(path) != NEWER:
                        failures.append(f"{case}: after the next save the directory holds {listing(workdir)}")
    return {"cases": cases, "failures": failures}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
