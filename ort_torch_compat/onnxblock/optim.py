"""Optimizer blocks: the ``optimizer_model.onnx`` graphs ORT's training runtime expects.

The runtime checks the graph inputs exactly (``learning_rate``, ``step``, ``params``,
``gradients``, ``first_order_moments`` [, ``second_order_moments``]) and looks for one
com.microsoft ``AdamWOptimizer`` or ``SGDOptimizerV2`` node; these blocks build those
graphs with onnxruntime-training 1.19.2's defaults (AdamW: eps 1e-6, weight decay 0,
adam_mode 1) and names.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import onnx

from . import _graph_utils, blocks
from .onnxblock import ForwardBlock

__all__ = ["ClipGradNorm", "SGDOptimizer", "AdamWOptimizer", "AdamW", "SGD"]


class ClipGradNorm(blocks.Block):
    """com.microsoft ``InplaceClipGradNorm(gradients, max_norm)``: clips the gradient sequence by L2 norm."""

    def __init__(self, max_norm: float):
        super().__init__()
        self._max_norm = max_norm

    def build(self, gradients_name: str) -> str:
        output_name = _graph_utils.generate_graph_name("clip_grad_norm_output")
        node = onnx.helper.make_node(
            "InplaceClipGradNorm",
            [gradients_name],
            [output_name],
            name=_graph_utils.generate_graph_name("InplaceClipGradNorm"),
            domain="com.microsoft",
            max_norm=self._max_norm,
        )
        self.base.graph.node.append(node)
        self.base.graph.value_info.append(
            onnx.helper.make_tensor_sequence_value_info(output_name, onnx.TensorProto.FLOAT, None)
        )
        return output_name


class _OptimizerNode(blocks.Block):
    def _build_optimizer_node(self, input_names: List[str], output_name: str, op_type: str, attributes: Dict) -> str:
        node = onnx.helper.make_node(
            op_type,
            input_names,
            [output_name],
            name=_graph_utils.generate_graph_name(op_type),
            domain="com.microsoft",
            **attributes,
        )
        self.base.graph.node.append(node)
        return output_name


class SGDOptimizer(_OptimizerNode):
    """``SGDOptimizerV2(learning_rate, params, gradients)``: ``w = w - lr * g``."""

    def build(self, learning_rate_name: str, gradients_name: str, params_name: str) -> str:
        return self._build_optimizer_node(
            [learning_rate_name, gradients_name, params_name],
            _graph_utils.generate_graph_name("update_completed"),
            "SGDOptimizerV2",
            {},
        )


class AdamWOptimizer(_OptimizerNode):
    """``AdamWOptimizer`` node (adam_mode 1: HuggingFace AdamW, decay after the update)."""

    def __init__(
        self,
        bias_correction: Optional[bool] = True,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: Optional[float] = 1e-6,
        weight_decay: Optional[float] = 0.0,
    ):
        super().__init__()
        self._bias_correction = bias_correction
        self._betas = betas
        self._eps = eps
        self._weight_decay = weight_decay

    def build(
        self,
        learning_rate_name: str,
        step_name: str,
        parameter_sequence_name: str,
        gradient_sequence_name: str,
        first_order_moment_sequence_name: str,
        second_order_moment_sequence_name: str,
    ) -> str:
        attributes = {
            "alpha": self._betas[0],
            "beta": self._betas[1],
            "epsilon": self._eps,
            "weight_decay": self._weight_decay,
            "correct_bias": 1 if self._bias_correction else 0,
            "adam_mode": 1,
        }
        inputs = [
            learning_rate_name,
            step_name,
            parameter_sequence_name,
            gradient_sequence_name,
            first_order_moment_sequence_name,
            second_order_moment_sequence_name,
        ]
        return self._build_optimizer_node(
            inputs, _graph_utils.generate_graph_name("adamw.updated_flag"), "AdamWOptimizer", attributes
        )


class _Optimizer(ForwardBlock):
    """Declares the runtime's fixed inputs, then adds the optimizer-specific node(s)."""

    def __init__(self, clip_grad: Optional[ClipGradNorm] = None):
        super().__init__()
        self._clip_grad = clip_grad

    def build(self, parameters: Tuple[Sequence[onnx.TensorProto], Sequence[onnx.TensorProto]]) -> str:
        trainable, _ = parameters
        if not trainable:
            raise RuntimeError("The optimizer model needs at least one trainable parameter (requires_grad is empty).")
        graph = self.base.graph
        graph.input.extend(
            [
                onnx.helper.make_tensor_value_info("learning_rate", onnx.TensorProto.FLOAT, [1]),
                onnx.helper.make_tensor_value_info("step", onnx.TensorProto.INT64, [1]),
            ]
        )
        for name in ("params", "gradients", "first_order_moments"):
            graph.input.append(onnx.helper.make_tensor_sequence_value_info(name, trainable[0].data_type, None))
        gradients_name = "gradients"
        if self._clip_grad is not None:
            gradients_name = self._clip_grad(gradients_name)
        return self._optimizer_specific_logic("learning_rate", "params", gradients_name, trainable)

    def _optimizer_specific_logic(
        self,
        learning_rate_name: str,
        params_name: str,
        gradients_name: str,
        trainable_parameters: Sequence[onnx.TensorProto],
    ) -> str:
        raise NotImplementedError("Subclasses must implement _optimizer_specific_logic method.")


class AdamW(_Optimizer):
    """The AdamW optimizer model (``OptimType.AdamW``: betas (0.9, 0.999), eps 1e-6, no weight decay)."""

    def __init__(
        self,
        bias_correction: bool = True,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        clip_grad: Optional[ClipGradNorm] = None,
    ):
        super().__init__(clip_grad)
        self._adamw = AdamWOptimizer(bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay)

    def _optimizer_specific_logic(
        self,
        learning_rate_name: str,
        params_name: str,
        gradients_name: str,
        trainable_parameters: Sequence[onnx.TensorProto],
    ) -> str:
        self.base.graph.input.append(
            onnx.helper.make_tensor_sequence_value_info("second_order_moments", trainable_parameters[0].data_type, None)
        )
        flag = self._adamw(
            learning_rate_name, "step", params_name, gradients_name, "first_order_moments", "second_order_moments"
        )
        self.base.graph.output.append(onnx.helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, [1]))
        return flag


class SGD(_Optimizer):
    """The SGD optimizer model (``OptimType.SGD``: no momentum, no weight decay)."""

    def __init__(self, clip_grad: Optional[ClipGradNorm] = None):
        super().__init__(clip_grad)
        self._sgd = SGDOptimizer()

    def _optimizer_specific_logic(
        self,
        learning_rate_name: str,
        params_name: str,
        gradients_name: str,
        trainable_parameters: Sequence[onnx.TensorProto],
    ) -> str:
        flag = self._sgd(learning_rate_name, params_name, gradients_name)
        self.base.graph.output.append(onnx.helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, [1]))
        return flag
