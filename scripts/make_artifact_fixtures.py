"""Record the fixtures of the artifact-generation tests with onnxruntime-training 1.19.2.

For every config: build a tiny torch model, export it (``torch.onnx.export(dynamo=False)``),
give the export to onnxruntime-training's ``generate_artifacts`` (after
``prepare_for_artifacts.prepare_model``, which ORT needs and our generator does not), train
ORT's artifacts with ``tests/scenario.run_scenario`` on ``onnxruntime.training.api`` and
write ``tests/fixtures/artifacts/<config>/``::

    model.onnx     the raw export: what our generator is given
    spec.json      generate_artifacts arguments, the scenario spec, and a summary of ORT's
                   artifacts (graph I/O, optimizer node, checkpoint sha256) from
                   generate_fixture_artifacts.describe_artifacts
    expected.npz   what ORT's training of ORT's artifacts recorded

The tests generate our artifacts from model.onnx and compare them with these.  Adding a
model is one line in CONFIGS (plus its family in ``build_model`` if it is new).  Each config
runs in its own process: onnxblock's name counter is process-global.

    python scripts/make_artifact_fixtures.py [--only NAME,...] [--out tests/fixtures/artifacts] [--jobs 2]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import io
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "artifacts"
sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "tests")]

import generate_fixture_artifacts as ours  # noqa: E402
import make_reference as reference  # noqa: E402

LOSS_TYPES = {"mse": "MSELoss", "ce": "CrossEntropyLoss", "bce": "BCEWithLogitsLoss", "l1": "L1Loss"}
DROPOUT_SEED = 1234


@dataclasses.dataclass
class Config:
    """One fixture.  ``build`` (optional) makes the model instead of ``build_model(family, loss)``:
    a function of the loss name returning build_model's tuple, e.g. for a model-zoo entry."""

    family: str
    loss: str
    optim: str
    opset: int
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)
    suffix: str = ""
    build: Optional[Callable[[str], tuple]] = None

    @property
    def name(self) -> str:
        return f"{self.family}_{self.loss}_{self.optim}{self.suffix}_op{self.opset}"


CONFIGS: List[Config] = [
    Config("mlp", "ce", "adamw", 17),
    Config("mlp", "mse", "sgd", 14),
    Config("mlp", "bce", "adamw", 17),
    Config("mlp", "l1", "sgd", 17),
    Config("mlp", "mse", "adamw", 17, {"optimizer": {"AdamW": {"weight_decay": 0.01}}}, "_wd"),
    Config("mlp", "mse", "adamw", 17, {"kwargs": {"nominal_checkpoint": True}}, "_nominal"),
    Config("mlp3d", "mse", "adamw", 17),
    Config("mlp3d", "l1", "adamw", 14),
    Config("cnn", "mse", "adamw", 17),
    Config("cnn", "ce", "sgd", 14),
    Config("cnngap", "bce", "adamw", 17),
    Config("transformer", "ce", "adamw", 17),
    Config("transformer", "mse", "adamw", 14),
    Config("decoder", "ce", "adamw", 17),
    Config("decoder", "mse", "sgd", 14),
    Config("decoder", "ce", "adamw", 18),
    Config("gru", "ce", "adamw", 17),
    Config("gru", "mse", "sgd", 14),
    Config("lstm", "bce", "adamw", 17),
    Config("lstm", "l1", "sgd", 14),
    Config("tensorops", "mse", "adamw", 17),
    Config("frozen", "ce", "adamw", 17),
    Config("twoout", "mse", "adamw", 17,
           {"kwargs": {"loss_input_names": ["y"], "additional_output_names": ["aux"]}}, "_lossinput_addout"),
    Config("dropout", "mse", "adamw", 17, {"seed": DROPOUT_SEED}),
    # Symbolic batch (and sequence) dims: shape-dependent gradients are computed at run time.
    Config("mlp", "ce", "adamw", 17, {"dynamic_axes": True}, "_dyn"),
    # ORT's own artifacts for the dynamic CNN crash ORT (AveragePoolGrad with a symbolic batch):
    # its reference comes from ORT's artifacts of the static export of the same model.
    Config("cnn", "mse", "sgd", 17, {"dynamic_axes": True, "ort_static_twin": True}, "_dyn"),
    Config("transformer", "ce", "adamw", 17, {"dynamic_axes": True}, "_dyn"),
    Config("lstm", "mse", "adamw", 17, {"dynamic_axes": True}, "_dyn"),
]

SEQUENCE_FAMILIES = ("transformer", "decoder")


