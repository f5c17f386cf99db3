"""ort_torch_compat.legacy.TrainingSession against independent numpy implementations of the
optimizer formulas of ONNX Runtime's legacy training kernels (docs/legacy.md).

The model is a linear layer with an MSE loss computed inside the ONNX graph, so the
gradient has a closed form: every step is replayed in numpy (float64) from the reference
weights, and the session's weights and optimizer state must follow it.
"""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_torch_compat.errors import InvalidInputError, ModelLoadError, ModelMismatchError
from ort_torch_compat.legacy import NodeArg, SessionOptions, TrainingParameters, TrainingSession

W, B = "lin.weight", "lin.bias"
RTOL, ATOL = 2e-5, 2e-6


# ---- model ---------------------------------------------------------------------------
class _LinearMSE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        pred = self.lin(x)
        return ((pred - y) ** 2).mean(), pred


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _LinearMSE(),
            (torch.randn(5, 4), torch.randn(5, 3)),
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["x", "y"],
            output_names=["loss", "pred"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}, "pred": {0: "batch"}},
        )
    return buffer.getvalue()


@pytest.fixture(scope="module")
def initial(model_bytes):
    model = onnx.load_from_string(model_bytes)
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}


def batches(count, seed=1, n=6):
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((n, 4)).astype(np.float32), rng.standard_normal((n, 3)).astype(np.float32))
        for _ in range(count)
    ]


def make_params(optimizer="SGDOptimizer", clip=False, float_attrs=None, int_attrs=None, **fields):
    params = TrainingParameters()
    params.loss_output_name = "loss"
    params.training_optimizer_name = optimizer
    params.enable_grad_norm_clip = clip
    for weight in (W, B):
        if float_attrs:
            params.optimizer_attributes_map[weight] = dict(float_attrs)
        if int_attrs:
            params.optimizer_int_attributes_map[weight] = dict(int_attrs)
    for key, value in fields.items():
        setattr(params, key, value)
    return params


def feed(x, y, lr=None, name="Learning_Rate"):
    values = {"x": x, "y": y}
    if lr is not None:
        values[name] = np.array([lr], dtype=np.float32)
    return values


# ---- numpy reference -------------------------------------------------------------------
def ref_loss_and_grads(w, x, y):
    x, y = x.astype(np.float64), y.astype(np.float64)
    residual = x @ w[W].T + w[B] - y
    dpred = 2.0 * residual / residual.size
    return float((residual**2).mean()), {W: dpred.T @ x, B: dpred.sum(axis=0)}


def ref_divisor(grads, max_norm, enabled):
    """Clip factor: ||g||/max_norm when the global norm exceeds max_norm (ReduceAllL2 + _ComputeGradScale)."""
    if not enabled:
        return 1.0
    norm = math.sqrt(sum(float((g**2).sum()) for g in grads.values()))
    return norm / max_norm if norm > max_norm else 1.0


def ref_adam(w, g, m1, m2, t, lr, alpha=0.9, beta=0.999, lam=0.0, eps=1e-8, bias=1, mode=0, div=1.0):
    g = g / div
    m1 = alpha * m1 + (1 - alpha) * g
    m2 = beta * m2 + (1 - beta) * g * g
    ac = 1 - alpha**t if bias else 1.0
    bc = 1 - beta**t if bias else 1.0
    if mode == 0:
        w = w - lr * ((m1 / ac) / (np.sqrt(m2 / bc) + eps) + lam * w)
    else:
        step_size = lr * math.sqrt(bc) / ac
        u = step_size * m1 / (np.sqrt(m2) + eps)
        w = w - u - lr * lam * (w - u)
    return w, m1, m2


