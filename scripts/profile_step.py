"""Per-step CPU time of one tiny training step: onnxruntime-training vs ours (compile off).

    ORT_TORCH_COMPAT_COMPILE=eager python scripts/profile_step.py ARTIFACT_DIR [ARTIFACT_DIR ...]
        [--rounds 7] [--steps 40] [--inputs numpy|torch] [--cprofile N]

ARTIFACT_DIR holds training_model.onnx, optimizer_model.onnx and checkpoint (or the
committed real-architecture fixtures: tests/fixtures/real_arch/<case>, whose .onnx.gz files
are decompressed into a temporary directory, and whose spec.json gives the input shapes).

One step is `module(*inputs); optimizer.step(); module.lazy_reset_grad()`, as in
scripts/benchmark.py.  Both backends run in this process with one thread
(torch.set_num_threads(1), ORT intra_op_num_threads=1), measured in process CPU time
(`time.process_time`: other engineers' load on a shared machine does not count), in
interleaved rounds (ORT, ours, ORT, ours, ...); the table shows medians over rounds of the
per-step mean.  Then ours is taken apart per phase, in the same way (each phase timed on its
own over `--steps` steps, so the phases add up to a little more than the whole step):

  input    values.to_tensors + the engine's checks and feeds (`TrainingEngine._feeds`)
  forward  the train module on the feeds and parameters (`TrainingEngine._forward`)
  backward loss.backward() (after a gradient release, as on a step after a reset)
  optim    Optimizer.step()
  reset    Module.lazy_reset_grad() plus the train step's gradient bookkeeping (keep the old
           gradients for a failed step, release them, fill the ones autograd left out)
  output   values.from_tensors (detach, numpy)
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import json
import os
import pathlib
import pstats
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("ORT_TORCH_COMPAT_COMPILE", "eager")

import numpy as np  # noqa: E402  (after the environment default above)
import torch  # noqa: E402


def _unpack(directory: pathlib.Path, scratch: pathlib.Path) -> pathlib.Path:
    if not any(p.suffix == ".gz" for p in directory.iterdir()):
        return directory
    target = scratch / directory.name
    target.mkdir(exist_ok=True)
    for source in directory.iterdir():
        if source.suffix == ".gz":
            (target / source.stem).write_bytes(gzip.decompress(source.read_bytes()))
        else:
            shutil.copy(source, target / source.name)
    return target


def _checkpoint(directory: pathlib.Path) -> pathlib.Path:
    for name in ("checkpoint", "nominal_checkpoint"):
        if (directory / name).exists():
            return directory / name
    raise SystemExit(f"{directory}: no checkpoint")


def _inputs(directory: pathlib.Path, module) -> list:
    """The test scenario's first batch where there is a spec.json (ort_torch_compat/testing/scenario.py), else
    inputs from the training model's declared shapes (symbolic dims: 2)."""
    rng = np.random.default_rng(0)
    spec_path = directory / "spec.json"
    if spec_path.exists():
        from ort_torch_compat.testing.scenario import make_batch

        batch = make_batch(json.loads(spec_path.read_text()), 1, 0)
        return [np.ascontiguousarray(batch[name]) for name in module.input_names()]
    else:
        import onnx

        model = onnx.load(directory / "training_model.onnx", load_external_data=False)
        declared = {i.name: i for i in model.graph.input}
        specs = []
        for name in module.input_names():
            t = declared[name].type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            shape = [d.dim_value if d.HasField("dim_value") else 2 for d in t.shape.dim]
            specs.append(
                {
                    "name": name,
                    "shape": shape,
                    "dtype": str(dtype),
                    "kind": "int" if np.issubdtype(dtype, np.integer) else "float",
                    "high": 2,
                }
            )
    values = []
    for spec in specs:
        if spec["kind"] == "int":
            values.append(rng.integers(0, spec.get("high", 2), size=spec["shape"]).astype(spec["dtype"]))
        else:
            values.append(rng.standard_normal(spec["shape"]).astype(spec["dtype"]))
    return values


_KEEP: list = []


def _session(api, directory, threads_option):
    state = api.CheckpointState.load_checkpoint(str(_checkpoint(directory)))
    module = api.Module(str(directory / "training_model.onnx"), state, None, "cpu", threads_option)
    spec_path = directory / "spec.json"
    if spec_path.exists() and json.loads(spec_path.read_text()).get("fill"):  # nominal: fill as the tests do
        from ort_torch_compat.testing.scenario import _ortvalue, fill_values

        filled = fill_values(json.loads(spec_path.read_text()))
        _KEEP.append(filled)  # ORT's C-level value does not own the array
        module.copy_buffer_to_parameters(_ortvalue(api, filled), trainable_only=False)
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    module.train()
    return state, module, optimizer


def _per_step(fn, steps: int) -> float:
    begin = time.process_time()
    for _ in range(steps):
        fn()
    return (time.process_time() - begin) / steps