# --------------------------------------------------------------------------- models
def build_model(family: str, loss: str):
    """``(module, args, input_names, output_names, input_kinds, training_mode, frozen)`` as in make_reference."""
    if family not in ("mlp3d", "cnngap", "decoder", "dropout"):
        return reference.build_model(family, loss)
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dout = 3
    training = torch.onnx.TrainingMode.EVAL
    kinds = {"x": ("normal", 0)}

    class MLP3D(nn.Module):
        """MatMul+Add layers on a 3-D input, ReLU, Sigmoid, arithmetic, a mean over one axis."""

        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 12)
            self.fc2 = nn.Linear(12, 8)
            self.head = nn.Linear(8, dout)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            h = torch.sigmoid(self.fc2(h)) * 2.0 - 1.0
            return self.head(h.mean(dim=1) / 1.5)

    class CNNGAP(nn.Module):
        """Conv (strided, grouped) and BatchNorm exported in inference mode, GlobalAveragePool."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(2, 4, 3, stride=2, padding=1)
            self.bn1 = nn.BatchNorm2d(4)
            self.conv2 = nn.Conv2d(4, 4, 3, padding=1, groups=2, bias=False)
            self.bn2 = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4, dout)

        def forward(self, x):
            h = torch.relu(self.bn1(self.conv1(x)))
            h = torch.sigmoid(self.bn2(self.conv2(h)))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))

    class Decoder(nn.Module):
        """A causal decoder block: embedding, RMSNorm (Pow/ReduceMean/Sqrt/Div), split QKV,
        masked (Where) softmax attention, Dropout (ratio 0), LayerNorm, tanh-GELU MLP, a
        pooled summary token (Squeeze/Unsqueeze/Slice/Concat) and a padding mask (Cast)."""

        def __init__(self, vocab=11, max_len=8, d=8, heads=2, ncls=5):
            super().__init__()
            self.d, self.heads, self.ncls = d, heads, ncls
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.randn(1, max_len, d) * 0.1)
            self.norm_w = nn.Parameter(torch.ones(d))
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 2 * d)
            self.fc2 = nn.Linear(2 * d, d)
            self.head = nn.Linear(d, ncls if loss == "ce" else dout)
            self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)), persistent=False)

        def forward(self, ids):
            batch, seq = ids.shape
            x = self.tok(ids) + self.pos[:, :seq]
            h = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.norm_w
            q, k, v = self.qkv(h).split(self.d, dim=-1)
            head_dim = self.d // self.heads
            q, k, v = (t.reshape(batch, seq, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
            scores = scores.masked_fill(~self.causal[:seq, :seq], -1e4)
            weights = F.dropout(scores.softmax(-1), p=0.0, training=self.training)
            attended = (weights @ v).transpose(1, 2).reshape(batch, seq, self.d)
            x = x + self.proj(attended)
            x = x + self.fc2(F.gelu(self.fc1(self.ln(x)), approximate="tanh"))
            summary = x.mean(dim=1, keepdim=True).squeeze(1)
            x = torch.cat([summary.unsqueeze(1), x[:, 1:]], dim=1)
            x = x * (ids > 0).unsqueeze(-1).to(x.dtype)
            y = self.head(x)
            return y.reshape(-1, self.ncls) if loss == "ce" else y.reshape(batch * seq, -1)[:, :dout]

    class DropoutMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 16)
            self.drop = nn.Dropout(0.3)
            self.fc2 = nn.Linear(16, dout)

        def forward(self, x):
            return self.fc2(self.drop(torch.relu(self.fc1(x))))

    if family == "mlp3d":
        model, args = MLP3D(), (torch.randn(2, 5, 6),)
    elif family == "cnngap":
        model, args = CNNGAP(), (torch.randn(4, 2, 6, 6),)
    elif family == "decoder":
        model, args = Decoder(), (torch.randint(1, 11, (2, 6)),)
        kinds = {"x": ("int", 11)}
        training = torch.onnx.TrainingMode.TRAINING  # keeps the (ratio 0) Dropout node
    else:
        model, args = DropoutMLP(), (torch.randn(4, 6),)
        training = torch.onnx.TrainingMode.TRAINING
    with torch.no_grad():  # distinct initializers (the exporter de-duplicates equal ones), non-trivial BN stats
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn_like(b) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(1.0 + torch.rand_like(b) * 0.5)
    return model, args, ["x"], ["y"], kinds, training, []


# --------------------------------------------------------------------------- worker
def _export(cfg: Config, model, args, in_names, out_names, training, dynamic: bool):
    import onnx
    import torch

    dynamic_axes = None
    if dynamic:
        first = {0: "batch", 1: "seq"} if cfg.family in SEQUENCE_FAMILIES else {0: "batch"}
        dynamic_axes = {in_names[0]: first, **{name: {0: f"{name}_rows"} for name in out_names}}
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, buffer, dynamo=False, opset_version=cfg.opset, input_names=in_names,
                          output_names=out_names, training=training, do_constant_folding=False,
                          dynamic_axes=dynamic_axes)
    return onnx.load_from_string(buffer.getvalue())


def _concrete_dims(exported, model, args) -> Dict[str, int]:
    """The example's size of every symbolic dim of the exported model's inputs and outputs."""
    import torch

    with torch.no_grad():
        outputs = model(*args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    sizes: Dict[str, int] = {}
    for infos, tensors in ((exported.graph.input, args), (exported.graph.output, outputs)):
        for info, tensor in zip(infos, tensors):
            for axis, dim in enumerate(info.type.tensor_type.shape.dim):
                if dim.dim_param:
                    sizes[dim.dim_param] = int(tensor.shape[axis])
    return sizes


def _ort_generate(prepared, arguments: Dict[str, Any], directory: pathlib.Path) -> None:
    import onnx
    import prepare_for_artifacts as prep
    from onnxruntime.training import artifacts, onnxblock

    optimizer = arguments["optimizer"]
    if isinstance(optimizer, dict):
        (kind, options), = optimizer.items()
        optimizer = getattr(onnxblock.optim, kind)(**options)
    else:
        optimizer = artifacts.OptimType[optimizer]
    artifacts.generate_artifacts(prepared, requires_grad=arguments["requires_grad"],
                                 frozen_params=arguments["frozen_params"], loss=artifacts.LossType[arguments["loss"]],
                                 optimizer=optimizer, artifact_directory=str(directory), **arguments["kwargs"])
    for path in sorted(directory.glob("*.onnx")):  # what ORT needs to load its own files (see prepare_for_artifacts)
        model = onnx.load(str(path))
        if path.name == "eval_model.onnx":
            prep.prune_batchnorm_outputs(model.graph)
        prep.set_ir_version(model)
        onnx.save(model, str(path))


def _scenario_spec(cfg: Config, directory: pathlib.Path, params: List[str], kinds: Dict[str, Any],
                   arguments: Dict[str, Any], concrete: Dict[str, int]) -> Dict[str, Any]:
    import onnx

    train_m = onnx.load(str(directory / "training_model.onnx"))
    eval_m = onnx.load(str(directory / "eval_model.onnx"))
    inputs = []
    for info in reference._user_inputs(train_m, params):
        tensor = info.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else concrete[d.dim_param] for d in tensor.shape.dim]
        if info.name in kinds:
            kind, high = kinds[info.name]
        elif info.name == "labels":
            kind, high = "int", int(reference._output_last_dim(train_m, eval_m))
        elif info.name == "target" and cfg.loss == "bce":
            kind, high = "binary", 0
        else:
            kind, high = "normal", 0
        inputs.append({"name": info.name, "shape": shape, "dtype": reference._onnx_dtype_name(tensor.elem_type),
                       "kind": kind, "high": high})
    return {
        "name": cfg.name, "family": cfg.family, "loss": cfg.loss, "optimizer": cfg.optim, "opset": cfg.opset,
        "lr": reference.LR[cfg.optim], "seed": reference.seed_of(cfg.name), "steps": 5, "accumulate_step": 2,
        "nominal": bool(arguments["kwargs"].get("nominal_checkpoint")),
        "inputs": inputs, "eval_inputs": [i.name for i in reference._user_inputs(eval_m, params)],
        "trainable_params": arguments["requires_grad"], "frozen_params": arguments["frozen_params"],
        "param_order": [i.name for i in train_m.graph.input if i.name in params],
        "param_shapes": {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
                         for i in train_m.graph.input if i.name in params},
    }


def run_ort_scenario(api, directory: pathlib.Path, spec: Dict[str, Any], seed: Optional[int]):
    """The scenario, with ORT's random generator seeded first when the model draws random masks."""
    import scenario

    if seed is not None:
        from onnxruntime.capi import _pybind_state

        _pybind_state.set_seed(seed)
    return scenario.run_scenario(api, directory, spec)


