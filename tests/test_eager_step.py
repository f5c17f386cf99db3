"""The eager train step's shortcuts (docs/design.md, "Per-step cost (eager)") compute what the
paths they short-cut compute: the direct-call graph, the input-check cache, the bias-free
linear fusion, the small-GEMM rule of the dense kernel and torch's own LSTM/GRU op."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from ort_torch_compat.api import CheckpointState, Module, Optimizer
from ort_torch_compat.engine.graph_module import direct_calls
from ort_torch_compat.errors import InvalidInputError
from ort_torch_compat.graph import dense_kernel
from ort_torch_compat.graph.converters.recurrent import Recurrent
from ort_torch_compat.graph.fusion import fuse_matmul_bias
from ort_torch_compat.testing.scenario import make_batch
from tests.conftest import FIXTURES, load_spec


def _session(name: str):
    directory = FIXTURES / name
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")
    batch = make_batch(load_spec(directory), 1, 0)
    return module, Optimizer(directory / "optimizer_model.onnx", module), [batch[n] for n in module.input_names()]


@pytest.mark.parametrize("name", ["transformer_ce_adamw_op17", "cnn_ce_adamw_op17", "lstm_ce_adamw_op17"])
def test_the_direct_call_graph_gives_the_modules_outputs_and_gradients_bit_for_bit(name):
    module, _, inputs = _session(name)
    engine = module._engine
    assert getattr(engine.train_runner, "_state", None) == "eager"  # the suite runs with compilation off
    feeds = engine._feeds(
        [torch.from_numpy(np.asarray(x)) for x in inputs],
        engine.train_io,
        engine._train_batch,
        engine.train_strings,
        "train step",
    )
    results = []
    for graph in (engine.train_module, direct_calls(engine.train_module)):
        state = {k: v.clone() for k, v in engine.train_module.state_dict().items()}  # running stats
        engine.store.release_grads()
        with torch.enable_grad():
            outputs = graph(*feeds, *engine._train_params)
            outputs[0].backward()
        results.append(
            (
                [o.detach().clone() for o in outputs],
                [t.grad.clone() for t in engine.store.trainable],
                {k: v.clone() for k, v in engine.train_module.state_dict().items()},
            )
        )
        engine.train_module.load_state_dict(state)
    (out_a, grad_a, state_a), (out_b, grad_b, state_b) = results
    assert all(torch.equal(a, b) for a, b in zip(out_a, out_b))
    assert all(torch.equal(a, b) for a, b in zip(grad_a, grad_b))
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert not any(node.op == "call_module" for node in engine.train_runner.eager.graph.nodes)


def test_cached_input_checks_still_refuse_a_bad_input_after_good_ones():
    module, optimizer, inputs = _session("transformer_ce_adamw_op17")
    for _ in range(2):
        module(*inputs)
        optimizer.step()
        module.lazy_reset_grad()
    x, labels = inputs
    with pytest.raises(InvalidInputError, match="data type for 'x'"):
        module(x.astype(np.int32), labels)
    with pytest.raises(InvalidInputError, match="invalid dimensions for input 'x'"):
        module(x[:, :3], labels)
    with pytest.raises(InvalidInputError, match="expects 2 input"):
        module(x)
    module(*inputs)  # and the good signature passes again
    module.eval()
    with pytest.raises(InvalidInputError, match="eval step: unexpected input data type for 'x'"):
        module(x.astype(np.int32), labels)


def _projection_model(bias: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "wt"], ["y"])]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [5, 4]),
    ]
    if bias:
        nodes[-1] = helper.make_node("MatMul", ["x", "wt"], ["p"])
        nodes.append(helper.make_node("Add", ["p", "b"], ["y"]))
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [5]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("bias", [False, True])
def test_matmul_of_a_transposed_weight_becomes_one_linear_node(bias):
    from ort_torch_compat.graph import build_graph_module

    model = _projection_model(bias)
    fused = fuse_matmul_bias(model.graph)
    assert [n.op_type for n in fused] == ["LinearBias" if bias else "Linear"]
    names = ["x", "w"] + (["b"] if bias else [])
    graph_module = build_graph_module(model.graph, {"": 17}, names, ["y"], "projection")
    values = [torch.randn(2, 3, 4), torch.randn(5, 4)] + ([torch.randn(5)] if bias else [])
    expected = torch.matmul(values[0], values[1].permute(1, 0)) + (values[2] if bias else 0)
    assert torch.equal(graph_module(*values)[0], expected)


def test_small_dense_layers_skip_onednn_and_large_ones_use_it():
    small = torch.randn(16, 32, requires_grad=True), torch.randn(32, 32, requires_grad=True), torch.randn(32)
    assert not dense_kernel._onednn_applies(*small)
    assert torch.equal(dense_kernel.linear(*small), torch.nn.functional.linear(*small))
    large = torch.randn(128, 256), torch.randn(256, 256), torch.randn(256)
    assert dense_kernel._onednn_applies(*large) == (dense_kernel._ONEDNN is not None)


@pytest.mark.parametrize("bias", [True, False])
def test_a_dense_layer_on_a_non_contiguous_input_traces_as_one_product(bias):
    """A seq-first view of a batch-first tensor (nn.MultiheadAttention's projections): torch's
    linear, traced without grad (as graph/specialize.py traces), is a batched product against
    the weight expanded per row block, whose backward sums a weight-sized gradient per block;
    ours is one 2-D product.  Values equal F.linear's within float32 rounding."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(4, 16, 32).transpose(0, 1)  # [16, 4, 32], not contiguous
    weight, b = torch.randn(48, 32), (torch.randn(48) if bias else None)

    def calls(function) -> list:
        graph = make_fx(lambda x, w, b: function(x, w, b))(x, weight, b)
        return [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]

    assert any("bmm" in c for c in calls(torch.nn.functional.linear)), "torch folds it now: the rewrite can go"
    with dense_kernel.plain_aten_kernels():
        ours = calls(dense_kernel.linear)
        torch.testing.assert_close(dense_kernel.linear(x, weight, b), torch.nn.functional.linear(x, weight, b))
    assert not any("bmm" in c or "expand" in c for c in ours), ours
    assert sum(c.split(".")[1] in ("mm", "addmm") for c in ours) == 1, ours


@pytest.mark.parametrize(
    "cell,direction,layout",
    [
        ("LSTM", "forward", 0),
        ("LSTM", "bidirectional", 0),
        ("LSTM", "forward", 1),
        ("GRU", "forward", 0),
        ("GRU", "bidirectional", 1),
    ],
)
def test_torchs_recurrent_op_matches_the_onnx_time_loop(cell, direction, layout):
    torch.manual_seed(0)
    dirs, hidden, gates = (2 if direction == "bidirectional" else 1), 6, (4 if cell == "LSTM" else 3)
    acts = ([torch.sigmoid, torch.tanh, torch.tanh] if cell == "LSTM" else [torch.sigmoid, torch.tanh]) * dirs
    outputs = 3 if cell == "LSTM" else 2
    module = Recurrent(cell, hidden, direction, layout, 1, outputs, acts, None, False)
    assert module.native
    x = torch.randn(*((5, 3) if layout == 0 else (3, 5)), 4, requires_grad=True)
    w = torch.randn(dirs, gates * hidden, 4, requires_grad=True)
    r = torch.randn(dirs, gates * hidden, hidden, requires_grad=True)
    b = torch.randn(dirs, 2 * gates * hidden, requires_grad=True)
    h0 = torch.randn(*((dirs, 3) if layout == 0 else (3, dirs)), hidden, requires_grad=True)
    extra = [torch.randn_like(h0, requires_grad=True)] if cell == "LSTM" else []
    args = (x, w, r, b, None, h0, *extra)
    native = module(*args)
    module.native = False
    loop = module(*args)
    for a, e in zip(native, loop):
        assert a.shape == e.shape and torch.allclose(a, e, rtol=1e-5, atol=1e-6)
    leaves = (x, w, r, b, h0, *extra)
    grads_native = torch.autograd.grad(sum((o * o).sum() for o in native), leaves)
    grads_loop = torch.autograd.grad(sum((o * o).sum() for o in loop), leaves)
    for a, e in zip(grads_native, grads_loop):
        assert torch.allclose(a, e, rtol=1e-4, atol=1e-5)


def test_unusual_recurrent_settings_keep_the_time_loop():
    lstm = [torch.sigmoid, torch.tanh, torch.tanh]
    assert not Recurrent("LSTM", 4, "reverse", 0, 0, 3, lstm, None, False).native
    assert not Recurrent("LSTM", 4, "forward", 0, 0, 3, lstm, 1.0, False).native  # clip
    assert not Recurrent("LSTM", 4, "forward", 0, 0, 3, lstm, None, True).native  # input_forget
    assert not Recurrent("LSTM", 4, "forward", 0, 0, 3, [torch.tanh, torch.tanh, torch.tanh], None, False).native
    assert not Recurrent("GRU", 4, "forward", 0, 0, 2, [torch.sigmoid, torch.tanh], None, False).native  # lbr 0
    assert not Recurrent("RNN", 4, "forward", 0, 0, 2, [torch.tanh], None, False).native


def test_a_trace_for_the_compiler_keeps_the_time_loop():
    """The compiler traces the loop (Inductor fuses it), never oneDNN's RNN op."""
    from torch.fx.experimental.proxy_tensor import make_fx

    module = Recurrent("LSTM", 4, "forward", 0, 0, 3, [torch.sigmoid, torch.tanh, torch.tanh], None, False)
    x, w, r = torch.randn(3, 2, 5), torch.randn(1, 16, 5), torch.randn(1, 16, 4)
    with dense_kernel.plain_aten_kernels():
        traced = make_fx(lambda *a: module(*a))(x, w, r)
    targets = {str(node.target) for node in traced.graph.nodes}
    assert not any("rnn" in t or "lstm" in t for t in targets)
    assert any("sigmoid" in t for t in targets)


def test_a_traced_time_loop_projects_every_step_in_one_product():
    """A batch-first input arrives transposed: in the graph the compiler gets, its
    projection must stay one 2-D product, not a batched product against an expanded weight
    (whose weight gradient is one product per time step, summed)."""
    from torch import fx

    from ort_torch_compat.graph.specialize import specialize

    graph = fx.Graph()
    x, w, r = graph.placeholder("x"), graph.placeholder("w"), graph.placeholder("r")
    steps_first = graph.call_method("transpose", (x, 0, 1))
    graph.output((graph.call_method("sum", (graph.call_module("lstm", (steps_first, w, r)),)),))
    root = torch.nn.Module()
    root.add_module(
        "lstm", Recurrent("LSTM", 4, "forward", 0, 0, 1, [torch.sigmoid, torch.tanh, torch.tanh], None, False)
    )
    module = fx.GraphModule(root, graph)
    tensors = [torch.randn(2, 3, 5, requires_grad=True), torch.randn(1, 16, 5, requires_grad=True)]
    tensors.append(torch.randn(1, 16, 4, requires_grad=True))
    specialized = specialize(module, tensors)
    targets = [str(node.target) for node in specialized.module.graph.nodes]
    assert "aten.mm.default" in targets and not any("bmm" in t for t in targets)
    torch.testing.assert_close(specialized.module(*tensors, *specialized.constants)[0], module(*tensors)[0])
