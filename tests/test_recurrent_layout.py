"""torch-exported LSTM/GRU nodes fed their layer's own parameters (graph/recurrent_layout.py):
which graphs are rewritten and which are not, and the rewritten node's outputs and
gradients against torch's own layer in float64, on each path the converter takes (torch's
recurrent op, the traced step's `lstm_sequence`, the time loop)."""

from __future__ import annotations

import contextlib
import glob
import io

import numpy
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from ort_torch_compat.graph import build_graph_module, dense_kernel
from ort_torch_compat.graph.converters.recurrent import Recurrent, TorchGateRecurrent
from ort_torch_compat.graph.recurrent_layout import torch_gate_recurrents
from ort_torch_compat.graph.traced_operators import operators_in_traces

SEQ, BATCH, FEATURES, HIDDEN = 5, 3, 6, 4


def _export(cell: str, bidirectional: bool, bias: bool, opset: int = 17, layers: int = 1) -> onnx.ModelProto:
    """The layer exported as training exports are made (parameters kept, not folded), with
    its parameters as graph inputs, as in a training model."""
    torch.manual_seed(0)
    layer = getattr(torch.nn, cell)(FEATURES, HIDDEN, layers, bias=bias, bidirectional=bidirectional)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x)[0]

    buffer = io.BytesIO()
    torch.onnx.export(
        Net(),
        (torch.randn(SEQ, BATCH, FEATURES),),
        buffer,
        dynamo=False,
        opset_version=opset,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        input_names=["x"],
        output_names=["y"],
    )
    model = onnx.load_from_string(buffer.getvalue())
    parameters = [init for init in model.graph.initializer if init.name.startswith("layer.")]
    for init in parameters:
        model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        model.graph.initializer.remove(init)
    return model


def _dims(info: onnx.ValueInfoProto):
    return [d.dim_value for d in info.type.tensor_type.shape.dim]


def _parameter_names(model: onnx.ModelProto):
    return [i.name for i in model.graph.input if i.name.startswith("layer.")]


def _build(model: onnx.ModelProto):
    opsets = {o.domain: o.version for o in model.opset_import}
    return build_graph_module(model.graph, opsets, ["x", *_parameter_names(model)], ["y"], "net")


def _fused_ops(model: onnx.ModelProto):
    return [n.op_type for n in torch_gate_recurrents(model.graph, list(model.graph.node)) if "TorchGates" in n.op_type]


def _reference(model: onnx.ModelProto, cell: str, bidirectional: bool, bias: bool, x, parameters, layers: int = 1):
    """torch's own layer in float64 with the exported parameters."""
    layer = getattr(torch.nn, cell)(FEATURES, HIDDEN, layers, bias=bias, bidirectional=bidirectional).double()
    with torch.no_grad():
        for name, value in zip(_parameter_names(model), parameters):
            getattr(layer, name[len("layer.") :]).copy_(value)
    y = layer(x)[0]
    wanted = [x] + [getattr(layer, name[len("layer.") :]) for name in _parameter_names(model)]
    return y, wanted


def _path(name: str):
    """The contexts under which the converter takes `name`'s path."""
    if name == "native":  # the eager step: torch's recurrent op
        return []
    if name == "lstm_sequence":  # the traced step's trace
        return [dense_kernel.plain_aten_kernels(), operators_in_traces(True)]
    return [dense_kernel.plain_aten_kernels()]  # traces for the compiler: the time loop


@pytest.mark.parametrize("path", ["native", "lstm_sequence", "loop"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_rewritten_node_is_torchs_layer(cell, bidirectional, bias, path):
    model = _export(cell, bidirectional, bias)
    assert _fused_ops(model) == [f"{cell}TorchGates"]
    module = _build(model).double()
    recurrents = [name for name, m in module.named_modules() if isinstance(m, Recurrent)]
    assert len(recurrents) == 1 and isinstance(module.get_submodule(recurrents[0]), TorchGateRecurrent)
    parameter_readers = {
        (user.op, user.target)
        for node in list(module.graph.nodes)[1:]
        if node.op == "placeholder"
        for user in node.users
    }
    assert parameter_readers == {("call_module", recurrents[0])}  # the slicing nodes are gone
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SEQ, BATCH, FEATURES, generator=generator, dtype=torch.float64, requires_grad=True)
    parameters = [
        torch.randn(*_dims(i), generator=generator, dtype=torch.float64).requires_grad_()
        for i in model.graph.input
        if i.name.startswith("layer.")
    ]
    with contextlib.ExitStack() as stack:
        for context in _path(path):
            stack.enter_context(context)
        actual = module(x, *parameters)[0]
    expected, wanted = _reference(model, cell, bidirectional, bias, x, parameters)
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)
    upstream = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    actual_grads = torch.autograd.grad(actual, [x, *parameters], upstream)
    expected_grads = torch.autograd.grad(expected, wanted, upstream)
    for name, a, e in zip(["x", *_parameter_names(model)], actual_grads, expected_grads):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("opset", [9, 13, 17, 20])
