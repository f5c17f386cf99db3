"""``ForwardBlock`` (builds a forward model) and ``TrainingBlock`` (adds the gradient graph)."""

from __future__ import annotations

from abc import abstractmethod
from typing import List, Set, Tuple

import onnx

from . import _graph_utils, blocks, training_model
from . import model_accessor as accessor


class ForwardBlock(blocks.Block):
    """A block whose ``build`` returns the graph output(s) of a forward model (e.g. an optimizer)."""

    def __init__(self):
        super().__init__()
        self._model = None

    @abstractmethod
    def build(self, *args, **kwargs):
        """Stack blocks on the registered model and return the name(s) of the graph output(s)."""

    def to_model_proto(self) -> onnx.ModelProto:
        if self._model is None:
            raise RuntimeError("Please build the forward models first before trying to retrieve it.")
        return self._model

    def __call__(self, *args, **kwargs):
        self.base = accessor.current().model
        output = self.build(*args, **kwargs)
        self._model = self.infer_shapes_on_base()
        _graph_utils.register_graph_outputs(self._model, output)
        accessor.current().model.CopyFrom(self._model)
        return output


class TrainingBlock(blocks.Block):
    """A block whose ``build`` returns the loss: calling it builds the training and eval models.

    Backpropagation starts at the first name ``build`` returns.  Parameters become graph
    inputs, the gradient graph is built by this library's gradient builder
    (``ort_torch_compat.gradient``), and each gradient gets ORT's
    ``InPlaceAccumulatorV2`` node.
    """

    def __init__(self):
        super().__init__()
        self._requires_grad: Set[str] = set()
        self._frozen_params: Set[str] = set()
        self._parameters = None
        self._training_model = None
        self._eval_model = None

    @abstractmethod
    def build(self, *args, **kwargs):
        """Stack the loss on the model's outputs and return the loss name (first) and extra outputs."""

    def requires_grad(self, argument_name: str, value: bool = True) -> None:
        """Mark ``argument_name`` trainable (``value=True``) or frozen (``value=False``)."""
        if value is True:
            self._requires_grad.add(argument_name)
            self._frozen_params.discard(argument_name)
        else:
            self._requires_grad.discard(argument_name)
            self._frozen_params.add(argument_name)

    def parameters(self) -> Tuple[List[onnx.TensorProto], List[onnx.TensorProto]]:
        """``(trainable, frozen)`` initializers, each in model order (available after the block ran)."""
        if self._parameters is None:
            raise RuntimeError("Please build the training model first before trying to retrieve the parameters.")
        return self._parameters

    def to_model_proto(self) -> Tuple[onnx.ModelProto, onnx.ModelProto]:
        """``(training model, eval model)``."""
        if self._training_model is None or self._eval_model is None:
            raise RuntimeError("Please build the training and eval models first before trying to retrieve them.")
        return self._training_model, self._eval_model

    def __call__(self, *args, **kwargs):
        self.base = accessor.current().model
        output = self.build(*args, **kwargs)
        model = self.infer_shapes_on_base()
        _graph_utils.register_graph_outputs(model, output)
        self._parameters = training_model.get_model_parameters(model, self._requires_grad, self._frozen_params)
        self._training_model, self._eval_model = training_model.build_gradient_graph(
            model, self._requires_grad, self._frozen_params, output
        )
        training_model.build_gradient_accumulation_graph(self._training_model, self._requires_grad)
        accessor.current().model.CopyFrom(self._training_model)
        return output
