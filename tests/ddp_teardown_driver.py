"""Run examples/ddp_train.py's main() (under torchrun), then fail if a gloo thread outlives it.

A gloo thread still alive when the interpreter shuts down can need the GIL to free a tensor,
and CPython then ends it inside a noexcept destructor: SIGABRT at exit, about once in 40 runs
(issue 19). That race is too rare to catch in one test run; the condition behind it is not.
tests/test_ddp.py launches this script instead of the example. Linux only (/proc/self/task).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import time
from typing import Dict, List, Set

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "ddp_train.py"


def _threads() -> Dict[str, str]:
    """This process's threads: id -> name (/proc/self/task)."""
    threads = {}
    for task in os.listdir("/proc/self/task"):
        try:
            threads[task] = pathlib.Path("/proc/self/task", task, "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
    return threads


def gloo_threads(started_by_init: Set[str]) -> List[str]:
    """The threads of gloo and torch's gloo process group still alive: those named so (torch
    2.14: gloo_tcp_loop, pt_gloo_runloop) and those `init_process_group` started (torch 2.6
    leaves its gloo threads with the interpreter's name), as 'name (id)'."""
    return sorted(f"{name} ({task})" for task, name in _threads().items() if "gloo" in name or task in started_by_init)


def main() -> None:
    import torch.distributed as dist

    spec = importlib.util.spec_from_file_location("ddp_train_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    if not os.path.isdir("/proc/self/task"):  # not Linux: run the example unchecked
        example.main(sys.argv[1:])
        return
    started_by_init: Set[str] = set()
    seen_while_training: List[str] = []
    init_process_group, train = dist.init_process_group, example.train

    def init_and_look(*args, **kwargs):
        before = set(_threads())
        result = init_process_group(*args, **kwargs)
        started_by_init.update(set(_threads()) - before)
        return result

    def train_and_look(*args, **kwargs):
        result = train(*args, **kwargs)
        seen_while_training.extend(gloo_threads(started_by_init))
        return result

    dist.init_process_group, example.train = init_and_look, train_and_look
    try:
        example.main(sys.argv[1:])
    finally:
        dist.init_process_group = init_process_group
    left = gloo_threads(started_by_init)
    deadline = time.monotonic() + 2.0
    while left and time.monotonic() < deadline:  # gloo's transport loop can end just after the group's
        time.sleep(0.05)  # last holder let go (seen once in a full suite run on 2 loaded cores: one
        left = gloo_threads(started_by_init)  # gloo_tcp_loop alive as main() returned); a leak stays
    print(f"gloo threads after training: {seen_while_training}; after main(): {left}", flush=True)
    if not seen_while_training:
        sys.exit("no gloo thread seen while training: init_process_group started none and none is named gloo")
    if left:
        sys.exit(f"gloo threads outlive main(): {left}")


if __name__ == "__main__":
    main()
