"""Building blocks that add nodes to the registered model (onnxruntime-training's ``onnxblock.blocks``).

A block's ``build`` appends nodes and initializers and returns the name(s) of what it
produced; calling the block runs ``build`` and then the ONNX checker, so a block that makes
an invalid model fails where it was called.  Node and value names use the same
``onnx::<token>::<n>`` scheme and the same order of calls as onnxruntime-training, so the
names in the generated models are ORT's.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from abc import ABC, abstractmethod
from typing import Any, List, Optional

import numpy as np
import onnx
import onnx.numpy_helper

from . import _graph_utils
from . import model_accessor as accessor

__all__ = [
    "Block",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "ReduceMean",
    "ReduceSum",
    "Sigmoid",
    "Log",
    "Neg",
    "Abs",
    "Constant",
    "SequenceConstruct",
    "ReduceAllL2",
    "Clip",
    "PassThrough",
    "InputLike",
    "LabelEncoder",
    "Cast",
    "Linear",
]


#: Initializers at least this big go to the shared external file (smaller ones stay inline).
_EXTERNAL_MIN_BYTES = 1 << 20


class _ExternalTensors:
    """One temp directory per registered model: its big initializers written once, to one
    file, and a small model whose initializers point into it, re-written at every check.

    The checker and shape inference need a path for models above protobuf's 2 GB limit.
    onnxruntime-training saves the whole model with external data at every block call (into
    ``temp.onnx`` in the working directory); for a 2 GB model that is ~2 GB written per block
    and, as the saved model keeps pointing at the file, the tensors had to be read back in
    each time (measured: 12 writes and reads, 16 GB resident, minutes, for a 2.2 GB model).
    Blocks add initializers and never rewrite one, so a tensor is keyed by name, type and
    shape and written the first time it is seen.
    """

    def __init__(self) -> None:
        self._directory = tempfile.TemporaryDirectory(prefix="onnxblock-")
        self.path = os.path.join(self._directory.name, "model.onnx")
        self._data = os.path.join(self._directory.name, "tensors.data")
        self._written = {}
        self._size = 0

    def close(self) -> None:
        self._directory.cleanup()

    def _stub(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        if tensor.data_location == onnx.TensorProto.EXTERNAL or _nominal_bytes(tensor) < _EXTERNAL_MIN_BYTES:
            return tensor
        key = (tensor.name, tensor.data_type, tuple(tensor.dims))
        if key not in self._written:
            raw = tensor.raw_data if tensor.HasField("raw_data") else onnx.numpy_helper.to_array(tensor).tobytes()
            with open(self._data, "ab") as handle:
                handle.write(raw)
            self._written[key] = (self._size, len(raw))
            self._size += len(raw)
        offset, length = self._written[key]
        stub = onnx.TensorProto(
            name=tensor.name, data_type=tensor.data_type, dims=tensor.dims, data_location=onnx.TensorProto.EXTERNAL
        )
        for name, value in (
            ("location", os.path.basename(self._data)),
            ("offset", str(offset)),
            ("length", str(length)),
        ):
            entry = stub.external_data.add()
            entry.key, entry.value = name, value
        return stub

    def save(self, model: onnx.ModelProto) -> str:
        """Write ``model`` (left unchanged) with its big initializers as references; return the path."""
        light = onnx.ModelProto()
        for field, value in model.ListFields():
            if field.name != "graph":
                if field.type == field.TYPE_MESSAGE and not _repeated(field):
                    getattr(light, field.name).CopyFrom(value)
                elif _repeated(field):
                    getattr(light, field.name).extend(value)
                else:
                    setattr(light, field.name, value)
        graph = light.graph
        for field, value in model.graph.ListFields():
            if field.name == "initializer":
                graph.initializer.extend(self._stub(tensor) for tensor in value)
            elif _repeated(field):
                getattr(graph, field.name).extend(value)
            elif field.type == field.TYPE_MESSAGE:
                getattr(graph, field.name).CopyFrom(value)
            else:
                setattr(graph, field.name, value)
        onnx.save(light, self.path)
        return self.path

    def load_inferred(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """The saved model after shape inference, with ``model``'s tensors in place of the references."""
        inferred = onnx.load(self.path, load_external_data=False)
        originals = {tensor.name: tensor for tensor in model.graph.initializer}
        for tensor in inferred.graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL and tensor.name in originals:
                tensor.CopyFrom(originals[tensor.name])
        return inferred


