"""Step-time benchmark: onnxruntime-training 1.19.2 vs ort_torch_compat vs eager PyTorch.

    python scripts/benchmark.py [--models mlp cnn ... | --models all] [--background 0 2]
        [--size bench|tiny] [--rounds 5] [--steps 30|1000] [--warmup 10|100] [--threads N]
        [--device cpu|cuda] [--fresh-seconds 120] [--json out.json]
    python scripts/benchmark.py --table out.json
    python scripts/measure_readme_figures.py --write --skip-quick --benchmark-json out.json   # docs/performance.md's table

Sizes (`--size`): "bench" (the default) and "tiny", on-device sizes: the real
architectures at the size of their test suite (batch 2-4, sequence 8, images 64; the
hand-made models at batch 4).

Models: `mlp`, `cnn`, `transformer` (hand-made, below) and the real architectures of
ort_torch_compat/testing/real_arch_models.py at their "bench" size (`mobilenet_v2` with a frozen backbone,
`resnet18`, `bert`, `gpt2`, `vit`, `lstm`, `lora`, ...), all CrossEntropy + AdamW
artifacts made by generate_artifacts (opset 17).  One training step is
`module(x, y); optimizer.step(); module.lazy_reset_grad()` (eager: forward, loss,
backward, fused torch.optim.AdamW step, zero_grad).

Load (`--background N`): N busy processes (one spinning Python loop each) run during the
measurements, started before and stopped after each load level: the machine a desktop
app, a federated-learning client or a CI runner shares with the training.

Method: every (load, model, backend) measurement runs in a fresh process; rounds are
interleaved (round 1: ort, ours, eager for every model; round 2: ...) so machine noise hits
all backends alike; the table reports medians over rounds of the per-round median step
time (wall and CPU time), setup (load checkpoint + build Module and Optimizer), the first
step (for ours: loads the compiled step from the cache), the library's import time (after
`import torch`) and peak RSS, and the ratios to ORT and eager.  Before the rounds, one
extra process per model compiles our train step into the benchmark's own cache
(`--work`/cache, reported as "compile s", the cold compile time), so the rounds measure a
warm start, as every run after the first one is.

First seconds (`--fresh-seconds S`, ORT and ours only): per round, a fresh process per
backend runs the training loop with default settings and an empty compile cache until S
seconds after the process was started (interpreter start, imports and setup counted);
reported: steps completed, the median and the longest step after the first, the steps over
twice that median, and for ours the step at which the compiled step took over (the compiler
runs in the background), the median step before it (traced steps) and the steps over twice
the median from it on (where a stall of the loop would show); for every backend, what those
steps spent most of their time on (on a CPU, queued for one, blocked, other) and the parts
of the longest step (ort_torch_compat/testing/step_accounting.py: about 1 us a step for
reading the thread's scheduler statistics, paid by every backend).  The compile cache starts
empty; with `--first-on-machine` TorchInductor's cache (its probes of the CPU's vector
instructions, its precompiled headers) does too, as on a machine that never compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import time

from ort_torch_compat.testing.benchmark_report import conditions, fresh_table, table, window_statistics
from ort_torch_compat.testing.step_accounting import StepClock

ROOT = pathlib.Path(__file__).resolve().parent.parent
BACKENDS = ("ort", "ours", "eager")
# also measurable (--backends): "compile", the hand-written model under torch.compile (default
# mode); "ours-off", ours with compilation and CUDA graphs off (CPU steps traced); "ours-eager",
# ours with every step through the converted module and autograd
EXTRA_BACKENDS = ("compile", "ours-off", "ours-eager")
HAND_WRITTEN = ("eager", "compile")
HAND_MADE = ("mlp", "cnn", "transformer")
ZOO_DEFAULT = ("mobilenet_v2", "resnet18", "bert", "gpt2", "vit", "lstm", "lora")
MAX_IR_VERSION = 10
SIZES = ("bench", "tiny", "large")
# tiny: the real-architecture suite's sizes; large: the GPU's compute-bound size (Hugging Face recipes)
_RECIPE_SIZE = {"bench": "bench", "tiny": "test", "large": "large"}


# ---- models -------------------------------------------------------------------------------
def _hand_made(name: str, size: str = "bench"):
    """(model, {input name: tensor}, classes); parameters get a little noise so no two are
    equal: the ONNX exporter would merge identical initializers (e.g. the deep-copied layers
    of a TransformerEncoder) into one tied weight, and ORT would then train another model."""
    import torch

    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 10),
        )
        example = torch.randn(128 if size == "bench" else 4, 784)
    elif name == "cnn":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(32),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(64),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(64 * 8 * 8, 10),
        )
        example = torch.randn(32 if size == "bench" else 4, 3, 32, 32)
    elif name == "transformer":

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
                self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                self.head = torch.nn.Linear(256, 10)

            def forward(self, x):
                return self.head(self.encoder(x).mean(dim=1))

        model, example = Encoder(), torch.randn(*((16, 64) if size == "bench" else (4, 16)), 256)
    else:
        raise ValueError(name)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 1e-3)
    model.train(name == "cnn")
    return model, {"input": example}, 10


class Workload:
    """A benchmark model: the torch model (eager), its inputs and how to make artifacts."""

    def __init__(self, name: str, size: str = "bench"):
        self.name = name
        self.size = size
        if name in HAND_MADE:
            self.model, self.inputs, self.classes = _hand_made(name, size)
            self.frozen = lambda param: False
        else:
            from ort_torch_compat.testing import real_arch_models as zoo

            built = zoo.RECIPES[name].build(_RECIPE_SIZE[size])
            if built.loss != "ce":
                raise ValueError(f"{name}: the benchmark times CrossEntropy models, this one uses {built.loss}")
            self.model, self.classes, self.frozen = built.model, built.classes, built.frozen
            self.inputs = {input_name: tensor for input_name, tensor, *_ in built.inputs}
            self.model.train()

    def make_artifacts(self, directory: pathlib.Path) -> None:
        if self.name in HAND_MADE:
            _hand_made_artifacts(self, directory)
        else:
            from ort_torch_compat.testing import real_arch_artifacts

            generator = "ort" if ort_generator_available() else "ours"
            real_arch_artifacts.make_artifacts(
                self.name,
                directory,
                real_arch_artifacts.Variant(opset=17, generator=generator),
                size=_RECIPE_SIZE[self.size],
            )

    def labels(self, directory: pathlib.Path):
        """Seeded labels shaped like the training model's `labels` input."""
        import numpy as np
        import onnx

        model = onnx.load(str(directory / "training_model.onnx"), load_external_data=False)
        spec = next(i for i in model.graph.input if i.name == "labels")
        shape = [d.dim_value for d in spec.type.tensor_type.shape.dim]
        return np.random.default_rng(0).integers(0, self.classes, size=shape).astype(np.int64)


