"""A converted graph specialized to one set of input shapes, as a functional aten graph.

Why: the converted module (builder.py) calls one onnx2torch module per ONNX node, with
Python control flow on shape tensors (`if torch.any(shape == 0)`, `.tolist()`), and
BatchNorm updates its running statistics in place.  Ahead-of-time compilation
(engine/compiled.py) needs none of that.  ORT's artifacts have static shapes for a given
batch, so one trace with real tensors (`make_fx`) folds every Shape/Gather/Concat/Reshape
chain into constants, inlines the modules into aten calls and, under `functionalize`,
turns the in-place running-stat updates into extra outputs (views stay views: the
compiler handles them natively).

Guards, so the specialized graph computes what the module computes for *every* input of
these shapes: a trace that read a tensor *value* derived from a user input or a parameter
(data-dependent control flow), or that contains random operators (Dropout: compiled code
would draw other random numbers than torch's generator), is refused with
`NotSpecializable`, and the caller keeps running the module itself.
"""

from __future__ import annotations

import contextlib
import operator
import threading
from dataclasses import dataclass
from typing import Iterator, List, Sequence, Set

import torch
from torch import fx

from . import dense_kernel, traced_operators


class NotSpecializable(RuntimeError):
    """The graph cannot be specialized; the message says why (shown to the user once)."""


@dataclass
class SpecializedGraph:
    """`module(*inputs, *constants)` returns the original outputs, then the new values of
    the inputs the original module updated in place (`mutated[i]` indexes inputs+constants)."""

    module: fx.GraphModule
    constants: List[torch.Tensor]
    num_outputs: int
    mutated: List[int]


def lifted_constants(module: fx.GraphModule) -> List[torch.Tensor]:
    """The module's tensor attributes (get_attr nodes), in graph order: the live tensors,
    so in-place updates of a compiled step land where the module keeps them."""
    parameters = dict(module.named_parameters())
    return [
        parameters[node.target] if node.target in parameters else module.get_buffer(node.target)
        for node in module.graph.nodes
        if node.op == "get_attr"
    ]


def _lift_constants(module: fx.GraphModule) -> fx.GraphModule:
    """Copy of `module` whose get_attr nodes are trailing placeholders (lifted_constants order)."""
    graph = fx.Graph()
    env = {}
    nodes = list(module.graph.nodes)
    for node in nodes:
        if node.op == "placeholder":
            env[node] = graph.placeholder(node.name)
    for index, node in enumerate(n for n in nodes if n.op == "get_attr"):
        env[node] = graph.placeholder(f"constant{index}")
    for node in nodes:
        if node.op not in ("placeholder", "get_attr"):
            env[node] = graph.node_copy(node, lambda n: env[n])
    return fx.GraphModule(module, graph)


def _functional_values(tensor: torch.Tensor):
    """`tolist()` of a functional tensor, element by element (each read is recorded)."""
    if tensor.dim() == 0:
        return tensor.item()
    return [_functional_values(row) for row in tensor.unbind(0)]


_TENSOR_TOLIST = vars(torch.Tensor).get("tolist")  # None: inherited from torch._C.TensorBase
_TOLIST_LOCK = threading.Lock()
_tolist_users = 0  # traces in progress (threads may trace at once): the last one restores torch's method


def _tolist(self: torch.Tensor):
    if torch._is_functional_tensor(self):
        return _functional_values(self)
    return (_TENSOR_TOLIST or torch._C.TensorBase.tolist)(self)


@contextlib.contextmanager
def _readable_traced_values() -> Iterator[None]:
    """`Tensor.tolist()` that works on the trace's functional tensors.

    Converters read shapes, axes and pads fed as tensors with `tolist()`.  Under
    `functionalize`, a value the graph computes (an exporter's Shape -> Gather -> Concat
    chain feeding a Reshape) is a functional tensor without storage, whose `tolist()` raises
    (or crashes, when 0-d).  While a trace runs, such tensors are read element by element;
    every other tensor keeps torch's method (the class attribute is process-wide, and
    functional tensors only exist inside a trace).  Afterwards `torch.Tensor` is as it was."""
    global _tolist_users
    with _TOLIST_LOCK:
        if _tolist_users == 0:
            torch.Tensor.tolist = _tolist
        _tolist_users += 1
    try:
        yield
    finally:
        with _TOLIST_LOCK:
            _tolist_users -= 1
            if _tolist_users == 0 and _TENSOR_TOLIST is None:
                del torch.Tensor.tolist
            elif _tolist_users == 0:
                torch.Tensor.tolist = _TENSOR_TOLIST


