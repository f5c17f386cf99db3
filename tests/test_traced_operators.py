"""The traced step's operators with hand-derived backwards (graph/traced_operators.py):
forward and backward against autograd's of the converters' equations, in float64; inlined
as aten calls by the joint graph's trace, with fewer calls than autograd's backward."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ort_torch_compat.graph import dense_kernel
from ort_torch_compat.graph.converters.recurrent import Recurrent
from ort_torch_compat.graph.traced_operators import (
    TRACED_OPERATOR_DECOMPOSITIONS,
    gru_sequence,
    lstm_sequence,
    onednn_linear,
    operators_in_traces,
    rms_norm,
)

SEQ, BATCH, HIDDEN, FEATURES = 5, 3, 4, 6


def _onnx_lstm(x_proj, h, c, r, reverse, torch_gates=False):
    """ONNX's LSTM equations (default activations), step by step; the gate blocks in ONNX's
    order (i, o, f, c) or torch's (i, f, g, o)."""
    ys = [None] * x_proj.shape[0]
    for k in range(x_proj.shape[0] - 1, -1, -1) if reverse else range(x_proj.shape[0]):
        blocks = (x_proj[k] + h @ r.t()).chunk(4, dim=1)
        i, f, g, o = blocks if torch_gates else (blocks[0], blocks[2], blocks[3], blocks[1])
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        ys[k] = h
    return torch.stack(ys), h, c


def _inputs(seed, seq=SEQ, batch=BATCH, hidden=HIDDEN):
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    return rand(seq, batch, 4 * hidden), rand(batch, hidden), rand(batch, hidden), rand(4 * hidden, hidden)


