"""Backend-agnostic training scenario for differential testing against onnxruntime-training 1.19.2.

The same code runs with ``onnxruntime.training.api`` (to produce the reference
``tests/fixtures/<config>/expected.npz``, see ``scripts/make_reference.py``)
and with ``ort_torch_compat.api`` (in our tests).  It only uses the public
training API, so both backends see exactly the same sequence of calls.

``run_scenario(api, artifacts_dir, spec)`` returns a flat ``dict[str, np.ndarray]``:

* ``names/train_inputs``, ``names/train_outputs``, ``names/eval_inputs``,
  ``names/eval_outputs`` -- ``Module.input_names()/output_names()`` per mode
  (numpy unicode arrays, possibly empty).
* ``sizes/trainable``, ``sizes/all`` -- ``get_parameters_size(True/False)`` (int64 0-d).
* ``init/contiguous_all``, ``init/contiguous_trainable`` -- ``get_contiguous_parameters``
  with ``trainable_only=False/True`` before training (float32 1-D).
* ``init/param/<p>`` -- every param (trainable and frozen) before training.
* ``lr/initial`` -- ``get_learning_rate()`` right after ``set_learning_rate(spec['lr'])``.
* For step ``k`` in 1..``spec['steps']`` (default 5); step ``spec['accumulate_step']``
  (default 2) makes two train calls, all others one:
    - ``step<k>/call<j>/input/<name>`` -- the inputs fed (train mode),
    - ``step<k>/call<j>/loss`` -- train output 0, ``step<k>/call<j>/out<i>`` -- train output i>=1,
    - ``step<k>/grad/<p>`` -- ``state.parameters[p].grad`` for every trainable p after the calls,
    - ``step<k>/frozen_grad_is_none`` -- bool per frozen param (order: ``spec['frozen_params']``),
    - ``step<k>/lr`` -- ``get_learning_rate()`` just before ``opt.step()``,
    - ``step<k>/param/<p>`` -- every param after ``opt.step()`` (frozen BN running stats change in
      place during train_step),
    - then ``lazy_reset_grad()``.
* ``final/contiguous_all`` -- ``get_contiguous_parameters(False)`` after training.
* ``eval/input/<name>``, ``eval/out<i>`` -- one eval batch after ``module.eval()``
  (``eval/out0`` is the loss).
* nominal configs (``spec['nominal']``) additionally record ``nominal/sizes/trainable``,
  ``nominal/sizes/all`` (read on the still-nominal state) -- the module is built on
  ``nominal_checkpoint`` and filled with ``copy_buffer_to_parameters(buf, trainable_only=False)``
  where ``buf`` comes from a module over the real ``checkpoint``.  Every other key is
  then identical to the non-nominal scenario.
* configs with ``spec['fill']`` (the real-architecture fixtures, which commit only the
  ``nominal_checkpoint``) build the module on ``nominal_checkpoint`` and fill it with
  ``copy_buffer_to_parameters(fill_values(spec), trainable_only=False)``: values from a
  fixed integer-hash rule, the same on every platform (see ``fill_values``).

Inputs are drawn from ``np.random.default_rng([spec['seed'], k, j])`` (eval batch:
``[seed, 1000, 0]``) following ``spec['inputs']``: a list (train-graph user input order)
of ``{"name", "shape", "dtype", "kind", "high"}`` with kind ``"normal"`` (float32
standard normal), ``"int"`` (int64 uniform in ``[0, high)``, class labels / token ids)
``"binary"`` (float32 in {0, 1}, BCE targets) or ``"mask"`` (int64 attention mask: per row
ones for a random-length prefix, zeros after it).  ``spec['eval_inputs']`` lists the
eval-graph user input names (default: same as train).
"""

from __future__ import annotations

import fnmatch
import pathlib
from typing import Any, Dict, Iterable, List, MutableMapping, Optional, Sequence

import numpy as np

EVAL_SEED_KEY = 1000
# 16 float32 ulps, relative: about the rounding error a float32 forward pass accumulates (the
# real-architecture CNNs' activations differ from float64 ones by 1e-6 to 4e-6, relative).
PERTURBATION = 2.0**-20


def _np(x: Any) -> np.ndarray:
    """Copy anything array-like (numpy, ORT OrtValue, torch tensor via numpy()) to a numpy array."""
    if hasattr(x, "detach"):  # torch.Tensor
        x = x.detach().cpu()
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    return np.array(x, copy=True)


def _names(seq: Iterable[str]) -> np.ndarray:
    return np.array(list(seq), dtype=np.str_)


