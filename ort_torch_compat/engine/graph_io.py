"""What ORT's training model feeds and returns, classified the way ORT's Module does.

The first two steps of the engine's set-up live here: `read_training_graph` /
`read_eval_graph` load a model and classify its inputs and outputs (`GraphIO`), and
`classify_feeds` says how a step feeds the graph (declared parameter shapes, string inputs
cast on the host, the shared batch dims).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional

from ..errors import ModelLoadError, ModelMismatchError
from .io_spec import BatchCheck, ValueSpec, names, value_spec
from .model_io import ModelSource, describe, load_model
from .state import TrainingState
from .string_inputs import StringCasts

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
    users = [
        value_spec(i)
        for i in inputs
        if i.name not in state.parameters and i.name != RESET_INPUT and not is_gradient_name(i.name)
    ]
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


@dataclass
class ModelGraph:
    """One model as the engine reads it: the ONNX graph, its classified I/O and the label
    that errors name it by ("training model 'path'")."""

    proto: "onnx.ModelProto"
    io: GraphIO
    label: str


@dataclass
class GraphFeeds:
    """How a step feeds one graph: `strings.model` is the graph the module is built from
    (without the Casts of string inputs, which run on the host), `shapes` the parameter
    shapes the graph declares, `batch` the symbolic dims its user inputs share."""

    graph: ModelGraph
    shapes: Dict[str, tuple]
    strings: StringCasts
    batch: BatchCheck


def read_training_graph(source: ModelSource, state: TrainingState) -> ModelGraph:
    """Load the training model and classify its I/O; reject models that are not ORT
    training models or do not match `state`."""
    label = f"training model {describe(source, 'training model')}"
    proto = load_model(source, "training model")
    return ModelGraph(proto, training_io(proto, state, label), label)


def read_eval_graph(source: Optional[ModelSource], state: TrainingState, training: GraphIO) -> Optional[ModelGraph]:
    """Load the eval model (None without one) and classify its I/O; it must feed on the
    training model's user inputs (`check_eval_matches`)."""
    if source is None:
        return None
    label = f"eval model {describe(source, 'eval model')}"
    proto = load_model(source, "eval model")
    io = eval_io(proto, state)
    check_eval_matches(io, training, label)
    return ModelGraph(proto, io, label)


def classify_feeds(graph: Optional[ModelGraph], state: TrainingState) -> Optional[GraphFeeds]:
    """`graph`'s feeds (None for no graph), after checking its parameters' declared dtypes
    and shapes against `state` and its string inputs against the Casts that read them."""
    if graph is None:
        return None
    shapes = check_parameter_types(graph.io, state, graph.label)
    strings = StringCasts(graph.proto, graph.io.user_inputs, graph.label)
    return GraphFeeds(graph, shapes, strings, BatchCheck(graph.proto, names(graph.io.user_inputs)))
