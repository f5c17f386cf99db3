"""A train step as one aten graph: the forward, its autograd backward and the flat gradients.

Both step forms that run without autograd start here: the AOTInductor library
(compile_build.py) and the traced step (traced_step.py).  `make_fx` traces the specialized
module's forward together with the backward autograd derives for output 0 (seeded with
ones, as the engine seeds it) into one graph returning the outputs, the new values of the
inputs the module updates in place, then the gradients flat: one tensor per dtype, the
trainable inputs' gradients one after another in input order (`gradient_groups`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Sequence

import torch
from torch import fx

from .compiled_step import gradient_groups

if TYPE_CHECKING:
    from ..graph.specialize import SpecializedGraph


def joint_train_graph(
    spec: "SpecializedGraph", tensors: Sequence[torch.Tensor], decompositions: Dict
) -> fx.GraphModule:
    """The graph of `spec`'s whole train step for inputs shaped like `tensors` (feeds and
    parameters; `spec.constants` follow them as inputs), traced on fake tensors with
    `decompositions` applied (the compiler's table, or {} to keep torch's own kernels)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..graph.specialize import NotSpecializable
    from ..graph.traced_operators import TRACED_OPERATOR_DECOMPOSITIONS

    args = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    args += [c.detach().clone() for c in spec.constants]
    groups = gradient_groups(tensors)
    if not groups:
        raise NotSpecializable("no input of the train step is trainable")

    def whole_step(*inputs: torch.Tensor) -> List[torch.Tensor]:
        with torch.enable_grad():
            results = list(spec.module(*inputs))
            loss = results[0]
            if not loss.requires_grad:
                raise NotSpecializable("the loss (output 0) does not depend on a trainable parameter")
            wanted = [i for group in groups for i in group]
            grads = torch.autograd.grad(loss, [inputs[i] for i in wanted], torch.ones_like(loss), allow_unused=True)
        filled = {i: torch.zeros_like(inputs[i]) if g is None else g for i, g in zip(wanted, grads)}
        flat = [torch.cat([filled[i].reshape(-1) for i in group]) for group in groups]
        return [r.detach() for r in results] + flat

    table = {**decompositions, **TRACED_OPERATOR_DECOMPOSITIONS}
    return make_fx(whole_step, decomposition_table=table, tracing_mode="fake")(*args)
