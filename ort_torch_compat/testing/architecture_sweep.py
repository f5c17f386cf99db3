"""The architecture sweep's cases: architectures the project did not design (``sweep_models``),
exported, made into artifacts by ORT and by us, trained by both and by a float64 eager-PyTorch
referee (``run_case``), and classified (``classify``).

``scripts/architecture_sweep.py`` runs the sweep and reports it (its docstring has the classes
and the tolerances); ``tests/test_architecture_sweep.py`` runs a fast subset through ``run_case``.
torch, transformers, torchvision and onnxruntime-training are imported by the functions that
need them.
"""

from __future__ import annotations

import copy
import io
import pathlib
import time
import traceback
import warnings
from typing import Any, Dict, List, Optional

from . import prepare_for_artifacts as prep
from . import sweep_models

EXPORTERS = ("ts17", "dyn18", "dyn17")
DEFAULT_EXPORTERS = ("ts17", "dyn18")
STEPS = 3
LR = 1e-3
BETAS = (0.9, 0.999)
EPS = 1e-6
PAIR_TOL = 1e-4  # ORT vs ours, relative to max(1, |loss|)
REF_TOL = 1e-3  # a runtime vs the float64 referee, where ORT cannot be compared
CHAOS_FACTOR = 4.0  # ORT and ours both within 4x what half a float32 ulp does in float64: rounding noise
CLASSES = ("MATCH", "ORT-OFF", "OURS-OFF", "ORT-FAIL", "OURS-FAIL", "REFUSED-BY-OUR-GENERATOR", "EXPORT-FAIL")


def short_error(error: BaseException, limit: int = 400) -> str:
    """The error in one line; long ones (ORT's C++ signatures) keep their head and their end,
    where ORT says what is missing ("... has not been registered: HardSwish for node ...")."""
    import re

    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", f"{type(error).__name__}: {error}").split())
    return text if len(text) <= limit else text[:120] + " ... " + text[-(limit - 125) :]


