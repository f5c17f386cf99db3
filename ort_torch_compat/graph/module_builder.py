"""Build a `torch.fx.GraphModule` from an ONNX graph, one torch module per ONNX node.

We own the wiring instead of calling `onnx2torch.convert`, and reuse only its per-op
converters (see docs/design.md): parameters stay *named placeholders* fed with our own
tensors (so they stay shared, trainable and named as in the checkpoint), a node's outputs
are indexed only when it really has several, module names are ours (custom domains with
dots are fine), and every unsupported operator is reported at once.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import operator
import re
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import onnx
from onnx import AttributeProto, defs, numpy_helper
from onnx2torch.onnx_graph import OnnxGraph
from onnx2torch.onnx_node import OnnxNode
from onnx2torch.onnx_tensor import OnnxTensor
from torch import fx, nn

from . import converters  # noqa: F401  (registers our converters)
from .attention_pattern import fuse_scaled_attention
from .converter_registry import find_converter, is_ours
from .converters.strings import STRING_OPS
from .errors import GraphConversionError, UnsupportedOperatorError
from .fusion import fuse_matmul_bias
from .options import ConversionOptions, converting_with
from .recurrent_layout import torch_gate_recurrents

NOT_TRAINABLE = "strings cannot be part of a training graph (torch has no string tensors)"


def typed_attributes(node: onnx.NodeProto) -> Dict[str, Any]:
    """A node's attributes as onnx2torch's converters expect them, read by the attribute's
    declared type.  onnx2torch's own parser tests the fields for truthiness, so an empty
    INTS/FLOATS/STRINGS/TENSORS attribute came back as the raw AttributeProto (the dynamo
    exporter writes `Constant(value_ints=[])`: "Could not infer dtype of AttributeProto")."""
    parsed: Dict[str, Any] = {}
    for attribute in node.attribute:
        kind = attribute.type
        if kind == AttributeProto.INT:
            parsed[attribute.name] = attribute.i
        elif kind == AttributeProto.FLOAT:
            parsed[attribute.name] = attribute.f
        elif kind == AttributeProto.STRING:
            parsed[attribute.name] = attribute.s.decode("utf-8", "replace")
        elif kind == AttributeProto.TENSOR:
            parsed[attribute.name] = OnnxTensor(attribute.t)
        elif kind == AttributeProto.INTS:
            if not attribute.ints and node.op_type == "Transpose":
                continue  # an empty perm is the default: reverse the axes (as onnx's reference does)
            parsed[attribute.name] = list(attribute.ints)
        elif kind == AttributeProto.FLOATS:
            parsed[attribute.name] = list(attribute.floats)
        elif kind == AttributeProto.STRINGS:
            parsed[attribute.name] = [s.decode("utf-8", "replace") for s in attribute.strings]
        elif kind == AttributeProto.TENSORS:
            parsed[attribute.name] = [OnnxTensor(t) for t in attribute.tensors]
        elif kind == AttributeProto.SPARSE_TENSOR:
            parsed[attribute.name] = attribute.sparse_tensor
        else:  # graphs, and attributes without a declared type: as onnx2torch gives them
            parsed[attribute.name] = OnnxNode._parse_attribute_value(attribute)
    return parsed


class _Constants(nn.Module):
    """Holds the graph's own constant initializers as buffers (they move with `.to()`)."""


def _module_name(index: int, op_type: str) -> str:
    return f"n{index}_{re.sub(r'[^0-9A-Za-z_]', '_', op_type)}"


def _first_if_tuple(value):
    return value[0] if isinstance(value, tuple) else value


def _may_return_tuple(domain: str, op_type: str, opset: int) -> bool:
    """True for onnx2torch-converted ops whose schema has several outputs: their modules
    may return a tuple although the (pruned) node uses only its first output (ours never do)."""
    if domain or is_ours(domain, op_type, opset):
        return False
    try:
        return defs.get_schema(op_type, max_inclusive_version=opset, domain="").max_output > 1
    except (RuntimeError, defs.SchemaError):
        return False


class _Lookups:
    """Converter and tuple-unwrapping decisions per (domain, op, opset), made once per build:
    a 100,000-node graph has a handful of distinct ops, and each lookup walks schemas."""

    def __init__(self, opsets: Dict[str, int]):
        self.opsets = opsets
        self.cache: Dict[Tuple[str, str], Tuple[object, bool]] = {}

    def __call__(self, node_domain: str, op_type: str) -> Tuple[object, bool]:
        key = (node_domain, op_type)
        found = self.cache.get(key)
        if found is None:
            domain = "" if node_domain == "ai.onnx" else node_domain
            opset = self.opsets.get(domain, 1)
            found = (find_converter(domain, op_type, opset), _may_return_tuple(domain, op_type, opset))
            self.cache[key] = found
        return found


def missing_operators(
    graph: onnx.GraphProto, opsets: Dict[str, int], training: bool = False, lookups: "_Lookups" = None
) -> List[tuple]:
    """(domain, op, opset) of every node no converter handles; in a training graph also the
    string ops, which run on numpy arrays outside autograd (see NOT_TRAINABLE)."""
    lookups = lookups or _Lookups(opsets)
    missing = []
    for node in graph.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if _refused_in_training(training, domain, node.op_type) or lookups(node.domain, node.op_type)[0] is None:
            missing.append((domain, node.op_type, opsets.get(domain, 1)))
    return missing


