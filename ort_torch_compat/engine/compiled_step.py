"""Running a compiled train step: the one AOTInductor library of a cache entry.

A step runs without autograd: the library computes the outputs and the gradient of the
loss (output 0, seeded with ones as the engine seeds it) with respect to every trainable
input, flat: one tensor per dtype, the inputs' gradients one after another in input order.
`CompiledTrainStep.run` returns them as they are (the engine copies or adds a flat gradient
into the parameters' flat gradient buffer in one call, ParameterStore.bind_flat_grads);
`CompiledTrainStep.train` adds them into each input's `.grad` as autograd would.  New
BatchNorm running statistics are copied into the state's tensors after each step.  The
library loads through `torch._C._aoti` (part of libtorch), without importing TorchDynamo or
TorchInductor.
"""

from __future__ import annotations

import base64
import ctypes
import functools
import pathlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

Observer = Callable[[torch.Tensor, torch.Tensor], None]


def accumulate_grad(tensor: torch.Tensor, grad: torch.Tensor) -> None:
    """Add `grad` into `tensor.grad` as autograd's AccumulateGrad does: the first gradient
    becomes `.grad` (a copy with the tensor's strides: `grad` is a view of a flat buffer),
    a later one is added in place."""
    if tensor.grad is not None:
        tensor.grad.add_(grad)
    else:
        tensor.grad = torch.empty_like(tensor).copy_(grad)


def eager_train_step(
    function: Callable, tensors: Sequence[torch.Tensor], observe: Optional[Observer] = None
) -> Sequence[torch.Tensor]:
    """`function(*tensors)` with autograd, then the backward of output 0 seeded with ones (as
    the compiled step does); `observe` through tensor hooks."""
    handles = []
    if observe is not None:
        handles = [t.register_hook(functools.partial(observe, t)) for t in tensors if t.requires_grad]
    try:
        with torch.enable_grad():
            outputs = function(*tensors)
            loss = outputs[0]
            if loss.requires_grad:
                loss.backward(torch.ones_like(loss) if loss.dim() else None)
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def gradient_groups(tensors: Sequence[torch.Tensor]) -> List[List[int]]:
    """Indices of the inputs that require grad, grouped by dtype (groups in order of first
    appearance, indices ascending): the layout of a compiled step's flat gradients."""
    groups: Dict[torch.dtype, List[int]] = {}
    for index, tensor in enumerate(tensors):
        if tensor.requires_grad:
            groups.setdefault(tensor.dtype, []).append(index)
    return list(groups.values())


class FlatGradientStep:
    """A train step run without autograd (a compiled library, or a traced graph: see
    traced_step.py) for one graph and one input signature.  `run` (each form's own) returns
    the outputs and the flat gradients, one per entry of `grad_groups`; `train` adds the
    gradients into `.grad` as autograd would."""

    num_outputs: int
    mutated: List[int]
    grad_groups: List[List[int]]
    constants: List[torch.Tensor]

    def _arguments(self, tensors: Sequence[torch.Tensor], contiguous_tail: int) -> List[torch.Tensor]:
        """The step's inputs: `tensors` (the first all but `contiguous_tail` made contiguous:
        the graph was built for dense row-major inputs), then the constants."""
        head = len(tensors) - contiguous_tail
        return [t.contiguous() for t in tensors[:head]] + list(tensors[head:]) + self.constants

    def _split(
        self, arguments: List[torch.Tensor], results: List[torch.Tensor]
    ) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """(outputs, flat gradients) of the step's results; the new running statistics
        written into the inputs they update."""
        after = self.num_outputs + len(self.mutated)
        if self.mutated:
            with torch.no_grad():
                for index, value in zip(self.mutated, results[self.num_outputs : after]):
                    arguments[index].copy_(value)
        return results[: self.num_outputs], results[after:]

    def run(
        self, tensors: Sequence[torch.Tensor], contiguous_tail: int = 0
    ) -> Optional[Tuple[List[torch.Tensor], List[torch.Tensor]]]:
        """(outputs, flat gradients) of the step on `tensors` (feeds, then parameters), the
        running statistics it updates written back; None, having written nothing back, where
        the step cannot run these inputs (the caller runs the eager step, which raises the
        error).  The last `contiguous_tail` tensors are known to be contiguous."""
        raise NotImplementedError

    def gradients(
        self, tensors: Sequence[torch.Tensor], flats: Sequence[torch.Tensor]
    ) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """(input, its gradient: a view into its group's flat gradient) for every trainable input."""
        pairs = []
        for group, flat in zip(self.grad_groups, flats):
            offset = 0
            for index in group:
                tensor = tensors[index]
                pairs.append((tensor, flat[offset : offset + tensor.numel()].view(tensor.shape)))
                offset += tensor.numel()
        return pairs

    def train(
        self, tensors: Sequence[torch.Tensor], observe: Optional[Observer] = None
    ) -> Optional[List[torch.Tensor]]:
        """Outputs of the train step on `tensors` (feeds, then parameters); the gradient of
        output 0 is added into the `.grad` of every input that requires grad, and passed to
        `observe(input, gradient)` first where given.  None, as `run`, where an index was
        out of range."""
        result = self.run(tensors)
        if result is None:
            return None
        outputs, flats = result
        with torch.no_grad():
            for tensor, grad in self.gradients(tensors, flats):
                if observe is not None:
                    observe(tensor, grad)
                accumulate_grad(tensor, grad)
        return outputs


