"""Reference trajectories of ORT's legacy SGD, Adam and Lamb optimizers, for the legacy session's tests.

The formulas are transcribed here, straight from ONNX Runtime's public source, in plain
float32 numpy (each scalar a float32, each operation in the source's order), independent
of `ort_torch_compat/optim/`.  docs/legacy.md lists the files, commits and lines:

* SGDOptimizer, AdamOptimizer: the CPU kernels, `orttraining/orttraining/training_ops/cpu/
  optimizer/optimizers.cc` (`SGDOptimizer<T>::Compute`, `AdamOptimizer<T>::Compute`), the
  attribute defaults of `optimizers.h` and the AdamOptimizer schema in
  `core/graph/training_op_defs.cc`, the bias correction of `cpu/optimizer/common.h`.
  The CPU Adam kernel reads no gradient norm: it never clips.
* LambOptimizer: ORT had only a CUDA kernel, `training_ops/cuda/optimizer/lamb_impl.cu`
  (`_LambComputeDirectionRule`, `_LambUpdateRule`), `lamb.cc` (the squared-norm reduction),
  the clipping divisor of `cuda/optimizer/common.cuh` (`_ComputeGradScale`), with the
  defaults of `core/graph/optimizer/lamb_optimizer_builder.cc`.
* Accumulation: the legacy optimizer graph (`core/graph/optimizer_graph_builder.cc`) sums
  N gradients (InPlaceAccumulator), multiplies them by 1/N (AddGradientScalingNodes) and
  takes one global L2 norm over all of them (ReduceAllL2) when `enable_grad_norm_clip`.

For each scenario of `ort_torch_compat/testing/legacy_optimizer_scenarios.py` the script writes the state
after every update to `tests/fixtures/legacy_optimizers/trajectories.npz`.  When
onnxruntime-training is installed it first runs ORT's own CPU SGD and Adam kernels on the
same scenario and refuses to write unless the transcription matches them (to float32 rounding:
ORT's Eigen sqrt is sometimes 1 ulp off; the bounds are ORT_RTOL and ORT_ATOL) and the
step counts exactly; provenance.json records the largest difference.

Usage:  python scripts/make_legacy_optimizer_fixtures.py [--out tests/fixtures/legacy_optimizers]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
from typing import Any, Dict, Optional

import numpy as np

from ort_torch_compat.testing.legacy_optimizer_scenarios import (
    SCENARIOS,
    WEIGHTS,
    attributes,
    calls,
    initial_weights,
    run_ort_cpu_kernels,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent

f32 = np.float32
# ORT's CPU build takes Eigen's vectorised sqrt, which is not always correctly rounded (measured: 1 ulp
# low on some elements); numpy's is.  Agreement with ORT's kernels is therefore checked to these bounds.
ORT_RTOL, ORT_ATOL = 1e-6, 1e-8
ADAM_DEFAULTS = {
    "alpha": 0.9,
    "beta": 0.999,
    "lambda": 0.0,
    "epsilon": 1e-8,
    "do_bias_correction": 1,
    "weight_decay_mode": 0,
}  # optimizers.h, AdamOptimizer schema
LAMB_DEFAULTS = {
    "alpha": 0.9,
    "beta": 0.999,
    "lambda": 0.0,
    "epsilon": 1e-6,
    "max_norm_clip": 1.0,
    "ratio_min": -math.inf,
    "ratio_max": math.inf,
    "do_bias_correction": 0,
}  # lamb_optimizer_builder.cc


def bias_correction(coefficient: np.float32, step: int) -> np.float32:
    """compute_bias_correction_coefficient: TC(1.0 - pow(double(coefficient), double(step))) for step > 0."""
    return f32(1.0 - math.pow(float(coefficient), float(step))) if step > 0 else f32(1.0)


def sgd(w: np.ndarray, g: np.ndarray, eta: np.float32) -> np.ndarray:
    delta = -eta * g
    return w + delta


def adam_cpu(w, g, m1, m2, step: int, eta: np.float32, attrs: Dict[str, Any]):
    alpha, beta, lam, eps = (f32(attrs[k]) for k in ("alpha", "beta", "lambda", "epsilon"))
    nm1 = alpha * m1 + ((f32(1) - alpha) * g)
    nm2 = beta * m2 + ((f32(1) - beta) * g * g)
    alpha_correction = bias_correction(alpha, step) if attrs["do_bias_correction"] else f32(1)
    beta_correction = bias_correction(beta, step) if attrs["do_bias_correction"] else f32(1)
    if attrs["weight_decay_mode"] == 0:
        denom = np.sqrt(nm2 / beta_correction) + eps
        update = ((nm1 / alpha_correction) / denom) + (lam * w)
        delta = -eta * update
    else:
        denom = np.sqrt(nm2) + eps
        step_size = eta * np.sqrt(beta_correction) / alpha_correction
        delta = -step_size * nm1 / denom - eta * lam * (w - step_size * nm1 / denom)
    return w + delta, nm1, nm2, step + 1


def global_norm(grads) -> np.float32:
    """ReduceAllL2 over every gradient."""
    return f32(math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads)))


def lamb(w, g, m1, m2, step: int, eta: np.float32, attrs: Dict[str, Any], g_norm: Optional[np.float32]):
    alpha, beta, lam, eps, max_norm = (f32(attrs[k]) for k in ("alpha", "beta", "lambda", "epsilon", "max_norm_clip"))
    g_scale = g_norm / max_norm if g_norm is not None and g_norm > max_norm else f32(1)  # _ComputeGradScale
    alpha_correction = bias_correction(alpha, step) if attrs["do_bias_correction"] else f32(1)
    beta_correction = bias_correction(beta, step) if attrs["do_bias_correction"] else f32(1)
    # _LambComputeDirectionRule, element by element
    g_unscaled = g / g_scale
    m1_new = alpha * m1 + (f32(1) - alpha) * g_unscaled
    m2_new = beta * m2 + (f32(1) - beta) * g_unscaled * g_unscaled
    d = lam * w + (m1_new / alpha_correction) / (np.sqrt(m2_new / beta_correction) + eps)
    finite = np.isfinite(d)
    d = np.where(finite, d, f32(0))
    m1_out, m2_out = np.where(finite, m1_new, m1), np.where(finite, m2_new, m2)
    # the squared-norm reduction, then _LambUpdateRule
    w_norm, d_norm = f32(np.sum(w.astype(np.float64) ** 2)), f32(np.sum(d.astype(np.float64) ** 2))
    if w_norm != 0 and d_norm != 0:
        ratio = eta * max(f32(attrs["ratio_min"]), min(f32(attrs["ratio_max"]), np.sqrt(w_norm / d_norm)))
    else:
        ratio = eta
    w_new = w + (-ratio * d)
    return np.where(np.isfinite(w_new), w_new, w), m1_out, m2_out


def trajectory(scenario: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """{"<update>/<ORT state name>": value} after every update of the scenario."""
    name = scenario["optimizer"]
    defaults = ADAM_DEFAULTS if name == "AdamOptimizer" else LAMB_DEFAULTS
    attrs = {}
    for weight in WEIGHTS:
        floats, ints = attributes(scenario, weight)
        attrs[weight] = {**defaults, **floats, **ints}
    if name == "LambOptimizer":  # one value for the node: the first weight's
        first = attrs[next(iter(WEIGHTS))]
        for values in attrs.values():
            values.update({k: first[k] for k in ("ratio_min", "ratio_max", "do_bias_correction")})
    state = {k: v.copy() for k, v in initial_weights(scenario).items()}
    if name != "SGDOptimizer":
        for weight, shape in WEIGHTS.items():
            state[f"Moment_1_{weight}"] = np.zeros(shape, np.float32)
            state[f"Moment_2_{weight}"] = np.zeros(shape, np.float32)
            if name == "AdamOptimizer":
                state[f"Update_Count_{weight}"] = np.array([1], np.int64)
        if name == "LambOptimizer":
            state["Step"] = np.array([1], np.int64)
    accumulation = scenario.get("accumulation", 1)
    out: Dict[str, np.ndarray] = {}
    sums: Dict[str, np.ndarray] = {}
    for index, (update, lr, grads) in enumerate(calls(scenario)):
        for weight, grad in grads.items():
            sums[weight] = grad.copy() if weight not in sums else sums[weight] + grad  # InPlaceAccumulator
        if (index + 1) % accumulation:
            continue
        scale = f32(1) / f32(accumulation)
        averaged = {w: (sums.pop(w) * scale if accumulation > 1 else sums.pop(w)) for w in WEIGHTS}
        eta = f32(lr)
        clip = scenario.get("clip", True)
        g_norm = global_norm(averaged.values()) if name == "LambOptimizer" and clip else None
        for weight, g in averaged.items():
            if name == "SGDOptimizer":
                state[weight] = sgd(state[weight], g, eta)
            elif name == "AdamOptimizer":
                count = int(state[f"Update_Count_{weight}"][0])
                (state[weight], state[f"Moment_1_{weight}"], state[f"Moment_2_{weight}"], count) = adam_cpu(
                    state[weight],
                    g,
                    state[f"Moment_1_{weight}"],
                    state[f"Moment_2_{weight}"],
                    count,
                    eta,
                    attrs[weight],
                )
                state[f"Update_Count_{weight}"] = np.array([count], np.int64)
            else:
                state[weight], state[f"Moment_1_{weight}"], state[f"Moment_2_{weight}"] = lamb(
                    state[weight],
                    g,
                    state[f"Moment_1_{weight}"],
                    state[f"Moment_2_{weight}"],
                    int(state["Step"][0]),
                    eta,
                    attrs[weight],
                    g_norm,
                )
        if name == "LambOptimizer":
            state["Step"] = state["Step"] + 1
        out.update((f"{update}/{key}", value.copy()) for key, value in state.items())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "legacy_optimizers"))
    args = parser.parse_args()
    arrays: Dict[str, np.ndarray] = {}
    checked: Dict[str, float] = {}
    for scenario in SCENARIOS:
        ours = trajectory(scenario)
        measured = run_ort_cpu_kernels(scenario)
        if measured is not None:
            worst = 0.0
            for key, value in measured.items():
                if value.dtype == np.int64:
                    if not np.array_equal(ours[key], value):
                        raise SystemExit(f"{scenario['name']}: {key} is {ours[key]}, ORT's CPU kernel gives {value}")
                    continue
                worst = max(worst, float(np.max(np.abs(ours[key].astype(np.float64) - value))))
                if not np.allclose(ours[key], value, rtol=ORT_RTOL, atol=ORT_ATOL):
                    raise SystemExit(
                        f"{scenario['name']}: the transcription differs from ORT's CPU kernel at {key}: "
                        f"max |diff| {np.max(np.abs(ours[key] - value))}"
                    )
            checked[scenario["name"]] = worst
        arrays.update((f"{scenario['name']}/{key}", value) for key, value in ours.items())
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "trajectories.npz", **arrays)
    try:
        import onnxruntime

        ort = f"onnxruntime-training {onnxruntime.__version__}"
    except ImportError:
        ort = None
    (out / "provenance.json").write_text(
        json.dumps(
            {
                "scenarios": [s["name"] for s in SCENARIOS],
                "max_abs_diff_to_ort_cpu_kernels": checked,
                "ort": ort,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {len(arrays)} arrays to {out}; max |diff| to {ort}'s CPU kernels: {checked}")


if __name__ == "__main__":
    main()