def run_worker(cfg: Config, out_root: pathlib.Path) -> Dict[str, Any]:
    stage = "import"
    try:
        import numpy as np
        import onnx
        import onnxruntime
        import torch

        onnxruntime.set_default_logger_severity(3)
        import prepare_for_artifacts as prep
        import scenario
        from onnxruntime.training import api as ort_api

        stage = "build and export"
        seed = reference.seed_of(cfg.name)
        torch.manual_seed(seed)
        np.random.seed(seed % 2 ** 32)
        model, args, in_names, out_names, kinds, training, frozen_torch = (cfg.build or (
            lambda loss: build_model(cfg.family, loss)))(cfg.loss)
        twin = copy.deepcopy(model)  # exporting in training mode updates BatchNorm's running statistics
        exported = _export(cfg, model, args, in_names, out_names, training, bool(cfg.extra.get("dynamic_axes")))
        for_ort = exported
        if cfg.extra.get("ort_static_twin"):
            for_ort = _export(cfg, twin, args, in_names, out_names, training, False)
        initializers = [i.name for i in exported.graph.initializer]
        parameters, buffers = dict(model.named_parameters()), dict(model.named_buffers())
        requires_grad = [n for n in initializers if n in parameters and n not in frozen_torch]
        frozen = [n for n in initializers if (n in parameters and n in frozen_torch)
                  or (n in buffers and buffers[n].dtype.is_floating_point)]
        arguments = {"requires_grad": requires_grad, "frozen_params": frozen, "loss": LOSS_TYPES[cfg.loss],
                     "optimizer": cfg.extra.get("optimizer", {"adamw": "AdamW", "sgd": "SGD"}[cfg.optim]),
                     "kwargs": cfg.extra.get("kwargs", {})}

        stage = "onnxruntime-training generate_artifacts"
        target = out_root / cfg.name
        with tempfile.TemporaryDirectory() as tmp:
            ort_dir = pathlib.Path(tmp) / "ort"
            ort_dir.mkdir()
            _ort_generate(prep.prepare_model(for_ort), arguments, ort_dir)
            stage = "scenario (onnxruntime.training.api)"
            spec = _scenario_spec(cfg, ort_dir, requires_grad + frozen, kinds, arguments,
                                  _concrete_dims(exported, model, args))
            expected = run_ort_scenario(ort_api, ort_dir, spec, cfg.extra.get("seed"))
            again = run_ort_scenario(ort_api, ort_dir, spec, cfg.extra.get("seed"))
            nondeterministic = scenario.compare(expected, again, rtol=0.0, atol=0.0)
            if nondeterministic:
                raise RuntimeError(f"ORT is not deterministic on this config: {nondeterministic[:3]}")
            summary = ours.describe_artifacts(ort_dir)
        stage = "write fixture"
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        onnx.save(exported, str(target / "model.onnx"))
        document = {
            "name": cfg.name,
            "generate_artifacts": arguments,
            "scenario": spec,
            "ort_seed": cfg.extra.get("seed"),
            "ort_static_twin": bool(cfg.extra.get("ort_static_twin")),
            "ort_artifacts": summary,
            "versions": {"onnxruntime-training": onnxruntime.__version__, "onnx": onnx.__version__,
                         "torch": torch.__version__},
        }
        (target / "spec.json").write_text(json.dumps(document, indent=1) + "\n")
        reference.save_npz(target / "expected.npz", expected)
        return {"name": cfg.name, "ok": True, "loss_first": float(expected["step1/call1/loss"]),
                "loss_last": float(expected["step5/call1/loss"]),
                "kb": sum(f.stat().st_size for f in target.iterdir()) / 1024}
    except BaseException as exc:  # noqa: BLE001 - reported by the driver
        return {"name": cfg.name, "ok": False, "stage": stage, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:]}