def _assert_values_and_gradients(actual, expected, inputs, upstream) -> None:
    """The outputs, and their gradients for `upstream` with respect to `inputs`, agree in float64."""
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    for e, a in zip(torch.autograd.grad(expected, inputs, upstream), torch.autograd.grad(actual, inputs, upstream)):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("torch_gates", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("sizes", [(SEQ, BATCH, HIDDEN), (1, 1, 1), (1, 3, 2), (7, 1, 5)])
def test_forward_and_gradients_are_onnx_equations(reverse, sizes, torch_gates):
    seq, batch, hidden = sizes
    inputs = _inputs(1, seq, batch, hidden)
    upstream = [torch.randn(seq, batch, hidden, dtype=torch.float64), *torch.randn(2, batch, hidden).double()]
    expected = _onnx_lstm(*inputs, reverse, torch_gates)
    actual = lstm_sequence(*inputs, reverse, torch_gates)[:3]
    _assert_values_and_gradients(actual, expected, inputs, upstream)


@pytest.mark.parametrize("torch_gates", [False, True])
def test_gradients_when_only_the_last_state_is_used(torch_gates):
    """A classifier on h_n: y and c_n get no gradient (undefined upstream gradients)."""
    inputs = _inputs(2)
    expected = torch.autograd.grad(_onnx_lstm(*inputs, False, torch_gates)[1].sum(), inputs)
    actual = torch.autograd.grad(lstm_sequence(*inputs, False, torch_gates)[1].sum(), inputs)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


def _joint(reverse, torch_gates):
    def step(x_proj, h0, c0, r):
        with torch.enable_grad():
            y, h, c = lstm_sequence(x_proj, h0, c0, r, reverse, torch_gates)[:3]
            loss = y.sin().sum() + h.sum() + c.cos().sum()
            return [loss.detach(), *torch.autograd.grad(loss, [x_proj, h0, c0, r])]

    return step


@pytest.mark.parametrize("torch_gates", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_the_joint_trace_inlines_it_with_one_recurrent_weight_product(reverse, torch_gates):
    inputs = [t.detach().requires_grad_() for t in _inputs(3)]
    graph = make_fx(
        _joint(reverse, torch_gates), decomposition_table=TRACED_OPERATOR_DECOMPOSITIONS, tracing_mode="fake"
    )(*inputs)
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert not any("ort_torch_compat" in str(t) for t in targets)  # aten calls only: TorchScript runs them
    products = [t for t in targets if t in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)]
    # per time step one forward and one backward product, plus one for the recurrent weight's
    # gradient over all steps (autograd's backward of the loop has one per step)
    assert len(products) == 2 * SEQ + 1
    expected = _joint(reverse, torch_gates)(*inputs)
    for e, a in zip(expected, graph(*inputs)):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("optional_inputs", [True, False])
def test_the_converter_traces_the_operator_where_the_loop_ran(direction, layout, optional_inputs, cell):
    """The ONNX node as traced for the traced step: the numbers and gradients of the time
    loop (which a trace for the compiler keeps)."""
    directions = 2 if direction == "bidirectional" else 1
    gates, outputs = (4, 3) if cell == "LSTM" else (3, 2)
    acts = ([torch.sigmoid, torch.tanh, torch.tanh] if cell == "LSTM" else [torch.sigmoid, torch.tanh]) * directions
    module = Recurrent(cell, HIDDEN, direction, layout, 1, outputs, acts, None, False)
    loop = Recurrent(cell, HIDDEN, direction, layout, 1, outputs, acts, None, False)
    loop.native = loop.sequence_operator = False
    generator = torch.Generator().manual_seed(4)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    x = rand(BATCH, SEQ, FEATURES) if layout else rand(SEQ, BATCH, FEATURES)
    states = (BATCH, directions, HIDDEN) if layout else (directions, BATCH, HIDDEN)
    inputs = [x, rand(directions, gates * HIDDEN, FEATURES), rand(directions, gates * HIDDEN, HIDDEN)]
    if optional_inputs:  # biases and initial states
        inputs += [rand(directions, 2 * gates * HIDDEN), None, rand(*states)]
        inputs += [rand(*states)] if cell == "LSTM" else []
    trainable = [t for t in inputs if t is not None]
    assert module.sequence_operator
    with dense_kernel.plain_aten_kernels(), operators_in_traces(True):
        actual = module(*inputs)
    expected = loop(*inputs)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    upstream = [torch.randn_like(e) for e in expected]
    for e, a in zip(
        torch.autograd.grad(expected, trainable, upstream), torch.autograd.grad(actual, trainable, upstream)
    ):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


def test_traces_for_the_compiler_keep_the_time_loop():
    acts = [torch.sigmoid, torch.tanh, torch.tanh]
    module = Recurrent("LSTM", HIDDEN, "forward", 0, 0, 3, acts, None, False)
    inputs = [
        torch.randn(SEQ, BATCH, FEATURES),
        torch.randn(1, 4 * HIDDEN, FEATURES),
        torch.randn(1, 4 * HIDDEN, HIDDEN),
    ]
    with dense_kernel.plain_aten_kernels():
        graph = make_fx(module, tracing_mode="fake")(*inputs)
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert not any("ort_torch_compat" in t for t in targets)
    with dense_kernel.plain_aten_kernels(), operators_in_traces(True):
        graph = make_fx(module, tracing_mode="fake")(*inputs)
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert "ort_torch_compat.lstm_sequence.default" in targets


def _onnx_gru(x_proj, h, r, rb, reverse, torch_gates=False):
    """ONNX's GRU equations with linear_before_reset (default activations), step by step;
    the gate blocks in ONNX's order (z, r, h) or torch's (r, z, n)."""
    ys = [None] * x_proj.shape[0]
    for k in range(x_proj.shape[0] - 1, -1, -1) if reverse else range(x_proj.shape[0]):
        x_blocks, h_blocks = x_proj[k].chunk(3, dim=1), (h @ r.t() + rb).chunk(3, dim=1)
        order = (1, 0, 2) if torch_gates else (0, 1, 2)
        (xz, xr, xn), (hz, hr, hn) = [[blocks[i] for i in order] for blocks in (x_blocks, h_blocks)]
        z, reset = torch.sigmoid(xz + hz), torch.sigmoid(xr + hr)
        n = torch.tanh(xn + reset * hn)
        h = (1 - z) * n + z * h
        ys[k] = h
    return torch.stack(ys), h


def _gru_inputs(seed, seq=SEQ, batch=BATCH, hidden=HIDDEN):
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    return rand(seq, batch, 3 * hidden), rand(batch, hidden), rand(3 * hidden, hidden), rand(3 * hidden)


@pytest.mark.parametrize("torch_gates", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("sizes", [(SEQ, BATCH, HIDDEN), (1, 1, 1), (1, 3, 2), (7, 1, 5)])
def test_gru_forward_and_gradients_are_onnx_equations(reverse, sizes, torch_gates):
    seq, batch, hidden = sizes
    inputs = _gru_inputs(6, seq, batch, hidden)
    upstream = [torch.randn(seq, batch, hidden, dtype=torch.float64), torch.randn(batch, hidden).double()]
    expected = _onnx_gru(*inputs, reverse, torch_gates)
    actual = gru_sequence(*inputs, reverse, torch_gates)[:2]
    _assert_values_and_gradients(actual, expected, inputs, upstream)


@pytest.mark.parametrize("used", ["y", "h_n"])
def test_gru_gradients_when_one_output_is_used(used):
    """A classifier on h_n, or a head on y alone: the other output's gradient is undefined."""
    inputs = _gru_inputs(7)
    index = 0 if used == "y" else 1
    expected = torch.autograd.grad(_onnx_gru(*inputs, False)[index].sin().sum(), inputs)
    actual = torch.autograd.grad(gru_sequence(*inputs, False, False)[index].sin().sum(), inputs)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_the_joint_trace_inlines_the_gru_with_one_recurrent_weight_product(reverse):
    def step(x_proj, h0, r, rb):
        with torch.enable_grad():
            y, h = gru_sequence(x_proj, h0, r, rb, reverse, True)[:2]
            loss = y.sin().sum() + h.cos().sum()
            return [loss.detach(), *torch.autograd.grad(loss, [x_proj, h0, r, rb])]

    inputs = [t.detach().requires_grad_() for t in _gru_inputs(8)]
    graph = make_fx(step, decomposition_table=TRACED_OPERATOR_DECOMPOSITIONS, tracing_mode="fake")(*inputs)
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert not any("ort_torch_compat" in str(t) for t in targets)
    products = [t for t in targets if t in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)]
    assert len(products) == 2 * SEQ + 1  # a forward and a backward product a step, one weight gradient
    for e, a in zip(step(*inputs), graph(*inputs)):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_rms_norm_is_the_converters_equations(axis):
    from ort_torch_compat.graph.converters.layer_norm import SimplifiedLayerNorm

    generator = torch.Generator().manual_seed(5)
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=generator, dtype=torch.float64).requires_grad_()
    scale = torch.randn(x.shape[axis:], generator=generator, dtype=torch.float64).requires_grad_()
    module = SimplifiedLayerNorm(axis - 3, 1e-5)
    expected = module(x, scale)
    with dense_kernel.plain_aten_kernels(), operators_in_traces(True):
        actual = module(x, scale)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    upstream = torch.randn_like(expected)
    for e, a in zip(
        torch.autograd.grad(expected, [x, scale], upstream), torch.autograd.grad(actual, [x, scale], upstream)
    ):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    graph = make_fx(
        lambda x, scale, dy: torch.autograd.grad(rms_norm(x, scale, axis, 1e-5)[0], [x, scale], dy),
        decomposition_table=TRACED_OPERATOR_DECOMPOSITIONS,
        tracing_mode="fake",
    )(x, scale, upstream)
    calls = [node for node in graph.graph.nodes if node.op == "call_function" and "detach" not in str(node.target)]
    assert not any("ort_torch_compat" in str(node.target) for node in calls)
    assert len(calls) <= 14  # forward 7, backward 7: autograd's backward of the forward's calls takes 17


