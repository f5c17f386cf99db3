"""Parameter and gradient storage on the engine's device.

All trainable parameters of one dtype live in one contiguous tensor, in training-graph
input order (ORT's contiguous-buffer order); each named parameter is a leaf view into it.
Gradients are the leaves' `.grad` tensors: on the first train step after a reset they are
dropped so autograd hands over its freshly computed gradients without a copy (ORT's
"overwrite"), on later steps autograd adds into them in place (ORT's "accumulate").  That
costs no extra pass over the gradients, where a persistent zeroed buffer would cost two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..codec.dtypes import torch_dtype
from ..errors import InvalidInputError, ModelMismatchError
from .state import ParameterSlot, TrainingState


@dataclass
class FlatGroup:
    """Trainable parameters sharing one dtype: one data tensor and, once CUDA graphs ask for
    it (`ParameterStore.flat_grad_views`), one gradient tensor."""

    dtype: torch.dtype
    data: torch.Tensor
    grad: Optional[torch.Tensor] = None
    names: List[str] = field(default_factory=list)
    spans: List[Tuple[int, int, torch.Size]] = field(default_factory=list)

    def view(self, flat: torch.Tensor, index: int) -> torch.Tensor:
        start, length, shape = self.spans[index]
        return flat[start : start + length].view(shape)


class ParameterStore:
    """Owns the device copies of a state's parameters and wires them into the state."""

    def __init__(
        self, state: TrainingState, order: Sequence[str], shapes: Dict[str, Tuple[int, ...]], device: torch.device
    ):
        self.state = state
        self.device = device
        extra = [name for name in state.parameters if name not in set(order)]
        self.order: List[str] = list(order) + extra
        self.groups: Dict[torch.dtype, FlatGroup] = {}
        self.trainable: List[torch.Tensor] = []
        self.trainable_names: List[str] = []  # the names of `trainable`, in the same order
        self._grad_views: Optional[List[torch.Tensor]] = None
        self.grads_bound = False  # every `.grad` is its flat gradient view (see bind_flat_grads)
        self._build(shapes)

    def _initial_value(self, slot: ParameterSlot, shape: Optional[Tuple[int, ...]]) -> torch.Tensor:
        if slot.tensor is not None:
            return slot.tensor
        if shape is None or any(d is None for d in shape):
            raise ModelMismatchError(f"nominal parameter '{slot.name}' has no static shape in the training model")
        return torch.zeros(shape, dtype=torch_dtype(slot.data_type))

    def _build(self, shapes: Dict[str, Tuple[int, ...]]) -> None:
        values = {name: self._initial_value(self.state.parameters[name], shapes.get(name)) for name in self.order}
        by_dtype: Dict[torch.dtype, List[str]] = {}
        for name in self.order:
            slot = self.state.parameters[name]
            if slot.requires_grad:
                by_dtype.setdefault(values[name].dtype, []).append(name)
            else:
                slot.tensor = values[name].to(self.device).contiguous()
        for dtype, names in by_dtype.items():
            total = sum(values[name].numel() for name in names)
            group = FlatGroup(dtype, torch.empty(total, dtype=dtype, device=self.device))
            offset = 0
            for name in names:
                value = values[name]
                group.names.append(name)
                group.spans.append((offset, value.numel(), value.shape))
                offset += value.numel()
            for index, name in enumerate(names):
                view = group.view(group.data, index)
                with torch.no_grad():
                    view.copy_(values[name])
                view.requires_grad_(True)
                view.grad = torch.zeros_like(view)  # ORT creates zeroed gradient buffers per Module
                self.state.parameters[name].tensor = view
                self.trainable.append(view)
                self.trainable_names.append(name)
            self.groups[dtype] = group

    # ---- gradients -------------------------------------------------------------------
    def release_grads(self) -> None:
        """Let the next backward pass install fresh gradients (ORT's overwrite)."""
        self.grads_bound = False
        for tensor in self.trainable:
            tensor.grad = None

    def flat_grad_views(self) -> List[torch.Tensor]:
        """Persistent gradient buffers aligned with `trainable`: views into one flat tensor
        per dtype group (`FlatGroup.grad`), made at the first call.  CUDA graphs write
        gradients into them and the optimizer graph reads them whole (cuda_graphs.py)."""
        if self._grad_views is None:
            views: List[torch.Tensor] = []
            for group in self.groups.values():
                group.grad = torch.zeros_like(group.data)
                views += [group.view(group.grad, index) for index in range(len(group.names))]
            self._grad_views = views
        return self._grad_views

    def bind_flat_grads(self, copy: bool) -> None:
        """Make every trainable parameter's `.grad` its flat gradient view; with `copy`, the
        values of the gradients they had first (zeros for none).  Free once bound: eager
        steps that accumulate add into the views in place, and only `release_grads` unbinds."""
        if self.grads_bound:
            return
        with torch.no_grad():
            for tensor, view in zip(self.trainable, self.flat_grad_views()):
                if copy and tensor.grad is not view:
                    view.zero_() if tensor.grad is None else view.copy_(tensor.grad)
                tensor.grad = view
        self.grads_bound = True

    def flat_groups_of(self, tensor_lists: Sequence[Sequence[torch.Tensor]]) -> Optional[List[FlatGroup]]:
        """The flat groups whose trainable parameters are exactly these lists of tensors (the
        same tensors, in span order), every group once; None where there are none such."""
        spans, start = [], 0  # `trainable` holds each group's views in turn
        for group in self.groups.values():
            spans.append((group, self.trainable[start : start + len(group.names)]))
            start += len(group.names)
        found: List[FlatGroup] = []
        for tensors in tensor_lists:
            match = next(
                (g for g, views in spans if len(views) == len(tensors) and all(a is b for a, b in zip(views, tensors))),
                None,
            )
            if match is None or match in found:
                return None
            found.append(match)
        return found if len(found) == len(self.groups) else None

    def fill_missing_grads(self) -> None:
        """Parameters the loss does not depend on keep a zero gradient, as in ORT."""
        for tensor in self.trainable:
            if tensor.grad is None:
                tensor.grad = torch.zeros_like(tensor)

    # ---- contiguous buffers (ORT's CopyParametersToBuffer / CopyBufferToParameters) ---
    def selected(self, trainable_only: bool) -> List[str]:
        return [n for n in self.order if self.state.parameters[n].requires_grad or not trainable_only]

    def size(self, trainable_only: bool) -> int:
        return sum(self.state.parameters[n].tensor.numel() for n in self.selected(trainable_only))

    def to_buffer(self, trainable_only: bool) -> torch.Tensor:
        names = self.selected(trainable_only)
        for name in names:
            if self.state.parameters[name].tensor.dtype != torch.float32:
                raise InvalidInputError(f"Data types must match: parameter '{name}' is not float32")
        if not names:
            return torch.empty(0, dtype=torch.float32, device=self.device)
        return torch.cat([self.state.parameters[n].tensor.detach().reshape(-1) for n in names])

    def from_buffer(self, buffer: torch.Tensor, trainable_only: bool) -> None:
        if buffer.dtype != torch.float32:
            raise InvalidInputError(f"Tensor type mismatch: the parameters buffer must be float32, got {buffer.dtype}")
        names = self.selected(trainable_only)
        expected = self.size(trainable_only)
        if buffer.numel() != expected:
            raise InvalidInputError(f"Parameters buffer size incorrect. Expected:{expected}, Actual:{buffer.numel()}")
        flat = buffer.reshape(-1).to(self.device)
        offset = 0
        with torch.no_grad():
            for name in names:
                tensor = self.state.parameters[name].tensor
                if tensor.dtype != torch.float32:
                    raise InvalidInputError(f"Tensor type mismatch: parameter '{name}' is not float32")
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()


def bind_parameters(
    state: TrainingState,
    train_order: Sequence[str],
    eval_order: Sequence[str],
    shapes: Dict[str, Tuple[int, ...]],
    device: torch.device,
) -> Tuple[ParameterStore, List[torch.Tensor], List[torch.Tensor]]:
    """The store of `state`'s parameters on `device` (trainable ones flat, in `train_order`),
    then the tensors the train and the eval module are fed, in their graphs' parameter order.

    `shapes`: the training graph's declared shapes, which give a nominal parameter its size."""
    store = ParameterStore(state, train_order, shapes, device)
    return (store, [state.parameters[n].tensor for n in train_order], [state.parameters[n].tensor for n in eval_order])