def ort_generator_available() -> bool:
    """Whether onnxruntime-training's generate_artifacts can make the artifacts (else ours does)."""
    try:
        from onnxruntime.training import artifacts  # noqa: F401
    except ImportError:
        return False
    return True


def _hand_made_artifacts(work: Workload, directory: pathlib.Path) -> None:
    import onnx
    import torch

    from ort_torch_compat.testing.prepare_for_artifacts import prepare_eval_model, prepare_model

    if ort_generator_available():
        from onnxruntime.training import artifacts
    else:  # Python 3.12+ or a GPU machine without onnxruntime-training: our generator
        from ort_torch_compat import artifacts

        prepare_model = prepare_eval_model = lambda proto: proto  # noqa: E731  (ours takes the export as it is)

    training = torch.onnx.TrainingMode.TRAINING if work.name == "cnn" else torch.onnx.TrainingMode.EVAL
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.onnx"
    torch.onnx.export(
        work.model,
        tuple(work.inputs.values()),
        str(path),
        input_names=list(work.inputs),
        output_names=["output"],
        dynamo=False,
        opset_version=17,
        training=training,
        do_constant_folding=False,
    )
    proto = prepare_model(onnx.load(str(path)))
    names = [init.name for init in proto.graph.initializer]
    frozen = [n for n in names if "running_" in n or "num_batches" in n]
    artifacts.generate_artifacts(
        proto,
        requires_grad=[n for n in names if n not in frozen],
        frozen_params=frozen,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(directory),
    )
    for file in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        p = onnx.load(str(directory / file))
        p = prepare_eval_model(p) if file == "eval_model.onnx" else p  # ORT refuses 3-output eval BN
        p.ir_version = min(p.ir_version, MAX_IR_VERSION)
        onnx.save(p, str(directory / file))


