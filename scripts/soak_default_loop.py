"""A training loop with default settings from a cold compile cache, against eager steps.

    python scripts/soak_default_loop.py ARTIFACT_DIR [ARTIFACT_DIR ...] [--seconds 300] [--compare-steps N]
        [--reference eager|off]

For each artifact directory (training_model.onnx, optimizer_model.onnx, checkpoint, and
inputs.npz with the feeds by input name, as scripts/benchmark.py writes them): a fresh
process trains with default settings (compile "auto", an empty cache of its own) for
`--seconds`, the plain loop `module(*feeds); optimizer.step(); module.lazy_reset_grad()`;
then a second fresh process runs the same number of steps with ORT_TORCH_COMPAT_COMPILE set to
the reference ("eager" by default: the converted module with autograd, which shares no code
with the traced and compiled steps; "off": traced steps) (or, with `--compare-steps N`, the
steps up to N past the switch to the compiled step: eager steps can be 10x slower than
compiled ones, so matching a 5-minute compiled run step for step can take an hour, while the
steps before the switch, the switch and N compiled steps show what can differ).
Reported per model: steps, the step at which the compiled step took over, the median and
longest step after the first and which step that was (the compiler must never stall the
loop), where the steps over twice the median and the longest one spent their time (running,
queued for a CPU, blocked, other: ort_torch_compat/testing/step_accounting.py), and the largest difference between the two runs' losses in units of the parity
tolerance (1e-5 + 1e-4*|loss|; 1.0 = at the tolerance).

Same-state probes: two runs' losses agree step for step only as long as the training does
not amplify float32 rounding (a U-Net fitting a fixed batch does: two eager runs that differ
only in their thread count part beyond the tolerance after ~90 steps).  So the default run
also saves its state (parameters, optimizer state) a few times: after 100 steps (traced,
while the compiler runs), after the first compiled step, 1000 steps later and at the end; the reference
setting loads each saved state in a fresh process and runs PROBE_STEPS steps from it, and
"probe_deviation" is the largest difference between those losses and the default run's at
the same steps, in the same units.  The run fails where a probe deviates beyond the
tolerance; "loss_deviation" (the whole trajectory) is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

PROBE_STEPS = 3  # steps run from each saved state: the second and third show its gradients and update
_TRACED_PROBE = 100  # a state saved after this many steps (traced while the compiler runs)
_LATE_PROBE = 1000  # ... and this many steps after the switch


def _feeds(directory: pathlib.Path) -> dict:
    import numpy as np

    with np.load(directory / "inputs.npz") as saved:
        return {key: saved[key] for key in saved.files}


def _resume(state, directory: pathlib.Path, feeds: dict):
    """(module, optimizer, the feeds in the module's input order) training from `state`."""
    import torch

    from ort_torch_compat import api

    module = api.Module(str(directory / "training_model.onnx"), state)
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    return module, optimizer, [torch.from_numpy(feeds[name]) for name in module.input_names()]


def _loop(directory: pathlib.Path, seconds: float, steps: int, probes: Optional[pathlib.Path]) -> dict:
    """The timed loop; with `probes`, the state saved there before the probe steps."""
    from ort_torch_compat import api
    from ort_torch_compat.testing.benchmark_report import window_statistics
    from ort_torch_compat.testing.step_accounting import StepClock

    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module, optimizer, values = _resume(state, directory, _feeds(directory))
    losses: List[float] = []
    clock = StepClock()  # step times, and where each step's time went
    switch = None
    probe_starts = {_TRACED_PROBE} if probes is not None else set()
    saved: List[int] = []
    deadline = time.perf_counter() + seconds
    final: Optional[int] = None  # the last probe, taken when the time is up
    while (len(losses) < steps) if steps else (final is None or len(losses) < final + PROBE_STEPS):
        if not steps and final is None and time.perf_counter() >= deadline:
            if probes is None:
                break
            final = len(losses)
            probe_starts.add(final)
        if len(losses) in probe_starts:  # outside the timed step
            api.CheckpointState.save_checkpoint(state, str(probes / str(len(losses))), include_optimizer_state=True)
            saved.append(len(losses))
        clock.start()
        loss = module(*values)
        optimizer.step()
        module.lazy_reset_grad()
        clock.stop()
        losses.append(float(loss))
        if switch is None and module._engine.train_runner.path == "compiled":
            switch = len(losses)
            if probes is not None:
                probe_starts |= {switch, switch + _LATE_PROBE}
    clock.close()
    statistics = window_statistics(clock.seconds, switch, clock)
    kept = ("switch_step", "median_ms", "max_ms", "max_step", "over_2x_median")
    return {
        "losses": losses,
        "probes": {str(start): losses[start : start + PROBE_STEPS] for start in saved},
        **{
            key: value
            for key, value in statistics.items()
            if key in kept or key.startswith(("over_2x_median_", "over_2x_local_median", "max_"))
        },
    }


def _replay(directory: pathlib.Path, probes: pathlib.Path, starts: List[str]) -> Dict[str, List[float]]:
    """The losses of PROBE_STEPS steps from each saved state, in this process's setting."""
    from ort_torch_compat import api

    feeds = _feeds(directory)
    replayed = {}
    for start in starts:
        state = api.CheckpointState.load_checkpoint(str(probes / start))
        module, optimizer, values = _resume(state, directory, feeds)
        losses = []
        for _ in range(PROBE_STEPS):
            losses.append(float(module(*values)))
            optimizer.step()
            module.lazy_reset_grad()
        replayed[start] = losses
    return replayed


def _child(setting: str, cache: str, arguments: List[str], timeout: float) -> dict:
    """This script's child mode (`arguments`) in a fresh process with ORT_TORCH_COMPAT_COMPILE
    set to `setting` ("default": unset) and its own compile cache; its JSON answer."""
    environment = dict(os.environ, ORT_TORCH_COMPAT_CACHE_DIR=cache)
    environment.pop("ORT_TORCH_COMPAT_COMPILE", None)
    if setting != "default":
        environment["ORT_TORCH_COMPAT_COMPILE"] = setting
    command = [sys.executable, __file__, "--child", *arguments]
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=timeout)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _deviation(ours: List[float], theirs: List[float]) -> float:
    """The largest difference of two loss sequences in units of the parity tolerance."""
    from ort_torch_compat.testing.parity_rule import ATOL, RTOL

    return max((abs(a - b) / (ATOL + RTOL * abs(b)) for a, b in zip(ours, theirs)), default=0.0)


