"""Train steps as one traced aten graph run by TorchScript's interpreter: no C++ compiler.

Why (measured, docs/design.md "The traced step"): at on-device sizes a train step is
400-600 aten calls on tensors of a few hundred elements, and what costs is the framework
around each call, not the kernel: the converted module's Python (one module per ONNX node)
and autograd's graph (one node per op, recorded and walked every step).  The same calls
made by TorchScript's C++ interpreter, from one graph holding the forward and its backward,
cost 2.5-4x less on the tiny real architectures; no compiler runs, nothing is cached on
disk, and the kernels are the eager step's own (torch's fused layer norm, softmax and
their backward; no decompositions), so the numbers are the eager step's.

How: `graph/specialize.py` traces the converted module for this input signature
(random operators kept: they draw from torch's generator as the module does; constant
subgraphs folded), `joint_graph.joint_train_graph` traces its forward and autograd backward
into one graph returning the outputs and the flat gradients, `_script` hands that graph to
`torch.jit.script`.  The step is checked once against the eager step on the first batch
(`step_check`: a disagreement refuses it) and timed against it: the runner
(compiled.py) uses it only where it is faster.  TorchScript is deprecated (torch 2.14
warns); where it is missing or refuses a graph, the steps run eagerly as before.
"""

from __future__ import annotations

import warnings
from typing import List, Optional, Sequence, Tuple

import torch
from torch import fx

from .compiled_step import FlatGradientStep, gradient_groups
from .joint_graph import joint_train_graph
from .step_check import check_against_eager, time_against_eager

_TIMED_ROUNDS = 3  # eager/traced step pairs timed before the traced step is used


def torchscript_available() -> bool:
    """Whether this torch still has TorchScript's compiler and interpreter."""
    return callable(getattr(torch.jit, "script", None))


class TracedTrainStep(FlatGradientStep):
    """The train step (forward, backward and flat gradients) of one graph for one input
    signature, as a TorchScript function."""

    def __init__(
        self,
        function: torch.jit.ScriptModule,
        constants: List[torch.Tensor],
        num_outputs: int,
        mutated: List[int],
        grad_groups: List[List[int]],
    ):
        self.function = function
        self.constants = constants
        self.num_outputs = num_outputs
        self.mutated = mutated
        self.grad_groups = grad_groups
        self.error: Optional[BaseException] = None  # why the last run failed

    def run(
        self, tensors: Sequence[torch.Tensor], contiguous_tail: int = 0
    ) -> Optional[Tuple[List[torch.Tensor], List[torch.Tensor]]]:
        """(outputs, flat gradients) of the step on `tensors`; running statistics written
        back after the step.  None, having written nothing back, where the graph raised (an
        index out of range, say): the caller runs the eager step, which raises the error
        with its explanation."""
        arguments = self._arguments(tensors, contiguous_tail)
        try:
            with torch.no_grad():  # parameters require grad: no autodiff graph in the interpreter
                results = self.function(*arguments)
        except Exception as error:  # noqa: BLE001  (the eager step raises it, explained)
            self.error = error
            return None
        return self._split(arguments, results)


def _script(graph: fx.GraphModule) -> torch.jit.ScriptModule:
    """`graph` (aten operator overloads) as TorchScript, which resolves overload packets by
    their schema, takes devices as strings and has no `_to_copy(x, dtype=...)` form."""
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        if isinstance(node.target, torch._ops.OpOverload):
            node.target = node.target.overloadpacket
        if node.target is torch.ops.aten._to_copy and len(node.args) == 1 and set(node.kwargs) == {"dtype"}:
            node.target = torch.ops.aten.to
        node.kwargs = {k: (v.type if isinstance(v, torch.device) else v) for k, v in node.kwargs.items()}
    graph.recompile()
    with warnings.catch_warnings():  # "torch.jit.script is deprecated", remarks on fx's module: ours, not the user's
        warnings.simplefilter("ignore")
        return torch.jit.script(graph)


def build_traced_step(module: fx.GraphModule, tensors: Sequence[torch.Tensor]) -> Tuple[TracedTrainStep, float, float]:
    """The traced step of `module` for inputs shaped like `tensors` (feeds, then parameters),
    checked against the eager step; with the eager and traced step's CPU milliseconds.
    Raises NotSpecializable (or what TorchScript raises) where the graph cannot be traced."""
    from ..graph.specialize import specialize

    spec = specialize(module, tensors, allow_random=True, fold_constants=True)
    graph = joint_train_graph(spec, tensors, {})
    step = TracedTrainStep(
        _script(graph), list(spec.constants), spec.num_outputs, spec.mutated, gradient_groups(tensors)
    )
    check_against_eager(step, module, tensors)
    eager_ms, traced_ms = time_against_eager(step, module, tensors, _TIMED_ROUNDS)
    return step, eager_ms, traced_ms