def ref_lamb(w, g, m1, m2, t, lr, alpha=0.9, beta=0.999, lam=0.0, eps=1e-6, bias=0, rmin=-np.inf, rmax=np.inf, div=1.0):
    g = g / div
    m1 = alpha * m1 + (1 - alpha) * g
    m2 = beta * m2 + (1 - beta) * g * g
    ac = 1 - alpha**t if bias else 1.0
    bc = 1 - beta**t if bias else 1.0
    d = lam * w + (m1 / ac) / (np.sqrt(m2 / bc) + eps)
    w_norm, d_norm = np.linalg.norm(w), np.linalg.norm(d)
    ratio = lr * min(max(w_norm / d_norm, rmin), rmax) if w_norm and d_norm else lr
    return w - ratio * d, m1, m2


def assert_close(actual, expected, what=""):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=what)


# ---- optimizers --------------------------------------------------------------------------
def test_sgd_updates_follow_formula_with_lr_from_feed(model_bytes, initial):
    session = TrainingSession(model_bytes, make_params("SGDOptimizer"))
    ref = {k: v.copy() for k, v in initial.items()}
    for step, ((x, y), lr) in enumerate(zip(batches(4), [0.1, 0.05, 0.2, 0.01])):
        loss, grads = ref_loss_and_grads(ref, x, y)
        out = session.run(["loss"], feed(x, y, lr))
        assert_close(out[0], loss, f"loss at step {step}")
        ref = {k: ref[k] - lr * grads[k] for k in ref}
        state = session.get_state()
        assert set(state) == {W, B}
        for k in ref:
            assert_close(state[k], ref[k], f"{k} after step {step}")


@pytest.mark.parametrize("mode,bias,lam", [(0, 1, 0.0), (0, 1, 0.01), (1, 1, 0.01), (1, 0, 0.0), (0, 0, 0.05)])
def test_adam_updates_follow_formula(model_bytes, initial, mode, bias, lam):
    attrs = {"alpha": 0.8, "beta": 0.95, "lambda": lam, "epsilon": 1e-6}
    params = make_params(
        "AdamOptimizer", float_attrs=attrs, int_attrs={"do_bias_correction": bias, "weight_decay_mode": mode}
    )
    session = TrainingSession(model_bytes, params)
    ref = {k: v.copy() for k, v in initial.items()}
    m1 = {k: np.zeros_like(v) for k, v in ref.items()}
    m2 = {k: np.zeros_like(v) for k, v in ref.items()}
    for step, ((x, y), lr) in enumerate(zip(batches(4, seed=2), [0.01, 0.02, 0.01, 0.005]), start=1):
        _, grads = ref_loss_and_grads(ref, x, y)
        session.run(["loss"], feed(x, y, lr))
        for k in ref:
            ref[k], m1[k], m2[k] = ref_adam(ref[k], grads[k], m1[k], m2[k], step, lr, 0.8, 0.95, lam, 1e-6, bias, mode)
        state = session.get_state()
        for k in ref:
            assert_close(state[k], ref[k], f"{k} after step {step}")
            assert_close(state[f"Moment_1_{k}"], m1[k])
            assert_close(state[f"Moment_2_{k}"], m2[k])
            assert state[f"Update_Count_{k}"].tolist() == [step + 1]


@pytest.mark.parametrize(
    "bias,lam,rmin,rmax",
    [(0, 0.0, -np.inf, np.inf), (1, 0.01, -np.inf, np.inf), (1, 0.0, 0.5, 0.9), (0, 0.0, -np.inf, 0.1)],
)
def test_lamb_updates_follow_formula(model_bytes, initial, bias, lam, rmin, rmax):
    attrs = {"alpha": 0.85, "beta": 0.99, "lambda": lam, "epsilon": 1e-6, "ratio_min": rmin, "ratio_max": rmax}
    session = TrainingSession(
        model_bytes, make_params("LambOptimizer", float_attrs=attrs, int_attrs={"do_bias_correction": bias})
    )
    ref = {k: v.copy() for k, v in initial.items()}
    m1 = {k: np.zeros_like(v) for k, v in ref.items()}
    m2 = {k: np.zeros_like(v) for k, v in ref.items()}
    for step, (x, y) in enumerate(batches(4, seed=3), start=1):
        _, grads = ref_loss_and_grads(ref, x, y)
        session.run(["loss"], feed(x, y, 0.02))
        for k in ref:
            ref[k], m1[k], m2[k] = ref_lamb(
                ref[k], grads[k], m1[k], m2[k], step, 0.02, 0.85, 0.99, lam, 1e-6, bias, rmin, rmax
            )
        state = session.get_state()
        assert state["Step"].tolist() == [step + 1]
        for k in ref:
            assert_close(state[k], ref[k], f"{k} after step {step}")
            assert_close(state[f"Moment_1_{k}"], m1[k])