def _soak(directory: pathlib.Path, args: argparse.Namespace) -> dict:
    """One model: the default run, the reference's trajectory and its probe replays."""
    timeout = args.seconds + 3600
    with (
        tempfile.TemporaryDirectory(prefix="soak-cache-") as cache,
        tempfile.TemporaryDirectory(prefix="soak-probes-") as probes,
    ):
        loop = [str(directory), "--seconds", str(args.seconds)]
        default = _child("default", cache, [*loop, "--probes", probes], timeout)
        if "error" in default:
            return {"error": f"default settings FAILED: {default['error']}"}
        compared = len(default["losses"])
        if args.compare_steps:
            compared = min(compared, (default["switch_step"] or 0) + args.compare_steps)
        reference = _child(args.reference, tempfile.gettempdir(), [*loop, "--steps", str(compared)], timeout)
        starts = list(default["probes"])
        replayed = _child(args.reference, tempfile.gettempdir(), [str(directory), *starts, "--replay", probes], timeout)
    for answer in (reference, replayed):
        if "error" in answer:
            return {"error": f"{args.reference} FAILED: {answer['error']}"}
    return {
        "model": directory.name,
        "steps": len(default["losses"]),
        "compared_steps": compared,
        "switch_step": default["switch_step"],
        "median_ms": round(default["median_ms"], 3),
        "max_ms": round(default["max_ms"], 2),
        "max_step": default["max_step"],
        "longest_over_median": round(default["max_ms"] / max(default["median_ms"], 1e-9), 1),
        # where the steps over twice the median and the longest one spent their time (step_accounting.py)
        **{
            key: value
            for key, value in default.items()
            if key.startswith(("over_2x_median", "over_2x_local_median", "max_")) and key != "max_ms"
        },
        "loss_deviation": round(_deviation(default["losses"], reference["losses"]), 3),
        "probe_steps": [int(start) for start in starts],
        "probe_deviation": round(max(_deviation(default["probes"][k], replayed[k]) for k in starts), 3),
        "reference": args.reference,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+", type=pathlib.Path)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument(
        "--compare-steps", type=int, default=0, help="compare the steps up to N past the switch (0: all)"
    )
    parser.add_argument("--reference", choices=("eager", "off"), default="eager", help="the setting compared with")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--probes", type=pathlib.Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--replay", type=pathlib.Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child and args.replay is not None:  # the directories' tail: the probes' start steps
        print(json.dumps(_replay(args.directories[0], args.replay, [str(start) for start in args.directories[1:]])))
        return 0
    if args.child:
        print(json.dumps(_loop(args.directories[0], args.seconds, args.steps, args.probes)))
        return 0
    failed = False
    for directory in args.directories:
        result = _soak(directory, args)
        if "error" in result:
            print(f"{directory.name}: {result['error']}")
            failed = True
            continue
        print(json.dumps(result))
        failed |= result["probe_deviation"] > 1.0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
