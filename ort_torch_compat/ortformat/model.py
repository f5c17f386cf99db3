"""ORT-format models (`*.ort`, flatbuffers schema `ort.fbs` of onnxruntime 1.19) as `onnx.ModelProto`.

`python -m onnxruntime.tools.convert_onnx_models_to_ort` writes a model as one flatbuffer
whose root is `InferenceSession { ort_version, model, kernel_type_str_resolver }` with file
identifier "ORTM".  `Model` mirrors ModelProto (IR version, opset imports, producer, metadata,
graph); `Graph` holds initializers, sparse initializers, one `ValueInfo` per node arg (name
and type), nodes (op type, domain, inputs/outputs by name, attributes incl. subgraphs), the
graph's input/output names, the edges between nodes (redundant with the names: not read) and
runtime-optimization records.  The field slots used below are those of the generated bindings
`onnxruntime/tools/ort_format_model/ort_flatbuffers_py/fbs/*.py` (vtable offsets 4, 6, 8...).

What is refused (`OrtFormatError`): format versions onnxruntime 1.19 does not load, fused
nodes (only compiling execution providers make them, never the converter), initializers whose
data lives outside the file (`external_data_offset`), sparse-tensor attributes (the schema has
no field for them), and graphs carrying runtime-optimization records (saved by
`--optimization_style Runtime` for QDQ node groups): ORT replays those only in minimal builds;
this package does not, and says which optimizer and actions are recorded.  Runtime-optimized
files without records hold exactly the graph they would without the option and load as such.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List

from .flatbuffer import Buffer, FlatbufferError, Table

if TYPE_CHECKING:
    import onnx

FILE_IDENTIFIER = b"ORTM"
# ORT 1.19 (onnxruntime/core/flatbuffers/schema/ort.fbs.h, kOrtModelVersion = 6) loads format
# versions 5 and 6 (older ones lack kernel type string resolvers and must be re-converted).
SUPPORTED_VERSIONS = ("5", "6")
# Nested subgraphs / sequence-of-sequence types: each graph level is three protobuf messages
# deep (NodeProto, AttributeProto, GraphProto) and protobuf parsers stop at 100 levels, so a
# deeper model could not be serialized and read back by onnx (or ORT) anyway.
_MAX_DEPTH = 24


class OrtFormatError(ValueError):
    """The bytes are not an ORT-format model this package can read (damaged, or a refused feature)."""


def is_ort_format(data: bytes) -> bool:
    """Whether `data` is a flatbuffer with ORT's model identifier "ORTM" at bytes 4..8."""
    return len(data) >= 8 and bytes(data[4:8]) == FILE_IDENTIFIER


# TensorDataType (and TensorProto) codes whose elements have a fixed byte size.
_ELEMENT_SIZES = {
    1: 4,
    2: 1,
    3: 1,
    4: 2,
    5: 2,
    6: 4,
    7: 8,
    9: 1,
    10: 2,
    11: 8,
    12: 4,
    13: 8,
    14: 8,
    15: 16,
    16: 2,
    17: 1,
    18: 1,
    19: 1,
    20: 1,
}
_STRING = 8

# AttributeType codes (equal to onnx.AttributeProto.AttributeType).
_FLOAT, _INT, _STR, _TENSOR, _GRAPH, _FLOATS, _INTS, _STRINGS, _TENSORS, _GRAPHS = range(1, 11)
_SPARSE_TENSOR, _SPARSE_TENSORS = 11, 12


def read_ort_model(data: bytes) -> "onnx.ModelProto":
    """The ORT-format model in `data` as an `onnx.ModelProto` (raises OrtFormatError)."""
    if not is_ort_format(data):
        raise OrtFormatError("not an ORT-format model (no 'ORTM' file identifier at bytes 4..8)")
    try:
        return _Reader(Buffer(data)).model()
    except FlatbufferError as error:
        raise OrtFormatError(f"damaged ORT-format model: {error}") from error
    except RecursionError as error:  # pragma: no cover - the depth limit comes first
        raise OrtFormatError("damaged ORT-format model: nesting too deep") from error