def test_lamb_ratio_bounds_must_agree_across_weights(model_bytes):
    params = make_params("LambOptimizer")
    params.optimizer_attributes_map = {W: {"ratio_min": 0.1}, B: {"ratio_min": 0.2}}
    with pytest.raises(ValueError, match="ratio_min"):
        TrainingSession(model_bytes, params)


def test_grad_norm_clipping_of_lamb(model_bytes, initial):
    max_norm = 0.05
    params = make_params(
        "LambOptimizer", clip=True, float_attrs={"max_norm_clip": max_norm}, int_attrs={"do_bias_correction": 1}
    )
    session = TrainingSession(model_bytes, params)
    ref = {k: v.copy() for k, v in initial.items()}
    m1 = {k: np.zeros_like(v) for k, v in ref.items()}
    m2 = {k: np.zeros_like(v) for k, v in ref.items()}
    for step, (x, y) in enumerate(batches(3, seed=4), start=1):
        _, grads = ref_loss_and_grads(ref, x, y)
        div = ref_divisor(grads, max_norm, True)
        assert div > 1.0, "the test must exercise clipping"
        session.run(["loss"], feed(x, y, 0.01))
        for k in ref:
            ref[k], m1[k], m2[k] = ref_lamb(ref[k], grads[k], m1[k], m2[k], step, 0.01, bias=1, div=div)
        state = session.get_state()
        for k in ref:
            assert_close(state[f"Moment_1_{k}"], m1[k], f"clipped moment of {k}")
            assert_close(state[k], ref[k], f"{k} after step {step}")


def test_adam_is_never_clipped_as_in_orts_cpu_kernel(model_bytes, initial):
    """ORT's CPU AdamOptimizer reads no gradient norm (docs/legacy.md): with clipping enabled and a
    max_norm_clip far below the gradient norm, the updates are the unclipped ones."""
    max_norm = 0.05
    params = make_params(
        "AdamOptimizer", clip=True, float_attrs={"max_norm_clip": max_norm}, int_attrs={"do_bias_correction": 1}
    )
    session = TrainingSession(model_bytes, params)
    ref = {k: v.copy() for k, v in initial.items()}
    m1 = {k: np.zeros_like(v) for k, v in ref.items()}
    m2 = {k: np.zeros_like(v) for k, v in ref.items()}
    for step, (x, y) in enumerate(batches(3, seed=4), start=1):
        _, grads = ref_loss_and_grads(ref, x, y)
        assert ref_divisor(grads, max_norm, True) > 1.0, "clipping would change the update"
        session.run(["loss"], feed(x, y, 0.01))
        for k in ref:
            ref[k], m1[k], m2[k] = ref_adam(ref[k], grads[k], m1[k], m2[k], step, 0.01, bias=1)
        state = session.get_state()
        for k in ref:
            assert_close(state[f"Moment_1_{k}"], m1[k], f"unclipped moment of {k}")
            assert_close(state[k], ref[k], f"{k} after step {step}")