_ONEDNN = pytest.mark.skipif(dense_kernel._ONEDNN is None, reason="this torch has no oneDNN")


@_ONEDNN
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(4, 16, 256), (64, 256)])
def test_onednn_linear_is_the_eager_steps_dense_layer(bias, shape):
    """The traced step's dense layer computes what the eager step's computes, bit for bit
    (the same oneDNN products), and both are a float64 replay's values within float32 rounding."""
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(*shape, generator=generator).requires_grad_()
    weight = torch.randn(1024, shape[-1], generator=generator).requires_grad_()
    b = torch.randn(1024, generator=generator).requires_grad_() if bias else None
    trainable = [t for t in (x, weight, b) if t is not None]
    assert dense_kernel._onednn_applies(x, weight, b)
    eager = dense_kernel.linear(x, weight, b)
    traced = onednn_linear(x, weight, b)
    assert torch.equal(traced, eager)
    upstream = torch.randn(eager.shape, generator=generator)
    eager_grads = torch.autograd.grad(eager, trainable, upstream)
    traced_grads = torch.autograd.grad(traced, trainable, upstream)
    for e, a in zip(eager_grads, traced_grads):
        assert torch.equal(a, e)
    wide = [t.detach().double().requires_grad_() for t in trainable]
    replay = torch.nn.functional.linear(wide[0], wide[1], wide[2] if bias else None)
    torch.testing.assert_close(traced.double(), replay, rtol=1e-5, atol=1e-4)
    for e, a in zip(torch.autograd.grad(replay, wide, upstream.double()), traced_grads):
        torch.testing.assert_close(a.double(), e, rtol=1e-5, atol=1e-3)


@_ONEDNN
def test_traces_for_the_traced_step_keep_onednn_products_and_the_compilers_do_not():
    """A trace for the compiler records aten's products (it lowers those); one for the traced
    step records the eager step's oneDNN products, forward and backward, inlined as oneDNN's op."""
    x, weight, b = torch.randn(4, 16, 256), torch.randn(1024, 256), torch.randn(1024)

    def targets(graph):
        return {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}

    with dense_kernel.plain_aten_kernels():
        graph = make_fx(dense_kernel.linear, tracing_mode="fake")(x, weight, b)
    assert not any("mkldnn" in t or "ort_torch_compat" in t for t in targets(graph))
    with dense_kernel.plain_aten_kernels(), operators_in_traces(True):
        graph = make_fx(dense_kernel.linear, tracing_mode="fake")(x, weight, b)
    assert "ort_torch_compat.onednn_linear.default" in targets(graph)
    trainable = [t.requires_grad_() for t in (x, weight, b)]
    joint = make_fx(
        lambda x, w, b, dy: [onednn_linear(x, w, b), *torch.autograd.grad(onednn_linear(x, w, b), [x, w, b], dy)],
        decomposition_table=TRACED_OPERATOR_DECOMPOSITIONS,
        tracing_mode="fake",
    )(*trainable, torch.randn(4, 16, 1024))
    assert not any("ort_torch_compat" in t for t in targets(joint))
    products = [n for n in joint.graph.nodes if n.op == "call_function" and "_linear_pointwise" in str(n.target)]
    assert len(products) == 4  # two forwards (one traced for the gradients), the input's and the weight's gradient
