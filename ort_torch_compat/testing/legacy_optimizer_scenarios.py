"""Optimizer scenarios for the legacy TrainingSession, shared by the fixture script and the tests.

`scripts/make_legacy_optimizer_fixtures.py` computes each scenario's trajectory from a
numpy transcription of ORT's legacy kernels (and checks it against ORT's own CPU kernels
when onnxruntime-training is installed); `tests/test_legacy_optimizers.py` replays it
through `ort_torch_compat.legacy.TrainingSession`.

The model makes the gradients exact inputs: loss = sum(a * g_a) + sum(b * g_b), so the
gradient of weight `a` is the fed `g_a` and the optimizer sees exactly the recorded
gradients.  A scenario is `updates` optimizer updates, each after `accumulation` calls
(ORT averages the accumulated gradients); the state is recorded after every update under
ORT's names (`a`, `Moment_1_a`, `Update_Count_a`, `Step`...).
"""

from __future__ import annotations

import functools
import zlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
from onnx import TensorProto, helper, numpy_helper

WEIGHTS = {"a": (3, 4), "b": (5,)}

SCENARIOS: List[Dict[str, Any]] = [
    {"name": "sgd", "optimizer": "SGDOptimizer", "lrs": [0.1, 0.05, 0.2, 0.01]},
    # All defaults, enable_grad_norm_clip (the default) on and a gradient norm far above
    # max_norm_clip's default 1: ORT's CPU kernel does not clip.
    {"name": "adam_defaults", "optimizer": "AdamOptimizer", "lrs": [0.01, 0.02, 0.01, 0.005, 0.01], "grad_scale": 4.0},
    {
        "name": "adam_mode1_decay",
        "optimizer": "AdamOptimizer",
        "lrs": [0.01, 0.02, 0.01, 0.005],
        "float": {"alpha": 0.85, "beta": 0.99, "lambda": 0.01, "epsilon": 1e-6},
        "int": {"weight_decay_mode": 1},
    },
    {
        "name": "adam_mode0_decay_no_bias_correction",
        "optimizer": "AdamOptimizer",
        "lrs": [0.01, 0.03, 0.02],
        "float": {"lambda": 0.05},
        "int": {"do_bias_correction": 0},
    },
    {
        "name": "adam_per_weight_attributes",
        "optimizer": "AdamOptimizer",
        "lrs": [0.02, 0.01, 0.02],
        "per_weight": {
            "a": {"float": {"alpha": 0.8, "lambda": 0.1}, "int": {"weight_decay_mode": 1}},
            "b": {"float": {"beta": 0.9, "epsilon": 1e-4}, "int": {"do_bias_correction": 0}},
        },
    },
    {"name": "adam_accumulate_3", "optimizer": "AdamOptimizer", "lrs": [0.01, 0.02, 0.01], "accumulation": 3},
    # Builder defaults (epsilon 1e-6, no bias correction, max_norm_clip 1) with clipping active.
    {"name": "lamb_defaults", "optimizer": "LambOptimizer", "lrs": [0.01, 0.02, 0.01, 0.005, 0.01], "grad_scale": 4.0},
    {
        "name": "lamb_bias_ratio_decay_no_clip",
        "optimizer": "LambOptimizer",
        "lrs": [0.02, 0.01, 0.02],
        "clip": False,
        "float": {"alpha": 0.85, "beta": 0.99, "lambda": 0.01, "ratio_min": 0.05, "ratio_max": 0.5},
        "int": {"do_bias_correction": 1},
    },
    {
        "name": "lamb_accumulate_2_clip",
        "optimizer": "LambOptimizer",
        "lrs": [0.01, 0.02, 0.01],
        "accumulation": 2,
        "float": {"max_norm_clip": 0.3},
    },
]


def attributes(scenario: Dict[str, Any], weight: str) -> Tuple[Dict[str, float], Dict[str, int]]:
    """(float attributes, int attributes) a scenario gives `weight` (absent: the defaults)."""
    own = scenario.get("per_weight", {}).get(weight, {})
    return ({**scenario.get("float", {}), **own.get("float", {})}, {**scenario.get("int", {}), **own.get("int", {})})


def initial_weights(scenario: Dict[str, Any]) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng([7, zlib.crc32(scenario["name"].encode())])
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in WEIGHTS.items()}