def test_grad_norm_clip_is_on_by_default_for_lamb_and_sgd_and_adam_ignore_it(model_bytes, initial):
    assert TrainingParameters().enable_grad_norm_clip is True
    ((x, y),) = batches(1, seed=5)
    clipped = TrainingSession(model_bytes, make_params("LambOptimizer", clip=True, float_attrs={"max_norm_clip": 1e-3}))
    free = TrainingSession(model_bytes, make_params("LambOptimizer", clip=False, float_attrs={"max_norm_clip": 1e-3}))
    clipped.run(["loss"], feed(x, y, 0.1))
    free.run(["loss"], feed(x, y, 0.1))
    assert not np.allclose(clipped.get_state()[f"Moment_1_{W}"], free.get_state()[f"Moment_1_{W}"])
    adam_clipped = TrainingSession(
        model_bytes, make_params("AdamOptimizer", clip=True, float_attrs={"max_norm_clip": 1e-3})
    )
    adam_free = TrainingSession(
        model_bytes, make_params("AdamOptimizer", clip=False, float_attrs={"max_norm_clip": 1e-3})
    )
    adam_clipped.run(["loss"], feed(x, y, 0.1))
    adam_free.run(["loss"], feed(x, y, 0.1))
    for key, value in adam_free.get_state().items():
        np.testing.assert_array_equal(adam_clipped.get_state()[key], value, err_msg=key)
    y = y * 20  # a gradient norm well above Lamb's default max_norm_clip of 1
    sgd = TrainingSession(model_bytes, make_params("SGDOptimizer", clip=True))
    sgd.run(["loss"], feed(x, y, 0.5))
    _, grads = ref_loss_and_grads(initial, x, y)
    assert ref_divisor(grads, 1.0, True) > 1.0
    assert_close(sgd.get_state()[W], initial[W] - 0.5 * grads[W], "SGD has no clipping input")


def test_gradient_accumulation_averages_and_updates_every_n_calls(model_bytes, initial):
    session = TrainingSession(model_bytes, make_params("SGDOptimizer", gradient_accumulation_steps=3))
    data = batches(6, seed=6)
    grads = [ref_loss_and_grads(initial, x, y)[1] for x, y in data[:3]]
    session.run(["loss"], feed(*data[0]))  # lr is only needed on the updating call
    session.run(["loss"], feed(*data[1], lr=0.3))
    assert_close(session.get_state()[W], initial[W], "no update before the 3rd call")
    with pytest.raises(InvalidInputError, match="Learning_Rate"):
        session.run(["loss"], feed(*data[2]))
    session.run(["loss"], feed(*data[2], lr=0.3))
    expected = {k: initial[k] - 0.3 * sum(g[k] for g in grads) / 3 for k in initial}
    for k in expected:
        assert_close(session.get_state()[k], expected[k], f"{k} after one accumulated update")
    grads2 = [ref_loss_and_grads(expected, x, y)[1] for x, y in data[3:]]
    for x, y in data[3:]:
        session.run(["loss"], feed(x, y, 0.1))
    for k in expected:
        assert_close(session.get_state()[k], expected[k] - 0.1 * sum(g[k] for g in grads2) / 3)


def test_adam_update_count_advances_once_per_accumulated_update(model_bytes):
    session = TrainingSession(model_bytes, make_params("AdamOptimizer", gradient_accumulation_steps=2))
    for x, y in batches(4, seed=7):
        session.run(["loss"], feed(x, y, 0.01))
    assert session.get_optimizer_state()[W]["Update_Count"].tolist() == [3]


def test_lr_feed_name_is_configurable(model_bytes, initial):
    session = TrainingSession(model_bytes, make_params("SGDOptimizer", lr_params_feed_name="lr"))
    assert session.get_inputs()[-1] == NodeArg("lr", "tensor(float)", [1])
    ((x, y),) = batches(1, seed=8)
    with pytest.raises(InvalidInputError, match="Invalid Feed Input Name:Learning_Rate"):
        session.run(["loss"], feed(x, y, 0.1))  # fed under the default name, which is unknown here
    with pytest.raises(InvalidInputError, match="Missing Input: lr"):
        session.run(["loss"], feed(x, y))
    session.run(["loss"], feed(x, y, 0.25, name="lr"))
    _, grads = ref_loss_and_grads(initial, x, y)
    assert_close(session.get_state()[B], initial[B] - 0.25 * grads[B])