def runtime_optimization_summary(data: bytes) -> Dict[str, List[str]]:
    """Optimizer name -> recorded action ids of the main graph (empty for most models)."""
    buf = Buffer(data)
    try:
        session = buf.root("InferenceSession")
        model = session.table(6, "model")
        graph = model.table(18, "graph") if model is not None else None
        return _runtime_records(graph) if graph is not None else {}
    except FlatbufferError as error:
        raise OrtFormatError(f"damaged ORT-format model: {error}") from error


def _runtime_records(graph: Table) -> Dict[str, List[str]]:
    container = graph.table(20, "runtime optimizations")
    summary: Dict[str, List[str]] = {}
    if container is None:
        return summary
    for entry in container.tables(4, "runtime optimization records"):
        name = entry.string(4, "optimizer name")
        records = entry.tables(6, f"records of optimizer {name!r}")
        if records:
            summary.setdefault(name, []).extend(record.string(4, "action id") for record in records)
    return summary


class _Reader:
    def __init__(self, buf: Buffer):
        self.buf = buf
        import onnx

        self.onnx = onnx

    def model(self) -> "onnx.ModelProto":
        onnx = self.onnx
        session = self.buf.root("InferenceSession")
        version = session.string(4, "ORT format version")
        if version not in SUPPORTED_VERSIONS:
            raise OrtFormatError(
                f"ORT format version {version!r} is not supported (onnxruntime 1.19 loads versions "
                f"{', '.join(SUPPORTED_VERSIONS)}; re-convert the model with "
                "onnxruntime.tools.convert_onnx_models_to_ort)"
            )
        model = session.table(6, "model")
        if model is None:
            raise OrtFormatError("the ORT-format file holds no model")
        proto = onnx.ModelProto()
        proto.ir_version = model.scalar(4, "i64")
        for opset in model.tables(6, "opset imports"):
            entry = proto.opset_import.add()
            entry.domain = opset.string(4, "opset domain")
            entry.version = opset.scalar(6, "i64")
        _set_text(proto, "producer_name", model.string(8, "producer name"))
        _set_text(proto, "producer_version", model.string(10, "producer version"))
        _set_text(proto, "domain", model.string(12, "model domain"))
        proto.model_version = model.scalar(14, "i64")
        _set_text(proto, "doc_string", model.string(16, "model doc string"))
        for prop in model.tables(22, "metadata props"):
            entry = proto.metadata_props.add()
            entry.key = prop.string(4, "metadata key")
            entry.value = prop.string(6, "metadata value")
        graph = model.table(18, "graph")
        if graph is None:
            raise OrtFormatError("the ORT-format model has no graph")
        self._graph(graph, proto.graph, "main_graph", depth=0)
        _set_text(proto.graph, "doc_string", model.string(20, "graph doc string"))
        return proto

    # -- graphs ---------------------------------------------------------------------------------
    def _graph(self, table: Table, out: "onnx.GraphProto", name: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise OrtFormatError(f"subgraphs nested more than {_MAX_DEPTH} deep")
        out.name = name
        records = _runtime_records(table)
        if records:
            described = "; ".join(f"{optimizer}: {sorted(set(actions))}" for optimizer, actions in records.items())
            raise OrtFormatError(
                f"graph '{name}' carries runtime optimization records ({described}), which onnxruntime replays only "
                "in minimal builds and this package does not apply; convert with --optimization_style Fixed"
            )
        for tensor in table.tables(4, f"initializers of graph '{name}'"):
            out.initializer.append(self._tensor(tensor, f"initializer of graph '{name}'"))
        for sparse in table.tables(18, f"sparse initializers of graph '{name}'"):
            out.sparse_initializer.append(self._sparse(sparse, f"sparse initializer of graph '{name}'"))
        value_infos: Dict[str, "onnx.ValueInfoProto"] = {}
        for info in table.tables(6, f"node args of graph '{name}'"):
            value = self._value_info(info, depth)
            if value.name:  # an omitted optional input/output has no value to describe
                value_infos[value.name] = value
        nodes, implicit = [], []
        for node in table.tables(8, f"nodes of graph '{name}'"):
            nodes.append(self._node(node, depth))
            implicit.append(node.texts(28, f"implicit inputs of node '{nodes[-1].name}'"))
        out.node.extend(_topological_order(nodes, implicit, name))
        inputs = table.texts(14, f"inputs of graph '{name}'")
        outputs = table.texts(16, f"outputs of graph '{name}'")
        for names, field in ((inputs, out.input), (outputs, out.output)):
            for value_name in names:
                info = value_infos.get(value_name)
                if info is None:
                    info = self.onnx.ValueInfoProto(name=value_name)
                field.append(info)
        # initializers carry their own types (a sparse one's would clash with a dense value info)
        listed = set(inputs) | set(outputs) | {t.name for t in out.initializer}
        listed |= {t.values.name for t in out.sparse_initializer}
        for value_name, info in value_infos.items():
            if value_name not in listed and info.HasField("type"):
                out.value_info.append(info)

    def _value_info(self, table: Table, depth: int) -> "onnx.ValueInfoProto":
        info = self.onnx.ValueInfoProto()
        info.name = table.string(4, "node arg name")
        _set_text(info, "doc_string", table.string(6, "node arg doc string"))
        type_table = table.table(8, f"type of node arg '{info.name}'")
        if type_table is not None:
            self._type(type_table, info.type, f"node arg '{info.name}'", depth)
        return info

    def _type(self, table: Table, out: "onnx.TypeProto", what: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise OrtFormatError(f"type of {what} nested more than {_MAX_DEPTH} deep")
        _set_text(out, "denotation", table.string(4, f"denotation of {what}"))
        kind = table.scalar(6, "u8")
        value = table.table(8, f"type of {what}")
        if kind == 0 or value is None:
            return
        if kind == 1:  # tensor_type
            tensor = out.tensor_type
            tensor.elem_type = value.scalar(4, "i32")
            shape = value.table(6, f"shape of {what}")
            if shape is not None:
                dims = tensor.shape
                dims.SetInParent()
                for dimension in shape.tables(4, f"dims of {what}"):
                    dim = dims.dim.add()
                    _set_text(dim, "denotation", dimension.string(6, f"dim denotation of {what}"))
                    dim_value = dimension.table(4, f"dim of {what}")
                    if dim_value is None:
                        continue
                    dim_type = dim_value.scalar(4, "i8")
                    if dim_type == 1:
                        dim.dim_value = dim_value.scalar(6, "i64")
                    elif dim_type == 2:
                        dim.dim_param = dim_value.string(8, f"dim param of {what}")
        elif kind == 2:  # sequence_type
            element = value.table(4, f"sequence element type of {what}")
            out.sequence_type.SetInParent()
            if element is not None:
                self._type(element, out.sequence_type.elem_type, what, depth + 1)
        elif kind == 3:  # map_type
            out.map_type.key_type = value.scalar(4, "i32")
            element = value.table(6, f"map value type of {what}")
            if element is not None:
                self._type(element, out.map_type.value_type, what, depth + 1)
        else:
            raise OrtFormatError(f"type of {what} has unknown kind {kind}")

    # -- nodes and attributes -----------------------------------------------------------------------
    def _node(self, table: Table, depth: int) -> "onnx.NodeProto":
        node = self.onnx.NodeProto()
        _set_text(node, "name", table.string(4, "node name"))
        what = f"node '{node.name}'"
        _set_text(node, "doc_string", table.string(6, f"doc string of {what}"))
        _set_text(node, "domain", table.string(8, f"domain of {what}"))
        node.op_type = table.string(14, f"op type of {what}")
        if table.scalar(16, "i32") != 0:
            raise OrtFormatError(
                f"{what} ({node.op_type}) is a fused node, which only a compiling execution provider "
                "makes; this package runs primitive ONNX nodes"
            )
        node.input.extend(table.texts(20, f"inputs of {what}"))
        node.output.extend(table.texts(22, f"outputs of {what}"))
        for attribute in table.tables(24, f"attributes of {what}"):
            node.attribute.append(self._attribute(attribute, node.name, depth))
        return node

    def _attribute(self, table: Table, node_name: str, depth: int) -> "onnx.AttributeProto":
        onnx = self.onnx
        node = f"node '{node_name}'"
        attr = onnx.AttributeProto()
        attr.name = table.string(4, f"attribute name of {node}")
        what = f"attribute '{attr.name}' of {node}"
        _set_text(attr, "doc_string", table.string(6, f"doc string of {what}"))
        kind = table.scalar(8, "i32")
        attr.type = kind if 0 <= kind <= 14 else 0
        if kind == _FLOAT:
            attr.f = table.scalar(10, "f32")
        elif kind == _INT:
            attr.i = table.scalar(12, "i64")
        elif kind == _STR:
            attr.s = table.bytes(14, what) or b""
        elif kind == _TENSOR:
            tensor = table.table(16, what)
            if tensor is None:
                raise OrtFormatError(f"{what} is a tensor attribute without a tensor")
            attr.t.CopyFrom(self._tensor(tensor, what))
        elif kind == _GRAPH:
            graph = table.table(18, what)
            if graph is None:
                raise OrtFormatError(f"{what} is a graph attribute without a graph")
            self._graph(graph, attr.g, f"{node_name}_{attr.name}", depth + 1)
        elif kind == _FLOATS:
            attr.floats.extend(table.scalars(20, "f32", what))
        elif kind == _INTS:
            attr.ints.extend(table.scalars(22, "i64", what))
        elif kind == _STRINGS:
            attr.strings.extend(table.strings(24, what))
        elif kind == _TENSORS:
            for i, tensor in enumerate(table.tables(26, what)):
                attr.tensors.append(self._tensor(tensor, f"{what}[{i}]"))
        elif kind == _GRAPHS:
            for i, graph in enumerate(table.tables(28, what)):
                self._graph(graph, attr.graphs.add(), f"{node_name}_{attr.name}_{i}", depth + 1)
        elif kind in (_SPARSE_TENSOR, _SPARSE_TENSORS):
            raise OrtFormatError(f"{what} is a sparse-tensor attribute, which the ORT format cannot hold")
        else:
            raise OrtFormatError(f"{what} has unknown attribute type {kind}")
        return attr

    # -- tensors ----------------------------------------------------------------------------------
    def _tensor(self, table: Table, what: str) -> "onnx.TensorProto":
        tensor = self.onnx.TensorProto()
        _set_text(tensor, "name", table.string(4, f"name of {what}"))
        what = f"{what} '{tensor.name}'"
        _set_text(tensor, "doc_string", table.string(6, f"doc string of {what}"))
        dims = table.scalars(8, "i64", f"dims of {what}")
        if any(d < 0 for d in dims):
            raise OrtFormatError(f"{what} has a negative dimension in {dims}")
        tensor.dims.extend(dims)
        tensor.data_type = table.scalar(10, "i32")
        if table.scalar(16, "i64", default=-1) >= 0:
            raise OrtFormatError(
                f"{what} keeps its data outside the model file (external_data_offset), which "
                "ORT-format models loaded from one file cannot locate"
            )
        count = 1
        for d in dims:
            count *= d
        if tensor.data_type == _STRING:
            values = table.strings(14, f"string data of {what}")
            if len(values) != count:
                raise OrtFormatError(f"{what} declares dims {dims} ({count} strings) but holds {len(values)}")
            tensor.string_data.extend(values)
            return tensor
        raw = table.raw(12, f"raw data of {what}") or b""
        size = _ELEMENT_SIZES.get(tensor.data_type)
        if size is None:
            if tensor.data_type in (21, 22, 23):  # 4-bit types, two elements a byte
                expected = (count + 1) // 2
            else:
                raise OrtFormatError(f"{what} has unknown data type {tensor.data_type}")
        else:
            expected = count * size
        if len(raw) != expected:
            raise OrtFormatError(
                f"{what} declares dims {dims} of data type {tensor.data_type} ({expected} bytes) but "
                f"holds {len(raw)} bytes"
            )
        tensor.raw_data = raw
        return tensor

    def _sparse(self, table: Table, what: str) -> "onnx.SparseTensorProto":
        sparse = self.onnx.SparseTensorProto()
        values = table.table(4, f"values of {what}")
        indices = table.table(6, f"indices of {what}")
        if values is None or indices is None:
            raise OrtFormatError(f"{what} lacks its values or indices")
        sparse.values.CopyFrom(self._tensor(values, f"values of {what}"))
        sparse.indices.CopyFrom(self._tensor(indices, f"indices of {what}"))
        _indices_as_int64(sparse.indices, f"{what} '{sparse.values.name}'")
        dims = table.scalars(8, "i64", f"dims of {what}")
        if any(d < 0 for d in dims):
            raise OrtFormatError(f"{what} has a negative dimension in {dims}")
        sparse.dims.extend(dims)
        return sparse


def _set_text(message, field: str, text: str) -> None:
    """Set a text field only when the file has text for it (an empty doc string would be stored)."""
    if text:
        setattr(message, field, text)


def _indices_as_int64(tensor: "onnx.TensorProto", what: str) -> None:
    """ORT stores sparse indices in the narrowest integer type that holds them (int8 for a small
    tensor); ONNX wants int64, which ORT widens them back to when it loads the model."""
    import numpy as np

    types = {3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 2: np.uint8, 4: np.uint16, 12: np.uint32}
    if tensor.data_type not in types:
        raise OrtFormatError(f"{what} has indices of data type {tensor.data_type}, not an integer type")
    if tensor.data_type != 7:
        values = np.frombuffer(tensor.raw_data, dtype=np.dtype(types[tensor.data_type]).newbyteorder("<"))
        tensor.raw_data = values.astype("<i8").tobytes()
        tensor.data_type = 7


def _topological_order(nodes: List["onnx.NodeProto"], implicit: List[List[str]], graph: str) -> List["onnx.NodeProto"]:
    """The nodes in an order where each comes after the producers of its inputs (ONNX requires it;
    ORT saves nodes by index, and its optimizers append fused nodes at the end).  Stable: an
    already sorted list is kept as it is.  Values no node here produces (graph inputs,
    initializers, outer-scope values) are available from the start; a node holding subgraphs
    also waits for the values they use from this graph (ORT lists them as implicit inputs)."""
    import heapq

    producer: Dict[str, int] = {}
    for index, node in enumerate(nodes):
        for output in node.output:
            if output:
                producer.setdefault(output, index)
    waiting = [0] * len(nodes)
    consumers: List[List[int]] = [[] for _ in nodes]
    for index, node in enumerate(nodes):
        sources = {producer[value] for value in (*node.input, *implicit[index]) if value in producer}
        for source in sources:
            consumers[source].append(index)
        waiting[index] = len(sources)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: List[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for consumer in consumers[index]:
            waiting[consumer] -= 1
            if waiting[consumer] == 0:
                heapq.heappush(ready, consumer)
    if len(order) != len(nodes):
        stuck = [nodes[i].name or nodes[i].op_type for i in range(len(nodes)) if waiting[i] > 0][:5]
        raise OrtFormatError(f"graph '{graph}' has a cycle among its nodes (e.g. {stuck})")
    return [nodes[i] for i in order]