@contextlib.contextmanager
def _trace_environment(device: torch.device) -> Iterator[None]:
    """Aten kernels (no oneDNN linear, which the compiler cannot lower; a trace for the
    traced step keeps it as a custom operator, see dense_kernel.py), no RNG drift,
    shapes computed in the graph readable (`_readable_traced_values`)."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), dense_kernel.plain_aten_kernels(), _readable_traced_values():
        yield


def _ancestors(node: fx.Node) -> Set[fx.Node]:
    seen: Set[fx.Node] = set()
    stack = [node]
    while stack:
        for parent in stack.pop().all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def _is_view(node: fx.Node) -> bool:
    """Whether the node's value may share memory with another value of the graph."""
    if node.op == "call_function" and node.target is operator.getitem:
        return _is_view(node.args[0])
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    return schema is not None and any(ret.alias_info is not None for ret in schema.returns)


def _check_traced(graph: fx.Graph, variable: Set[str], allow_random: bool) -> None:
    """Refuse random operators (unless allowed) and values read from inputs that may change
    between steps."""
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if not allow_random and torch.Tag.nondeterministic_seeded in node.target.tags:
            raise NotSpecializable(f"the graph draws random numbers ({node.target.name()}, e.g. Dropout)")
        if node.target is torch.ops.aten._local_scalar_dense.default:  # .item(), .tolist(), bool()
            sources = [n.name for n in _ancestors(node) if n.op == "placeholder" and n.name in variable]
            if sources:
                raise NotSpecializable(
                    "the graph's control flow reads tensor values computed from inputs or "
                    "parameters (data-dependent shapes)"
                )


def _fold_constants(graph: fx.Graph, placeholders: List[fx.Node], constants: List[torch.Tensor], first: int) -> None:
    """Evaluate once every node computed from constants alone (placeholders[first:], the
    values in `constants`, none of them updated in place) and feed its value as a new
    constant: device copies of host-made constants, masks and shape tensors derived from
    them are then no longer computed at each step (a CUDA graph could not record a copy
    from pageable host memory)."""
    values = {node: constants[index - first] for index, node in enumerate(placeholders) if index >= first}
    folded: List[fx.Node] = []
    for node in graph.nodes:
        if node.op != "call_function" or not node.all_input_nodes:
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and (
            target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags
        ):
            continue
        if not all(parent in values for parent in node.all_input_nodes):
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
        with torch.no_grad():
            values[node] = target(*args, **kwargs)
        folded.append(node)
    for node in folded:
        value = values[node]
        if not isinstance(value, torch.Tensor) or all(user in values for user in node.users):
            continue
        constants.append(value.detach())
        with graph.inserting_after(placeholders[-1]):
            placeholders.append(graph.placeholder(f"folded_constant{len(constants)}"))
        node.replace_all_uses_with(placeholders[-1])
    graph.eliminate_dead_code()


_SQRT2 = 2.0**0.5


def _constant_value(arg, values: dict):
    """A Python number for a scalar argument: a number, or a one-element constant placeholder."""
    if isinstance(arg, (int, float)):
        return float(arg)
    tensor = values.get(arg)
    if isinstance(tensor, torch.Tensor) and tensor.numel() == 1 and tensor.is_floating_point():
        return float(tensor.reshape(()))
    return None


def _near(value, wanted: float) -> bool:
    return value is not None and abs(value - wanted) <= 1e-6 * abs(wanted)