# ---- one measurement (child process) --------------------------------------------------------
def measure(
    backend: str,
    name: str,
    directory: pathlib.Path,
    steps: int,
    warmup: int,
    device: str,
    threads: int,
    size: str = "bench",
) -> dict:
    import numpy as np
    import torch

    if threads:
        torch.set_num_threads(threads)
    # Only the eager backend builds the torch model (transformers and torchvision are not
    # imported by the others: they would count in their memory); all read the same inputs.
    work = Workload(name, size) if backend in HAND_WRITTEN else None
    with np.load(directory / "inputs.npz") as saved:
        feeds = {key: saved[key] for key in saved.files}
    begin_import = time.perf_counter()
    if backend == "ort":
        import onnxruntime
        from onnxruntime.training import api
    elif backend == "ours":
        from ort_torch_compat import api
    import_s = time.perf_counter() - begin_import  # torch itself is already imported by all
    start = time.perf_counter()  # setup = load + build, imports excluded (they are process start-up)
    extra = {}
    if backend in HAND_WRITTEN:
        if device.startswith("cuda"):  # float32 as ours runs it (cuDNN convolutions default to TF32)
            from ort_torch_compat.engine.precision import tf32_scope

            tf32_scope(False).__enter__()
        model = work.model.to(device)
        if backend == "compile":
            model = torch.compile(model)
        for param_name, param in model.named_parameters():
            param.requires_grad_(not work.frozen(param_name))
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-3, eps=1e-6, weight_decay=0.0, fused=True)
        tensors = [torch.from_numpy(feeds[key]).to(device) for key in feeds if key != "labels"]
        labels = torch.from_numpy(feeds["labels"]).to(device)

        def step():
            loss = torch.nn.functional.cross_entropy(model(*tensors), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    else:
        state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
        if backend == "ort":
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = threads
            module = api.Module(str(directory / "training_model.onnx"), state, session_options=options)
            values = [feeds[key] for key in module.input_names()]
        else:  # torch tensors on the device: the zero-copy path (numpy inputs also work)
            module = api.Module(str(directory / "training_model.onnx"), state, device=device)
            values = [torch.from_numpy(feeds[key]).to(device) for key in module.input_names()]
        optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)

        def step():
            module(*values)
            optimizer.step()
            module.lazy_reset_grad()

    setup = time.perf_counter() - start
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    begin = time.perf_counter()
    step()
    sync()
    first_ms = 1000 * (time.perf_counter() - begin)
    if backend == "ours":
        extra = {"compile_s": module._engine.train_runner.compile_seconds}
    for _ in range(warmup):
        step()
    sync()
    wall, cpu = [], []
    for _ in range(steps):
        begin, begin_cpu = time.perf_counter(), time.process_time()
        step()
        sync()
        wall.append(time.perf_counter() - begin)
        cpu.append(time.process_time() - begin_cpu)
    if backend == "ours":  # after the steps: a trial (compiled.py) decides within the warm-up
        runner = module._engine.train_runner
        extra.update(compiled=runner.path == "compiled", step_form=_step_form(runner))
    if backend == "ours" and module._engine._graphs is not None:  # after the steps: replaying from step 2
        extra.update(cuda_graphs=module._engine._graphs.replaying, graph_refusals=module._engine._graphs.refusals)
    return {
        "step_ms": 1000 * statistics.median(wall),
        "cpu_ms": 1000 * statistics.median(cpu),
        "setup_s": setup,
        "first_ms": first_ms,
        "import_s": import_s,
        "peak_rss_mb": _peak_rss_mb(),
        **extra,
    }


def measure_window(backend: str, directory: pathlib.Path, started: float, seconds: float) -> dict:
    """The training loop of a fresh process with default settings until `seconds` after
    `started` (the driver's clock when it started this process)."""
    import numpy as np

    if backend == "ort":
        from onnxruntime.training import api
    else:
        import torch

        from ort_torch_compat import api
    with np.load(directory / "inputs.npz") as saved:
        feeds = {key: saved[key] for key in saved.files}
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state)
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    values = [feeds[key] if backend == "ort" else torch.from_numpy(feeds[key]) for key in module.input_names()]
    clock, switch, switch_s = StepClock(), None, None  # step times, and where each step's time went
    times = clock.seconds
    deadline = started + seconds
    first_at = time.time() - started
    while True:
        clock.start()
        module(*values)
        optimizer.step()
        module.lazy_reset_grad()
        clock.stop()
        if switch is None and backend == "ours" and module._engine.train_runner.path == "compiled":
            switch, switch_s = len(times), time.time() - started
        if time.time() >= deadline:
            break
    clock.close()
    return {"ready_s": first_at, "switch_s": switch_s, **window_statistics(times, switch, clock)}


def _peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM (getrusage's ru_maxrss starts from the
    parent's peak, which is the driver's, since Linux keeps it across fork and exec)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- driver ---------------------------------------------------------------------------------
