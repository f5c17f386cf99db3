"""Record the real-architecture fixtures: ORT-generated artifacts of the zoo
(ort_torch_compat/testing/real_arch_models.py), replayed through ort_torch_compat/testing/scenario.py with onnxruntime-training
1.19.2, with a float64 replay of the same artifacts, and (where ORT cannot train) a float64
eager-torch replay of the same torch model.

Per case, ``tests/fixtures/real_arch/<case>/`` gets:

- ``training_model.onnx.gz``, ``eval_model.onnx.gz``, ``optimizer_model.onnx.gz``: the
  artifacts as generate_artifacts wrote them (IR version lowered to 10, eval-model
  BatchNorm outputs pruned: see scripts/prepare_for_artifacts.py), gzip-compressed;
- ``nominal_checkpoint``: names, shapes and dtypes only (no weights); the scenario fills the
  parameters with ``ort_torch_compat.testing.scenario.fill_values`` (a fixed integer-hash rule) through
  ``copy_buffer_to_parameters(buffer, trainable_only=False)``, on every backend;
- ``spec.json``: the scenario spec (inputs, parameters, fill rule, lr, steps), the variant,
  which anchor the case is compared with, and whether it is well conditioned;
- ``expected.npz``: condensed records (ort_torch_compat/testing/parity_rule.py; ``pack``ed, the part
  ``for_fixture`` keeps) of the ``anchor`` (ORT, or the eager replay where ORT cannot
  train), of ``f64`` (our engine on a float64 copy of the artifacts,
  ort_torch_compat/testing/float64_replay.py), for cases that are not well conditioned of ``perturbed1..3``
  (the float64 replay from initial parameters moved by 16 float32 ulps: how far rounding
  alone carries a trajectory), and where ORT's step 1 is itself off the float64 replay,
  ``eager_step1`` (the eager replay's step 1, a second independent step-1 reference).

Eval-mode exports of BatchNorm models: ORT 1.19.2 writes the running-stat update into
whatever the running-stat input aliases, here the BatchNorm weight and bias (the exporter
de-duplicated the equal-valued initializers into ``Identity`` nodes), so a train step changes
weights.  We never write there.  The anchor for those cases is ORT on the same artifacts with
each such input routed through ``Mul(x, 1)`` (so ORT's write lands in a scratch buffer); the
measured quirk is stored in spec.json (``ort_quirk``).

``summary.json`` collects one line per case (the parity verdict under the rule, as our engine
gives it at recording time, losses, timings): ``scripts/real_arch_table.py`` turns it into the
README table.

    python scripts/make_real_arch_reference.py [--matrix committed|full] [--only GLOB,...]
        [--out tests/fixtures/real_arch] [--jobs 1] [--list]

Needs onnxruntime-training 1.19.2, torchvision and transformers (``pip install -e ".[ort,zoo]"``).
Each case runs in its own process: onnxblock names loss outputs with a process-global counter.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import gzip
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from typing import Any, Dict, List, Optional

from ort_torch_compat.testing import REPO
from ort_torch_compat.testing import real_arch_artifacts as arts
from ort_torch_compat.testing import real_arch_models as zoo

DEFAULT_OUT = REPO / "tests" / "fixtures" / "real_arch"
LR = {"adamw": 1e-3, "sgd": 1e-2}
STEPS, ACCUMULATE_STEP = 5, 2
PERTURBATION_SEEDS = (1, 2, 3)
BN_RECIPES = ("mobilenet_v2", "resnet18", "efficientnet_b0", "unet")
MODEL_FILES = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx")


@dataclasses.dataclass(frozen=True)
class Case:
    recipe: str
    variant: arts.Variant

    @property
    def name(self) -> str:
        return f"{self.recipe}_{self.variant.tag}"


def full_matrix() -> List[Case]:
    """Every recipe at both opsets, both export modes, both optimizers; running stats as frozen
    params and as initializers where the model has any."""
    cases = []
    for recipe in zoo.RECIPES:
        for opset in (14, 17):
            for export in ("train", "eval"):
                for stats in ("frozen", "initializer") if recipe in BN_RECIPES else ("frozen",):
                    for optimizer in ("adamw", "sgd"):
                        cases.append(Case(recipe, arts.Variant(opset, export, stats, optimizer)))
    return cases


def committed_matrix() -> List[Case]:
    """The CI subset: every recipe at both opsets (train export, frozen stats, AdamW); SGD on one
    model per family; the eval-mode export of the torchvision BatchNorm models (de-duplicated
    running stats; both opsets for the cheapest) and of the transformers whose eval graphs
    differ; running stats left as initializers on three BatchNorm models (efficientnet_b0's
    would add half a megabyte of initializers to the fixtures)."""
    cases = [Case(r, arts.Variant(opset)) for r in zoo.RECIPES for opset in (14, 17)]
    cases += [Case(r, arts.Variant(17, optimizer="sgd")) for r in ("resnet18", "bert", "llama", "lstm", "unet")]
    cases += [Case("mobilenet_v2", arts.Variant(opset, export="eval")) for opset in (14, 17)]
    cases += [Case(r, arts.Variant(17, export="eval")) for r in ("resnet18", "efficientnet_b0")]
    cases += [Case(r, arts.Variant(17, export="eval")) for r in ("gpt2", "distilbert", "vit")]
    cases += [Case(r, arts.Variant(17, stats="initializer")) for r in ("mobilenet_v2", "resnet18", "unet")]
    return cases


def select(cases: List[Case], only: Optional[str]) -> List[Case]:
    if not only:
        return cases
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    return [c for c in cases if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]


# --------------------------------------------------------------------------- spec
def _fill_init(checkpoint: pathlib.Path, names: List[str]) -> Dict[str, List[float]]:
    """[center, spread] per parameter from the freshly initialised model: a uniform draw with
    the real tensor's mean and standard deviation; constant tensors (BatchNorm/LayerNorm
    weights and biases, running stats) get a spread of 10% of their magnitude (at least 0.01)."""
    import numpy as np

    from ort_torch_compat.api import CheckpointState

    state = CheckpointState.load_checkpoint(checkpoint)
    init = {}
    for name in names:
        values = state.parameters[name].data.astype(np.float64)
        center, std = float(values.mean()), float(values.std())
        spread = std * 3**0.5 if std > 1e-12 else 0.1 * max(abs(center), 0.1)
        init[name] = [float(f"{center:.8g}"), float(f"{spread:.8g}")]
    return init


def _user_inputs(model, params: set, info: Dict[str, Any]) -> List[Dict[str, Any]]:
    import onnx

    kinds = {i["name"]: i for i in info["inputs"]}
    inputs = []
    for value in model.graph.input:
        name = value.name
        if name in params or name == "lazy_reset_grad" or name.endswith("_grad.accumulation.buffer"):
            continue
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = str(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
        if name in kinds:
            kind, high = kinds[name]["kind"], kinds[name]["high"]
        elif name == "labels":
            kind, high = "int", info["classes"]
        else:
            kind, high = "normal", 0
        inputs.append({"name": name, "shape": shape, "dtype": dtype, "kind": kind, "high": high})
    return inputs


def _optimizer_attributes(path: pathlib.Path) -> Dict[str, Any]:
    import onnx

    for node in onnx.load(str(path)).graph.node:
        if node.op_type in ("AdamWOptimizer", "SGDOptimizerV2"):
            return {"op_type": node.op_type, **{a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}}
    return {}


def build_spec(case: Case, directory: pathlib.Path, info: Dict[str, Any]) -> Dict[str, Any]:
    import onnx

    train = onnx.load(str(directory / "training_model.onnx"))
    params = set(info["trainable_params"]) | set(info["frozen_params"])
    order = [v.name for v in train.graph.input if v.name in params]
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in train.graph.input if v.name in params
    }
    seed = zlib.crc32(case.name.encode()) % (2**31)
    return {
        "name": case.name,
        "recipe": case.recipe,
        "family": zoo.RECIPES[case.recipe].family,
        "variant": dataclasses.asdict(case.variant),
        "optimizer": case.variant.optimizer,
        "opset": case.variant.opset,
        "loss": info["loss"],
        "lr": LR[case.variant.optimizer],
        "seed": seed,
        "steps": STEPS,
        "accumulate_step": ACCUMULATE_STEP,
        "inputs": _user_inputs(train, params, info),
        "trainable_params": info["trainable_params"],
        "frozen_params": info["frozen_params"],
        "param_order": order,
        "param_shapes": shapes,
        "fill": {"seed": seed, "init": _fill_init(directory / "checkpoint", order)},
        "optimizer_attributes": _optimizer_attributes(directory / "optimizer_model.onnx"),
        "note": zoo.RECIPES[case.recipe].note,
    }


# --------------------------------------------------------------------------- ORT
def unowned_running_stat_inputs(model, frozen: set) -> List[tuple]:
    """(node index, input position) of training-mode BatchNorm running-stat inputs that are not
    frozen params or initializers: where ORT writes into something that is not a buffer."""
    initializers = {i.name for i in model.graph.initializer}
    found = []
    for index, node in enumerate(model.graph.node):
        if node.op_type in ("BatchNormInternal", "BatchNormalization"):
            for position in (3, 4):
                name = node.input[position] if position < len(node.input) else ""
                if name and name not in frozen and name not in initializers:
                    found.append((index, position))
    return found


def dealias(directory: pathlib.Path, frozen: set) -> int:
    """Route each unowned running-stat input through ``Mul(x, 1)`` (in the training model):
    ORT then writes its update into a scratch buffer instead of a weight.  Returns the count."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    path = directory / "training_model.onnx"
    model = onnx.load(str(path))
    sites = unowned_running_stat_inputs(model, frozen)
    if not sites:
        return 0
    model.graph.initializer.append(numpy_helper.from_array(np.ones([1], np.float32), "dealias_one"))
    inserted: Dict[int, list] = {}
    for count, (index, position) in enumerate(sites):
        node = model.graph.node[index]
        copy = f"{node.input[position]}_dealias_{count}"
        inserted.setdefault(index, []).append(
            helper.make_node("Mul", [node.input[position], "dealias_one"], [copy], name=f"dealias_{count}")
        )
        node.input[position] = copy
    nodes = []
    for index, node in enumerate(model.graph.node):
        nodes += inserted.get(index, []) + [node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(path))
    return len(sites)


