"""Attention chains recognised as one ScaledAttention node (graph/attention_pattern.py,
converters/attention.py) and the traced step's `scaled_attention` operator
(graph/traced_operators.py): which graphs are rewritten and which are not; eagerly the
rewritten graph computes the written graph's values and gradients bit for bit; the
operator's values and gradients (a learned mask's too) against the written equations in
float64; the joint trace inlines it as the attention kernel's two aten calls."""

from __future__ import annotations

import math

import numpy
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.fx.experimental.proxy_tensor import make_fx

from ort_torch_compat.graph import build_graph_module, module_builder
from ort_torch_compat.graph.attention_pattern import fuse_scaled_attention
from ort_torch_compat.graph.traced_operators import (
    TRACED_OPERATOR_DECOMPOSITIONS,
    attention_fits,
    operators_in_traces,
    scaled_attention,
)

B, H, L, S, E = 2, 3, 5, 7, 4
DIVISOR = math.sqrt(8.0)


def _scalar(name: str, value: float, data_type=TensorProto.FLOAT) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy.array(value, dtype=helper.tensor_dtype_to_np_dtype(data_type)), name)


def _model(
    form: str,
    mask: str = "",
    opset: int = 17,
    softmax_axis=-1,
    data_type=TensorProto.FLOAT,
    extra_outputs=(),
    casts=(),
    dropout_ratio=None,
    dropout_mask_read=False,
) -> onnx.ModelProto:
    """q [B,H,L,E], kt [B,H,E,S], v [B,H,S,E] -> y, with the attention written as `form`:
    "divide" (scores / c, older exporters), "split" (q * c1 and kt * c2, torch's exporter),
    "scaled" (scores * c then the mask, Llama's), "constant-node" (a Constant node's scale),
    "swapped" (Mul(c, q), Add(mask, scores)), "plain" (no scale).  `mask`: "" none,
    "input" (a graph input, [B,1,1,S]), "constant" ([L,S] initializer), "learned" (a
    graph input [H,L,S] trained like a parameter)."""
    nodes, inits = [], []
    inputs = [
        helper.make_tensor_value_info(n, data_type, s)
        for n, s in (("q", [B, H, L, E]), ("kt", [B, H, E, S]), ("v", [B, H, S, E]))
    ]
    q, kt = "q", "kt"
    if form in ("split", "swapped"):
        inits += [_scalar("c1", 0.6, data_type), _scalar("c2", 0.7, data_type)]
        nodes += [
            helper.make_node("Mul", ["c1", "q"] if form == "swapped" else ["q", "c1"], ["qs"]),
            helper.make_node("Mul", ["kt", "c2"], ["ks"]),
        ]
        q, kt = "qs", "ks"
    nodes.append(helper.make_node("MatMul", [q, kt], ["scores"]))
    scores = "scores"
    if form == "divide":
        inits.append(_scalar("c", DIVISOR, data_type))  # not a power of two: / c is not * (1 / c)
        nodes.append(helper.make_node("Div", ["scores", "c"], ["scaled"]))
        scores = "scaled"
    elif form in ("scaled", "constant-node"):
        if form == "scaled":
            inits.append(_scalar("c", 0.5, data_type))
        else:
            nodes.append(helper.make_node("Constant", [], ["c"], value=_scalar("value", 0.5, data_type)))
        nodes.append(helper.make_node("Mul", ["scores", "c"], ["scaled"]))
        scores = "scaled"
    if mask:
        if mask == "input":
            inputs.append(helper.make_tensor_value_info("mask", data_type, [B, 1, 1, S]))
        elif mask == "learned":
            inputs.append(helper.make_tensor_value_info("mask", data_type, [H, L, S]))
        else:
            causal = numpy.triu(numpy.full((L, S), -1e4), 1).astype(helper.tensor_dtype_to_np_dtype(data_type))
            inits.append(numpy_helper.from_array(causal, "mask"))
        nodes.append(helper.make_node("Add", ["mask", scores] if form == "swapped" else [scores, "mask"], ["masked"]))
        scores = "masked"
    axis = {} if softmax_axis is None else {"axis": softmax_axis}
    nodes.append(helper.make_node("Softmax", [scores], ["p"], **axis))
    probabilities = "p"
    for index, to in enumerate(casts):
        nodes.append(helper.make_node("Cast", [probabilities], [f"p{index}"], to=to))
        probabilities = f"p{index}"
    if dropout_ratio is not None:  # active (training_mode True), as training exports write it
        inits += [_scalar("ratio", dropout_ratio, data_type), numpy_helper.from_array(numpy.array(True), "training")]
        nodes.append(helper.make_node("Dropout", [probabilities, "ratio", "training"], ["pd", "keep"]))
        probabilities = "pd"
    nodes.append(helper.make_node("MatMul", [probabilities, "v"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", data_type, None)]
    if dropout_mask_read:
        outputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, None))
    outputs += [helper.make_tensor_value_info(name, data_type, None) for name in extra_outputs]
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _fused_count(model: onnx.ModelProto) -> int:
    nodes = fuse_scaled_attention(model.graph, list(model.graph.node), model.opset_import[0].version)
    return sum(node.op_type == "ScaledAttention" for node in nodes)


def _build(model: onnx.ModelProto, fused: bool, monkeypatch) -> torch.nn.Module:
    with monkeypatch.context() as patch:
        if not fused:
            patch.setattr(module_builder, "fuse_scaled_attention", lambda graph, nodes, opset: list(nodes))
        names = [i.name for i in model.graph.input]
        outputs = [o.name for o in model.graph.output]
        return build_graph_module(model.graph, {"": model.opset_import[0].version}, names, outputs, "attention")


def _inputs(model: onnx.ModelProto, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    return [torch.randn(*shape, generator=generator, dtype=dtype).requires_grad_() for shape in shapes.values()]


FORMS = ["divide", "split", "scaled", "constant-node", "swapped", "plain"]


@pytest.mark.parametrize("mask", ["", "input", "constant", "learned"])
@pytest.mark.parametrize("form", FORMS)
def test_written_forms_are_fused_and_compute_the_written_graph_bit_for_bit(form, mask, monkeypatch):
    model = _model(form, mask)
    assert _fused_count(model) == 1
    fused, written = _build(model, True, monkeypatch), _build(model, False, monkeypatch)
    assert any(type(m).__name__ == "ScaledAttention" for m in fused.modules())
    assert not any(type(m).__name__ == "ScaledAttention" for m in written.modules())
    inputs = _inputs(model)
    actual, expected = fused(*inputs)[0], written(*inputs)[0]
    assert torch.equal(actual, expected)
    upstream = torch.randn_like(expected)
    for a, e in zip(torch.autograd.grad(actual, inputs, upstream), torch.autograd.grad(expected, inputs, upstream)):
        assert torch.equal(a, e)


@pytest.mark.parametrize(
    "casts, fits",
    [((TensorProto.FLOAT, TensorProto.FLOAT), True), ((TensorProto.FLOAT16, TensorProto.FLOAT), False)],
)
def test_casts_after_the_softmax_are_kept_in_order(casts, fits, monkeypatch):
    """HF's softmax(..., dtype=float32).to(dtype) exports as Casts; a narrowing one rounds the
    probabilities, so the traced step's kernel (which would not) is not used then."""
    model = _model("scaled", "constant", casts=casts)
    assert _fused_count(model) == 1
    fused, written = _build(model, True, monkeypatch), _build(model, False, monkeypatch)
    inputs = _inputs(model)
    assert torch.equal(fused(*inputs)[0], written(*inputs)[0])
    with operators_in_traces(True):
        graph = make_fx(fused, tracing_mode="real")(*[t.detach() for t in inputs])
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert ("ort_torch_compat.scaled_attention.default" in targets) == fits


def test_a_dropout_of_ratio_zero_is_the_identity_between(monkeypatch):
    """Llama's export: softmax, two Casts, Dropout(ratio 0, training) then the product."""
    model = _model("scaled", "constant", casts=(TensorProto.FLOAT, TensorProto.FLOAT), dropout_ratio=0.0)
    assert _fused_count(model) == 1
    fused, written = _build(model, True, monkeypatch), _build(model, False, monkeypatch)
    inputs = _inputs(model)
    actual, expected = fused(*inputs)[0], written(*inputs)[0]
    assert torch.equal(actual, expected)
    for a, e in zip(torch.autograd.grad(actual.sum(), inputs), torch.autograd.grad(expected.sum(), inputs)):
        assert torch.equal(a, e)


@pytest.mark.parametrize(
    "change",
    [
        "dropout of ratio 0.1",
        "dropout whose mask is read",
        "probabilities read elsewhere",
        "scores read elsewhere",
        "softmax over another axis",
        "softmax-11 without axis",
        "tensor scale",
        "constant divided by scores",
        "zero scale",
        "dropout between",
        "legacy broadcast attribute",
        "integer cast",
    ],
)
def test_chains_that_are_not_attention_as_written_are_left_alone(change):
    model = None
    if change == "probabilities read elsewhere":
        model = _model("divide", extra_outputs=("p",))
    elif change == "scores read elsewhere":
        model = _model("divide", extra_outputs=("scores",))
    elif change == "dropout of ratio 0.1":
        model = _model("divide", dropout_ratio=0.1)
    elif change == "dropout whose mask is read":
        model = _model("divide", dropout_ratio=0.0, dropout_mask_read=True)
    elif change == "softmax over another axis":
        model = _model("divide", softmax_axis=1)
    elif change == "softmax-11 without axis":
        model = _model("divide", opset=11, softmax_axis=None)
    else:
        model = _model("divide")
        nodes = model.graph.node
        if change == "tensor scale":
            model.graph.initializer[0].CopyFrom(numpy_helper.from_array(numpy.full(S, 2.0, numpy.float32), "c"))
        elif change == "constant divided by scores":
            nodes[1].input[:] = ["c", "scores"]
        elif change == "zero scale":
            model.graph.initializer[0].CopyFrom(_scalar("c", 0.0))
        elif change == "dropout between":
            nodes[3].input[0] = "pd"
            nodes.insert(3, helper.make_node("Dropout", ["p"], ["pd"]))
        elif change == "legacy broadcast attribute":
            nodes[1].attribute.append(helper.make_attribute("broadcast", 1))
        elif change == "integer cast":
            nodes[3].input[0] = "pc"
            nodes.insert(3, helper.make_node("Cast", ["p"], ["pc"], to=TensorProto.INT32))
    assert _fused_count(model) == 0


def test_a_scaled_query_read_elsewhere_stays_and_is_the_query(monkeypatch):
    model = _model("split", extra_outputs=("qs",))
    nodes = fuse_scaled_attention(model.graph, list(model.graph.node), 17)
    assert [n.op_type for n in nodes] == ["Mul", "ScaledAttention"]
    assert list(nodes[1].input[:5]) == ["qs", "kt", "v", "", "c2"]
    inputs = _inputs(model)
    fused, written = _build(model, True, monkeypatch), _build(model, False, monkeypatch)
    for a, e in zip(fused(*inputs), written(*inputs)):
        assert torch.equal(a, e)


def test_a_well_formed_graph_keeps_its_node_order_and_other_nodes():
    model = _model("divide", "input")
    before = list(model.graph.node)
    nodes = fuse_scaled_attention(model.graph, before, 17)
    assert [n.op_type for n in nodes] == ["ScaledAttention"]
    fused = nodes[0]
    assert list(fused.input) == ["q", "kt", "v", "", "", "c", "mask"] and list(fused.output) == ["y"]
    attributes = {a.name: helper.get_attribute_value(a) for a in fused.attribute}
    attributes["scale"] = numpy_helper.to_array(attributes["scale"])
    assert attributes["scores_divided"] == 1 and attributes["scale"].dtype == numpy.float64
    assert float(attributes["scale"]) == 1.0 / float(numpy.float32(DIVISOR))  # the float32 constant, divided in float64
    assert list(model.graph.node) == before  # the graph itself is not changed


def _explicit(q, k, v, mask, scale):
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    return torch.matmul(torch.softmax(scores if mask is None else scores + mask, -1), v)


@pytest.mark.parametrize("mask_shape", [None, (L, S), (S,), (B, 1, 1, S), (1, H, L, S), (H, L, S), (B, H, L, S)])
@pytest.mark.parametrize("sizes", [(B, H, L, S, E), (1, 1, 1, 1, 1), (3, 1, 4, 2, 8)])
def test_the_operator_is_the_written_equations_in_float64(mask_shape, sizes):
    batch, heads, rows, columns, size = sizes
    generator = torch.Generator().manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    if mask_shape is not None:  # the mask's shape for these sizes
        named = {B: batch, H: heads, L: rows, S: columns}
        mask_shape = tuple(1 if d == 1 else named[d] for d in mask_shape)
    # Q and K as the exporters' transposed views of [batch, rows, heads, size]
    q = rand(batch, rows, heads, size).transpose(1, 2).requires_grad_()
    k = rand(batch, columns, heads, size).transpose(1, 2).requires_grad_()
    v = rand(batch, heads, columns, size).requires_grad_()
    mask = None if mask_shape is None else rand(*mask_shape).requires_grad_()
    trained = [t for t in (q, k, v, mask) if t is not None]
    assert attention_fits(q, k.transpose(-1, -2), v, mask)
    actual, expected = scaled_attention(q, k, v, mask, 0.7), _explicit(q, k, v, mask, 0.7)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    upstream = rand(*expected.shape)
    for a, e in zip(torch.autograd.grad(actual, trained, upstream), torch.autograd.grad(expected, trained, upstream)):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "case",
    ["3-D", "broadcast batch", "head sizes differ", "mask of another type", "mask not broadcastable", "half", "empty"],
)
def test_shapes_the_operator_does_not_take(case):
    q, kt, v, mask = torch.randn(B, H, L, E), torch.randn(B, H, E, S), torch.randn(B, H, S, E), None
    if case == "3-D":
        q, kt, v = q[0], kt[0], v[0]
    elif case == "broadcast batch":
        kt = kt[:1]
    elif case == "head sizes differ":
        v = torch.randn(B, H, S, E + 1)
    elif case == "mask of another type":
        mask = torch.zeros(L, S, dtype=torch.float64)
    elif case == "mask not broadcastable":
        mask = torch.zeros(2, S)
    elif case == "half":
        q, kt, v = q.half(), kt.half(), v.half()
    elif case == "empty":
        q, v = torch.randn(B, H, 0, E), torch.randn(B, H, S, E)
    assert attention_fits(torch.randn(B, H, L, E), torch.randn(B, H, E, S), torch.randn(B, H, S, E), None)
    assert not attention_fits(q, kt, v, mask)


def test_the_joint_trace_inlines_the_attention_kernels(monkeypatch):
    """As the traced step's trace does (engine/joint_graph.py): aten calls only, one attention
    kernel each way, no batched products; values and gradients those of the written graph."""
    model = _model("split", "constant")
    fused = _build(model, True, monkeypatch)
    written = _build(model, False, monkeypatch)
    inputs = [t.detach().requires_grad_() for t in _inputs(model)]

    def step(module):
        def run(*tensors):
            with torch.enable_grad():
                loss = module(*tensors)[0].sin().sum()
                return [loss.detach(), *torch.autograd.grad(loss, tensors)]

        return run

    with operators_in_traces(True):
        graph = make_fx(step(fused), decomposition_table=TRACED_OPERATOR_DECOMPOSITIONS, tracing_mode="real")(*inputs)
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert not any("ort_torch_compat" in str(t) for t in targets)
    aten = torch.ops.aten
    assert targets.count(aten._scaled_dot_product_flash_attention_for_cpu.default) == 1
    assert targets.count(aten._scaled_dot_product_flash_attention_for_cpu_backward.default) == 1
    assert aten.bmm.default not in targets and aten._softmax.default not in targets
    expected = step(written)(*inputs)
    for e, a in zip(expected, graph(*inputs)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask", ["", "constant", "input", "learned"])
def test_single_head_attention_takes_the_kernel_as_one_head(mask, monkeypatch):
    """[batch, rows, size] attention (one head, no head axis): traced as the operator on
    [batch, 1, rows, size] views; values and gradients those of the written graph."""
    model = _model("divide", mask, data_type=TensorProto.DOUBLE)
    for value in model.graph.input:  # no head axis: q [B,L,E], kt [B,E,S], v [B,S,E]; masks [B,1,S], [L,S]
        dims = value.type.tensor_type.shape.dim
        del dims[0 if value.name == "mask" and mask == "learned" else 1]
    fused, written = _build(model, True, monkeypatch), _build(model, False, monkeypatch)
    inputs = _inputs(model, torch.float64)
    with operators_in_traces(True):
        actual = fused(*inputs)[0]
        graph = make_fx(fused, tracing_mode="real")(*[t.detach() for t in inputs])
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert "ort_torch_compat.scaled_attention.default" in targets
    expected = written(*inputs)[0]
    assert actual.shape == expected.shape == (B, L, E)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    upstream = torch.randn_like(expected)
    for a, e in zip(torch.autograd.grad(actual, inputs, upstream), torch.autograd.grad(expected, inputs, upstream)):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(24))
def test_fuzzed_scale_constants_match_only_what_they_hold(seed, monkeypatch, tmp_path):
    """The scale's bytes, type, shape and location mutated (initializer or Constant node):
    the pass never raises; where it fuses, the module computes what the written graph does,
    and where the written graph cannot be built, neither can the fused one."""
    rng = numpy.random.default_rng(seed)
    model = _model("divide" if seed % 2 else "constant-node")
    tensor = (
        model.graph.initializer[0]
        if seed % 2
        else next(a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute)
    )
    kind = seed % 6
    if kind == 0:  # random bytes of a random length
        tensor.raw_data = rng.bytes(int(rng.integers(0, 9)))
        tensor.ClearField("float_data")
    elif kind == 1:  # another type, same bytes
        tensor.data_type = int(rng.choice([TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32, 0, 99]))
    elif kind == 2:  # dims that disagree with the data
        tensor.dims[:] = [int(d) for d in rng.integers(0, 3, int(rng.integers(1, 3)))]
    elif kind == 3:  # data kept in a file (model loading reads those; the pass reads no file, even one there)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "scale.bin").write_bytes(numpy.array(3.0, numpy.float32).tobytes())
        tensor.data_location = TensorProto.EXTERNAL
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", "../outside" if (seed // 6) % 2 else "scale.bin"
    elif kind == 4:  # a non-finite or zero scale
        value = numpy.array(rng.choice([numpy.inf, -numpy.inf, numpy.nan, 0.0]), numpy.float32)
        tensor.CopyFrom(numpy_helper.from_array(value, tensor.name))
    else:  # an ordinary value in either float field
        tensor.CopyFrom(numpy_helper.from_array(numpy.array(rng.normal(), numpy.float32), tensor.name))
    fused_count = _fused_count(model)  # never raises
    assert fused_count in (0, 1)
    assert not (kind == 3 and fused_count)
    try:
        written = _build(model, False, monkeypatch)
        inputs = _inputs(model)
        expected = written(*inputs)[0]
    except Exception as error:  # noqa: BLE001  (the written graph's own failure)
        with pytest.raises(type(error)):
            _build(model, True, monkeypatch)(*_inputs(model))
        return
    if fused_count:
        assert torch.equal(_build(model, True, monkeypatch)(*inputs)[0], expected)