def test_no_optimizer_computes_gradients_without_updating(model_bytes, initial):
    session = TrainingSession(model_bytes, make_params("", set_gradients_as_graph_outputs=True))
    ((x, y),) = batches(1, seed=9)
    loss, grad_w, grad_b = session.run(["loss", f"{W}_grad", f"{B}_grad"], feed(x, y))
    ref_loss, grads = ref_loss_and_grads(initial, x, y)
    assert_close(loss, ref_loss)
    assert_close(grad_w, grads[W])
    assert_close(grad_b, grads[B])
    assert_close(session.get_state()[W], initial[W])
    assert [a.name for a in session.get_outputs()] == ["loss", "pred", f"{B}_grad", f"{W}_grad"]  # sorted, as ORT
    assert "Learning_Rate" not in [a.name for a in session.get_inputs()]


# ---- state -------------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", ["SGDOptimizer", "AdamOptimizer", "LambOptimizer"])
def test_get_state_load_state_round_trip(model_bytes, optimizer):
    data = batches(4, seed=10)
    first = TrainingSession(model_bytes, make_params(optimizer))
    for x, y in data[:3]:
        first.run(["loss"], feed(x, y, 0.01))
    state = first.get_state()
    second = TrainingSession(model_bytes, make_params(optimizer))
    second.load_state(state, strict=True)
    for key, value in second.get_state().items():
        np.testing.assert_array_equal(value, state[key], err_msg=key)
    out_first = first.run(["loss", "pred"], feed(*data[3], 0.01))
    out_second = second.run(["loss", "pred"], feed(*data[3], 0.01))
    for a, b in zip(out_first, out_second):
        np.testing.assert_array_equal(a, b)
    for key, value in first.get_state().items():
        np.testing.assert_array_equal(second.get_state()[key], value, err_msg=key)


def test_load_state_strict_and_lenient(model_bytes):
    session = TrainingSession(model_bytes, make_params("AdamOptimizer"))
    state = session.get_state()
    extra = dict(state, unknown_tensor=np.zeros(2, np.float32))
    session.load_state(extra)  # lenient: unknown names are skipped
    with pytest.raises(ModelMismatchError, match="unknown_tensor"):
        session.load_state(extra, strict=True)
    session.load_state({W: np.full((3, 4), 0.5, np.float32)})  # partial, lenient
    np.testing.assert_array_equal(session.get_state()[W], np.full((3, 4), 0.5, np.float32))
    session.load_state({f"Update_Count_{B}": np.array([7], np.int64)}, strict=True)
    assert session.get_optimizer_state()[B]["Update_Count"].tolist() == [7]
    with pytest.raises(ModelMismatchError, match="expected"):
        session.load_state({W: np.zeros((4, 3), np.float32)})
    with pytest.raises(ModelMismatchError):
        session.load_state({B: np.zeros(3, np.float64)})
    np.testing.assert_array_equal(session.get_state()[W], np.full((3, 4), 0.5, np.float32))


def test_frozen_weights_are_not_state(model_bytes, initial):
    session = TrainingSession(model_bytes, make_params("AdamOptimizer", weights_not_to_train={B}))
    assert set(session.get_state()) == {W, f"Moment_1_{W}", f"Moment_2_{W}", f"Update_Count_{W}"}
    with pytest.raises(ModelMismatchError, match=B):
        session.load_state({B: np.zeros(3, np.float32)}, strict=True)
    ((x, y),) = batches(1, seed=11)
    session.run(["loss"], feed(x, y, 0.1))
    assert set(session.get_model_state()["full_precision"]) == {W}
    assert not np.allclose(session.get_state()[W], initial[W])