def make_batch(spec: dict, k: int, j: int) -> Dict[str, np.ndarray]:
    """Deterministic inputs for train call ``j`` of step ``k`` (``k=1000`` is the eval batch)."""
    rng = np.random.default_rng([int(spec.get("seed", 0)), k, j])
    batch: Dict[str, np.ndarray] = {}
    for inp in spec["inputs"]:
        shape = tuple(int(d) for d in inp["shape"])
        kind = inp.get("kind", "normal")
        if kind == "int":
            arr = rng.integers(0, int(inp["high"]), size=shape, dtype=np.int64)
        elif kind == "binary":
            arr = rng.integers(0, 2, size=shape).astype(np.float32)
        elif kind == "normal":
            arr = rng.standard_normal(shape).astype(np.float32)
        elif kind == "mask":  # attention mask: per row, ones for a random-length prefix, then padding
            lengths = rng.integers(1, shape[-1] + 1, size=shape[:-1])
            arr = (np.arange(shape[-1]) < lengths[..., None]).astype(np.int64)
        else:
            raise ValueError(f"unknown input kind {kind!r}")
        dtype = np.dtype(inp.get("dtype", arr.dtype))
        batch[inp["name"]] = arr.astype(dtype, copy=False)
    return batch


def _outputs(result: Any) -> List[np.ndarray]:
    if isinstance(result, (tuple, list)):
        return [_np(r) for r in result]
    return [_np(result)]


