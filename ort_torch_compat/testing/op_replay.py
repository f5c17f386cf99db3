"""Replaying one recorded op-coverage case through ort_torch_compat's graph converters.

``scripts/make_op_coverage.py`` records, per case (one op, one schema version, one attribute
variant; see ``ort_torch_compat/testing/op_coverage_cases.py``), what onnxruntime 1.19.2 computes:

* ``<id>/model``: the one-op model; ``<id>/in/<name>``: its inputs; ``<id>/out/<name>``: the
  outputs of ``onnxruntime.InferenceSession`` (graph optimizations off);
* ``<id>/train_model``: the forward+loss part of the training model ORT's gradient builder made
  from it (float inputs trained, loss = sum_i sum(output_i * W_i) with random constants W_i), cut
  the way the engine cuts it; ``<id>/loss`` and ``<id>/grad/<param>``: ORT's train step.

The same functions decide the coverage table (the script) and the tests
(tests/test_op_coverage.py), so the table's forward and gradient columns are test results.

Tolerance: float32 rounding, ``|ours - ort| <= rtol*|ort| + atol*max(1, max|ort|)`` with the
case's rtol/atol (1e-4/1e-5 unless the case says otherwise); integers, booleans and strings
compare exactly, shapes and dtypes always exactly.
"""

from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx
import torch

from ort_torch_compat.graph import GraphConversionError, build_graph_module, forward_graph

from . import REPO

FIXTURES = REPO / "tests" / "fixtures" / "ops"
MANIFEST = FIXTURES / "manifest.json"

# Where a case is not simply "equal to ORT": regexes over case ids, with the reason.
# ORT's gradient is not the derivative of its own forward, and we reproduce it by default
# (ort_torch_compat.graph.gradient_quirks); gradients="exact" gives the derivative.
ORT_GRADIENT_QUIRKS: Dict[str, str] = {
    r"^ai\.onnx\.Dropout-1[23]\.(ratio0\.3|training_false)$": "inactive Dropout with a ratio input: scaled by 1/(1-ratio)",
    r"^ai\.onnx\.Gelu-20\.tanh$": "Gelu approximate=tanh: the gradient of erf GELU",
    r"^ai\.onnx\.Clip-6\.": "Clip-6: the gradient ignores the bounds",
    r"^ai\.onnx\.SoftmaxCrossEntropyLoss-1[23]\.log_prob$": "no gradient through log_prob",
    r"^ai\.onnx\.AveragePool-\d+\.same_lower$": "AveragePool SAME_LOWER: the gradient of SAME_UPPER pooling",
    r"^ai\.onnx\.AveragePool-19\.dilations": "AveragePool dilations: the gradient of undilated pooling",
    r"^ai\.onnx\.Scatter(Elements|ND)-1[68]\.(add|mul|max|min)$": "reducing scatter: the gradient of the plain scatter",
}
# ORT's gradient is not the derivative of its forward, with no formula we could match: not
# reproduced, ours is checked against central differences of the forward instead.
ORT_GRADIENT_WRONG: Dict[str, str] = {
    r"^ai\.onnx\.Conv-(1|11)\.2d_same_(upper|lower)$": "Conv with auto_pad SAME_*",
    r"^ai\.onnx\.Where-(9|16)\.broadcast$": "Where with a broadcast data input",
    r"^ai\.onnx\.LSTM-(7|14)\.peepholes$": "LSTM with peepholes",
}


def op_key(case: dict) -> str:
    """'domain.Op' of a case id 'domain.Op-version.variant' ('...-ort' for ORT's own schemas)."""
    head, version = case["id"].split("-", 1)
    return head + "-ort" if version.startswith("ort.") else head


def matching(table: Dict[str, str], case_id: str) -> str:
    """The reason of the first pattern in `table` that matches `case_id`, else ""."""
    return next((reason for pattern, reason in table.items() if re.search(pattern, case_id)), "")


@dataclass
class Outcome:
    """pass | fail | unsupported (a clear error when the module is built) | none (nothing to compare)."""

    status: str
    detail: str = ""

    def __str__(self) -> str:
        return self.status + (f": {self.detail}" if self.detail else "")


def load_manifest(path: pathlib.Path = MANIFEST) -> List[dict]:
    return json.loads(path.read_text())["cases"]


def fixture_file(case: dict) -> str:
    """The .npz holding a case's arrays: one per op ('domain.Op.npz')."""
    return case["id"].split("-", 1)[0] + ".npz"


class Arrays:
    """Lazy access to the per-op .npz files of the manifest's cases."""

    def __init__(self, directory: pathlib.Path = FIXTURES):
        self.directory = directory
        self._open: Dict[str, Mapping[str, np.ndarray]] = {}

    def __call__(self, case: dict) -> Mapping[str, np.ndarray]:
        name = fixture_file(case)
        if name not in self._open:
            self._open[name] = dict(np.load(self.directory / name, allow_pickle=False))
        return self._open[name]


