"""Step-time benchmark: onnxruntime-training 1.19.2 vs ort_torch_compat vs eager PyTorch.

    python scripts/benchmark.py [--rounds 5] [--steps 30] [--device cpu|cuda] [--json out.json]

For each model (MLP 784-1024-1024-10 @128, CNN Conv/BN/MaxPool on 3x32x32 @32, 2-layer
transformer encoder d=256/4 heads/seq 64 @16; all CrossEntropy + AdamW artifacts made by
generate_artifacts), one training step is `module(x, y); optimizer.step();
module.lazy_reset_grad()` (eager: forward, loss, backward, torch.optim.AdamW step,
zero_grad).  Every (backend, model) measurement runs in a fresh process; rounds are
interleaved (round 1: ort, ours, eager; round 2: ...) so machine noise hits all backends
alike, and the table reports medians over rounds of the per-round median step time, plus
setup time (load checkpoint + build Module + Optimizer), the library's import time (after
`import torch`) and peak RSS.
Artifacts are generated once into --work (needs onnxruntime-training to generate).
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
BACKENDS = ("ort", "ours", "eager")
MAX_IR_VERSION = 10


# ---- models -------------------------------------------------------------------------------
def build_model(name: str):
    """(model, example input, classes); parameters get a little noise so no two are equal:
    the ONNX exporter would merge identical initializers (e.g. the deep-copied layers of a
    TransformerEncoder) into one tied weight, and ORT would then train a different model."""
    import torch

    model, example, classes = _base_model(name)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 1e-3)
    return model, example, classes


def _base_model(name: str):
    import torch

    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                    torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        return model, torch.randn(128, 784), 10
    if name == "cnn":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1, bias=False), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 10))
        return model, torch.randn(32, 3, 32, 32), 10
    if name == "transformer":
        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
                self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                self.head = torch.nn.Linear(256, 10)

            def forward(self, x):
                return self.head(self.encoder(x).mean(dim=1))

        return Encoder(), torch.randn(16, 64, 256), 10
    raise ValueError(name)


def make_artifacts(name: str, directory: pathlib.Path) -> None:
    import onnx
    import torch
    from onnxruntime.training import artifacts

    sys.path.insert(0, str(ROOT / "scripts"))
    from prepare_for_artifacts import prepare_eval_model, prepare_model

    model, example, _ = build_model(name)
    training = torch.onnx.TrainingMode.TRAINING if name == "cnn" else torch.onnx.TrainingMode.EVAL
    model.train(name == "cnn")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.onnx"
    torch.onnx.export(model, (example,), str(path), input_names=["input"], output_names=["output"], dynamo=False,
                      opset_version=17, training=training, do_constant_folding=False)
    proto = prepare_model(onnx.load(str(path)))
    names = [init.name for init in proto.graph.initializer]
    frozen = [n for n in names if "running_" in n or "num_batches" in n]
    trainable = [n for n in names if n not in frozen]
    artifacts.generate_artifacts(proto, requires_grad=trainable, frozen_params=frozen,
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=str(directory))
    for file in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        p = onnx.load(str(directory / file))
        p = prepare_eval_model(p) if file == "eval_model.onnx" else p  # ORT refuses 3-output eval BN
        p.ir_version = min(p.ir_version, MAX_IR_VERSION)
        onnx.save(p, str(directory / file))
    torch.save(model.state_dict(), directory / "eager_state.pt")


# ---- one measurement (child process) --------------------------------------------------------
def measure(backend: str, name: str, directory: pathlib.Path, steps: int, warmup: int, device: str) -> dict:
    import resource

    import numpy as np
    import torch

    _, example, classes = build_model(name)
    rng = np.random.default_rng(0)
    x = example.numpy()
    y = rng.integers(0, classes, size=(x.shape[0],)).astype(np.int64)
    begin_import = time.perf_counter()
    if backend == "ort":
        from onnxruntime.training import api
    elif backend == "ours":
        from ort_torch_compat import api
    import_s = time.perf_counter() - begin_import  # torch itself is already imported by all
    start = time.perf_counter()  # setup = load + build, imports excluded (they are process start-up)
    if backend == "eager":
        model, _, _ = build_model(name)
        model.load_state_dict(torch.load(directory / "eager_state.pt", weights_only=True))
        model.to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6, weight_decay=0.0)
        xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)

        def step():
            loss = torch.nn.functional.cross_entropy(model(xt), yt)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    else:
        if backend == "ort":
            xt, yt = x, y
        else:  # torch tensors on the device: the zero-copy path (numpy inputs also work)
            xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
        module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"),
                            device=device)
        optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)

        def step():
            module(xt, yt)
            optimizer.step()
            module.lazy_reset_grad()
    setup = time.perf_counter() - start
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - begin)
    return {"step_ms": 1000 * statistics.median(times), "setup_s": setup, "import_s": import_s,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# ---- driver ---------------------------------------------------------------------------------
def run_child(backend: str, name: str, directory: pathlib.Path, args) -> dict:
    command = [sys.executable, __file__, "--child", backend, name, str(directory), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--device", args.device]
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "transformer"])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--work", type=pathlib.Path, default=ROOT / "bench_out")
    parser.add_argument("--json", type=pathlib.Path, default=None)
    parser.add_argument("--child", nargs=3, metavar=("BACKEND", "MODEL", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        backend, name, directory = args.child
        print(json.dumps(measure(backend, name, pathlib.Path(directory), args.steps, args.warmup, args.device)))
        return
    backends = [b for b in args.backends if not (b == "ort" and args.device != "cpu")]
    results: dict = {m: {b: [] for b in backends} for m in args.models}
    for name in args.models:
        directory = args.work / name
        if not (directory / "checkpoint").exists():
            make_artifacts(name, directory)
    for round_index in range(args.rounds):
        for name in args.models:
            for backend in backends:
                results[name][backend].append(run_child(backend, name, args.work / name, args))
        print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)

    summary = {}
    for name in args.models:
        summary[name] = {}
        for backend in backends:
            ok = [r for r in results[name][backend] if "error" not in r]
            if not ok:
                summary[name][backend] = {"error": results[name][backend][0]["error"]}
                continue
            summary[name][backend] = {key: statistics.median(r[key] for r in ok) for key in ok[0]}
    header = (f"{'model':<12}{'backend':<8}{'step ms':>10}{'setup s':>10}{'import s':>10}{'peak RSS MB':>13}"
              f"{'vs ort':>9}{'vs eager':>10}")
    lines = [header, "-" * len(header)]
    for name in args.models:
        for backend in backends:
            row = summary[name][backend]
            if "error" in row:
                lines.append(f"{name:<12}{backend:<8}  error: {row['error']}")
                continue
            ratios = []
            for ref in ("ort", "eager"):
                ref_row = summary[name].get(ref, {})
                ratios.append(f"{row['step_ms'] / ref_row['step_ms']:.2f}" if "step_ms" in ref_row else "-")
            lines.append(f"{name:<12}{backend:<8}{row['step_ms']:>10.2f}{row['setup_s']:>10.2f}{row['import_s']:>10.2f}"
                         f"{row['peak_rss_mb']:>13.0f}{ratios[0]:>9}{ratios[1]:>10}")
    table = "\n".join(lines)
    print(table)
    if args.json:
        import platform

        import torch
        machine = {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                   "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "device": args.device}
        args.json.write_text(json.dumps({"machine": machine, "rounds": args.rounds, "steps": args.steps,
                                         "summary": summary, "raw": results, "table": table}, indent=1))


if __name__ == "__main__":
    main()