def test_every_opsets_slicing_is_recognised(opset):
    """Slice and Unsqueeze with attributes (opset < 10 / < 13) or constant inputs."""
    model = _export("LSTM", True, True, opset)
    assert _fused_ops(model) == ["LSTMTorchGates"]
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(SEQ, BATCH, FEATURES, generator=generator, dtype=torch.float64)
    parameters = [torch.randn(*_dims(i), generator=generator, dtype=torch.float64) for i in model.graph.input[1:]]
    expected, _ = _reference(model, "LSTM", True, True, x, parameters)
    torch.testing.assert_close(_build(model).double()(x, *parameters)[0], expected, rtol=1e-10, atol=1e-12)


def test_ort_artifacts_are_rewritten():
    """ORT's artifact generation writes the three Slices as one Split (and Concat as
    ConcatTraining): the committed LSTM and GRU fixtures, which the parity suites train
    against ORT's recorded numbers, take the rewritten path."""
    paths = sorted(glob.glob("tests/fixtures/*/training_model.onnx"))
    recurrent = {
        path: onnx.load(path)
        for path in paths
        if any(
            n.op_type in ("LSTMTraining", "GRUTraining") for n in onnx.load(path, load_external_data=False).graph.node
        )
    }
    assert len(recurrent) >= 10
    for path, model in recurrent.items():
        assert len(_fused_ops(model)) == 1, path


def _node_feeding(model: onnx.ModelProto, op_type: str, position: int) -> onnx.NodeProto:
    """The node producing input `position` of the first `op_type` node's input (the Concat
    under W's Unsqueeze, for position 1)."""
    by_output = {out: node for node in model.graph.node for out in node.output}
    recurrent = next(n for n in model.graph.node if n.op_type == op_type)
    return by_output[by_output[recurrent.input[position]].input[0]]


def _refused_in_onnx_order(model):
    concat = _node_feeding(model, "LSTM", 1)  # i, o, f+c -> i, f+c, o: torch's own order, not a reordering
    concat.input[:] = [concat.input[0], concat.input[2], concat.input[1]]


def _refused_with_clip(model):
    next(n for n in model.graph.node if n.op_type == "LSTM").attribute.append(helper.make_attribute("clip", 3.0))


def _refused_with_sequence_lens(model):
    lstm = next(n for n in model.graph.node if n.op_type == "LSTM")
    model.graph.initializer.append(numpy_helper.from_array(__import__("numpy").full(BATCH, SEQ, "int32"), "lens"))
    lstm.input[4] = "lens"


def _refused_with_a_larger_source(model):
    """The gates cut from the first half of a parameter twice the layer's size."""
    info = next(i for i in model.graph.input if i.name == "layer.weight_ih_l0")
    info.type.tensor_type.shape.dim[0].dim_value *= 2


@pytest.mark.parametrize(
    "change", [_refused_in_onnx_order, _refused_with_clip, _refused_with_sequence_lens, _refused_with_a_larger_source]
)
def test_other_graphs_are_left_as_they_are(change):
    model = _export("LSTM", False, True)
    change(model)
    assert _fused_ops(model) == []


def test_slices_read_elsewhere_are_kept():
    model = _export("LSTM", False, True)
    concat = _node_feeding(model, "LSTM", 1)
    model.graph.output.append(helper.make_tensor_value_info(concat.input[1], onnx.TensorProto.FLOAT, None))
    nodes = torch_gate_recurrents(model.graph, list(model.graph.node))
    assert [n.op_type for n in nodes if "TorchGates" in n.op_type] == ["LSTMTorchGates"]
    produced = {out for node in nodes for out in node.output}
    assert concat.input[1] in produced and concat.input[0] not in produced and concat.output[0] not in produced