def _opsets(model: onnx.ModelProto) -> Dict[str, int]:
    return {("" if entry.domain == "ai.onnx" else entry.domain): entry.version for entry in model.opset_import}


def build_module(
    model_bytes: np.ndarray,
    name: str,
    inputs: Optional[Sequence[str]] = None,
    outputs: Optional[Sequence[str]] = None,
    **options,
) -> torch.nn.Module:
    """The engine's path: cut the graph to `outputs`, convert it node by node."""
    model = onnx.load_from_string(np.asarray(model_bytes, dtype=np.uint8).tobytes())
    inputs = list(inputs if inputs is not None else [info.name for info in model.graph.input])
    outputs = list(outputs if outputs is not None else [info.name for info in model.graph.output])
    graph = forward_graph(model, outputs, inputs, name)
    return build_graph_module(graph, _opsets(model), inputs, outputs, name, **options)


def _torch_input(value: np.ndarray, trainable: bool = False):
    if value.dtype.kind in "USO":  # strings stay numpy arrays (torch has no string tensors)
        return value
    tensor = torch.from_numpy(np.array(value, copy=True))
    return tensor.requires_grad_() if trainable else tensor


def _numpy(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def compare(name: str, ours, expected: np.ndarray, rtol: float, atol: float, values: bool = True) -> Optional[str]:
    """None if `ours` matches `expected` (see the module docstring), else what differs."""
    ours = _numpy(ours)
    if expected.dtype.kind in "US":
        ours = ours.astype(expected.dtype) if ours.dtype.kind in "USO" else ours
    if ours.dtype != expected.dtype:
        return f"{name}: dtype {ours.dtype}, ORT {expected.dtype}"
    if ours.shape != expected.shape:
        return f"{name}: shape {list(ours.shape)}, ORT {list(expected.shape)}"
    if not values:
        return None
    if expected.dtype.kind != "f":
        if not np.array_equal(ours, expected):
            return f"{name}: {int(np.sum(ours != expected))} of {expected.size} elements differ"
        return None
    ours64, expected64 = ours.astype(np.float64), expected.astype(np.float64)
    both_nan = np.isnan(ours64) & np.isnan(expected64)
    scale = max(1.0, float(np.max(np.abs(expected64[np.isfinite(expected64)]), initial=0.0)))
    close = np.abs(ours64 - expected64) <= rtol * np.abs(expected64) + atol * scale
    close |= both_nan | (ours64 == expected64)
    if not close.all():
        worst = float(np.nanmax(np.abs(ours64 - expected64)))
        return f"{name}: {int((~close).sum())} of {expected.size} elements differ (max |diff| {worst:.3g})"
    return None


def _stochastic_invariant(case: dict, feeds: Dict[str, np.ndarray], outputs: List[np.ndarray]) -> Optional[str]:
    """What a random op must still satisfy: a dropout output is 0 or x/(1-ratio)."""
    if case["op"] not in ("Dropout", "BiasDropout"):
        return None
    names = case["inputs"]
    x = feeds[names[0]].astype(np.float64)
    if case["op"] == "BiasDropout":
        x = x + feeds[names[1]]
    ratio = float(feeds[names[3 if case["op"] == "BiasDropout" else 1]])
    y = outputs[0].astype(np.float64)
    if case["op"] == "BiasDropout":
        y = y - feeds[names[2]]
    kept = np.isclose(y, x / (1.0 - ratio), rtol=1e-5, atol=1e-6)
    dropped = np.isclose(y, 0.0, atol=1e-6)
    if not (kept | dropped).all():
        return "output is neither 0 nor x/(1-ratio)"
    share = float(dropped.mean())
    if abs(share - ratio) > 0.3:
        return f"{share:.2f} of the elements dropped for ratio {ratio}"
    return None


def replay_forward(case: dict, arrays: Mapping[str, np.ndarray]) -> Outcome:
    """Run the one-op model through our converters and compare with ORT's inference outputs."""
    if case["ort_forward"] != "ok":
        return Outcome("none", "ORT does not run this case")
    key = case["id"]
    try:
        module = build_module(arrays[f"{key}/model"], key)
    except GraphConversionError as error:
        return Outcome("unsupported", str(error))
    feeds = {name: arrays[f"{key}/in/{name}"] for name in set(case["inputs"]) | set(case["graph_inputs"]) if name}
    try:
        with torch.no_grad():
            outputs = module(*[_torch_input(feeds[name]) for name in case["graph_inputs"]])
    except Exception as error:  # noqa: BLE001 - any runtime failure is a failing case
        return Outcome("fail", f"{type(error).__name__}: {error}"[:300])
    problems = []
    produced = [_numpy(value) for value in outputs]
    for name, value in zip(case["outputs"], produced):
        problem = compare(name, value, arrays[f"{key}/out/{name}"], case["rtol"], case["atol"], not case["stochastic"])
        if problem:
            problems.append(problem)
    if not problems and case["stochastic"]:
        problem = _stochastic_invariant(case, feeds, produced)
        if problem:
            problems.append(problem)
    return Outcome("fail", "; ".join(problems)) if problems else Outcome("pass")


def replay_gradient(case: dict, arrays: Mapping[str, np.ndarray], **options) -> Outcome:
    """One train step of ORT's training graph (forward+loss part) through our converters:
    the loss and the gradient of every trained input, compared with ORT's."""
    if case["ort_gradient"] != "ok":
        return Outcome("none", case["ort_gradient"])
    key = case["id"]
    params = case["trainable"]
    user = case["train_inputs"]
    try:
        module = build_module(
            arrays[f"{key}/train_model"], f"{key} (training graph)", user + params, ["loss"], **options
        )
    except GraphConversionError as error:
        return Outcome("unsupported", str(error))
    leaves = {name: _torch_input(arrays[f"{key}/in/{name}"], trainable=True) for name in params}
    try:
        with torch.enable_grad():
            (loss,) = module(*[_torch_input(arrays[f"{key}/in/{name}"]) for name in user], *[leaves[p] for p in params])
            loss.backward()
    except Exception as error:  # noqa: BLE001
        return Outcome("fail", f"{type(error).__name__}: {error}"[:300])
    problems = []
    if not case["stochastic"]:
        problem = compare("loss", loss, arrays[f"{key}/loss"], case["rtol"], case["atol"])
        if problem:
            problems.append(problem)
    for name in params:
        grad = leaves[name].grad
        grad = torch.zeros_like(leaves[name]) if grad is None else grad
        problem = compare(
            f"grad {name}", grad, arrays[f"{key}/grad/{name}"], case["rtol"], case["atol"], not case["stochastic"]
        )
        if problem:
            problems.append(problem)
    return Outcome("fail", "; ".join(problems)) if problems else Outcome("pass")


def replay_gradient_numerically(case: dict, arrays: Mapping[str, np.ndarray], samples: int = 24, **options) -> Outcome:
    """Where ORT's gradient is not the derivative of its forward: our loss must still match
    ORT's, and our gradient (float64 autograd) must match float64 central differences of our
    forward at up to `samples` elements per trained input."""
    key = case["id"]
    params, user = case["trainable"], case["train_inputs"]
    try:
        module = build_module(
            arrays[f"{key}/train_model"], f"{key} (training graph)", user + params, ["loss"], **options
        )
    except GraphConversionError as error:
        return Outcome("unsupported", str(error))
    module = module.double()
    users = [_torch_input(arrays[f"{key}/in/{name}"]) for name in user]
    users = [u.double() if isinstance(u, torch.Tensor) and u.is_floating_point() else u for u in users]
    base = {name: torch.from_numpy(arrays[f"{key}/in/{name}"].astype(np.float64)) for name in params}

    def loss_at(values: Dict[str, torch.Tensor]) -> torch.Tensor:
        return module(*users, *[values[name] for name in params])[0]

    leaves = {name: value.clone().requires_grad_() for name, value in base.items()}
    with torch.enable_grad():
        loss = loss_at(leaves)
        loss.backward()
    problems = []
    problem = compare("loss", loss.float(), arrays[f"{key}/loss"], case["rtol"], case["atol"])
    if problem:
        problems.append(problem)
    eps = 1e-6
    for name in params:
        flat = base[name].reshape(-1)
        picks = np.unique(np.linspace(0, flat.numel() - 1, min(samples, flat.numel())).astype(int))
        numeric = []
        with torch.no_grad():
            for index in picks:
                values = []
                for sign in (1.0, -1.0):
                    moved = dict(base)
                    shifted = flat.clone()
                    shifted[index] += sign * eps
                    moved[name] = shifted.reshape(base[name].shape)
                    values.append(float(loss_at(moved)))
                numeric.append((values[0] - values[1]) / (2 * eps))
        ours = leaves[name].grad.reshape(-1)[torch.from_numpy(picks)].numpy()
        numeric = np.asarray(numeric)
        scale = max(1.0, float(np.abs(numeric).max()))
        if not (np.abs(ours - numeric) <= 1e-5 * scale + 1e-4 * np.abs(numeric)).all():
            problems.append(
                f"grad {name}: autograd differs from central differences by {np.abs(ours - numeric).max():.3g}"
            )
    return Outcome("fail", "; ".join(problems)) if problems else Outcome("pass")


def gradient_outcome(case: dict, arrays: Mapping[str, np.ndarray]) -> Outcome:
    """The gradient check the suite applies to this case (see ORT_GRADIENT_WRONG)."""
    if case["ort_gradient"] == "ok" and matching(ORT_GRADIENT_WRONG, case["id"]):
        return replay_gradient_numerically(case, arrays)
    return replay_gradient(case, arrays)