def _refused_in_training(training: bool, domain: str, op_type: str) -> bool:
    """String ops run on numpy arrays outside autograd: no training graph may hold them."""
    return training and not domain and op_type in STRING_OPS


def build_graph_module(
    graph: onnx.GraphProto,
    opsets: Dict[str, int],
    input_names: Sequence[str],
    output_names: Sequence[str],
    model_name: str,
    gradients: str = "ort",
    training: bool = False,
) -> fx.GraphModule:
    """Return a GraphModule whose forward takes `input_names` positionally and returns a tuple.

    `gradients`: "ort" reproduces ONNX Runtime's gradient quirks, "exact" does not (see
    gradient_quirks).  `training`: the graph is a training model's forward part, where ops
    that cannot carry gradients are refused when the Module is created."""
    with converting_with(ConversionOptions(gradients=gradients), opsets), _collector_paused():
        return _build(graph, opsets, input_names, output_names, model_name, training)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a graph is built, as it was before after.

    A build allocates a few objects per node (modules, fx nodes, their links) and frees none
    until it ends, so every automatic collection in it walks the growing graph and finds
    nothing: with it on, an 8,000-node chain took 130 us of CPU per node instead of 60, and
    how much more varied from run to run with the heap.  A collection that is due runs at the
    next allocation after the build.  Nested or concurrent builds leave the collector on
    unless the caller had turned it off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _build(
    graph: onnx.GraphProto,
    opsets: Dict[str, int],
    input_names: Sequence[str],
    output_names: Sequence[str],
    model_name: str,
    training: bool,
) -> fx.GraphModule:
    lookups = _Lookups(opsets)
    missing = missing_operators(graph, opsets, training, lookups)
    if missing:
        reasons = {key: NOT_TRAINABLE for key in missing if _refused_in_training(training, key[0], key[1])}
        raise UnsupportedOperatorError(model_name, missing, reasons)

    fused = onnx.GraphProto(name=graph.name)  # the graph without copying its nodes twice
    for field in ("input", "output", "initializer", "value_info", "sparse_initializer"):
        getattr(fused, field).extend(getattr(graph, field))
    nodes = torch_gate_recurrents(graph, fuse_matmul_bias(graph))
    fused.node.extend(fuse_scaled_attention(graph, nodes, opsets.get("", 1)))
    onnx_graph = OnnxGraph(fused)
    for node in onnx_graph.nodes.values():
        node._proto_attributes = typed_attributes(node.proto)  # onnx2torch's parser drops empty lists
    fx_graph = fx.Graph()
    root = nn.Module()
    constants = _Constants()
    root.add_module("constants", constants)
    env: Dict[str, fx.Node] = {}

    for index, name in enumerate(input_names):
        env[name] = fx_graph.placeholder(f"in{index}")

    def value(name: str) -> fx.Node:
        if name not in env:
            initializer = onnx_graph.initializers.get(name)
            if initializer is None:
                raise GraphConversionError(f"{model_name}: value '{name}' is used before it is produced")
            buffer_name = f"c{len(env)}"
            if initializer.proto.data_type == onnx.TensorProto.STRING:  # numpy: torch has no strings
                setattr(constants, buffer_name, numpy_helper.to_array(initializer.proto).astype(str))
            else:
                constants.register_buffer(buffer_name, initializer.to_torch())
            env[name] = fx_graph.get_attr(f"constants.{buffer_name}")
        return env[name]

    for index, (unique_name, node) in enumerate(onnx_graph.nodes.items()):
        converter, may_return_tuple = lookups(node.domain, node.operation_type)
        try:
            torch_module, mapping = converter(node, onnx_graph)
        except (NotImplementedError, KeyError, ValueError) as error:
            raise GraphConversionError(
                f"{model_name}: cannot convert node '{node.name}' ({node.domain or 'ai.onnx'}::{node.operation_type}): {error}"
            ) from error
        module_name = _module_name(index, node.operation_type)
        root.add_module(module_name, torch_module)

        args = [None if not name else value(name) for name in mapping.inputs]
        kwargs = {}
        if None in args:
            first_skipped = args.index(None)
            parameters = list(inspect.signature(torch_module.forward).parameters)[first_skipped : len(args)]
            kwargs = {key: arg for key, arg in zip(parameters, args[first_skipped:]) if arg is not None}
            args = args[:first_skipped]
        call = fx_graph.call_module(module_name, tuple(args), kwargs)

        outputs = list(mapping.outputs)
        if len(outputs) == 1:
            if may_return_tuple:
                call = fx_graph.call_function(_first_if_tuple, (call,))
            env[outputs[0]] = call
        else:
            for position, output in enumerate(outputs):
                if output:
                    env[output] = fx_graph.call_function(operator.getitem, (call, position))

    fx_graph.output(tuple(value(name) for name in output_names))
    module = fx.GraphModule(root, fx_graph, class_name=re.sub(r"\W", "_", model_name))
    return module