def test_model_and_optimizer_state_structure(model_bytes):
    ((x, y),) = batches(1, seed=12)
    adam = TrainingSession(model_bytes, make_params("AdamOptimizer"))
    adam.run(["loss"], feed(x, y, 0.01))
    model_state = adam.get_model_state()
    assert list(model_state) == ["full_precision"] and set(model_state["full_precision"]) == {W, B}
    assert model_state["full_precision"][W].dtype == np.float32
    assert adam.get_model_state(include_mixed_precision_weights=True)["mixed_precision"] == {}
    opt = adam.get_optimizer_state()
    assert set(opt) == {W, B}
    assert set(opt[W]) == {"Moment_1", "Moment_2", "Update_Count"}
    assert opt[W]["Moment_1"].shape == (3, 4) and opt[W]["Update_Count"].dtype == np.int64

    lamb = TrainingSession(model_bytes, make_params("LambOptimizer"))
    lamb.run(["loss"], feed(x, y, 0.01))
    opt = lamb.get_optimizer_state()
    assert set(opt) == {W, B, "shared_optimizer_state"}
    assert set(opt[W]) == {"Moment_1", "Moment_2"}
    assert opt["shared_optimizer_state"]["Step"].tolist() == [2]

    sgd = TrainingSession(model_bytes, make_params("SGDOptimizer"))
    assert sgd.get_optimizer_state() == {}
    assert sgd.get_partition_info_map() == {}


def test_optimizer_initial_state(model_bytes, initial):
    params = make_params("AdamOptimizer")
    m1 = {W: np.full((3, 4), 0.01, np.float32), B: np.full(3, -0.02, np.float32)}
    m2 = {W: np.full((3, 4), 0.003, np.float32), B: np.full(3, 0.001, np.float32)}
    params.set_optimizer_initial_state(
        {k: {"Moment_1": m1[k], "Moment_2": m2[k], "Update_Count": np.array([5])} for k in (W, B)}
    )
    session = TrainingSession(model_bytes, params)
    assert session.get_optimizer_state()[W]["Update_Count"].tolist() == [5]
    ((x, y),) = batches(1, seed=13)
    session.run(["loss"], feed(x, y, 0.01))
    _, grads = ref_loss_and_grads(initial, x, y)
    for k in (W, B):
        w, _, _ = ref_adam(initial[k], grads[k], m1[k].astype(np.float64), m2[k].astype(np.float64), 5, 0.01)
        assert_close(session.get_state()[k], w, k)

    lamb_params = make_params("LambOptimizer")
    lamb_params.set_optimizer_initial_state({"shared_optimizer_state": {"Step": np.array([4], np.int64)}})
    assert TrainingSession(model_bytes, lamb_params).get_state()["Step"].tolist() == [4]

    bad = make_params("AdamOptimizer")
    bad.set_optimizer_initial_state({W: {"Moment_1": np.zeros((4, 3), np.float32)}})
    with pytest.raises(ModelMismatchError, match="Moment_1"):
        TrainingSession(model_bytes, bad)