class CompiledTrainStep(FlatGradientStep):
    """The compiled train step (forward, backward and gradients) of one graph for one input
    signature: one AOTInductor library."""

    def __init__(self, directory: pathlib.Path, meta: Dict, constants: List[torch.Tensor]):
        self.library = torch._C._aoti.AOTIModelContainerRunnerCpu(str(directory / "step.so"), 1)
        self.num_outputs: int = meta["num_outputs"]
        self.mutated: List[int] = meta["mutated"]
        self.grad_groups: List[List[int]] = meta["grad_groups"]
        self.index_flag: bool = meta["index_flag"]  # the library's last result: every index was in range
        self.constants = constants

    def run(
        self, tensors: Sequence[torch.Tensor], contiguous_tail: int = 0
    ) -> Optional[Tuple[List[torch.Tensor], List[torch.Tensor]]]:
        """(outputs, flat gradients: one per entry of `grad_groups`) of the step on `tensors`
        (feeds, then parameters); running statistics the step updates are written back.
        None, having written nothing back, where an input's index was out of range
        (graph/index_guard.py): the caller runs the step eagerly, which raises the error.
        The library takes contiguous tensors: the last `contiguous_tail` are known to be
        (the parameter store's views), the others are made so."""
        arguments = self._arguments(tensors, contiguous_tail)
        results = self.library.run(arguments)  # a C++ call: nothing for autograd to record
        if self.index_flag and not results.pop():
            return None
        return self._split(arguments, results)


def decode_tensor(record: Dict) -> torch.Tensor:
    data = bytearray(base64.b64decode(record["data"]))
    flat = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return flat.view(getattr(torch, record["dtype"])).reshape(record["shape"])


def check_layout(meta: Dict) -> None:
    """Raise ValueError unless `meta` describes a compiled step (the manifest's digest has
    already caught damage: this catches an entry of another format or a bug)."""

    def integers(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)

    if not (
        isinstance(meta.get("num_outputs"), int)
        and integers(meta.get("mutated"))
        and isinstance(meta.get("index_flag"), bool)
        and isinstance(meta.get("grad_groups"), list)
        and all(integers(g) and g for g in meta["grad_groups"])
        and isinstance(meta.get("trace_constants"), list)
        and all(
            isinstance(r, dict)
            and isinstance(r.get("dtype"), str)
            and integers(r.get("shape"))
            and isinstance(r.get("data"), str)
            for r in meta["trace_constants"]
        )
        and all(
            isinstance(meta.get(k), (int, float)) and not isinstance(meta.get(k), bool)
            for k in ("eager_ms", "compiled_ms")
        )
        and "step.so" in set(meta.get("files", {}))
    ):
        raise ValueError("the manifest does not describe a compiled train step")


_preloaded: List[object] = []


def preload_libraries(directory: pathlib.Path) -> None:
    """dlopen the entry's library (kept loaded), so that loading it again is cheap."""
    try:
        _preloaded.append(ctypes.CDLL(str(directory / "step.so")))
    except OSError:
        pass  # the runner's own load reports it