# ---------------------------------------------------------------- export
def export(case, exporter: str):
    """torch.onnx.export of the model in training mode; returns a ModelProto."""
    import onnx
    import torch

    model = case.model.train()
    names = [name for name, _ in case.inputs]
    args = tuple(tensor for _, tensor in case.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "ts17":
            buffer = io.BytesIO()
            torch.onnx.export(
                model,
                args,
                buffer,
                dynamo=False,
                opset_version=17,
                input_names=names,
                output_names=["logits"],
                training=torch.onnx.TrainingMode.TRAINING,
                do_constant_folding=False,
            )
            return onnx.load_from_string(buffer.getvalue())
        return prep.export_dynamo(model, args, names, "logits", {"dyn18": 18, "dyn17": 17}[exporter])


def trainable_names(case, model) -> List[str]:
    """Initializers that are (float) torch parameters, in initializer order.  A tied parameter
    counts under every path: the dynamo exporter names GPT-2's tied embedding after its LM
    head (``lm_head.weight``), which ``named_parameters()`` leaves out."""
    params = {name for name, p in case.model.named_parameters(remove_duplicate=False) if p.dtype.is_floating_point}
    return [init.name for init in model.graph.initializer if init.name in params]


# ---------------------------------------------------------------- data
def batches(case, seed: int = 1):
    """STEPS + 1 batches (inputs, labels) as numpy, shaped like the example inputs."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS + 1):
        inputs = []
        for name, tensor in case.inputs:
            if tensor.dtype.is_floating_point:
                inputs.append(rng.standard_normal(tuple(tensor.shape)).astype(np.float32))
            elif name in ("attention_mask", "token_type_ids") or name.endswith("mask"):
                inputs.append(np.ones(tuple(tensor.shape), np.int64))
            else:
                inputs.append(rng.integers(0, sweep_models.VOCAB, tuple(tensor.shape)).astype(np.int64))
        out.append(inputs)
    return out


def label_batches(count: int, classes: int, seed: int = 2):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(0, classes, (count,)).astype(np.int64) for _ in range(STEPS + 1)]


# ---------------------------------------------------------------- the three parties
def referee(
    case, trainable: List[str], data, labels, perturb: int = 0, dtype: str = "float64", loss: str = "ce"
) -> Dict[str, Any]:
    """Float64 eager torch: the same forward, CrossEntropy (mean; ``loss="mse"``: MSE, mean, as
    ORT's MSELoss block), ORT's AdamW (adam_mode 1).
    ``perturb=seed`` multiplies every parameter by 1 +- 2**-24 (half a float32 ulp, random sign):
    how far that moves the losses measures how much float32 rounding alone can (ill-conditioned
    models, e.g. BatchNorm over few values, amplify it chaotically)."""
    import torch

    torch_dtype = getattr(torch, dtype)
    mse = loss == "mse"  # (`loss` is reused below for the loss tensor)
    model = copy.deepcopy(case.model).to(torch_dtype).train()
    params = dict(model.named_parameters())
    # a tied parameter may be trainable under another of its paths (GPT-2's lm_head.weight, dynamo exporter)
    params.update({name: p for name, p in model.named_parameters(remove_duplicate=False) if name in trainable})
    if perturb:
        distinct = {id(p): p for p in params.values()}
        generator = torch.Generator().manual_seed(perturb)
        with torch.no_grad():
            for p in distinct.values():
                sign = torch.randint(0, 2, p.shape, generator=generator, dtype=torch.float64) * 2 - 1
                p.mul_(1 + sign * 2.0**-24)
    train = [params[name] for name in trainable]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in train:
        p.requires_grad_(True)
    m = [torch.zeros_like(p) for p in train]
    v = [torch.zeros_like(p) for p in train]
    losses = []

    def loss_of(inputs, label):
        tensors = [torch.from_numpy(x).to(torch_dtype) if x.dtype.kind == "f" else torch.from_numpy(x) for x in inputs]
        logits = model(*tensors)
        if mse:
            return torch.nn.functional.mse_loss(logits, torch.from_numpy(label).to(torch_dtype))
        return torch.nn.functional.cross_entropy(logits, torch.from_numpy(label))

    for step in range(STEPS):
        loss = loss_of(data[step], labels[step])
        losses.append(float(loss.detach()))
        grads = torch.autograd.grad(loss, train, allow_unused=True)
        t = step + 1
        with torch.no_grad():
            for p, g, mi, vi in zip(train, grads, m, v):
                if g is None:
                    g = torch.zeros_like(p)
                mi.mul_(BETAS[0]).add_(g, alpha=1 - BETAS[0])
                vi.mul_(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1])
                step_size = LR * (1 - BETAS[1] ** t) ** 0.5 / (1 - BETAS[0] ** t)
                p.sub_(step_size * mi / (vi.sqrt() + EPS))
    with torch.no_grad():
        losses.append(float(loss_of(data[STEPS], labels[STEPS])))
    return {"losses": losses, "params": {name: params[name].detach().double().numpy() for name in trainable}}


def train(api, directory: pathlib.Path, trainable: List[str], data, labels) -> Dict[str, Any]:
    """3 steps with an onnxruntime.training.api-shaped module (ORT's or ours), then a 4th forward."""
    import numpy as np

    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state)
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(LR)
    module.train()
    losses = []
    for step in range(STEPS + 1):
        loss = module(*data[step], labels[step])
        losses.append(float(np.asarray(loss)))
        if step < STEPS:
            optimizer.step()
            module.lazy_reset_grad()
    params = {name: np.array(state.parameters[name].data) for name in trainable}
    return {"losses": losses, "params": params}


def ort_artifacts(model, trainable: List[str], directory: pathlib.Path) -> None:
    import onnx
    from onnxruntime.training import artifacts

    prepared = prep.prepare_model(copy.deepcopy(model))
    artifacts.generate_artifacts(
        prepared,
        requires_grad=trainable,
        frozen_params=[],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(directory),
    )
    for path in directory.glob("*.onnx"):
        prep.patch_ir_version_file(path)
    assert onnx.load(str(directory / "training_model.onnx"), load_external_data=False).ir_version <= 10


def our_artifacts(model, trainable: List[str], directory: pathlib.Path) -> None:
    from ort_torch_compat import artifacts

    artifacts.generate_artifacts(
        copy.deepcopy(model),
        requires_grad=trainable,
        frozen_params=[],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(directory),
    )


# ---------------------------------------------------------------- comparison
def deviation(run: Optional[Dict[str, Any]], ref: Dict[str, Any]) -> Optional[float]:
    """Largest loss difference, relative to max(1, |loss|), over the 4 forwards."""
    if not run or "losses" not in run:
        return None
    return max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(run["losses"], ref["losses"]))


def pair_deviation(a: Dict[str, Any], b: Dict[str, Any]) -> float:
    return max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(a["losses"], b["losses"]))


