"""Turning an error raised inside torch during a step into one that names the input.

torch's messages name no graph input (`IndexError: Target 5 is out of bounds`).  When a
step fails on the CPU, the forward pass is replayed node by node (only then, so steps pay
nothing) to find the failing operator and the user inputs it reads.  On an accelerator the
error names the step's inputs only: kernels there report errors asynchronously.
"""

from __future__ import annotations

import re
from typing import List, NoReturn, Optional, Sequence

import torch
from torch import fx

from ..errors import InvalidInputError, OrtTorchCompatError

_OP_FROM_MODULE = re.compile(r"^n\d+_(?P<op>.+)$")  # graph.builder names modules n<index>_<op type>
_NOT_INPUT_ERRORS = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),) if t is not None)


class _Locator(fx.Interpreter):
    """Runs the graph and remembers the node being executed."""

    current: Optional[fx.Node] = None

    def run_node(self, node: fx.Node):
        self.current = node
        return super().run_node(node)


def _failing_node(module: torch.nn.Module, args: Sequence[torch.Tensor]) -> Optional[fx.Node]:
    if not isinstance(module, fx.GraphModule):
        return None
    locator = _Locator(module)
    try:
        with torch.no_grad():  # on copies: the replay must not update BatchNorm's running stats again
            locator.run(*[arg.detach().clone() for arg in args])
    except Exception:  # noqa: BLE001 - any error: we only want where it happened
        return locator.current
    return None  # the forward pass succeeds on its own: the failure was in the backward pass


def _inputs_read(node: fx.Node, user_inputs: dict) -> List[str]:
    """User inputs among the node's arguments, else among its ancestors."""
    direct = list(dict.fromkeys(user_inputs[arg] for arg in node.all_input_nodes if arg in user_inputs))
    if direct:
        return direct
    found, stack, seen = set(), list(node.all_input_nodes), set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in user_inputs:
            found.add(user_inputs[current])
        stack.extend(current.all_input_nodes)
    return sorted(found, key=list(user_inputs.values()).index)


def raise_explained(
    error: Exception, module: torch.nn.Module, args: Sequence[torch.Tensor], user_input_names: Sequence[str], step: str
) -> NoReturn:
    """Re-raise `error` (raised by `module(*args)`) as InvalidInputError naming the operator and
    the user inputs it reads, chained to it; errors that are not about the inputs as they are."""
    explained = _explain(error, module, args, user_input_names, step)
    if explained is None:
        raise error
    raise explained from error


def _explain(
    error: Exception, module: torch.nn.Module, args: Sequence[torch.Tensor], user_input_names: Sequence[str], step: str
) -> Optional[InvalidInputError]:
    if isinstance(error, (OrtTorchCompatError,) + _NOT_INPUT_ERRORS) or not isinstance(
        error, (RuntimeError, IndexError, ValueError, TypeError)
    ):
        return None
    devices = sorted({str(arg.device) for arg in args if arg.device.type != "cpu"})
    node = None if devices else _failing_node(module, args)
    reason = f"{type(error).__name__}: {error}".strip()
    if node is None:
        names = ", ".join(f"'{name}'" for name in user_input_names)
        # Accelerators report kernel errors asynchronously: a replay there cannot locate them.
        where = f"on {', '.join(devices)}" if devices else "computing gradients"
        return InvalidInputError(f"{step} failed {where} (inputs {names}); check their values. {reason}")
    placeholders = [n for n in node.graph.nodes if n.op == "placeholder"]
    user_inputs = dict(zip(placeholders, user_input_names))
    match = _OP_FROM_MODULE.match(str(node.target)) if node.op == "call_module" else None
    operator = f"operator {match.group('op')}" if match else f"node {node.name}"
    read = _inputs_read(node, user_inputs)
    culprit = (
        f"input '{read[0]}'"
        if len(read) == 1
        else "inputs " + ", ".join(f"'{name}'" for name in read)
        if read
        else "no user input"
    )
    return InvalidInputError(f"{step} failed in {operator}, which reads {culprit}; check its values. {reason}")
