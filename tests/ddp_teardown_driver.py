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
from typing import List

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "ddp_train.py"


def gloo_threads() -> List[str]:
    """Names of this process's threads that belong to gloo or torch's gloo process group."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            name = pathlib.Path("/proc/self/task", task, "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if "gloo" in name:
            names.append(name)
    return sorted(names)


def main() -> None:
    spec = importlib.util.spec_from_file_location("ddp_train_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    seen_while_training: List[str] = []
    train = example.train

    def train_and_look(*args, **kwargs):
        result = train(*args, **kwargs)
        seen_while_training.extend(gloo_threads())
        return result

    if not os.path.isdir("/proc/self/task"):  # not Linux: run the example unchecked
        example.main(sys.argv[1:])
        return
    example.train = train_and_look
    example.main(sys.argv[1:])
    left = gloo_threads()
    print(f"gloo threads after training: {seen_while_training}; after main(): {left}", flush=True)
    if not seen_while_training:
        sys.exit("no gloo thread seen while training: their names changed, update gloo_threads()")
    if left:
        sys.exit(f"gloo threads outlive main(): {left}")


if __name__ == "__main__":
    main()