def calls(scenario: Dict[str, Any]) -> Iterator[Tuple[int, float, Dict[str, np.ndarray]]]:
    """(update index, lr of that update, {weight: gradient}) for every session call, in order."""
    rng = np.random.default_rng([11, zlib.crc32(scenario["name"].encode())])
    scale = np.float32(scenario.get("grad_scale", 1.0))
    for update, lr in enumerate(scenario["lrs"]):
        for _ in range(scenario.get("accumulation", 1)):
            yield (
                update,
                lr,
                {name: rng.standard_normal(shape).astype(np.float32) * scale for name, shape in WEIGHTS.items()},
            )


def model_bytes(scenario: Dict[str, Any]) -> bytes:
    """loss = sum(a * g_a) + sum(b * g_b), weights initialised from `initial_weights`."""
    nodes, sums = [], []
    for name in WEIGHTS:
        nodes.append(helper.make_node("Mul", [name, f"g_{name}"], [f"p_{name}"]))
        nodes.append(helper.make_node("ReduceSum", [f"p_{name}"], [f"s_{name}"], keepdims=0))
        sums.append(f"s_{name}")
    nodes.append(helper.make_node("Add", sums, ["loss"]))
    graph = helper.make_graph(
        nodes,
        "gradients_as_inputs",
        [helper.make_tensor_value_info(f"g_{name}", TensorProto.FLOAT, list(shape)) for name, shape in WEIGHTS.items()],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(value, name) for name, value in initial_weights(scenario).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def run_session(scenario: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """The scenario through ort_torch_compat.legacy.TrainingSession: {"<update>/<state name>": value}."""
    from ort_torch_compat.legacy import TrainingParameters, TrainingSession

    params = TrainingParameters()
    params.loss_output_name = "loss"
    params.training_optimizer_name = scenario["optimizer"]
    params.gradient_accumulation_steps = scenario.get("accumulation", 1)
    params.enable_grad_norm_clip = scenario.get("clip", True)
    for weight in WEIGHTS:
        floats, ints = attributes(scenario, weight)
        if floats:
            params.optimizer_attributes_map[weight] = floats
        if ints:
            params.optimizer_int_attributes_map[weight] = ints
    session = TrainingSession(model_bytes(scenario), params)
    trajectory: Dict[str, np.ndarray] = {}
    accumulation = scenario.get("accumulation", 1)
    for index, (update, lr, grads) in enumerate(calls(scenario)):
        feed = {f"g_{name}": grad for name, grad in grads.items()}
        feed["Learning_Rate"] = np.array([lr], np.float32)
        session.run(["loss"], feed)
        if (index + 1) % accumulation == 0:
            trajectory.update((f"{update}/{key}", value) for key, value in session.get_state().items())
    return trajectory


@functools.lru_cache(maxsize=None)
def ort_kernel_missing(optimizer: str) -> Optional[str]:
    """None when the installed onnxruntime runs the com.microsoft `optimizer` CPU kernel, else
    why not.  Only onnxruntime-training builds have the training kernels (SGDOptimizer,
    AdamOptimizer); the plain `onnxruntime` package imports fine and refuses the node."""
    if optimizer == "LambOptimizer":
        return "ORT had no CPU LambOptimizer kernel (only CUDA)"
    try:
        import onnxruntime
    except ImportError:
        return "onnxruntime is not installed"
    shape = [2]
    inputs = [("lr", TensorProto.FLOAT, [1]), ("w", TensorProto.FLOAT, shape), ("g", TensorProto.FLOAT, shape)]
    outputs = [("w_out", TensorProto.FLOAT, shape)]
    if optimizer == "AdamOptimizer":
        inputs[1:1] = [("count", TensorProto.INT64, [1])]
        inputs += [("m1", TensorProto.FLOAT, shape), ("m2", TensorProto.FLOAT, shape)]
        outputs = [
            ("count_out", TensorProto.INT64, [1]),
            ("m1_out", TensorProto.FLOAT, shape),
            ("m2_out", TensorProto.FLOAT, shape),
        ] + outputs
    node = helper.make_node(optimizer, [i[0] for i in inputs], [o[0] for o in outputs], domain="com.microsoft")
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    try:
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's own exception types
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (
            f"onnxruntime {onnxruntime.__version__} has no com.microsoft {optimizer} CPU kernel "
            f"(onnxruntime-training builds have it): {first_line[:200]}"
        )
    return None


def run_ort_cpu_kernels(scenario: Dict[str, Any]) -> Optional[Dict[str, np.ndarray]]:
    """The scenario through ONNX Runtime's own CPU SGDOptimizer / AdamOptimizer kernels (one
    node per weight, as the legacy graph builder made them: Adam gets the global gradient
    norm when clipping is on), the accumulated gradients averaged in float32 as the legacy
    optimizer graph does.  None where the installed onnxruntime lacks the kernel (Lamb: ORT
    had no CPU kernel; the plain `onnxruntime` package: no training kernels) or is absent;
    `ort_kernel_missing` says why."""
    if ort_kernel_missing(scenario["optimizer"]):
        return None
    import onnxruntime

    adam = scenario["optimizer"] == "AdamOptimizer"
    clip = scenario.get("clip", True)
    sessions = {}
    for name, shape in WEIGHTS.items():
        floats, ints = attributes(scenario, name)
        if adam:
            inputs = [
                ("lr", TensorProto.FLOAT, [1]),
                ("count", TensorProto.INT64, [1]),
                ("w", TensorProto.FLOAT, shape),
                ("g", TensorProto.FLOAT, shape),
                ("m1", TensorProto.FLOAT, shape),
                ("m2", TensorProto.FLOAT, shape),
            ]
            outputs = [
                ("count_out", TensorProto.INT64, [1]),
                ("m1_out", TensorProto.FLOAT, shape),
                ("m2_out", TensorProto.FLOAT, shape),
                ("w_out", TensorProto.FLOAT, shape),
            ]
        else:
            inputs = [("lr", TensorProto.FLOAT, [1]), ("w", TensorProto.FLOAT, shape), ("g", TensorProto.FLOAT, shape)]
            outputs = [("w_out", TensorProto.FLOAT, shape)]
        names = [i[0] for i in inputs]
        if adam and clip:  # as the graph builder wires it: no fp16 weights, no loss scale, the global norm
            names += ["", "", "global_norm"]
            inputs.append(("global_norm", TensorProto.FLOAT, []))
        node = helper.make_node(
            scenario["optimizer"], names, [o[0] for o in outputs], domain="com.microsoft", **floats, **ints
        )
        graph = helper.make_graph(
            [node],
            "optimizer",
            [helper.make_tensor_value_info(*i) for i in inputs],
            [helper.make_tensor_value_info(*o) for o in outputs],
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        )
        model.ir_version = 8
        sessions[name] = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    state = {name: value.copy() for name, value in initial_weights(scenario).items()}
    if adam:
        for name, shape in WEIGHTS.items():
            state[f"Moment_1_{name}"] = np.zeros(shape, np.float32)
            state[f"Moment_2_{name}"] = np.zeros(shape, np.float32)
            state[f"Update_Count_{name}"] = np.array([1], np.int64)
    trajectory: Dict[str, np.ndarray] = {}
    accumulation = scenario.get("accumulation", 1)
    sums: Dict[str, np.ndarray] = {}
    for index, (update, lr, grads) in enumerate(calls(scenario)):
        for name, grad in grads.items():
            sums[name] = grad.copy() if name not in sums else sums[name] + grad
        if (index + 1) % accumulation:
            continue
        averaged = {
            name: sums.pop(name) * (np.float32(1.0) / np.float32(accumulation)) if accumulation > 1 else sums.pop(name)
            for name in WEIGHTS
        }
        norm = np.float32(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in averaged.values())))
        for name, grad in averaged.items():
            feed = {"lr": np.array([lr], np.float32), "w": state[name], "g": grad}
            if adam:
                feed.update(
                    count=state[f"Update_Count_{name}"], m1=state[f"Moment_1_{name}"], m2=state[f"Moment_2_{name}"]
                )
                if clip:
                    feed["global_norm"] = np.array(norm)
                (state[f"Update_Count_{name}"], state[f"Moment_1_{name}"], state[f"Moment_2_{name}"], state[name]) = (
                    sessions[name].run(None, feed)
                )
            else:
                (state[name],) = sessions[name].run(None, feed)
        trajectory.update((f"{update}/{key}", value.copy()) for key, value in state.items())
    return trajectory