def ort_quirk(directory: pathlib.Path, spec: Dict[str, Any]) -> Dict[str, Any]:
    """Measure ORT on the original artifacts: does one train step (no optimizer step) change
    parameters that are not running-stat buffers?"""
    import numpy as np
    from onnxruntime.training import api

    from ort_torch_compat.testing import scenario

    state = api.CheckpointState.load_checkpoint(str(directory / "nominal_checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    filled = scenario.fill_values(spec)  # the C-level OrtValue does not own this memory
    module.copy_buffer_to_parameters(scenario._ortvalue(api, filled), trainable_only=False)
    before = {n: np.array(state.parameters[n].data) for n in spec["param_order"]}
    batch = scenario.make_batch(spec, 1, 1)
    module.train()
    module(*[batch[i["name"]] for i in spec["inputs"]])
    changed = {n: float(np.abs(np.array(state.parameters[n].data) - v).max()) for n, v in before.items()}
    return {"changed_by_train_step": {n: c for n, c in changed.items() if c > 0 and ("running" not in n)}}


# --------------------------------------------------------------------------- eager replay
def eager_replay(case: Case, spec: Dict[str, Any], directory: pathlib.Path, out) -> None:
    """The scenario on the torch model itself, in float64, with ORT's semantics: parameters from
    the fill rule (by name), BatchNorm running stats updated with the biased batch variance and
    ONNX momentum (or, left as initializers, frozen at the exported values, which tracing the
    training-mode export already moved once), the loss block's loss, ORT's optimizer kernel."""
    import numpy as np
    import onnx
    import torch
    import torch.nn.functional as F

    from ort_torch_compat.optim import adamw_step, sgd_step
    from ort_torch_compat.testing import scenario

    built = zoo.RECIPES[case.recipe].build("test")
    model = built.model.double()
    _ort_batch_norms(model, update=case.variant.stats == "frozen")
    _float64_t5_norms(model)
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    with torch.no_grad():
        for init in onnx.load(str(directory / "eval_model.onnx")).graph.initializer:
            if init.name in tensors and init.name not in spec["param_order"]:
                tensors[init.name].copy_(torch.from_numpy(onnx.numpy_helper.to_array(init).astype(np.float64)))
    values = scenario.fill_values(spec)
    offset = 0
    with torch.no_grad():
        for name in spec["param_order"]:
            target = tensors[name]
            count = target.numel()
            target.copy_(torch.from_numpy(values[offset : offset + count].astype(np.float64)).view_as(target))
            offset += count
    trainable = [tensors[n] for n in spec["trainable_params"]]
    for name, param in model.named_parameters():
        param.requires_grad_(name in spec["trainable_params"])
    model_inputs = [i["name"] for i, _ in zip(spec["inputs"], built.inputs)]
    attrs = spec["optimizer_attributes"]
    moments = [[torch.zeros_like(p) for p in trainable] for _ in range(2)]

    def loss_of(batch):
        args = [
            torch.from_numpy(batch[n]).double() if batch[n].dtype == np.float32 else torch.from_numpy(batch[n])
            for n in model_inputs
        ]
        output = model(*args)
        if spec["loss"] == "ce":
            return F.cross_entropy(output, torch.from_numpy(batch["labels"]))
        return F.mse_loss(output, torch.from_numpy(batch["target"]).double())

    for name in spec["param_order"]:
        out[f"init/param/{name}"] = tensors[name].detach().numpy()
    for k in range(1, spec["steps"] + 1):
        model.train()
        for param in trainable:
            param.grad = None
        for j in range(1, (2 if k == spec["accumulate_step"] else 1) + 1):
            loss = loss_of(scenario.make_batch(spec, k, j))
            loss.backward()
            out[f"step{k}/call{j}/loss"] = loss.detach().numpy()
        for name, param in zip(spec["trainable_params"], trainable):
            out[f"step{k}/grad/{name}"] = param.grad.numpy()
        grads = [p.grad for p in trainable]
        if attrs["op_type"] == "SGDOptimizerV2":
            sgd_step(trainable, grads, lr=spec["lr"])
        else:
            adamw_step(
                trainable,
                grads,
                moments[0],
                moments[1],
                lr=spec["lr"],
                step=k,
                alpha=attrs["alpha"],
                beta=attrs["beta"],
                epsilon=attrs["epsilon"],
                weight_decay=attrs["weight_decay"],
                adam_mode=int(attrs["adam_mode"]),
                correct_bias=bool(attrs["correct_bias"]),
                fused=False,
            )
        for name in spec["param_order"]:
            out[f"step{k}/param/{name}"] = tensors[name].detach().numpy()
    model.eval()
    with torch.no_grad():
        out["eval/out0"] = loss_of(scenario.make_batch(spec, scenario.EVAL_SEED_KEY, 0)).numpy()


def _ort_batch_norms(model, update: bool) -> None:
    """Train-mode BatchNorm as ORT's BatchNormInternal: biased running variance.  Running stats
    left as initializers (``update=False``) are updated in the training model's own copy,
    which nothing reads: the eval model keeps the exported values."""
    import torch
    import torch.nn.functional as F

    def forward(self, x):
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        if update:
            dims = [0] + list(range(2, x.dim()))
            with torch.no_grad():
                mean, var = x.mean(dims), x.var(dims, unbiased=False)
                self.running_mean.mul_(1 - self.momentum).add_(mean, alpha=self.momentum)
                self.running_var.mul_(1 - self.momentum).add_(var, alpha=self.momentum)
        return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)

    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.forward = forward.__get__(module)


def _float64_t5_norms(model) -> None:
    """T5's RMSNorm computes its variance in float32 on purpose; the replay wants float64."""
    import torch

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for module in model.modules():
        if type(module).__name__ == "T5LayerNorm":
            module.forward = forward.__get__(module)


# --------------------------------------------------------------------------- worker
def run_case(case: Case, out_root: pathlib.Path) -> Dict[str, Any]:
    import onnx
    import onnxruntime
    import torch

    torch.set_num_threads(1)  # as tests/test_real_architectures.py runs: the same float32 rounding
    onnxruntime.set_default_logger_severity(3)
    from onnxruntime.training import api as ort_api

    import ort_torch_compat.api as ours
    from ort_torch_compat.testing import parity_rule as rule
    from ort_torch_compat.testing import scenario
    from ort_torch_compat.testing.float64_replay import FLOAT64_API
    from ort_torch_compat.testing.reference_models import save_npz

    result: Dict[str, Any] = {"case": case.name, "recipe": case.recipe, **dataclasses.asdict(case.variant)}
    stage = "generate_artifacts"
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"{case.name}_"))
    try:
        info = arts.make_artifacts(case.recipe, work, case.variant, "test", nominal=True)
        stage = "spec"
        spec = build_spec(case, work, info)
        recipe = zoo.RECIPES[case.recipe]
        frozen = set(spec["frozen_params"])
        unowned = unowned_running_stat_inputs(onnx.load(str(work / "training_model.onnx")), frozen)
        records: Dict[str, Dict[str, Any]] = {}
        timings: Dict[str, float] = {}

        if recipe.ort_trains:
            stage = "ORT scenario"
            anchor_dir = work
            if unowned:
                spec["ort_quirk"] = ort_quirk(work, spec)
                anchor_dir = work / "dealiased"
                shutil.copytree(work, anchor_dir)
                dealias(anchor_dir, frozen)
            started = time.perf_counter()
            records["anchor"] = dict(scenario.run_scenario(ort_api, anchor_dir, spec, rule.CondensedRecord()))
            timings["ort_s"] = time.perf_counter() - started
            spec["anchor"] = "ort_dealiased" if unowned else "ort"
        elif case.variant.export == "train" or case.recipe not in BN_RECIPES:
            stage = "eager float64 replay"
            eager = rule.CondensedRecord()
            eager_replay(case, spec, work, eager)
            records["anchor"] = dict(eager)
            spec["anchor"] = "eager_float64"
        else:
            raise RuntimeError(
                "no anchor: ORT cannot train this model, and the eager model has no twin of the "
                "eval-mode export's de-duplicated BatchNorm tensors"
            )

        stage = "float64 replay"
        records["f64"] = dict(scenario.run_scenario(FLOAT64_API, work, spec, rule.CondensedRecord()))
        stage = "perturbed float64 replays"
        perturbed = {
            f"perturbed{seed}": dict(
                scenario.run_scenario(
                    FLOAT64_API, work, dict(spec, fill=dict(spec["fill"], perturb=seed)), rule.CondensedRecord()
                )
            )
            for seed in PERTURBATION_SEEDS
        }
        spec["well_conditioned"] = all(
            rule.well_conditioned(record, records["f64"], spec) for record in [records["anchor"], *perturbed.values()]
        )
        if not spec["well_conditioned"]:
            records.update(perturbed)
        first, _ = rule.split_keys(records["anchor"])
        gap, gap_key = rule.max_deviation(records["anchor"], records["f64"], first, spec)
        if gap > 1.0 and spec["anchor"] == "ort" and case.variant.export == "train":
            stage = "eager float64 replay of step 1 (ORT off the float64 replay at step 1)"
            eager = rule.CondensedRecord()
            eager_replay(case, dict(spec, steps=1), work, eager)
            confirmed, _ = rule.max_deviation(eager, records["f64"], [k for k in first if k in eager], spec)
            spec["ort_step1_off_exact"] = {"worst": gap_key, "deviation": gap, "eager_vs_f64": confirmed}
            if confirmed <= 1.0:
                records["eager_step1"] = {k: v for k, v in eager.items() if k.startswith("step1/")}

        stage = "our scenario"
        started = time.perf_counter()
        actual = dict(scenario.run_scenario(ours, work, spec, rule.CondensedRecord()))
        timings["ours_s"] = time.perf_counter() - started
        perturbed = {name: records[name] for name in records if name.startswith("perturbed")}
        verdict = rule.judge(actual, records["anchor"], records["f64"], spec, perturbed, records.get("eager_step1"))
        stored = {"anchor": rule.for_fixture(records["anchor"], spec["well_conditioned"])}
        stored.update({name: rule.for_fixture(records[name], False, step1=False) for name in ["f64", *perturbed]})
        if "eager_step1" in records:
            stored["eager_step1"] = rule.for_fixture(records["eager_step1"], False)
        again = rule.judge(
            actual,
            stored["anchor"],
            stored["f64"],
            spec,
            {name: stored[name] for name in perturbed},
            stored.get("eager_step1"),
        )
        if again["parity"] != verdict["parity"]:
            raise RuntimeError(f"the stored subset changes the verdict: {verdict} -> {again}")

        stage = "write fixture"
        target = out_root / case.name
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name in MODEL_FILES:
            with open(work / name, "rb") as source, gzip.GzipFile(target / f"{name}.gz", "wb", mtime=0) as sink:
                shutil.copyfileobj(source, sink)
        shutil.copy(work / "nominal_checkpoint", target / "nominal_checkpoint")
        (target / "spec.json").write_text(json.dumps(spec, indent=1) + "\n")
        save_npz(target / "expected.npz", rule.pack(stored))
        losses = lambda record: [float(record[f"step{k}/call1/loss"]) for k in range(1, STEPS + 1)]  # noqa: E731
        result.update(
            ok=True,
            anchor=spec["anchor"],
            well_conditioned=spec["well_conditioned"],
            verdict=verdict,
            anchor_losses=losses(records["anchor"]),
            f64_losses=losses(records["f64"]),
            ours_losses=losses(actual),
            timings=timings,
            ort_quirk=spec.get("ort_quirk"),
            kbytes=round(sum(f.stat().st_size for f in target.iterdir()) / 1024, 1),
        )
    except BaseException as error:  # noqa: BLE001 - recorded in summary.json, not hidden
        result.update(
            ok=False,
            stage=stage,
            error=f"{type(error).__name__}: {str(error)[:2000]}",
            traceback=traceback.format_exc()[-3000:],
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


# --------------------------------------------------------------------------- driver
def _spawn(case: Case, out_root: pathlib.Path, timeout: float) -> Dict[str, Any]:
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", case.name, "--out", str(out_root)]
    env = dict(os.environ, PYTHONHASHSEED="0")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"case": case.name, "ok": False, "stage": "subprocess", "error": f"timed out after {timeout}s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {
        "case": case.name,
        "ok": False,
        "stage": "subprocess",
        "error": f"worker exited with {done.returncode}",
        "traceback": done.stderr[-3000:],
    }