def _nominal_bytes(tensor: onnx.TensorProto) -> int:
    """Elements x element size, without serializing (upb's ByteSize encodes the whole tensor);
    0 for strings and types numpy cannot hold (they stay inline)."""
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return 0
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def _repeated(field) -> bool:
    is_repeated = getattr(field, "is_repeated", None)
    return bool(is_repeated) if is_repeated is not None else field.label == field.LABEL_REPEATED


def _external_tensors() -> _ExternalTensors:
    """The registered model's _ExternalTensors (closed when its ``base`` context ends)."""
    current = accessor.current()
    if current.external_tensors is None:
        current.external_tensors = _ExternalTensors()
    return current.external_tensors


class Block(ABC):
    """Base class of every block: subclasses implement ``build(*input_names) -> output name(s)``."""

    def __init__(self, temp_file_name: str = "temp.onnx"):
        if os.path.isabs(temp_file_name):
            raise RuntimeError("Please pass in a relative path for the temp_file_name.")
        self.base: Optional[onnx.ModelProto] = None

    @abstractmethod
    def build(self, *args, **kwargs):
        """Add this block's nodes to ``self.base`` and return the output name(s)."""

    def __call__(self, *args, **kwargs):
        self.base = accessor.current().model
        output = self.build(*args, **kwargs)
        self._check_base()
        return output

    def _check_base(self) -> None:
        if accessor.current().has_path:
            onnx.checker.check_model(_external_tensors().save(accessor.current().model), True)
        else:
            onnx.checker.check_model(self.base, True)

    def infer_shapes_on_base(self) -> onnx.ModelProto:
        """The registered model with ONNX shape inference applied (a new ModelProto)."""
        if accessor.current().has_path:
            external = _external_tensors()
            onnx.shape_inference.infer_shapes_path(external.save(accessor.current().model))
            return external.load_inferred(accessor.current().model)
        return onnx.shape_inference.infer_shapes(accessor.current().model)


class _BinaryOp(Block):
    def __init__(self, op_name: str):
        super().__init__()
        self._op_name = op_name

    def build(self, input_name1: str, input_name2: str) -> str:
        output_name = _graph_utils.generate_graph_name(f"{self._op_name.lower()}_output")
        node = onnx.helper.make_node(
            self._op_name,
            [input_name1, input_name2],
            [output_name],
            name=_graph_utils.generate_graph_name(self._op_name),
        )
        self.base.graph.node.append(node)
        return output_name


class Add(_BinaryOp):
    """``Add(a, b)``."""

    def __init__(self):
        super().__init__("Add")


class Sub(_BinaryOp):
    """``Sub(a, b)``."""

    def __init__(self):
        super().__init__("Sub")


class Mul(_BinaryOp):
    """``Mul(a, b)``."""

    def __init__(self):
        super().__init__("Mul")


class Div(_BinaryOp):
    """``Div(a, b)``."""

    def __init__(self):
        super().__init__("Div")


class Pow(Block):
    """``Pow(x, exponent)`` with the exponent a float[1] initializer."""

    def __init__(self, exponent: float):
        super().__init__()
        self._exponent = exponent

    def build(self, pow_input_name: str) -> str:
        exponent_name = _graph_utils.generate_graph_name("pow_exponent")
        self.base.graph.initializer.append(
            onnx.helper.make_tensor(exponent_name, onnx.TensorProto.FLOAT, [1], [self._exponent])
        )
        output_name = _graph_utils.generate_graph_name("pow_output")
        node = onnx.helper.make_node(
            "Pow", [pow_input_name, exponent_name], [output_name], name=_graph_utils.generate_graph_name("Pow")
        )
        self.base.graph.node.append(node)
        return output_name