def _record_params(out: Dict[str, np.ndarray], state: Any, prefix: str, names: Sequence[str]) -> None:
    for name in names:
        out[f"{prefix}/{name}"] = _np(state.parameters[name].data)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on uint64 arrays (wrapping arithmetic: the same bits everywhere)."""
    x = x * np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def fill_values(spec: dict) -> np.ndarray:
    """The float32 parameter buffer (``spec['param_order']``) that ``spec['fill']`` prescribes.

    Per parameter ``p`` with ``spec['fill']['init'][p] = [center, spread]``, element ``i`` is
    ``center + spread * (2u - 1)`` where ``u`` in [0, 1) is the top 53 bits of
    ``splitmix64(i + 2^32 * (crc32(p) ^ seed))``: integer arithmetic, so every platform and
    numpy version gets the same bits (no random-generator stream involved).

    ``spec['fill']['perturb'] = s`` (float64 replays only) returns float64 values, each moved by
    ``PERTURBATION`` (relative) in a direction drawn from seed ``s``: the chaos probe of
    ort_torch_compat/testing/parity_rule.py.
    """
    import zlib

    seed = int(spec["fill"]["seed"])
    parts = []
    with np.errstate(over="ignore"):
        for name in spec["param_order"]:
            center, spread = spec["fill"]["init"][name]
            count = int(np.prod(spec["param_shapes"][name], dtype=np.int64))
            key = np.uint64((zlib.crc32(name.encode()) ^ seed) & 0xFFFFFFFF) << np.uint64(32)
            bits = _splitmix64(np.arange(count, dtype=np.uint64) + key)
            unit = (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53
            parts.append((center + spread * (2.0 * unit - 1.0)).astype(np.float32))
    values = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if spec["fill"].get("perturb") is not None:
        signs = np.random.default_rng(int(spec["fill"]["perturb"])).choice([-1.0, 1.0], size=values.shape)
        return values.astype(np.float64) * (1.0 + signs * PERTURBATION)
    return values


def _ortvalue(api: Any, array: np.ndarray) -> Any:
    """An OrtValue holding ``array``, as ``api``'s Module accepts it: ORT 1.19.2's
    ``copy_buffer_to_parameters`` only takes the C-level value (what its
    ``get_contiguous_parameters`` returns), not ``onnxruntime.OrtValue``; that value does
    not keep ``array`` alive, the caller must."""
    factory = getattr(api, "OrtValue", None)
    if factory is not None:
        return factory.ortvalue_from_numpy(array)
    from onnxruntime import OrtValue

    return OrtValue.ortvalue_from_numpy(array)._ortvalue


def run_scenario(
    api: Any,
    artifacts_dir: "pathlib.Path | str",
    spec: dict,
    out: Optional[MutableMapping[str, np.ndarray]] = None,
    model_suffix: str = ".onnx",
) -> MutableMapping[str, np.ndarray]:
    """Run the standard training scenario with ``api`` on the artifacts in ``artifacts_dir``.

    ``model_suffix`` picks the models' files: ``training_model{suffix}`` and so on (".ort"
    for ORT-format artifacts).

    Results go into ``out`` (a new dict by default; a mapping that condenses what is stored
    keeps big models' records small, see ort_torch_compat/testing/parity_rule.py).
    """
    d = pathlib.Path(artifacts_dir)
    trainable: List[str] = list(spec["trainable_params"])
    frozen: List[str] = list(spec.get("frozen_params", []))
    all_params = trainable + frozen
    steps = int(spec.get("steps", 5))
    acc_step = int(spec.get("accumulate_step", 2))
    train_names = [i["name"] for i in spec["inputs"]]
    eval_names = list(spec.get("eval_inputs", train_names))
    out = {} if out is None else out

    train_model = d / f"training_model{model_suffix}"
    eval_model = d / f"eval_model{model_suffix}"
    if spec.get("fill"):
        state = api.CheckpointState.load_checkpoint(d / "nominal_checkpoint")
        module = api.Module(train_model, state, eval_model)
        out["nominal/sizes/trainable"] = np.array(module.get_parameters_size(True), dtype=np.int64)
        out["nominal/sizes/all"] = np.array(module.get_parameters_size(False), dtype=np.int64)
        # a name, not a temporary: ORT's C-level OrtValue does not own the numpy memory
        filled = fill_values(spec)
        module.copy_buffer_to_parameters(_ortvalue(api, filled), trainable_only=False)
    elif spec.get("nominal"):
        real_state = api.CheckpointState.load_checkpoint(d / "checkpoint")
        real_module = api.Module(train_model, real_state, eval_model)
        buf = real_module.get_contiguous_parameters(trainable_only=False)
        state = api.CheckpointState.load_checkpoint(d / "nominal_checkpoint")
        module = api.Module(train_model, state, eval_model)
        out["nominal/sizes/trainable"] = np.array(module.get_parameters_size(True), dtype=np.int64)
        out["nominal/sizes/all"] = np.array(module.get_parameters_size(False), dtype=np.int64)
        module.copy_buffer_to_parameters(buf, trainable_only=False)
        del real_module, real_state
    else:
        state = api.CheckpointState.load_checkpoint(d / "checkpoint")
        module = api.Module(train_model, state, eval_model)
    opt = api.Optimizer(d / f"optimizer_model{model_suffix}", module)
    opt.set_learning_rate(float(spec["lr"]))
    out["lr/initial"] = np.array(opt.get_learning_rate(), dtype=np.float64)

    module.train()
    out["names/train_inputs"] = _names(module.input_names())
    out["names/train_outputs"] = _names(module.output_names())
    module.eval()
    out["names/eval_inputs"] = _names(module.input_names())
    out["names/eval_outputs"] = _names(module.output_names())
    module.train()
    out["sizes/trainable"] = np.array(module.get_parameters_size(True), dtype=np.int64)
    out["sizes/all"] = np.array(module.get_parameters_size(False), dtype=np.int64)
    out["init/contiguous_all"] = np.asarray(_np(module.get_contiguous_parameters(trainable_only=False)))
    out["init/contiguous_trainable"] = np.asarray(_np(module.get_contiguous_parameters(trainable_only=True)))
    _record_params(out, state, "init/param", all_params)

    for k in range(1, steps + 1):
        ncalls = 2 if k == acc_step else 1
        for j in range(1, ncalls + 1):
            batch = make_batch(spec, k, j)
            for name in train_names:
                out[f"step{k}/call{j}/input/{name}"] = batch[name]
            outs = _outputs(module(*[batch[n] for n in train_names]))
            out[f"step{k}/call{j}/loss"] = outs[0]
            for i, o in enumerate(outs[1:], start=1):
                out[f"step{k}/call{j}/out{i}"] = o
        for name in trainable:
            g = state.parameters[name].grad
            if g is None:
                raise AssertionError(f"trainable parameter {name} has no gradient after train_step")
            out[f"step{k}/grad/{name}"] = _np(g)
        out[f"step{k}/frozen_grad_is_none"] = np.array([state.parameters[n].grad is None for n in frozen], dtype=bool)
        out[f"step{k}/lr"] = np.array(opt.get_learning_rate(), dtype=np.float64)
        opt.step()
        _record_params(out, state, f"step{k}/param", all_params)
        module.lazy_reset_grad()

    out["final/contiguous_all"] = np.asarray(_np(module.get_contiguous_parameters(trainable_only=False)))

    module.eval()
    batch = make_batch(spec, EVAL_SEED_KEY, 0)
    for name in eval_names:
        out[f"eval/input/{name}"] = batch[name]
    for i, o in enumerate(_outputs(module(*[batch[n] for n in eval_names]))):
        out[f"eval/out{i}"] = o
    module.train()
    return out


def run_scheduler_scenario(
    api: Any, artifacts_dir: "pathlib.Path | str", warmup: int, total: int, initial_lr: float, steps: int
) -> Dict[str, np.ndarray]:
    """LinearLRScheduler trace: ``lr`` = [lr after construction, lr after each (opt.step(); sched.step())].

    ``api.LinearLRScheduler(opt, warmup, total, initial_lr)`` is called with the arguments
    exactly as named by the Python API (ORT 1.19's Python wrapper swaps them, see spec §4).
    No train step is run: the optimizer steps on the zero gradient buffers, which is all
    the scheduler needs (it reads the optimizer's step count).
    """
    d = pathlib.Path(artifacts_dir)
    state = api.CheckpointState.load_checkpoint(d / "checkpoint")
    module = api.Module(d / "training_model.onnx", state, d / "eval_model.onnx")
    opt = api.Optimizer(d / "optimizer_model.onnx", module)
    sched = api.LinearLRScheduler(opt, warmup, total, initial_lr)
    lrs = [opt.get_learning_rate()]
    for _ in range(steps):
        opt.step()
        sched.step()
        lrs.append(opt.get_learning_rate())
    return {"lr": np.array(lrs, dtype=np.float64)}


def compare(
    expected: Dict[str, np.ndarray],
    actual: Dict[str, np.ndarray],
    rtol: float = 1e-5,
    atol: float = 1e-6,
    ignore: Iterable[str] = (),
    tolerances: Optional[Dict[str, "tuple[float, float]"]] = None,
) -> List[str]:
    """Return one line per mismatching key (empty list: everything matches).

    * keys matching a glob in ``ignore`` are skipped;
    * ``tolerances`` maps a glob to ``(rtol, atol)``, first match wins, else the defaults;
    * missing/extra keys, shape and dtype mismatches are reported;
    * string and bool arrays must be equal; numeric ones use ``np.allclose``-style
      ``|a-e| <= atol + rtol*|e|`` (NaNs must coincide); the line gives the max abs diff.
    """
    ignore = list(ignore)
    tolerances = dict(tolerances or {})

    def skipped(key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, pat) for pat in ignore)

    def tol_for(key: str) -> "tuple[float, float]":
        for pat, tol in tolerances.items():
            if fnmatch.fnmatchcase(key, pat):
                return tol
        return rtol, atol

    problems: List[str] = []
    for key in sorted(set(expected) | set(actual)):
        if skipped(key):
            continue
        if key not in actual:
            problems.append(f"{key}: missing from actual")
            continue
        if key not in expected:
            problems.append(f"{key}: unexpected key in actual")
            continue
        e = np.asarray(expected[key])
        a = np.asarray(actual[key])
        if e.shape != a.shape:
            problems.append(f"{key}: shape {a.shape} != expected {e.shape}")
            continue
        if e.dtype.kind in "USOb" or a.dtype.kind in "USOb":
            if e.dtype.kind != a.dtype.kind or not np.array_equal(e, a):
                problems.append(f"{key}: {a.tolist()!r} != expected {e.tolist()!r}")
            continue
        r, t = tol_for(key)
        ef = e.astype(np.float64)
        af = a.astype(np.float64)
        nan_e, nan_a = np.isnan(ef), np.isnan(af)
        if (nan_e != nan_a).any():
            problems.append(f"{key}: NaN pattern differs ({int(nan_a.sum())} vs expected {int(nan_e.sum())})")
            continue
        diff = np.abs(np.where(nan_e, 0.0, af - ef))
        with np.errstate(invalid="ignore"):
            bad = ~(diff <= t + r * np.abs(np.where(nan_e, 0.0, ef)))
        # identical infinities are equal
        bad &= ~((ef == af) & np.isinf(ef))
        if bad.any():
            finite = diff[np.isfinite(diff)]
            maxdiff = float(finite.max()) if finite.size else float("inf")
            problems.append(
                f"{key}: max abs diff {maxdiff:.3e} ({int(bad.sum())}/{bad.size} elements "
                f"outside rtol={r:g} atol={t:g})"
            )
        elif e.dtype != a.dtype:
            problems.append(f"{key}: dtype {a.dtype} != expected {e.dtype}")
    return problems