def _fuse_erf_gelu(graph: fx.Graph, placeholders: List[fx.Node], constants: List[torch.Tensor], first: int) -> None:
    """Replace exported exact GELUs, 0.5 * x * (1 + erf(x / sqrt(2))) in the orders exporters
    write it (x / sqrt(2) or x * (1/sqrt(2)); the 0.5 first or last), by `aten.gelu`: one kernel
    each way instead of about a dozen passes over the activations.  Same function; float32
    results differ by rounding only."""
    values = {node: constants[index - first] for index, node in enumerate(placeholders) if index >= first}
    aten = torch.ops.aten

    def only_user(node: fx.Node):
        return next(iter(node.users)) if len(node.users) == 1 else None

    def other(node: fx.Node, one: object):
        a, b = node.args[:2]
        return b if a is one else a if b is one else None

    for erf in [n for n in graph.nodes if n.op == "call_function" and n.target is aten.erf.default]:
        scaled = erf.args[0]
        if not isinstance(scaled, fx.Node) or len(scaled.users) != 1 or scaled.kwargs:
            continue
        if scaled.target is aten.div.Tensor and _near(_constant_value(scaled.args[1], values), _SQRT2):
            x = scaled.args[0]
        elif scaled.target is aten.mul.Tensor and _near(_constant_value(scaled.args[1], values), 1 / _SQRT2):
            x = scaled.args[0]
        else:
            continue
        plus = only_user(erf)
        if plus is None or plus.target is not aten.add.Tensor or plus.kwargs:
            continue
        if not _near(_constant_value(other(plus, erf), values), 1.0):
            continue
        first_mul, last = only_user(plus), None
        if first_mul is None or first_mul.target is not aten.mul.Tensor:
            continue
        partner = other(first_mul, plus)
        if partner is x:  # x * (1 + erf) then * 0.5
            last = only_user(first_mul)
            if (
                last is None
                or last.target is not aten.mul.Tensor
                or not _near(_constant_value(other(last, first_mul), values), 0.5)
            ):
                continue
        elif (
            isinstance(partner, fx.Node)
            and partner.target is aten.mul.Tensor
            and x in partner.args[:2]
            and _near(_constant_value(other(partner, x), values), 0.5)
        ):
            last = first_mul  # (0.5 * x) * (1 + erf)
        else:
            continue
        with graph.inserting_before(last):
            gelu = graph.call_function(aten.gelu.default, (x,))
        last.replace_all_uses_with(gelu)
    graph.eliminate_dead_code()


def _tiling_convolutions_as_products(graph: fx.Graph) -> None:
    """Replace 2-D convolutions whose kernel tiles the image (stride equal to the kernel, no
    padding, dilation 1, one group: a ViT's patch embedding, a 1x1 convolution) by one matrix
    product over the tiles.  The same sums of products; what changes is the code around them:
    on the CPU the compiled step calls oneDNN's convolution and its backward through layout
    conversions (ViT-tiny's whole compiled step, measured: 0.43-0.48 ms with the convolution,
    0.25-0.28 ms with the product; MobileNetV2's 1x1 convolutions 6.2 -> 5.7 ms)."""
    aten = torch.ops.aten

    def call(op, *args) -> fx.Node:
        return graph.call_function(op, args)

    for conv in [n for n in graph.nodes if n.op == "call_function" and n.target is aten.convolution.default]:
        x, weight, bias, stride, padding, dilation, transposed, _, groups = conv.args
        image, kernel = getattr(x, "meta", {}).get("val"), getattr(weight, "meta", {}).get("val")
        if not isinstance(image, torch.Tensor) or not isinstance(kernel, torch.Tensor) or image.dim() != 4:
            continue
        batch, channels, height, width = image.shape
        out_channels, _, kh, kw = kernel.shape
        if transposed or groups != 1 or list(stride) != [kh, kw] or any(padding) or list(dilation) != [1, 1]:
            continue
        rows, columns = height // kh, width // kw
        if not rows or not columns:
            continue
        with graph.inserting_before(conv):
            if (rows * kh, columns * kw) != (height, width):  # the convolution drops the remainder
                x = call(aten.slice.Tensor, call(aten.slice.Tensor, x, 2, 0, rows * kh), 3, 0, columns * kw)
            tiles = call(aten.reshape.default, x, [batch, channels, rows, kh, columns, kw])
            tiles = call(aten.permute.default, tiles, [0, 2, 4, 1, 3, 5])
            tiles = call(aten.reshape.default, tiles, [batch * rows * columns, channels * kh * kw])
            flat_kernel = call(aten.reshape.default, weight, [out_channels, channels * kh * kw])
            flat_kernel = call(aten.permute.default, flat_kernel, [1, 0])
            if bias is None:
                product = call(aten.mm.default, tiles, flat_kernel)
            else:
                product = call(aten.addmm.default, bias, tiles, flat_kernel)
            product = call(aten.reshape.default, product, [batch, rows, columns, out_channels])
            result = call(aten.permute.default, product, [0, 3, 1, 2])
        result.meta["val"] = conv.meta.get("val")  # the shape a following convolution reads
        conv.replace_all_uses_with(result)
        graph.erase_node(conv)


FEW_ROWS = 4  # matrix products with at most this many rows become sums (`_few_row_products_as_sums`)
FEW_ROW_MACS = 1 << 18  # ... and at most this many multiply-adds


