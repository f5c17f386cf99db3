"""What ORT's training model feeds and returns, classified the way ORT's Module does."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List

from ..errors import ModelLoadError, ModelMismatchError
from .io_spec import ValueSpec, value_spec
from .state import TrainingState

if TYPE_CHECKING:
    import onnx

RESET_INPUT = "lazy_reset_grad"
GRAD_SUFFIXES = ("_grad.accumulation.buffer", "_grad.accumulation.out", "_grad")


def is_gradient_name(name: str) -> bool:
    return name.endswith(GRAD_SUFFIXES)


@dataclass
class GraphIO:
    """User inputs, parameter inputs (graph order) and user outputs of one model."""

    user_inputs: List[ValueSpec]
    param_inputs: List[ValueSpec]
    outputs: List[str]

    def param_names(self) -> List[str]:
        return [spec.name for spec in self.param_inputs]


def training_io(model: onnx.ModelProto, state: TrainingState, name: str) -> GraphIO:
    """Classify training-model inputs; reject models that are not ORT training models."""
    inputs = list(model.graph.input)
    input_names = {info.name for info in inputs}
    grad_buffers = [info.name for info in inputs if info.name.endswith("_grad.accumulation.buffer")]
    if RESET_INPUT not in input_names and not grad_buffers:
        raise ModelLoadError(
            f"{name} is not a training model: it has no '{RESET_INPUT}' input and no gradient accumulation "
            "buffers (make artifacts with onnxruntime.training.artifacts.generate_artifacts)"
        )
    params = [value_spec(i) for i in inputs if i.name in state.parameters]
    users = [value_spec(i) for i in inputs if i.name not in state.parameters and i.name != RESET_INPUT
             and not is_gradient_name(i.name)]
    trained = {buf[: -len("_grad.accumulation.buffer")] for buf in grad_buffers}
    missing = sorted(trained - set(state.parameters))
    if missing:
        raise ModelMismatchError(f"{name} trains parameter(s) {missing} that the checkpoint does not contain")
    extra = sorted(set(state.parameters) - input_names)
    if extra:
        raise ModelMismatchError(f"checkpoint parameter(s) {extra} are not inputs of {name}")
    outputs = [out.name for out in model.graph.output if not is_gradient_name(out.name)]
    if not outputs:
        raise ModelLoadError(f"{name} has no loss output")
    return GraphIO(users, params, outputs)


def eval_io(model: onnx.ModelProto, state: TrainingState) -> GraphIO:
    params = [value_spec(i) for i in model.graph.input if i.name in state.parameters]
    users = [value_spec(i) for i in model.graph.input if i.name not in state.parameters]
    return GraphIO(users, params, [out.name for out in model.graph.output])


def check_eval_matches(evaluation: GraphIO, training: GraphIO, name: str) -> None:
    """An eval model must feed on the training model's user inputs and the state's parameters.

    ORT accepts any eval model here and fails only at the first EvalStep (as a feed-count or
    shape error); an eval model made for other artifacts is caught now, naming the inputs.
    """
    declared = {spec.name: spec for spec in training.user_inputs}
    unknown = [spec.name for spec in evaluation.user_inputs if spec.name not in declared]
    if unknown:
        raise ModelMismatchError(
            f"{name} does not match the training model: input(s) {unknown} are neither inputs of the training "
            f"model ({sorted(declared)}) nor parameters of the checkpoint (was it made for other artifacts?)"
        )
    for spec in evaluation.user_inputs:
        other = declared[spec.name]
        if spec.elem_type and other.elem_type and spec.elem_type != other.elem_type:
            raise ModelMismatchError(
                f"{name} does not match the training model: input '{spec.name}' is {spec.type_name} there "
                f"but {other.type_name} in the training model"
            )


def check_parameter_types(io: GraphIO, state: TrainingState, name: str) -> Dict[str, tuple]:
    """Compare declared parameter shapes/dtypes with the state's; return declared shapes."""
    from ..codec.dtypes import dtype_name

    shapes = {}
    for spec in io.param_inputs:
        slot = state.parameters[spec.name]
        if spec.elem_type and slot.data_type != spec.elem_type:
            raise ModelMismatchError(
                f"parameter '{spec.name}': checkpoint dtype {dtype_name(slot.data_type)} but {name} declares "
                f"{dtype_name(spec.elem_type)}"
            )
        if spec.shape is not None:
            shapes[spec.name] = spec.shape
            if slot.tensor is not None:
                actual = tuple(slot.tensor.shape)
                if len(actual) != len(spec.shape) or any(d is not None and d != a for d, a in zip(spec.shape, actual)):
                    raise ModelMismatchError(
                        f"parameter '{spec.name}': checkpoint shape {list(actual)} but {name} declares "
                        f"{['?' if d is None else d for d in spec.shape]}"
                    )
    return shapes