def update_error(run: Optional[Dict[str, Any]], ref: Dict[str, Any], start: Dict[str, Any]) -> Optional[float]:
    """||update - referee's update|| / ||referee's update|| over all trainable parameters (info only:
    Adam turns rounding noise in exactly-zero gradients into +-lr updates that change no loss)."""
    import numpy as np

    if not run or "params" not in run:
        return None
    num = den = 0.0
    for name, final in ref["params"].items():
        if name not in run["params"]:
            return None
        u_ref = final - start[name]
        u_run = run["params"][name].astype(np.float64) - start[name]
        num += float(np.sum((u_run - u_ref) ** 2))
        den += float(np.sum(u_ref**2))
    return (num / den) ** 0.5 if den else 0.0


def ort_reason(message: str) -> str:
    """ORT's error reduced to what it says is missing."""
    import re

    for pattern, template in (
        (r"has not been registered: (\S+) for node (.*)$", "no gradient builder for {0} (node {1})"),
        (
            r"Could not find an implementation for (\S+?)\(\d+\) node with name '([^']*)'",
            "no kernel for {0} (node {1})",
        ),
        (
            r"Cannot compute the partial derivative for '([^']*)' as it's unreachable",
            "its gradient graph finds parameter {0} unreachable from the loss",
        ),
        (r"\[ONNXRuntimeError\] : \d+ : (.*)$", "{0}"),
    ):
        match = re.search(pattern, message)
        if match:
            return template.format(*(g.strip()[:160] for g in match.groups()))
    return message[-200:]


def _noise(record: Dict[str, Any]) -> float:
    """How far float32 rounding alone takes a correct run: 4x the larger of eager torch in float32
    and the float64 run from parameters moved by half a float32 ulp, off the float64 referee."""
    return CHAOS_FACTOR * max(record.get("sensitivity") or 0.0, record.get("eager_float32_deviation") or 0.0)


def classify(record: Dict[str, Any]) -> Dict[str, str]:
    stages = record["stages"]
    if "export" in stages:
        return {"class": "EXPORT-FAIL", "why": stages["export"]}
    if "ours_generate" in stages:
        message = stages["ours_generate"]
        if "UnsupportedGradientError" in message:
            import re

            rest = message.split("no gradient for ", 1)[-1]
            ops = re.match(r"(?:[\w.:]+, )*[\w.:]+", rest).group(0)
            # reasons other than a missing builder (a configuration the builder refuses), once each
            reasons = sorted(
                {
                    r.strip()
                    for r in re.findall(r"\(node '[^']*'\): (.*?)(?= [\w.:]+ \(node '|$)", rest)
                    if r.strip() and r.strip() != "no gradient builder" and "..." not in r
                }
            )
            if reasons:
                ops += " (" + "; ".join(reasons) + ")"
            ort = next((stages[s] for s in ("ort_generate", "ort_train") if s in stages), None)
            ort_says = f"ORT: {ort_reason(ort)}" if ort else "ORT trains it"
            return {"class": "REFUSED-BY-OUR-GENERATOR", "why": f"no gradient for {ops}; {ort_says}"}
        return {"class": "OURS-FAIL", "why": "our generate_artifacts: " + message}
    if "ours_train" in stages:
        return {"class": "OURS-FAIL", "why": "our runtime: " + stages["ours_train"]}
    if "referee" in stages:
        return {"class": "MATCH", "why": "no referee: " + stages["referee"]}
    dev = record["deviation"]
    ort_failed = next((stages[s] for s in ("ort_generate", "ort_train") if s in stages), None)
    if ort_failed is not None:
        stage = "generate_artifacts" if "ort_generate" in stages else "training"
        if dev["ours"] is not None and dev["ours"] > max(REF_TOL, _noise(record)):
            return {
                "class": "OURS-OFF",
                "why": f"ORT fails ({stage}); ours is {dev['ours']:.2g} off the float64 referee",
            }
        return {"class": "ORT-FAIL", "why": f"ORT {stage}: {ort_reason(ort_failed)}"}
    if record["pair_deviation"] <= PAIR_TOL:
        return {"class": "MATCH", "why": ""}
    noise = _noise(record)
    if noise > PAIR_TOL and max(dev["ours"], dev["ort"]) <= noise:
        return {
            "class": "MATCH",
            "why": f"ill-conditioned: float32 rounding alone (eager torch in float32 "
            f"{record.get('eager_float32_deviation') or 0:.2g}, half an ulp on the "
            f"parameters {record.get('sensitivity') or 0:.2g}) moves the losses that "
            f"much; ORT {dev['ort']:.2g}, ours {dev['ours']:.2g} off the float64 referee",
        }
    if dev["ours"] < dev["ort"]:
        return {"class": "ORT-OFF", "why": f"ORT {dev['ort']:.2g} vs ours {dev['ours']:.2g} off the float64 referee"}
    return {"class": "OURS-OFF", "why": f"ours {dev['ours']:.2g} vs ORT {dev['ort']:.2g} off the float64 referee"}