def _write_summary(out_root: pathlib.Path, results: Dict[str, Dict[str, Any]]) -> None:
    path = out_root / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary.update(results)
    import onnxruntime
    import torch

    path.write_text(
        json.dumps(
            {k: summary[k] for k in sorted(summary) if k != "_versions"}
            | {"_versions": {"onnxruntime": onnxruntime.__version__, "torch": torch.__version__}},
            indent=1,
        )
        + "\n"
    )


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", choices=["committed", "full"], default="committed")
    parser.add_argument("--only", help="comma-separated globs over case names")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cases = full_matrix() if args.matrix == "full" or args.worker else committed_matrix()
    by_name = {c.name: c for c in full_matrix() + committed_matrix()}
    if args.worker:
        print("RESULT " + json.dumps(run_case(by_name[args.worker], args.out.resolve())), flush=True)
        return 0
    cases = select(cases, args.only)
    if args.list:
        print("\n".join(c.name for c in cases))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    from concurrent.futures import ThreadPoolExecutor

    results: Dict[str, Dict[str, Any]] = {}
    started = time.time()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {c.name: pool.submit(_spawn, c, args.out.resolve(), args.timeout) for c in cases}
        for name, future in futures.items():
            result = results[name] = future.result()
            status = (
                f"{result['verdict']['parity']} ({result['anchor']}, "
                f"{'well conditioned' if result['well_conditioned'] else 'trajectory rule'})"
                if result.get("ok")
                else f"FAILED at {result.get('stage')}: {result.get('error', '')[:300]}"
            )
            print(f"[{time.time() - started:7.1f}s] {name}: {status}", flush=True)
    _write_summary(args.out, results)
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