def run_child(
    backend: str, name: str, directory: pathlib.Path, args, environment: dict, steps=None, window: bool = False
) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        backend,
        name,
        str(directory),
        "--steps",
        str(steps if steps is not None else args.steps),
        "--warmup",
        str(args.warmup),
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        "--size",
        args.size,
    ]
    if window:
        command += ["--window-start", repr(time.time()), "--fresh-seconds", str(args.fresh_seconds)]
    if backend in ("ours-off", "ours-eager"):  # ours, neither compiled nor replayed as CUDA graphs
        command[3] = "ours"
        environment = dict(
            environment, ORT_TORCH_COMPAT_COMPILE=backend.split("-")[1], ORT_TORCH_COMPAT_CUDA_GRAPHS="0"
        )
    out = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=environment)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return {"error": lines[-1][:300] if lines else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


class Background:
    """N busy processes (spinning Python loops) for the duration of a `with` block."""

    def __init__(self, count: int):
        self.count = count
        self.processes = []

    def __enter__(self):
        loop = "while True:\n    pass\n"
        self.processes = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(self.count)]
        time.sleep(1.0 if self.count else 0.0)  # let the scheduler see them before the first measurement
        return self

    def __exit__(self, *exc):
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait()


def summarize(results: dict) -> dict:
    summary: dict = {}
    for load, models in results.items():
        for name, backends in models.items():
            for backend, runs in backends.items():
                ok = [r for r in runs if "error" not in r]
                if not ok:
                    row = {"error": runs[0]["error"] if runs else "not run"}
                else:
                    numeric = {  # over every round: a round without a switch has no switch_s
                        k: None
                        for r in ok
                        for k, v in r.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)
                    }
                    row = {
                        key: statistics.median(r[key] for r in ok if r.get(key) is not None)
                        for key in numeric
                        if any(r.get(key) is not None for r in ok)
                    }
                    if "compiled" in ok[0]:
                        row["compiled"] = all(r.get("compiled") for r in ok)
                    if "step_form" in ok[0]:  # per round: compiled, traced, traced on Static Runtime, eager
                        row["step_forms"] = [r.get("step_form") for r in ok]
                    if "cuda_graphs" in ok[0]:
                        row["cuda_graphs"] = all(r.get("cuda_graphs") for r in ok)
                        row["graph_refusals"] = sorted({reason for r in ok for reason in r.get("graph_refusals", [])})
                summary.setdefault(load, {}).setdefault(name, {})[backend] = row
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(HAND_MADE + ZOO_DEFAULT),
        help="model names, or 'all' (every recipe ORT can train)",
    )
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument("--background", nargs="+", type=int, default=[0], help="load levels (busy processes)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None, help="measured steps (default: 30; tiny: 1000)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: 10; tiny: 100)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads for every backend (0: defaults)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=SIZES, default="bench")
    parser.add_argument(
        "--fresh-seconds",
        type=float,
        default=0,
        help="also run the first-seconds axis: steps in this many seconds of a fresh process",
    )
    parser.add_argument(
        "--first-on-machine",
        action="store_true",
        help="first-seconds axis: start TorchInductor's cache empty too, as on a machine that never compiled",
    )
    parser.add_argument("--window-start", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=pathlib.Path, default=ROOT / "bench_out")
    parser.add_argument("--json", type=pathlib.Path, default=None)
    parser.add_argument("--table", type=pathlib.Path, default=None, help="print the table of a JSON report")
    parser.add_argument("--child", nargs=3, metavar=("BACKEND", "MODEL", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    # At tiny sizes a step is 0.1-1 ms: 30 steps are a few ms of measurement, and the first
    # hundred steps still move (caches, the thread choice); measure a second of steady state.
    tiny = args.size == "tiny"
    args.steps = args.steps if args.steps is not None else (1000 if tiny else 30)
    args.warmup = args.warmup if args.warmup is not None else (100 if tiny else 10)
    if args.child:
        backend, name, directory = args.child
        if args.window_start is not None:
            print(json.dumps(measure_window(backend, pathlib.Path(directory), args.window_start, args.fresh_seconds)))
            return
        print(
            json.dumps(
                measure(
                    backend,
                    name,
                    pathlib.Path(directory),
                    args.steps,
                    args.warmup,
                    args.device,
                    args.threads,
                    args.size,
                )
            )
        )
        return
    if args.table:
        report = json.loads(args.table.read_text())
        print(conditions(report) + "\n" + table(report))
        if "fresh_summary" in report:
            print(fresh_table(report))
        return
    if args.models == ["all"]:
        from ort_torch_compat.testing import real_arch_models as zoo

        args.models = list(HAND_MADE) + [name for name, recipe in zoo.RECIPES.items() if recipe.ort_trains]
    import numpy as np

    unknown = sorted(set(args.backends) - set(BACKENDS + EXTRA_BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {unknown}; choose from {BACKENDS + EXTRA_BACKENDS}")
    backends = [b for b in args.backends if not (b == "ort" and args.device != "cpu")]
    environment = dict(os.environ, ORT_TORCH_COMPAT_CACHE_DIR=str(args.work / "cache"))
    work_dirs = {name: args.work / (name if args.size == "bench" else f"{name}-{args.size}") for name in args.models}
    for name in args.models:
        directory = work_dirs[name]
        if not (directory / "checkpoint").exists() or not (directory / "inputs.npz").exists():
            work = Workload(name, args.size)
            if not (directory / "checkpoint").exists():
                work.make_artifacts(directory)
            feeds = {key: tensor.numpy() for key, tensor in work.inputs.items()}
            np.savez(directory / "inputs.npz", **feeds, labels=work.labels(directory))
    compile_report = {}
    if "ours" in backends and args.device == "cpu":  # a cold compile per model (CPU steps compile):
        # reported, and warms the cache for the rounds
        for name in args.models:
            cold = run_child(
                "ours", name, work_dirs[name], args, dict(environment, ORT_TORCH_COMPAT_COMPILE="on"), steps=1
            )
            compile_report[name] = {
                "compile_s": cold.get("compile_s"),
                "compiled": cold.get("compiled"),
                "error": cold.get("error"),
            }
            print(f"{name}: cold compile {compile_report[name]}", file=sys.stderr)
    results: dict = {}
    fresh: dict = {}
    for load in args.background:
        results[str(load)] = {m: {b: [] for b in backends} for m in args.models}
        fresh[str(load)] = {m: {b: [] for b in backends if b in ("ort", "ours")} for m in args.models}
        with Background(load):
            for round_index in range(args.rounds):
                for name in args.models:
                    for backend in backends:
                        results[str(load)][name][backend].append(
                            run_child(backend, name, work_dirs[name], args, environment)
                        )
                    for backend in fresh[str(load)][name] if args.fresh_seconds else ():
                        cold = dict(environment, ORT_TORCH_COMPAT_CACHE_DIR=str(args.work / "cold_cache"))
                        if args.first_on_machine:  # TorchInductor's own cache too: its checks of
                            # the CPU's vector instructions and its precompiled headers
                            cold["TORCHINDUCTOR_CACHE_DIR"] = str(args.work / "cold_inductor_cache")
                        for directory in ("cold_cache", "cold_inductor_cache"):
                            shutil.rmtree(args.work / directory, ignore_errors=True)
                        fresh[str(load)][name][backend].append(
                            run_child(backend, name, work_dirs[name], args, cold, window=True)
                        )
                print(f"load {load}: round {round_index + 1}/{args.rounds} done", file=sys.stderr)
    machine = {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu": _cpu_description(),
        "cpus": os.cpu_count(),
        "torch": _torch_version(),
        "threads": args.threads,
        "device": args.device,
        "gpu": _gpu_name(args.device),
        "generator": "onnxruntime-training" if ort_generator_available() else "ort_torch_compat",
    }
    report = {
        "machine": machine,
        "size": args.size,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "compile": compile_report,
        "summary": summarize(results),
        "raw": results,
    }
    if args.fresh_seconds:
        report.update(
            fresh_seconds=args.fresh_seconds,
            fresh_first_on_machine=args.first_on_machine,
            fresh_summary=summarize(fresh),
            fresh_raw=fresh,
        )
    print(conditions(report) + "\n" + table(report))
    if args.fresh_seconds:
        print(fresh_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def _gpu_name(device: str):
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def _step_form(runner) -> str:
    """Which form ran the measured train steps: "compiled", "traced" (TorchScript's
    interpreter), "static" (traced, on Static Runtime) or "eager"."""
    if runner.path != "traced":
        return runner.path
    return "static" if any(step is not None and step.static for step in runner._traced.values()) else "traced"


def _cpu_description() -> str:
    """The CPU's model name and last-level cache size from /proc/cpuinfo (platform.processor()
    is empty on Linux): shared machines differ by host, and ratios to ORT with them."""
    try:
        lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return f"{fields.get('model name', platform.machine())}, cache {fields.get('cache size', '?')}"


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main()