# ---------------------------------------------------------------- one case
def run_case(arch: str, exporter: str, workdir: pathlib.Path) -> Dict[str, Any]:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    record: Dict[str, Any] = {"arch": arch, "exporter": exporter, "stages": {}, "seconds": {}}
    stages = record["stages"]
    case = sweep_models.ARCHS[arch]()
    record["source"] = case.source
    record["classes"] = case.classes

    def timed(name, fn):
        start = time.perf_counter()
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 (recorded)
            stages[name] = short_error(error, 2000 if name == "ours_generate" else 400)  # every refused op named
            record.setdefault("tracebacks", {})[name] = traceback.format_exc()[-3000:]
            return None
        finally:
            record["seconds"][name] = round(time.perf_counter() - start, 2)

    model = timed("export", lambda: export(case, exporter))
    if model is None:
        record.update(classify(record))
        return record
    record["ops"] = sorted({f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in model.graph.node})
    trainable = trainable_names(case, model)
    record["trainable"] = len(trainable)
    record["trainable_values"] = int(
        sum(p.numel() for n, p in case.model.named_parameters(remove_duplicate=False) if n in set(trainable))
    )
    if not trainable:
        stages["ours_generate"] = "no torch parameter is an initializer of the exported model"
        record.update(classify(record))
        return record
    data = batches(case)
    with torch.no_grad():
        count = int(case.model(*[torch.from_numpy(x) for x in data[0]]).shape[0])
    labels = label_batches(count, case.classes)
    start = {
        name: p.detach().double().numpy().copy() for name, p in case.model.named_parameters(remove_duplicate=False)
    }
    runs: Dict[str, Any] = {}
    runs["ref"] = timed("referee", lambda: referee(case, trainable, data, labels))
    perturbed = timed("referee_perturbed", lambda: referee(case, trainable, data, labels, perturb=1))
    eager32 = timed("eager_float32", lambda: referee(case, trainable, data, labels, dtype="float32"))
    ort_dir, our_dir = workdir / "ort", workdir / "ours"
    ort_dir.mkdir()
    our_dir.mkdir()
    from ort_torch_compat import api as ours_api

    try:
        from onnxruntime.training import api as ort_api
    except ImportError:
        ort_api = None
    if (
        ort_api is not None
        and timed("ort_generate", lambda: ort_artifacts(model, trainable, ort_dir)) is None
        and "ort_generate" not in stages
    ):
        runs["ort"] = timed("ort_train", lambda: train(ort_api, ort_dir, trainable, data, labels))
        runs["ours_on_ort"] = timed("ours_on_ort_train", lambda: train(ours_api, ort_dir, trainable, data, labels))
    elif ort_api is None:
        stages["ort_generate"] = "onnxruntime-training is not installed"
    if (
        timed("ours_generate", lambda: our_artifacts(model, trainable, our_dir)) is None
        and "ours_generate" not in stages
    ):
        runs["ours"] = timed("ours_train", lambda: train(ours_api, our_dir, trainable, data, labels))
    record["losses"] = {k: (v["losses"] if v else None) for k, v in runs.items()}
    ref = runs.get("ref")
    if ref:
        record["sensitivity"] = deviation(perturbed, ref)
        record["eager_float32_deviation"] = deviation(eager32, ref)
        record["deviation"] = {k: deviation(runs.get(k), ref) for k in ("ort", "ours", "ours_on_ort")}
        record["update_error"] = {k: update_error(runs.get(k), ref, start) for k in ("ort", "ours", "ours_on_ort")}
    else:
        record["deviation"] = {"ort": None, "ours": None, "ours_on_ort": None}
    if runs.get("ort") and runs.get("ours"):
        record["pair_deviation"] = pair_deviation(runs["ours"], runs["ort"])
    if ref is None and "ours_generate" not in stages and "ours_train" not in stages:
        if runs.get("ort") and runs.get("ours"):
            record.update(
                {
                    "class": "MATCH" if record["pair_deviation"] <= PAIR_TOL else "OURS-OFF",
                    "why": "no float64 referee: " + stages["referee"],
                }
            )
            return record
    record.update(classify(record))
    return record