def _few_row_products_as_sums(graph: fx.Graph) -> None:
    """Replace floating-point matrix products ``mm(a, b)`` / ``addmm(c, a, b)`` whose ``a``
    has at most FEW_ROWS rows (an LSTM's recurrent product at batch 2, a classifier head on a
    pooled batch) by ``sum(a[:, None, :] * b.T[None], -1)`` (plus ``c``).  The same sums of
    products in another order, float32 rounding apart.  At these sizes a product is a few dot
    products, and the GEMM library call around it costs more than the arithmetic; as a sum,
    Inductor generates it inline, fused with the elementwise code next to it, in the forward
    and (through autograd of the sum) the backward pass.  Measured on the compiled steps of
    the tiny benchmark models (batch 2, one thread): LSTM 0.138 -> 0.094 ms (nine products of
    two rows per step), BERT 0.170 -> 0.163, DistilBERT 0.183 -> 0.167, LoRA 0.150 -> 0.140
    (the head).  Up to 8 rows (batched products included) BERT, DistilBERT, GPT-2 and Llama
    were 20-28% slower, and small products of 16 rows and more slower again (docs/design.md)."""
    aten = torch.ops.aten
    for node in [
        n for n in graph.nodes if n.op == "call_function" and n.target in (aten.mm.default, aten.addmm.default)
    ]:
        if node.kwargs:  # addmm's beta/alpha
            continue
        bias, a, b = node.args if node.target is aten.addmm.default else (None, *node.args)
        left, right = getattr(a, "meta", {}).get("val"), getattr(b, "meta", {}).get("val")
        if not isinstance(left, torch.Tensor) or not isinstance(right, torch.Tensor) or not left.is_floating_point():
            continue
        (rows, inner), columns = left.shape, right.shape[1]
        if rows > FEW_ROWS or rows * inner * columns > FEW_ROW_MACS:
            continue
        with graph.inserting_before(node):
            rows_ = graph.call_function(aten.unsqueeze.default, (a, 1))  # [rows, 1, inner]
            columns_ = graph.call_function(
                aten.unsqueeze.default, (graph.call_function(aten.permute.default, (b, [1, 0])), 0)
            )
            result = graph.call_function(
                aten.sum.dim_IntList, (graph.call_function(aten.mul.Tensor, (rows_, columns_)), [-1])
            )
            if bias is not None:
                result = graph.call_function(aten.add.Tensor, (result, bias))
        result.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(result)
        graph.erase_node(node)


def _bias_adds_unfused(graph: fx.Graph) -> None:
    """Replace ``addmm(c, a, b)`` whose ``c`` is one row of biases by ``mm(a, b) - (-c)``.
    On the CPU Inductor keeps addmm as one library call that first copies the biases,
    expanded, into the output (an expand and a copy around each GEMM); as a subtraction the
    bias goes into the fused loop after the product.  Written as a subtraction of the
    negated bias because Inductor's pattern matcher turns ``mm(a, b) + c`` back into addmm
    (it unfuses the bias only on GPUs); ``p - (-c)`` is ``p + c`` bit for bit.  The value
    differs from addmm's by float32 rounding only (the bias is added to the rounded product
    instead of being accumulated into it).  Measured on the compiled steps of the tiny
    benchmark models: docs/design.md."""
    aten = torch.ops.aten
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target is aten.addmm.default]:
        if any(node.kwargs.get(scale, 1) != 1 for scale in ("beta", "alpha")) or len(node.args) != 3:
            continue
        bias, a, b = node.args
        column, right = getattr(bias, "meta", {}).get("val"), getattr(b, "meta", {}).get("val")
        if not isinstance(column, torch.Tensor) or not isinstance(right, torch.Tensor):
            continue
        if column.dim() != 1 or column.dtype != right.dtype or not column.is_floating_point():
            continue
        with graph.inserting_before(node):
            product = graph.call_function(aten.mm.default, (a, b))
            product.meta["val"] = node.meta.get("val")
            negated = graph.call_function(aten.neg.default, (bias,))
            result = graph.call_function(aten.sub.Tensor, (product, negated))
        result.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(result)
        graph.erase_node(node)


