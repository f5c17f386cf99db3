"""Running a compiled train step: the forward and backward AOTInductor libraries of a cache entry.

A step runs without autograd: the forward library, then the backward library with the
loss seeded as the engine seeds it, and the gradients added into the parameters' `.grad` as
autograd would (ORT's overwrite/accumulate semantics and the optimizer unchanged; measured
~0.1 ms less per step than one autograd Function around the two libraries).  New BatchNorm
running statistics are copied into the state's tensors after each forward.  The libraries
load through `torch._C._aoti` (part of libtorch), without importing TorchDynamo or
TorchInductor.
"""

from __future__ import annotations

import base64
import ctypes
import functools
import pathlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch


def _restride(tensor: torch.Tensor, stride: Tuple[int, ...]) -> torch.Tensor:
    """A copy with the strides the backward library was built for (never expected to run)."""
    return torch.empty_strided(tensor.shape, stride, dtype=tensor.dtype, device=tensor.device).copy_(tensor)


Observer = Callable[[torch.Tensor, torch.Tensor], None]


def accumulate_grad(tensor: torch.Tensor, grad: torch.Tensor, owned: bool) -> None:
    """Add `grad` into `tensor.grad` as autograd's AccumulateGrad does: the first gradient
    becomes `.grad` (a copy with the tensor's strides unless `grad` is already laid out so
    and `owned`, i.e. no other tensor shares its memory), a later one is added in place."""
    if tensor.grad is not None:
        tensor.grad.add_(grad)
    elif owned and grad.stride() == tensor.stride():
        tensor.grad = grad
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


class CompiledTrainStep:
    """The compiled forward+backward of one graph for one input signature.

    `train(tensors)` is a whole train step without autograd: the forward library, then the
    backward library seeded as the engine seeds the loss (ones for output 0, zeros for the
    other differentiable outputs), and the parameter gradients added into `.grad`."""

    def __init__(self, directory: pathlib.Path, meta: Dict, constants: List[torch.Tensor]):
        runner = torch._C._aoti.AOTIModelContainerRunnerCpu
        self.forward_library = runner(str(directory / "forward.so"), 1)
        self.backward_library = runner(str(directory / "backward.so"), 1)
        self.num_outputs: int = meta["num_outputs"]
        self.mutated: List[int] = meta["mutated"]
        self.num_results = self.num_outputs + len(self.mutated)
        self.grad_outputs: List[int] = meta["grad_outputs"]
        self.no_grad_inputs = set(meta["no_grad_inputs"])
        self.activation_strides = [tuple(s) for s in meta["activation_strides"]]
        self.constants = constants
        self._restrided: Optional[List[int]] = None  # activations whose strides differ from the build's

    def train(self, tensors: Sequence[torch.Tensor], observe: Optional[Observer] = None) -> List[torch.Tensor]:
        """Outputs of the train step on `tensors` (feeds, then parameters); the gradient of
        output 0 is added into the `.grad` of every input that requires grad, and passed to
        `observe(input, gradient)` first where given."""
        every = list(tensors) + self.constants
        with torch.no_grad():
            outputs = self.forward_library.run([t.contiguous() for t in every])
            results = outputs[: self.num_results]
            for index, value in zip(self.mutated, results[self.num_outputs :]):
                every[index].copy_(value)
            if self.grad_outputs and self.grad_outputs[0] == 0:
                activations = outputs[self.num_results :]
                if self._restrided is None:  # the library lays its outputs out the same way every call
                    self._restrided = [
                        i for i, (a, s) in enumerate(zip(activations, self.activation_strides)) if a.stride() != s
                    ]
                for i in self._restrided:
                    activations[i] = _restride(activations[i], self.activation_strides[i])
                del outputs
                tangents = [torch.ones_like(results[0])]
                tangents += [torch.zeros_like(results[i]) for i in self.grad_outputs[1:]]
                grads = self.backward_library.run(activations + tangents)
                del activations
                taken = {t.data_ptr() for t in every} | {r.data_ptr() for r in results}  # not to be .grad
                for index, (tensor, grad) in enumerate(zip(tensors, grads)):
                    if index in self.no_grad_inputs or not tensor.requires_grad or grad is None:
                        continue
                    if observe is not None:
                        observe(tensor, grad)
                    accumulate_grad(tensor, grad, owned=grad._base is None and grad.data_ptr() not in taken)
                    taken.add(grad.data_ptr())
        return results[: self.num_outputs]


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
        and integers(meta.get("grad_outputs"))
        and integers(meta.get("no_grad_inputs"))
        and isinstance(meta.get("activation_strides"), list)
        and all(integers(s) for s in meta["activation_strides"])
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
        and {"forward.so", "backward.so"} <= set(meta.get("files", {}))
    ):
        raise ValueError("the manifest does not describe a compiled train step")


_preloaded: List[object] = []


def preload_libraries(directory: pathlib.Path) -> None:
    """dlopen the entry's libraries (kept loaded), so that loading them again is cheap."""
    for name in ("forward.so", "backward.so"):
        try:
            _preloaded.append(ctypes.CDLL(str(directory / name)))
        except OSError:
            return  # the runner's own load reports it