def profile(directory: pathlib.Path, rounds: int, steps: int, kind: str, cprofile: int) -> dict:
    import onnxruntime
    from onnxruntime.training import api as ort_api

    import ort_torch_compat.api as ours
    from ort_torch_compat.values import from_tensors, to_tensors

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    _, module, optimizer = _session(ours, directory, options)
    inputs = _inputs(directory, module)
    feeds_ours = inputs if kind == "numpy" else [torch.from_numpy(a) for a in inputs]
    try:  # ORT cannot train some models at all (T5's broadcast position bias): ours alone then
        _, ort_module, ort_opt = _session(ort_api, directory, options)
        ort_module(*inputs)
    except Exception as error:  # noqa: BLE001
        print(f"{directory.name}: ORT cannot run it ({str(error).splitlines()[0][:120]})", file=sys.stderr)
        ort_module = None

    def ort_step():
        if ort_module is None:
            return
        ort_module(*inputs)
        ort_opt.step()
        ort_module.lazy_reset_grad()

    def our_step():
        module(*feeds_ours)
        optimizer.step()
        module.lazy_reset_grad()

    for _ in range(5):  # warm up both (allocators, first-step work)
        ort_step()
        our_step()
    ort_times, our_times = [], []
    for _ in range(rounds):
        ort_times.append(_per_step(ort_step, steps))
        our_times.append(_per_step(our_step, steps))

    # ---- phases of ours ---------------------------------------------------------------
    engine = module._engine
    store = engine.store
    params = engine._train_params

    def phase_input():
        tensors, _ = to_tensors(feeds_ours)
        engine._feeds(tensors, engine.train_io, engine._train_batch, engine.train_strings, "train step")

    tensors, out_kind = to_tensors(feeds_ours)
    feeds = engine._feeds(tensors, engine.train_io, engine._train_batch, engine.train_strings, "train step")

    forward = getattr(engine, "_forward", None) or (lambda f: engine.train_runner.eager(*f, *params))

    def phase_forward():
        with torch.enable_grad():
            forward(feeds)

    def phase_backward_setup():
        store.release_grads()
        with torch.enable_grad():
            return forward(feeds)

    def phase_reset():  # the train step's gradient bookkeeping around a reset, without the backward
        module.lazy_reset_grad()
        previous = [tensor.grad for tensor in store.trainable]
        store.release_grads()
        for tensor, grad in zip(store.trainable, previous):
            tensor.grad = grad
        store.fill_missing_grads()

    with torch.enable_grad():
        sample_out = forward(feeds)

    def phase_output():
        from_tensors([o.detach() for o in sample_out], out_kind)

    phases = {name: [] for name in ("input", "forward", "backward", "optim", "reset", "output")}
    for _ in range(rounds):
        phases["input"].append(_per_step(phase_input, steps))
        phases["forward"].append(_per_step(phase_forward, steps))
        spent = 0.0
        for _ in range(steps):
            outputs = phase_backward_setup()
            begin = time.process_time()
            outputs[0].backward()
            spent += time.process_time() - begin
        store.fill_missing_grads()
        phases["backward"].append(spent / steps)
        phases["optim"].append(_per_step(optimizer.step, steps))
        phases["reset"].append(_per_step(phase_reset, steps))
        phases["output"].append(_per_step(phase_output, steps))

    if cprofile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(cprofile):
            our_step()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)

    ort_ms = statistics.median(ort_times) * 1e3 if ort_module is not None else float("nan")
    our_ms = statistics.median(our_times) * 1e3
    return {
        "model": directory.name,
        "ort_ms": ort_ms,
        "ours_ms": our_ms,
        "ratio": our_ms / ort_ms,
        **{f"{k}_ms": statistics.median(v) * 1e3 for k, v in phases.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=pathlib.Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--inputs", choices=("numpy", "torch"), default="numpy")
    parser.add_argument("--cprofile", type=int, default=0, help="also cProfile this many steps of ours")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    header = (
        f"{'model':38s} {'ORT ms':>7s} {'ours ms':>7s} {'ratio':>6s} | {'input':>6s} {'fwd':>6s} "
        f"{'bwd':>6s} {'optim':>6s} {'reset':>6s} {'output':>6s}"
    )
    print(header)
    with tempfile.TemporaryDirectory() as scratch:
        for directory in args.dirs:
            row = profile(
                _unpack(directory, pathlib.Path(scratch)), args.rounds, args.steps, args.inputs, args.cprofile
            )
            rows.append(row)
            print(
                f"{row['model']:38s} {row['ort_ms']:7.3f} {row['ours_ms']:7.3f} {row['ratio']:6.2f} | "
                f"{row['input_ms']:6.3f} {row['forward_ms']:6.3f} {row['backward_ms']:6.3f} "
                f"{row['optim_ms']:6.3f} {row['reset_ms']:6.3f} {row['output_ms']:6.3f}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
