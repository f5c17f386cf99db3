"""The engine's one way of turning an ONNX model into a torch module.

A module computes `io.outputs` from the user inputs followed by the parameters (graph
inputs fed with the state's tensors); the rest of the model's values are its constants.
Every caller (the training engine, the legacy session's loss model, `to_torch_module`)
builds its graphs here, so they convert the same way.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Sequence

import torch

from ..errors import ModelMismatchError
from .compiled import TrainStepRunner
from .graph_io import GraphFeeds, GraphIO
from .io_spec import names
from .model_io import opset_map
from .state import TrainingState

if TYPE_CHECKING:
    import onnx


def build_module(
    model: "onnx.ModelProto",
    io: GraphIO,
    label: str,
    fed_names: Optional[Sequence[str]] = None,
    gradients: str = "ort",
    training: bool = False,
    buffers: Sequence[str] = (),
) -> torch.nn.Module:
    """A module whose forward takes `io`'s user inputs (or `fed_names`, the values fed in
    their place, such as the outputs of string Casts run on the host) then its parameters
    and returns `io.outputs`.  `gradients` and `training`: see `graph.build_graph_module`.

    `buffers`: the frozen parameters a training-mode BatchNorm may update in place (its
    running statistics); any other running-stat input is never written, see
    `graph.running_stats`, because it may alias a weight."""
    from ..graph import build_graph_module, detach_unowned_running_stats, forward_graph  # onnx2torch: at first use

    input_names = list(names(io.user_inputs) if fed_names is None else fed_names) + io.param_names()
    graph = detach_unowned_running_stats(forward_graph(model, io.outputs, input_names, label), buffers)
    return build_graph_module(graph, opset_map(model), input_names, io.outputs, label, gradients, training)


@dataclass(frozen=True)
class ModuleRecipe:
    """`build_module`'s arguments, kept so that another process (the compile worker, see
    `compile_worker.py`) can build the same module: everything here pickles (the ONNX model,
    names, flags), whereas a converted module holds closures that do not."""

    model: "onnx.ModelProto"
    io: GraphIO
    label: str
    fed_names: Optional[Sequence[str]] = None
    gradients: str = "ort"
    training: bool = False
    buffers: Sequence[str] = field(default_factory=tuple)

    def build(self) -> torch.nn.Module:
        """The module, in training or eval mode as the recipe says (on the CPU)."""
        module = build_module(
            self.model, self.io, self.label, self.fed_names, self.gradients, self.training, self.buffers
        )
        return module.train(self.training)


class _NodeCall(functools.partial):
    """A node's converter `forward` under the node's module name, in this module: fx's
    generated code refers to a target from a torch module (nn.ReLU's forward) by its import
    path, so bound methods cannot be targets as they are; a partial costs no Python frame."""


def _named_call(forward, name: str) -> _NodeCall:
    call = _NodeCall(forward)
    call.__name__ = call.__qualname__ = name
    call.__module__ = __name__
    return call


def direct_calls(module: torch.nn.Module) -> torch.nn.Module:
    """`module`'s computation with each node's converter `forward` called directly, not
    through `nn.Module.__call__` (hook dispatch and the attribute lookup of the submodule:
    ~1.7 us a node; measured 7-20% of forward+backward of the real-architecture fixtures at
    on-device sizes, see docs/design.md "Per-step cost (eager)").

    The converter modules are shared, not copied (their state, BatchNorm running stats
    included, is the original's); the original stays what the compiler keys and traces and
    what a failed step is explained on.  Anything but a GraphModule without hooks comes back
    as is."""
    from torch import fx

    if not isinstance(module, fx.GraphModule):
        return module
    graph = fx.Graph()
    env = {}
    for node in module.graph.nodes:
        target = module.get_submodule(node.target) if node.op == "call_module" else None
        if target is not None and not (target._forward_hooks or target._forward_pre_hooks):
            env[node] = graph.call_function(
                _named_call(target.forward, node.target),
                fx.map_arg(node.args, env.__getitem__),
                fx.map_arg(node.kwargs, env.__getitem__),
            )
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
    direct = fx.GraphModule(module, graph, class_name=type(module).__name__)
    direct.train(module.training)
    return direct


def frozen_parameters(io: GraphIO, state: TrainingState) -> List[str]:
    """The parameters of `io` that do not train: `build_module`'s `buffers`, the only
    running statistics a training-mode BatchNorm may update in place."""
    return [name for name in io.param_names() if not state.parameters[name].requires_grad]


def io_for_outputs(model: "onnx.ModelProto", io: GraphIO, outputs: Sequence[str], label: str) -> GraphIO:
    """`io` cut to `outputs`: only the user inputs and parameters those outputs depend on.

    Raises ModelMismatchError when the model computes none of some output.
    """
    from ..graph.subgraph import ancestor_nodes

    graph = model.graph
    available = {out for node in graph.node for out in node.output if out} | {i.name for i in graph.input}
    missing = [name for name in outputs if name not in available]
    if missing:
        raise ModelMismatchError(f"{label} does not compute output(s) {missing}")
    used = {name for node in ancestor_nodes(graph, outputs) for name in node.input} | set(outputs)
    return GraphIO(
        [spec for spec in io.user_inputs if spec.name in used],
        [spec for spec in io.param_inputs if spec.name in used],
        list(outputs),
    )


@dataclass
class StepModules:
    """The training engine's modules: the train module with the runner that steps it
    (eager through its direct-call copy, or compiled), the eval module (None without an eval
    model) with its direct-call copy."""

    train: torch.nn.Module
    train_runner: TrainStepRunner
    eval: Optional[torch.nn.Module]
    eval_direct: Optional[torch.nn.Module]


def build_step_modules(
    train: GraphFeeds,
    evaluation: Optional[GraphFeeds],
    state: TrainingState,
    gradients: str,
    device: torch.device,
    session_options: object,
) -> StepModules:
    """Convert the train graph (training mode; its frozen parameters are the buffers a
    BatchNorm may update) and the eval graph (eval mode) into modules on `device`."""
    train_io, train_label = train.graph.io, train.graph.label
    recipe = ModuleRecipe(
        train.strings.model,
        train_io,
        train_label,
        train.strings.fed_names,
        gradients,
        training=True,
        buffers=tuple(frozen_parameters(train_io, state)),
    )
    train_module = recipe.build().to(device)
    # Eager steps run the direct-call graph; the runner keys, traces and compiles the module.
    runner = TrainStepRunner(train_module, recipe, device, session_options, eager=direct_calls(train_module))
    if evaluation is None:
        return StepModules(train_module, runner, None, None)
    eval_io = evaluation.graph.io
    eval_module = (
        build_module(
            evaluation.strings.model,
            eval_io,
            evaluation.graph.label,
            evaluation.strings.fed_names,
            gradients,
            buffers=frozen_parameters(eval_io, state),
        )
        .to(device)
        .eval()
    )
    return StepModules(train_module, runner, eval_module, direct_calls(eval_module))