class _UnaryOp(Block):
    def __init__(self, op_name: str, **attributes: Any):
        super().__init__()
        self._op_name = op_name
        self._attributes = attributes

    def build(self, input_name: str) -> str:
        output_name = _graph_utils.generate_graph_name(f"{self._op_name.lower()}_output")
        node = onnx.helper.make_node(
            self._op_name,
            [input_name],
            [output_name],
            _graph_utils.generate_graph_name(self._op_name),
            **self._attributes,
        )
        self.base.graph.node.append(node)
        return output_name


class ReduceMean(_UnaryOp):
    """``ReduceMean`` over all axes."""

    def __init__(self, keepdims: bool = True):
        super().__init__("ReduceMean", keepdims=keepdims)


class ReduceSum(_UnaryOp):
    """``ReduceSum`` over all axes."""

    def __init__(self, keepdims: bool = True):
        super().__init__("ReduceSum", keepdims=keepdims)


class Sigmoid(_UnaryOp):
    def __init__(self):
        super().__init__("Sigmoid")


class Log(_UnaryOp):
    def __init__(self):
        super().__init__("Log")


class Neg(_UnaryOp):
    def __init__(self):
        super().__init__("Neg")


class Abs(_UnaryOp):
    def __init__(self):
        super().__init__("Abs")


class Constant(Block):
    """A float[1] initializer; returns its name."""

    def __init__(self, value_float: float):
        super().__init__()
        self._value = value_float

    def build(self) -> str:
        name = _graph_utils.generate_graph_name("initializer")
        self.base.graph.initializer.append(onnx.helper.make_tensor(name, onnx.TensorProto.FLOAT, [1], [self._value]))
        return name


class SequenceConstruct(Block):
    """``SequenceConstruct(*inputs)``."""

    def build(self, *sequence_input_names: str) -> str:
        output_name = _graph_utils.generate_graph_name("sequenceconstruct_output")
        node = onnx.helper.make_node(
            "SequenceConstruct",
            list(sequence_input_names),
            [output_name],
            _graph_utils.generate_graph_name("SequenceConstruct"),
        )
        self.base.graph.node.append(node)
        return output_name


class ReduceAllL2(Block):
    """com.microsoft ``ReduceAllL2(*inputs)``: the L2 norm over all the inputs together."""

    def build(self, *reduce_node_input_names: str) -> str:
        output_name = _graph_utils.generate_graph_name("reducealll2_output")
        node = onnx.helper.make_node(
            "ReduceAllL2",
            list(reduce_node_input_names),
            [output_name],
            _graph_utils.generate_graph_name("ReduceAllL2"),
            domain="com.microsoft",
        )
        self.base.graph.node.append(node)
        self.base.graph.value_info.append(onnx.helper.make_tensor_value_info(output_name, onnx.TensorProto.FLOAT, [1]))
        return output_name


class Clip(Block):
    """``Clip(x, min, max)`` with float[1] bounds (either may be omitted)."""

    def __init__(self, clip_min: Optional[float] = None, clip_max: Optional[float] = None):
        super().__init__()
        self._min = clip_min
        self._max = clip_max

    def build(self, clip_input_name: str) -> str:
        bounds = []
        for token, value in (("clip_min", self._min), ("clip_max", self._max)):
            name = ""
            if value is not None:
                name = _graph_utils.generate_graph_name(token)
                self.base.graph.initializer.append(onnx.helper.make_tensor(name, onnx.TensorProto.FLOAT, [1], [value]))
            bounds.append(name)
        output_name = _graph_utils.generate_graph_name("clip_output")
        node = onnx.helper.make_node(
            "Clip", [clip_input_name, *bounds], [output_name], _graph_utils.generate_graph_name("Clip")
        )
        self.base.graph.node.append(node)
        return output_name


class PassThrough(Block):
    """Returns its inputs unchanged (the "no loss" block)."""

    def build(self, *input_names: str):
        return input_names


