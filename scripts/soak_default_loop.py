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
loop), and the largest difference between the two runs' losses in units of the parity
tolerance (1e-5 + 1e-4*|loss|; 1.0 = at the tolerance).
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


def _loop(directory: pathlib.Path, seconds: float, steps: int) -> dict:
    import numpy as np
    import torch

    from ort_torch_compat import api
    from ort_torch_compat.testing.benchmark_report import window_statistics

    with np.load(directory / "inputs.npz") as saved:
        feeds = {key: saved[key] for key in saved.files}
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state)
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    values = [torch.from_numpy(feeds[name]) for name in module.input_names()]
    losses, times, switch = [], [], None
    deadline = time.perf_counter() + seconds
    while (len(losses) < steps) if steps else (time.perf_counter() < deadline):
        begin = time.perf_counter()
        loss = module(*values)
        optimizer.step()
        module.lazy_reset_grad()
        times.append(time.perf_counter() - begin)
        losses.append(float(loss))
        if switch is None and module._engine.train_runner.path == "compiled":
            switch = len(losses)
    statistics = window_statistics(times, switch)
    return {"losses": losses, **{key: statistics[key] for key in ("switch_step", "median_ms", "max_ms", "max_step")}}


def _child(directory: pathlib.Path, setting: str, seconds: float, steps: int, cache: str) -> dict:
    environment = dict(os.environ, ORT_TORCH_COMPAT_CACHE_DIR=cache)
    environment.pop("ORT_TORCH_COMPAT_COMPILE", None)
    if setting != "default":
        environment["ORT_TORCH_COMPAT_COMPILE"] = setting
    command = [sys.executable, __file__, "--child", str(directory), "--seconds", str(seconds), "--steps", str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=seconds + 3600)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+", type=pathlib.Path)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--compare-steps", type=int, default=0, help="compare the steps up to N past the switch (0: all)"
    )
    parser.add_argument("--reference", choices=("eager", "off"), default="eager", help="the setting compared with")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_loop(args.directories[0], args.seconds, args.steps)))
        return 0
    failed = False
    for directory in args.directories:
        with tempfile.TemporaryDirectory(prefix="soak-cache-") as cache:
            default = _child(directory, "default", args.seconds, 0, cache)
        if "error" in default:
            print(f"{directory.name}: default settings FAILED: {default['error']}")
            failed = True
            continue
        compared = len(default["losses"])
        if args.compare_steps:
            compared = min(compared, (default["switch_step"] or 0) + args.compare_steps)
        off = _child(directory, args.reference, args.seconds, compared, tempfile.gettempdir())
        if "error" in off:
            print(f"{directory.name}: {args.reference} FAILED: {off['error']}")
            failed = True
            continue
        worst = max(
            (abs(a - b) / (1e-5 + 1e-4 * abs(b)) for a, b in zip(default["losses"], off["losses"])), default=0.0
        )
        stall = default["max_ms"] / max(default["median_ms"], 1e-9)
        print(
            json.dumps(
                {
                    "model": directory.name,
                    "steps": len(default["losses"]),
                    "compared_steps": compared,
                    "switch_step": default["switch_step"],
                    "median_ms": round(default["median_ms"], 3),
                    "max_ms": round(default["max_ms"], 2),
                    "max_step": default["max_step"],
                    "longest_over_median": round(stall, 1),
                    "loss_deviation": round(worst, 3),
                    "reference": args.reference,
                }
            )
        )
        failed |= worst > 1.0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