# --------------------------------------------------------------------------- driver
def _spawn(name: str, out_root: pathlib.Path) -> Dict[str, Any]:
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", name, "--out", str(out_root)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"name": name, "ok": False, "stage": "worker crashed", "error": done.stderr[-2000:]}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated config names")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in CONFIGS}
    out_root = pathlib.Path(args.out).resolve()
    if args.list:
        print("\n".join(by_name))
        return 0
    if args.worker:
        print("RESULT " + json.dumps(run_worker(by_name[args.worker], out_root)), flush=True)
        return 0
    names = [n for n in (args.only or "").split(",") if n] or list(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        parser.error(f"unknown configs {unknown}")
    out_root.mkdir(parents=True, exist_ok=True)
    start = time.time()
    from concurrent.futures import ThreadPoolExecutor

    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for result in pool.map(lambda n: _spawn(n, out_root), names):
            if result["ok"]:
                print(f"[{time.time() - start:6.1f}s] {result['name']}: ok  loss {result['loss_first']:.5f} -> "
                      f"{result['loss_last']:.5f}  {result['kb']:.0f} kB", flush=True)
            else:
                failed += 1
                print(f"[{time.time() - start:6.1f}s] {result['name']}: FAILED at {result['stage']}: "
                      f"{result['error']}\n{result.get('traceback', '')}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
