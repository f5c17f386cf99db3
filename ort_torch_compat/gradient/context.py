"""The view one gradient builder gets of its forward node.

It mirrors the vocabulary of ORT's gradient builders: ``I(i)``/``O(i)`` are the forward
node's input/output names, ``GO(i)`` the gradient flowing into output ``i`` (``""`` when
none), ``GI(i)`` the name the builder must write input ``i``'s gradient to (``""`` when
that input needs none), ``IA(x)`` a fresh intermediate name.  Emitted nodes are named
``<forward node>_Grad/<Op>_<k>``, so every backward node says which forward node it came
from.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np
import onnx

from ..errors import UnsupportedGradientError
from .graph_index import GraphIndex, Shape, is_static

MS_DOMAIN = "com.microsoft"


class GradientContext:
    def __init__(
        self,
        index: GraphIndex,
        node: onnx.NodeProto,
        node_name: str,
        output_grads: Sequence[str],
        input_grads: Sequence[str],
    ):
        self.index = index
        self.node = node
        self.node_name = node_name
        self._output_grads = list(output_grads)
        self._input_grads = list(input_grads)
        self._emitted = 0
        self.attributes: Dict[str, Any] = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    # ---- the forward node ------------------------------------------------------------
    @property
    def opset(self) -> int:
        return self.index.opset

    @property
    def op_type(self) -> str:
        return self.node.op_type

    def I(self, i: int) -> str:  # noqa: E743 - ORT's name
        return self.node.input[i] if i < len(self.node.input) else ""

    def O(self, i: int) -> str:  # noqa: E743
        return self.node.output[i] if i < len(self.node.output) else ""

    def num_inputs(self) -> int:
        return len(self.node.input)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attributes.get(name, default)

    def source_attributes(self, drop: Sequence[str] = ()) -> Dict[str, Any]:
        """The forward node's attributes as keyword arguments for :meth:`emit`."""
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in self.attributes.items() if k not in drop}

    def shape(self, name: str) -> Shape:
        return self.index.shape(name)

    def elem_type(self, name: str) -> int:
        return self.index.elem_type(name)

    def np_dtype(self, name: str) -> np.dtype:
        elem = self.elem_type(name) or onnx.TensorProto.FLOAT
        return onnx.helper.tensor_dtype_to_np_dtype(elem)

    # ---- gradients -------------------------------------------------------------------
    def GO(self, i: int) -> str:  # noqa: N802 - ORT's name
        return self._output_grads[i] if i < len(self._output_grads) else ""

    def GI(self, i: int) -> str:  # noqa: N802
        return self._input_grads[i] if i < len(self._input_grads) else ""

    def requires(self, i: int) -> bool:
        return bool(self.GI(i))

    def GI_or_unused(self, i: int) -> str:  # noqa: N802
        """``GI(i)``, or a fresh name for a required output of a gradient op nobody reads."""
        return self.GI(i) or self.IA(f"unused_grad_{i}")

    def IA(self, name: str) -> str:  # noqa: N802
        return self.index.unique(f"{self.node_name}_Grad/{name}")

    def unsupported(self, reason: str) -> UnsupportedGradientError:
        return UnsupportedGradientError([(self.node.domain or "ai.onnx", self.op_type, self.node_name, reason)])

    # ---- emission --------------------------------------------------------------------
    def emit(
        self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], domain: str = "", **attributes: Any
    ) -> List[str]:
        node = onnx.helper.make_node(
            op_type,
            list(inputs),
            list(outputs),
            name=f"{self.node_name}_Grad/{op_type}_{self._emitted}",
            domain=domain or None,
            **attributes,
        )
        self._emitted += 1
        self.index.new_nodes.append(node)
        return list(outputs)

    def constant(self, name: str, value: Any, dtype: Any = None) -> str:
        """An initializer holding ``value`` (numpy, or a list with ``dtype``), named ``IA(name)``."""
        return self.index.add_initializer(self.IA(name), np.asarray(value, dtype=dtype))

    def scalar_like(self, key: str, value: float, like: str, shape: Sequence[int] = ()) -> str:
        """A shared constant of ``like``'s element type (ORT's ``OneConstant_Type1``, ``HalfConstant...``)."""
        dtype = self.np_dtype(like)
        elem = self.elem_type(like) or onnx.TensorProto.FLOAT
        return self.index.shared_constant(f"{key}_Type{elem}", np.full(tuple(shape), value, dtype=dtype))

    def int64s(self, name: str, values: Sequence[int]) -> str:
        return self.constant(name, np.asarray(list(values), dtype=np.int64))

    # ---- opset-dependent forms -------------------------------------------------------
    def reduce_sum(self, data: str, axes: Sequence[int], keepdims: bool, output: str) -> None:
        if self.opset < 13:
            self.emit("ReduceSum", [data], [output], axes=list(axes), keepdims=int(keepdims))
        else:
            axes_name = self.int64s(f"ReduceAxes_for_{output}", axes)
            self.emit("ReduceSum", [data, axes_name], [output], keepdims=int(keepdims), noop_with_empty_axes=0)

    def unsqueeze(self, data: str, axes: "Sequence[int] | str", output: str) -> None:
        """Unsqueeze by constant axes (a list) or by an axes tensor (a name, opset >= 13)."""
        if self.opset < 13:
            if isinstance(axes, str):
                raise self.unsupported("Unsqueeze by an axes tensor needs opset 13 or newer")
            self.emit("Unsqueeze", [data], [output], axes=list(axes))
        else:
            axes_name = axes if isinstance(axes, str) else self.int64s(f"axes_for_{output}", axes)
            self.emit("Unsqueeze", [data, axes_name], [output])

    def squeeze(self, data: str, axes: "Sequence[int] | str", output: str) -> None:
        if self.opset < 13:
            if isinstance(axes, str):
                raise self.unsupported("Squeeze by an axes tensor needs opset 13 or newer")
            self.emit("Squeeze", [data], [output], axes=list(axes))
        else:
            axes_name = axes if isinstance(axes, str) else self.int64s(f"axes_for_{output}", axes)
            self.emit("Squeeze", [data, axes_name], [output])

    def reshape_like(self, data: str, like: str, output: str) -> None:
        """``output = Reshape(data, shape of like)``, with a constant target when ``like``'s shape is all ints."""
        shape = self.shape(like)
        if shape is not None and all(isinstance(d, int) for d in shape):
            target = self.int64s(f"{like}_shape", shape)
        else:
            target = self.IA(f"{like}_shape")
            self.emit("Shape", [like], [target])
        self.emit("Reshape", [data, target], [output])

    # ---- broadcasting ----------------------------------------------------------------
    def reduce_to(self, grad: str, grad_shape: Shape, target: str, output: str) -> None:
        """``output`` = ``grad`` summed over the axes along which ``target`` was broadcast.

        Static shapes give constant axes (a ReduceSum, or an Identity when nothing was
        broadcast); otherwise ``BroadcastGradientArgs`` computes the axes at run time.
        """
        target_shape = self.shape(target)
        if is_static(grad_shape) and is_static(target_shape):
            axes = broadcast_reduction_axes(target_shape, grad_shape)
            if not axes:
                self.emit("Identity", [grad], [output])
                return
            keepdims = len(grad_shape) == len(target_shape)
            reduced = (
                [1 if i in axes else d for i, d in enumerate(grad_shape)]
                if keepdims
                else [d for i, d in enumerate(grad_shape) if i not in axes]
            )
            if reduced == list(target_shape):
                self.reduce_sum(grad, axes, keepdims, output)
            else:
                summed = self.IA(f"ReduceSum_{grad}_for_{target}")
                self.reduce_sum(grad, axes, True, summed)
                self.reshape_like(summed, target, output)
            return
        target_dims = self.IA(f"Shape_{target}")
        grad_dims = self.IA(f"Shape_{grad}")
        axes_name = self.IA(f"ReduceAxes_{target}")
        self.emit("Shape", [target], [target_dims])
        self.emit("Shape", [grad], [grad_dims])
        self.emit("BroadcastGradientArgs", [target_dims, grad_dims], [axes_name, ""], domain=MS_DOMAIN)
        summed = self.IA(f"ReduceSum_{grad}_for_{target}")
        if self.opset < 13:
            self.emit(
                "ReduceSumTraining", [grad, axes_name], [summed], domain=MS_DOMAIN, keepdims=1, noop_with_empty_axes=1
            )
        else:
            self.emit("ReduceSum", [grad, axes_name], [summed], keepdims=1, noop_with_empty_axes=1)
        self.emit("Reshape", [summed, target_dims], [output])


def broadcast_reduction_axes(target: List, full: List) -> List[int]:
    """Axes of ``full`` (the broadcast result) along which ``target`` was broadcast.

    Leading axes ``target`` lacks, plus axes where ``target`` has size 1 and ``full`` does
    not; symbolic dims are taken to match (as ORT's ``ComputeBroadcastBackwardAxes`` does).
    """
    offset = len(full) - len(target)
    axes = list(range(offset))
    for i, dim in enumerate(target):
        other = full[offset + i]
        if dim == 1 and other != 1:
            axes.append(offset + i)
    return axes