# ---- weight selection -------------------------------------------------------------------
def _scaled_model():
    """loss = mean((X @ W * s - Y)^2) with s a float scalar initializer that is also a graph input."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2) / 10, "W")
    s = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "s")
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["xw"]),
        helper.make_node("Mul", ["xw", "s"], ["pred"]),
        helper.make_node("Sub", ["pred", "Y"], ["diff"]),
        helper.make_node("Mul", ["diff", "diff"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "scaled",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[w, s],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="unit-test",
        domain="ai.test",
        model_version=3,
        doc_string="a scaled regression",
    )
    helper.set_model_props(model, {"purpose": "legacy"})
    return model.SerializeToString()


@pytest.mark.parametrize(
    "fields,expected",
    [
        ({}, {"W", "s"}),
        ({"immutable_weights": {"Mul": [(1, 2.0)]}}, {"W"}),
        ({"immutable_weights": {"Mul": [(1, 3.0)]}}, {"W", "s"}),
        ({"weights_to_train": {"s"}}, {"s"}),
        ({"weights_not_to_train": {"s"}}, {"W"}),
        ({"weights_to_train": {"W", "nonexistent"}}, {"W"}),
    ],
)
def test_trainable_weight_selection(fields, expected):
    params = TrainingParameters()
    params.loss_output_name = "loss"
    params.training_optimizer_name = "SGDOptimizer"
    for key, value in fields.items():
        setattr(params, key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = TrainingSession(_scaled_model(), params)
    assert set(session.get_model_state()["full_precision"]) == expected


def test_overridable_initializer_feed_and_metadata():
    params = TrainingParameters()
    params.loss_output_name = "loss"
    params.training_optimizer_name = "SGDOptimizer"
    params.weights_to_train = {"W"}
    session = TrainingSession(_scaled_model(), params)
    assert session.get_overridable_initializers() == [NodeArg("s", "tensor(float)", [])]
    assert [a.name for a in session.get_inputs()] == ["X", "Y", "Learning_Rate"]
    assert session.get_inputs()[0].shape == ["N", 3]
    x = np.ones((2, 3), np.float32)
    y = np.zeros((2, 2), np.float32)
    w = np.arange(6, dtype=np.float64).reshape(3, 2) / 10
    (loss_default,) = session.run(["loss"], {"X": x, "Y": y, "Learning_Rate": np.array([0.0], np.float32)})
    (loss_override,) = session.run(
        ["loss"], {"X": x, "Y": y, "s": np.array(1.0, np.float32), "Learning_Rate": np.array([0.0], np.float32)}
    )
    assert_close(loss_default, ((x @ w * 2) ** 2).mean())
    assert_close(loss_override, ((x @ w) ** 2).mean())
    meta = session.get_modelmeta()
    assert (meta.producer_name, meta.graph_name, meta.domain, meta.description, meta.version) == (
        "unit-test",
        "scaled",
        "ai.test",
        "a scaled regression",
        3,
    )
    assert meta.custom_metadata_map == {"purpose": "legacy"}


# ---- session surface -----------------------------------------------------------------------
def test_accessors(model_bytes, tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(model_bytes)
    options = SessionOptions()
    options.intra_op_num_threads = 1
    session = TrainingSession(
        str(path), make_params("AdamOptimizer"), sess_options=options, providers=["CPUExecutionProvider"]
    )
    assert session.get_session_options() is options
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert session.get_provider_options() == {"CPUExecutionProvider": {}}
    assert [(a.name, a.type, a.shape) for a in session.get_inputs()] == [
        ("x", "tensor(float)", ["batch", 4]),
        ("y", "tensor(float)", ["batch", 3]),
        ("Learning_Rate", "tensor(float)", [1]),
    ]
    assert [(a.name, a.shape) for a in session.get_outputs()] == [("loss", []), ("pred", ["batch", 3])]
    assert session.get_overridable_initializers() == []
    assert session.get_modelmeta().producer_name == "pytorch"
    assert isinstance(TrainingSession(model_bytes, make_params()).get_session_options(), SessionOptions)
    assert session.is_output_fp32_node("loss")
    ((x, y),) = batches(1, seed=14)
    loss, pred = session.run(None, feed(x, y, 0.01))  # None: every graph output
    assert pred.shape == (6, 3) and loss.shape == ()


def test_unavailable_providers_fall_back_to_cpu(model_bytes):
    if torch.cuda.is_available():
        session = TrainingSession(model_bytes, make_params(), providers=[("CUDAExecutionProvider", {"device_id": 0})])
        assert session.get_providers() == ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return
    with pytest.warns(RuntimeWarning, match="CUDAExecutionProvider"):
        session = TrainingSession(
            model_bytes, make_params(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
    assert session.get_providers() == ["CPUExecutionProvider"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_matches_cpu(model_bytes):
    data = batches(3, seed=15)
    cpu = TrainingSession(model_bytes, make_params("LambOptimizer", clip=True))
    gpu = TrainingSession(model_bytes, make_params("LambOptimizer", clip=True), providers=["CUDAExecutionProvider"])
    for x, y in data:
        cpu.run(["loss"], feed(x, y, 0.01))
        gpu.run(["loss"], feed(x, y, 0.01))
    for key, value in cpu.get_state().items():
        np.testing.assert_allclose(gpu.get_state()[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_feed_and_fetch_errors(model_bytes):
    session = TrainingSession(model_bytes, make_params())
    ((x, y),) = batches(1, seed=16)
    with pytest.raises(InvalidInputError, match="Invalid Feed Input Name"):
        session.run(["loss"], dict(feed(x, y, 0.1), z=x))
    with pytest.raises(InvalidInputError, match="Missing Input: y"):
        session.run(["loss"], {"x": x, "Learning_Rate": np.array([0.1], np.float32)})
    with pytest.raises(InvalidInputError, match="data type"):
        session.run(["loss"], feed(x.astype(np.float64), y, 0.1))
    with pytest.raises(InvalidInputError, match="Invalid Output Name"):
        session.run(["nope"], feed(x, y, 0.1))
    with pytest.raises(InvalidInputError, match="trained weight"):
        session.run(["loss"], dict(feed(x, y, 0.1), **{W: np.zeros((3, 4), np.float32)}))


def test_configuration_errors(model_bytes, tmp_path):
    with pytest.raises(ValueError, match="loss_output_name"):
        TrainingSession(model_bytes, make_params(loss_output_name=""))
    with pytest.raises(ModelLoadError, match="not produced"):
        TrainingSession(model_bytes, make_params(loss_output_name="missing"))
    with pytest.raises(ValueError, match="MomentumOptimizer"):
        TrainingSession(model_bytes, make_params("MomentumOptimizer"))
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        TrainingSession(model_bytes, make_params(gradient_accumulation_steps=0))
    with pytest.raises(TypeError):
        TrainingSession(model_bytes, {"loss_output_name": "loss"})
    with pytest.raises(AttributeError):
        TrainingParameters().learning_rate = 0.1  # unknown fields are rejected, as by the pybind class
    ort_path = tmp_path / "model.ort"
    ort_path.write_bytes(model_bytes)
    with pytest.raises(NotImplementedError, match="ORT format"):
        TrainingSession(str(ort_path), make_params())


@pytest.mark.parametrize(
    "field,value",
    [
        ("world_size", 2),
        ("world_rank", 1),
        ("data_parallel_size", 2),
        ("horizontal_parallel_size", 2),
        ("pipeline_parallel_size", 2),
        ("num_pipeline_micro_batches", 4),
        ("deepspeed_zero_stage", 1),
        ("allreduce_post_accumulation", True),
        ("enable_adasum", True),
        ("pipeline_cut_info_string", "a-b"),
        ("sliced_tensor_names", ["w"]),
    ],
)
def test_multi_node_fields_point_to_ddp(model_bytes, field, value):
    with pytest.raises(NotImplementedError, match="DistributedDataParallel") as info:
        TrainingSession(model_bytes, make_params(**{field: value}))
    assert field in str(info.value) and "examples/ddp_train.py" in str(info.value)


@pytest.mark.parametrize("field", ["use_mixed_precision", "use_fp16_moments"])
def test_mixed_precision_is_not_implemented(model_bytes, field):
    with pytest.raises(NotImplementedError, match="mixed-precision"):
        TrainingSession(model_bytes, make_params(**{field: True}))


def test_parameters_are_snapshotted(model_bytes, initial):
    params = make_params("SGDOptimizer")
    session = TrainingSession(model_bytes, params)
    params.training_optimizer_name = "AdamOptimizer"
    params.lr_params_feed_name = "other"
    ((x, y),) = batches(1, seed=17)
    session.run(["loss"], feed(x, y, 0.1))
    assert set(session.get_state()) == {W, B}


def test_set_providers_keeps_weights_optimizer_state_and_accumulated_gradients(model_bytes):
    data = batches(6, seed=18)
    moved = TrainingSession(model_bytes, make_params("AdamOptimizer", gradient_accumulation_steps=2))
    stayed = TrainingSession(model_bytes, make_params("AdamOptimizer", gradient_accumulation_steps=2))
    for index, (x, y) in enumerate(data):
        if index in (2, 3):  # between updates, then in the middle of an accumulation cycle
            moved.set_providers(["CPUExecutionProvider"])
        moved.run(["loss"], feed(x, y, 0.01))
        stayed.run(["loss"], feed(x, y, 0.01))
    assert moved.get_providers() == ["CPUExecutionProvider"]
    for key, value in stayed.get_state().items():
        np.testing.assert_array_equal(moved.get_state()[key], value, err_msg=key)