class InputLike(Block):
    """Adds a graph input typed like an existing graph input or output."""

    def __init__(self, like: str):
        super().__init__()
        self._like = like

    def build(self, input_name: Optional[str] = None) -> str:
        cloned = None
        with contextlib.suppress(LookupError):
            cloned = copy.deepcopy(_graph_utils.get_input_from_input_name(self.base, self._like))
        if cloned is None:
            with contextlib.suppress(LookupError):
                cloned = copy.deepcopy(_graph_utils.get_output_from_output_name(self.base, self._like))
        if cloned is None:
            raise LookupError(f"Could not find input or output with name {self._like}")
        cloned.name = input_name or _graph_utils.generate_graph_name("input")
        self.base.graph.input.append(cloned)
        return cloned.name


class LabelEncoder(Block):
    """ai.onnx.ml ``LabelEncoder`` with the given keys, values and defaults."""

    def __init__(
        self,
        default_float: float = 0.0,
        default_int64: int = -1,
        default_string: str = "_Unused",
        keys_floats: Optional[List[float]] = None,
        keys_int64s: Optional[List[int]] = None,
        keys_strings: Optional[List[str]] = None,
        values_floats: Optional[List[float]] = None,
        values_int64s: Optional[List[int]] = None,
        values_strings: Optional[List[str]] = None,
    ):
        super().__init__()
        self._attributes = {
            "default_float": default_float,
            "default_int64": default_int64,
            "default_string": default_string,
        }
        optional = {
            "keys_floats": keys_floats,
            "keys_int64s": keys_int64s,
            "keys_strings": keys_strings,
            "values_floats": values_floats,
            "values_int64s": values_int64s,
            "values_strings": values_strings,
        }
        self._attributes.update({name: value for name, value in optional.items() if value is not None})

    def build(self, label_encoder_input_name: str) -> str:
        output_name = _graph_utils.generate_graph_name("label_encoder.output")
        node = onnx.helper.make_node(
            "LabelEncoder",
            [label_encoder_input_name],
            [output_name],
            _graph_utils.generate_graph_name("LabelEncoder"),
            domain="ai.onnx.ml",
            **self._attributes,
        )
        self.base.graph.node.append(node)
        return output_name


class Cast(Block):
    """``Cast(x, to)``."""

    def __init__(self, to: int):
        super().__init__()
        self._to = to

    def build(self, cast_input_name: str) -> str:
        output_name = _graph_utils.generate_graph_name("cast.output")
        node = onnx.helper.make_node(
            "Cast", [cast_input_name], [output_name], _graph_utils.generate_graph_name("Cast"), to=self._to
        )
        self.base.graph.node.append(node)
        return output_name


class Linear(Block):
    """A ``Gemm`` layer with fresh random (numpy global RNG) weight [in, out] and bias [out]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, alpha: float = 1.0, beta: float = 1.0):
        super().__init__()
        self._in_features = in_features
        self._out_features = out_features
        self._bias = bias
        self._alpha = alpha
        self._beta = beta

    def build(self, linear_input_name: str) -> str:
        from onnx import numpy_helper

        weight_name = _graph_utils.generate_graph_name("linear.weight")
        self.base.graph.initializer.append(
            numpy_helper.from_array(
                np.random.randn(self._in_features, self._out_features).astype(np.float32), weight_name
            )
        )
        inputs = [linear_input_name, weight_name]
        if self._bias:
            bias_name = _graph_utils.generate_graph_name("linear.bias")
            self.base.graph.initializer.append(
                numpy_helper.from_array(np.random.randn(self._out_features).astype(np.float32), bias_name)
            )
            inputs.append(bias_name)
        output_name = _graph_utils.generate_graph_name("linear.output")
        node = onnx.helper.make_node(
            "Gemm",
            inputs,
            [output_name],
            _graph_utils.generate_graph_name("linear"),
            alpha=self._alpha,
            beta=self._beta,
        )
        self.base.graph.node.append(node)
        return output_name
