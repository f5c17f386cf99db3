"""Checkpoint load/save cost at scale: onnxruntime-training 1.19.2 vs ort_torch_compat.

    python scripts/measure_checkpoint_scale.py [--work /tmp/ckpt_scale] [--rounds 5]
        [--layers 8] [--width 4096] [--json out.json]

The model is ``layers`` x Linear(width, width) in float32 (the default, 8 x 4096, has 134M
parameters), CrossEntropy + AdamW artifacts made once by ORT's ``generate_artifacts``
under ``--work`` (never in the repository).  A checkpoint with optimizer state (weights,
biases and both AdamW moments of each: 1.6 GB at the default size) is made once by ORT
after one train step and one optimizer step.

Then, in fresh processes, rounds interleaved (round 1: ort, ours for each measurement;
round 2: ...) so machine noise hits both alike:

* ``load``: ``CheckpointState.load_checkpoint`` of that checkpoint;
* ``save``: load + ``Module`` + ``Optimizer`` + ``CheckpointState.save_checkpoint(...,
  include_optimizer_state=True)`` (the saved file is removed afterwards).

Each child reports its wall times and peak RSS (VmHWM).  Both children import numpy and
torch before the clock starts (as scripts/benchmark.py does), so the baseline memory of
an imported torch counts for both.  The report gives medians over rounds and the ratios
ours / ORT.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_IR_VERSION = 10
BACKENDS = ("ort", "ours")
KINDS = ("load", "save")


# ---- artifacts (once) -------------------------------------------------------------------------
def make_artifacts(work: pathlib.Path, layers: int, width: int, batch: int = 4) -> None:
    import numpy as np
    import onnx
    import torch
    from onnxruntime.training import artifacts

    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    example = torch.randn(batch, width)
    path = work / "model.onnx"
    torch.onnx.export(
        model,
        (example,),
        str(path),
        input_names=["input"],
        output_names=["output"],
        dynamo=False,
        opset_version=17,
        do_constant_folding=False,
    )
    del model
    proto = onnx.load(str(path))
    names = [init.name for init in proto.graph.initializer]
    artifacts.generate_artifacts(
        proto,
        requires_grad=names,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(work),
    )
    del proto
    path.unlink()
    for file in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        p = onnx.load(str(work / file))
        p.ir_version = min(p.ir_version, MAX_IR_VERSION)
        onnx.save(p, str(work / file))
    rng = np.random.default_rng(0)
    np.savez(
        work / "inputs.npz",
        input=rng.standard_normal((batch, width)).astype(np.float32),
        labels=rng.integers(0, width, size=(batch,)).astype(np.int64),
    )
    # The checkpoint with optimizer state, as ORT writes it after one step.
    subprocess.run([sys.executable, __file__, "--make-state", str(work)], check=True)


def make_state(work: pathlib.Path) -> None:
    import numpy as np
    from onnxruntime.training import api

    state = api.CheckpointState.load_checkpoint(str(work / "checkpoint"))
    module = api.Module(str(work / "training_model.onnx"), state)
    optimizer = api.Optimizer(str(work / "optimizer_model.onnx"), module)
    with np.load(work / "inputs.npz") as saved:
        feeds = {key: saved[key] for key in saved.files}
    module(*[feeds[name] for name in module.input_names()])
    optimizer.step()
    api.CheckpointState.save_checkpoint(state, str(work / "checkpoint_opt"), include_optimizer_state=True)


# ---- one measurement (child process) ------------------------------------------------------------
def _peak_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(backend: str, kind: str, work: pathlib.Path) -> dict:
    import numpy  # noqa: F401  (both backends pay for numpy and torch alike)
    import torch  # noqa: F401

    if backend == "ort":
        from onnxruntime.training import api
    else:
        from ort_torch_compat import api
    base_rss = _rss_mb()
    source = str(work / "checkpoint_opt")
    start = time.perf_counter()
    state = api.CheckpointState.load_checkpoint(source)
    load_s = time.perf_counter() - start
    result = {"load_s": load_s, "base_rss_mb": base_rss}
    if kind == "save":
        module = api.Module(str(work / "training_model.onnx"), state)
        optimizer = api.Optimizer(str(work / "optimizer_model.onnx"), module)
        target = work / f"saved_{backend}"
        begin = time.perf_counter()
        api.CheckpointState.save_checkpoint(state, str(target), include_optimizer_state=True)
        result["save_s"] = time.perf_counter() - begin
        result["total_s"] = time.perf_counter() - start
        result["saved_bytes"] = target.stat().st_size
        del optimizer, module
        for path in (target, pathlib.Path(str(target) + ".data")):
            if path.exists():
                path.unlink()
    result["peak_rss_mb"] = _peak_rss_mb()
    return result


def run_child(backend: str, kind: str, work: pathlib.Path) -> dict:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--child", backend, kind, str(work)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=environment)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return {"error": lines[-1][:300] if lines else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- driver ---------------------------------------------------------------------------------------
def summarize(results: dict) -> dict:
    summary = {}
    for kind in KINDS:
        for backend in BACKENDS:
            runs = [r for r in results[kind][backend] if "error" not in r]
            if not runs:
                continue
            summary.setdefault(kind, {})[backend] = {
                key: statistics.median(r[key] for r in runs) for key in runs[0] if isinstance(runs[0][key], float)
            }
        if len(summary.get(kind, {})) == 2:
            ort, ours = summary[kind]["ort"], summary[kind]["ours"]
            summary[kind]["ratio"] = {key: ours[key] / ort[key] for key in ours if key in ort and ort[key]}
            # Per-round ratios (same round, adjacent processes) show the spread under noise.
            pairs = list(zip(results[kind]["ort"], results[kind]["ours"]))
            keys = ("total_s", "save_s", "peak_rss_mb") if kind == "save" else ("load_s", "peak_rss_mb")
            summary[kind]["round_ratios"] = {
                key: [round(b[key] / a[key], 3) for a, b in pairs if key in a and key in b] for key in keys
            }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/ckpt_scale")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--json")
    parser.add_argument("--child", nargs=3, metavar=("BACKEND", "KIND", "WORK"), help=argparse.SUPPRESS)
    parser.add_argument("--make-state", metavar="WORK", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        backend, kind, work = args.child
        print(json.dumps(measure(backend, kind, pathlib.Path(work))))
        return
    if args.make_state:
        make_state(pathlib.Path(args.make_state))
        return
    work = pathlib.Path(args.work)
    if not (work / "checkpoint_opt").exists():
        begin = time.perf_counter()
        make_artifacts(work, args.layers, args.width)
        print(f"artifacts made in {time.perf_counter() - begin:.0f} s under {work}", file=sys.stderr)
    size = (work / "checkpoint_opt").stat().st_size
    print(f"checkpoint_opt: {size / 1e9:.2f} GB", file=sys.stderr)
    results = {kind: {backend: [] for backend in BACKENDS} for kind in args.kinds}
    for round_index in range(args.rounds):
        for kind in args.kinds:
            for backend in BACKENDS:
                result = run_child(backend, kind, work)
                results[kind][backend].append(result)
                print(f"round {round_index + 1} {kind:4} {backend:4} {json.dumps(result)}", file=sys.stderr)
    report = {"checkpoint_bytes": size, "rounds": args.rounds, "results": results, "summary": summarize(results)}
    for kind, by_backend in report["summary"].items():
        for backend, values in by_backend.items():
            print(
                f"{kind:4} {backend:12} "
                + "  ".join(f"{k}={v}" if isinstance(v, list) else f"{k}={v:.3f}" for k, v in values.items())
            )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