def _mutated(seed: int) -> onnx.ModelProto:
    """The exported bidirectional LSTM with one of its reordering's parts changed at random:
    a Slice bound, a Concat's order, an Unsqueeze's axis, the node's hidden size or direction."""
    rng = numpy.random.default_rng(seed)
    model = _export("LSTM", True, True)
    by_output = {out: node for node in model.graph.node for out in node.output}
    slicing = [n for n in model.graph.node if n.op_type in ("Slice", "Concat", "Unsqueeze")]
    lstm = next(n for n in model.graph.node if n.op_type == "LSTM")
    kind = seed % 4
    if kind == 0:  # a Slice's start or end (a Constant input)
        node = rng.choice([n for n in slicing if n.op_type == "Slice"])
        constant = by_output[node.input[int(rng.integers(1, 3))]]
        value = int(rng.integers(-3 * HIDDEN, 5 * HIDDEN))
        constant.attribute[0].t.CopyFrom(numpy_helper.from_array(numpy.array([value], "int64")))
    elif kind == 1:  # a Concat's inputs reordered
        node = rng.choice([n for n in slicing if n.op_type == "Concat" and len(n.input) > 1])
        order = rng.permutation(len(node.input))
        node.input[:] = [node.input[i] for i in order]
    elif kind == 2:  # an Unsqueeze's axis
        node = rng.choice([n for n in slicing if n.op_type == "Unsqueeze"])
        by_output[node.input[1]].attribute[0].t.CopyFrom(numpy_helper.from_array(numpy.array([1], "int64")))
    else:  # the node's attributes
        for attribute in lstm.attribute:
            if attribute.name == "hidden_size" and rng.random() < 0.5:
                attribute.i = int(rng.integers(-1, 2 * HIDDEN))
            if attribute.name == "direction":
                attribute.s = rng.choice([b"forward", b"reverse", b"\xff\xfe", b"bidirectional"])
    return model


@pytest.mark.parametrize("seed", range(24))
def test_changed_reorderings_are_rewritten_only_where_exact(seed, monkeypatch):
    """Fuzzed: the pass never raises, and where it still rewrites the node, the module
    computes what the graph as written computes, or fails where that fails (a change outside
    the reordering, such as an Unsqueeze of the initial states' shape)."""
    from ort_torch_compat.graph import module_builder

    model = _mutated(seed)
    if not _fused_ops(model):
        return
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SEQ, BATCH, FEATURES, generator=generator, dtype=torch.float64)
    parameters = [torch.randn(*_dims(i), generator=generator, dtype=torch.float64) for i in model.graph.input[1:]]

    def run():
        try:
            return _build(model).double()(x, *parameters)[0]
        except Exception as error:  # what the graph as written raises, compared below
            return type(error)

    rewritten = run()
    monkeypatch.setattr(module_builder, "torch_gate_recurrents", lambda graph, nodes: list(nodes))
    as_written = run()
    if isinstance(as_written, type):
        assert rewritten is as_written
    else:
        torch.testing.assert_close(rewritten, as_written, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("path", ["native", "lstm_sequence", "loop"])
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_stacked_layers_are_each_rewritten(cell, path):
    """Two bidirectional layers: two nodes, each fed its own layer's parameters."""
    model = _export(cell, True, True, layers=2)
    assert _fused_ops(model) == [f"{cell}TorchGates"] * 2
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(SEQ, BATCH, FEATURES, generator=generator, dtype=torch.float64, requires_grad=True)
    parameters = [
        torch.randn(*_dims(i), generator=generator, dtype=torch.float64).requires_grad_() for i in model.graph.input[1:]
    ]
    with contextlib.ExitStack() as stack:
        for context in _path(path):
            stack.enter_context(context)
        actual = _build(model).double()(x, *parameters)[0]
    expected, wanted = _reference(model, cell, True, True, x, parameters, layers=2)
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)
    for a, e in zip(torch.autograd.grad(actual.sum(), [x, *parameters]), torch.autograd.grad(expected.sum(), wanted)):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)
