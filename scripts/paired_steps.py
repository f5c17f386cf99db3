"""Warm step time of onnxruntime-training and ours in ONE process, in alternating blocks.

    python scripts/paired_steps.py ARTIFACT_DIR [--inputs FILE] [--rounds 20] [--steps 500] [--json FILE]

A diagnostic for noisy hosts, next to `scripts/benchmark.py` (which runs each backend in its
own process and stays the measurement of record).  On a shared VM the speed of the same
step moves by up to 2x between processes and within one over seconds (docs/performance.md,
2026-12-05), for ORT as for ours; two processes measured minutes apart can land in
different phases.  Here both libraries train the same artifacts (separate states) in one
process, in blocks of `--steps` steps that alternate (ORT first in even rounds, ours first
in odd ones), so each ratio compares blocks a second apart.  One step is
`module(*inputs); optimizer.step(); module.lazy_reset_grad()` (ORT gets numpy inputs, ours
torch tensors, as in the benchmark), wall time, default threads; 300 warm-up steps each.

ARTIFACT_DIR holds training_model.onnx, optimizer_model.onnx and checkpoint; the inputs
(and labels) come from an .npz whose names are the training model's inputs (default
ARTIFACT_DIR/inputs.npz, as `scripts/benchmark.py` writes it).  The compile setting is the
library's (`ORT_TORCH_COMPAT_COMPILE`, cache `ORT_TORCH_COMPAT_CACHE_DIR`); a cold cache
compiles during the warm-up under "auto" only where it finishes in time, so warm it first
(`ort-torch-compat compile`, or one benchmark run).  Prints one JSON object: the medians of
the block medians (ms), the median and range of the per-round ratios ours / ORT, and the
form of our step that ran (compiled, traced, eager).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time


def _trainer(api, directory: pathlib.Path, feeds: dict, as_torch: bool):
    """A one-step closure over a fresh Module and Optimizer of `api`, and the Module."""
    import torch

    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state)
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    missing = [name for name in module.input_names() if name not in feeds]
    if missing:
        raise SystemExit(f"the inputs file has no {missing}: it needs every training input {module.input_names()}")
    values = [torch.from_numpy(feeds[name]) if as_torch else feeds[name] for name in module.input_names()]

    def step() -> None:
        module(*values)
        optimizer.step()
        module.lazy_reset_grad()

    return step, module


def _block_ms(step, steps: int) -> float:
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        step()
        times.append(time.perf_counter() - begin)
    return 1000 * statistics.median(times)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("--inputs", type=pathlib.Path, help="an .npz of the training inputs (default DIR/inputs.npz)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=500, help="steps per block")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)

    import numpy as np

    try:
        from onnxruntime.training import api as ort_api
    except ImportError as error:
        raise SystemExit(f"onnxruntime-training is needed for the ORT side ({error}): pip install -e '.[ort]'")
    from ort_torch_compat import api as our_api

    with np.load(args.inputs or args.directory / "inputs.npz") as saved:
        feeds = {name: saved[name] for name in saved.files}
    ort_step, _ = _trainer(ort_api, args.directory, feeds, as_torch=False)
    our_step, our_module = _trainer(our_api, args.directory, feeds, as_torch=True)
    for _ in range(args.warmup):
        ort_step()
        our_step()
    blocks = {"ort": [], "ours": []}
    for number in range(args.rounds):
        order = (("ort", ort_step), ("ours", our_step))
        for name, step in order if number % 2 == 0 else order[::-1]:
            time.sleep(0.02)  # ORT's pool threads stop spinning before our block starts
            blocks[name].append(_block_ms(step, args.steps))
    ratios = [ours / ort for ours, ort in zip(blocks["ours"], blocks["ort"])]
    report = {
        "form": our_module._engine.train_runner.path,
        "ort_ms": round(statistics.median(blocks["ort"]), 4),
        "ours_ms": round(statistics.median(blocks["ours"]), 4),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "blocks_ms": {name: [round(value, 6) for value in values] for name, values in blocks.items()},
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps({key: value for key, value in report.items() if key != "blocks_ms"}))
    return report


if __name__ == "__main__":
    main()