def specialize(
    module: fx.GraphModule,
    example_inputs: Sequence[torch.Tensor],
    allow_random: bool = False,
    fold_constants: bool = False,
    convolutions_as_products: bool = False,
    few_row_products_as_sums: bool = False,
    bias_adds_unfused: bool = False,
    hand_derived_backwards: bool = False,
) -> SpecializedGraph:
    """Trace `module(*example_inputs)` into a functional aten graph for exactly these shapes.

    Runs the module once on copies of the inputs (nothing the caller owns changes, the
    random generators are restored).  Raises NotSpecializable with the reason.
    `allow_random`: keep random operators (the graph then draws from torch's generators
    when it runs, as the module does: what a CUDA graph replays, see engine/cuda_graphs.py).
    `fold_constants`: compute what depends on constants alone once, here (`_fold_constants`),
    and fuse exported exact GELUs into one op (`_fuse_erf_gelu`).
    `convolutions_as_products`: 2-D convolutions whose kernel tiles the image become matrix
    products (`_tiling_convolutions_as_products`; for the CPU compiler).
    `few_row_products_as_sums`: matrix products of a few rows become sums of elementwise
    products (`_few_row_products_as_sums`; for the CPU compiler).
    `bias_adds_unfused`: a product plus a row of biases becomes a product, then the biases
    added (as the subtraction of their negation: `_bias_adds_unfused`; for the CPU compiler).
    `hand_derived_backwards`: LSTMs and RMSNorms as operators with hand-derived backwards
    (graph/traced_operators.py; for the traced step: the compiler fuses the converters' calls)."""
    from torch.func import functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    lifted, constants = _lift_constants(module), lifted_constants(module)
    copies = [tensor.detach().clone() for tensor in list(example_inputs) + constants]
    device = example_inputs[0].device if example_inputs else torch.device("cpu")
    with _trace_environment(device), traced_operators.operators_in_traces(hand_derived_backwards):
        traced = make_fx(
            functionalize(lifted, remove="mutations"),
            decomposition_table={},
            tracing_mode="real",
            _error_on_data_dependent_ops=False,
        )(*copies)
    graph = traced.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    # Trace-time constants (torch.tensor(...) inside converters) become inputs too.
    for node in list(graph.nodes):
        if node.op == "get_attr":
            constants.append(getattr(traced, node.target))
            with graph.inserting_after(placeholders[-1]):
                placeholders.append(graph.placeholder(f"trace_constant{len(constants)}"))
            node.replace_all_uses_with(placeholders[-1])
            graph.erase_node(node)

    # Rewrites for the CPU compiler, before the outputs are read (a rewritten node can be one).
    if convolutions_as_products:
        _tiling_convolutions_as_products(graph)
    if few_row_products_as_sums:
        _few_row_products_as_sums(graph)
    if bias_adds_unfused:
        _bias_adds_unfused(graph)

    # functionalize writes input updates back as trailing copy_(input, new_value): make them outputs.
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    outputs = list(output.args[0])
    index_of = {node: index for index, node in enumerate(placeholders)}
    mutated: List[int] = []
    new_values: List[fx.Node] = []
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default and node.args[0] in index_of:
            mutated.append(index_of[node.args[0]])
            new_values.append(node.args[1])
            graph.erase_node(node)
    variable = {placeholders[i].name for i in range(len(example_inputs))}
    variable |= {placeholders[i].name for i in mutated}
    _check_traced(graph, variable, allow_random)

    # Every output a fresh tensor (not an input, a view or another output): the compiled
    # code's output list then maps one to one onto these.
    fresh: List[fx.Node] = []
    with graph.inserting_before(output):
        for value in outputs + new_values:
            if value.op == "placeholder" or value in fresh or _is_view(value):
                value = graph.call_function(torch.ops.aten.clone.default, (value,))
            fresh.append(value)
    output.args = (tuple(fresh),)
    for node in graph.nodes:
        # A view recorded on the trace's real strides may not be a view of the strides the
        # compiler picks; in a graph without in-place updates reshape means the same.
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    if fold_constants and not any(i >= len(example_inputs) for i in mutated):
        _fold_constants(graph, placeholders, constants, len(example_inputs))
        _fuse_erf_gelu(graph, placeholders, constants, len(example_inputs))
    graph.eliminate_dead_code()
    for node in graph.nodes:
        if (
            node.op == "call_function"
            and isinstance(node.target, torch._ops.OpOverload)
            and node.target._schema.is_mutable
        ):
            raise NotSpecializable(f"in-place operator {node.target.name()} left after functionalization")
    traced.recompile()
    return SpecializedGraph(traced, constants, len(outputs), mutated)
