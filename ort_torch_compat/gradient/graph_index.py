"""What the gradient builder knows about the graph: types, shapes, names in use, new nodes.

Shapes come from ONNX shape inference (run on the model before the gradient is built) and
are lists of dims, each an ``int`` (known size), a ``str`` (symbolic ``dim_param``) or
``None`` (unknown); a shape is None when even the rank is unknown.  Builders use static
shapes where they are known (constant reduction axes, constant reshape targets) and fall
back to shape-computing nodes otherwise, as ORT's builder does.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Union

import numpy as np
import onnx
from onnx import numpy_helper

Dim = Union[int, str, None]
Shape = Optional[List[Dim]]

#: onnx's shape inference names dims it cannot infer ``unk__<n>``: unknown, not symbolic equalities.
_INVENTED_DIM_PREFIX = "unk__"

FLOAT_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
    }
)


def _shape_of(type_proto: onnx.TypeProto) -> Shape:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    dims: List[Dim] = []
    for dim in type_proto.tensor_type.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param") and dim.dim_param and not dim.dim_param.startswith(_INVENTED_DIM_PREFIX):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return dims


def is_static(shape: Shape) -> bool:
    """Every dim known (an int or a symbolic name), as ORT's ``GetShape`` requires."""
    return shape is not None and all(d is not None for d in shape)


class GraphIndex:
    """Index of one model's graph, plus the nodes and initializers the builder adds to it."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.opset = onnx_opset(model)
        self._types: Dict[str, onnx.TypeProto] = {}
        inferred = _inferred_graph(model)
        for info in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
            self._types.setdefault(info.name, info.type)
        for init in self.graph.initializer:
            if init.name not in self._types:
                self._types[init.name] = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
        self.taken: Set[str] = set(self._types)
        for node in self.graph.node:
            self.taken.update(name for name in node.output if name)
            self.taken.update(name for name in node.input if name)
            if node.name:
                self.taken.add(node.name)
        self.new_nodes: List[onnx.NodeProto] = []
        self.new_initializers: List[onnx.TensorProto] = []
        self.new_value_info: List[onnx.ValueInfoProto] = []
        self._shared: Dict[str, str] = {}

    # ---- types and shapes ------------------------------------------------------------
    def elem_type(self, name: str) -> int:
        type_proto = self._types.get(name)
        if type_proto is None or not type_proto.HasField("tensor_type"):
            return 0
        return int(type_proto.tensor_type.elem_type)

    def shape(self, name: str) -> Shape:
        type_proto = self._types.get(name)
        return None if type_proto is None else _shape_of(type_proto)

    def may_be_float(self, name: str) -> bool:
        """True unless the tensor is known not to be floating point (unknown types may carry gradients)."""
        elem = self.elem_type(name)
        return elem == 0 or elem in FLOAT_TYPES

    def set_type(self, name: str, type_proto: onnx.TypeProto) -> None:
        self._types[name] = type_proto

    def declare_like(self, name: str, like: str) -> None:
        """Record ``name``'s type as ``like``'s (a gradient has its tensor's type and shape).

        Written into the model as value_info: some of ORT's gradient kernels (AveragePoolGrad)
        take their output shape from the graph instead of computing it.
        """
        elem = self.elem_type(like)
        if not elem:
            return
        shape = self.shape(like)
        info = onnx.helper.make_tensor_value_info(
            name, elem, None if shape is None else [d if d is not None else None for d in shape]
        )
        self.new_value_info.append(info)
        self.set_type(name, info.type)

    # ---- names -----------------------------------------------------------------------
    def unique(self, wanted: str) -> str:
        """``wanted``, or ``wanted__<k>`` if that name is in use; the result is reserved."""
        name, k = wanted, 0
        while name in self.taken:
            k += 1
            name = f"{wanted}__{k}"
        self.taken.add(name)
        return name

    def reserve(self, name: str) -> None:
        self.taken.add(name)

    # ---- additions -------------------------------------------------------------------
    def add_initializer(self, name: str, value: np.ndarray) -> str:
        self.new_initializers.append(numpy_helper.from_array(np.asarray(value), name))
        self.set_type(
            name,
            onnx.helper.make_tensor_type_proto(
                onnx.helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), list(np.shape(value))
            ),
        )
        return name

    def shared_constant(self, key: str, value: np.ndarray) -> str:
        """One initializer per ``key`` for the whole gradient graph (``OneConstant_Type1``...)."""
        if key not in self._shared:
            self._shared[key] = self.add_initializer(self.unique(key), value)
        return self._shared[key]


def _inferred_graph(model: onnx.ModelProto) -> onnx.GraphProto:
    """The graph with ONNX shape inference applied to a copy (the model itself is not changed).

    Tensors that are no longer graph outputs (a model output the loss consumes) lose their
    declared types in the model; inference gives them back.  Ops onnx does not know
    (com.microsoft) simply get no shapes, and their builders use run-time shapes.
    """
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    except Exception:  # noqa: BLE001 - shapes are an optimisation; without them builders go dynamic
        return model.graph


def onnx_opset(model: onnx.ModelProto) -> int:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return int(opset.version)
    raise ValueError("the model imports no ai.onnx opset")
