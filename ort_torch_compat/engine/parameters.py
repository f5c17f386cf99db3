"""Flat parameter, gradient and moment storage.

All trainable parameters of one dtype live in one contiguous tensor, in training-graph
input order (ORT's contiguous-buffer order); each named parameter is a leaf view into it,
and its `.grad` is a view into a matching flat gradient tensor.  Autograd then accumulates
gradients in place, the optimizer updates every parameter with a handful of whole-buffer
kernels (no Python loop over parameters), and get/copy of the contiguous buffer is a copy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..errors import InvalidInputError, ModelMismatchError
from .state import ParameterSlot, TrainingState


@dataclass
class FlatGroup:
    """Trainable parameters sharing one dtype: one data tensor, one gradient tensor."""

    dtype: torch.dtype
    data: torch.Tensor
    grad: torch.Tensor
    names: List[str] = field(default_factory=list)
    spans: List[Tuple[int, int, torch.Size]] = field(default_factory=list)

    def view(self, flat: torch.Tensor, index: int) -> torch.Tensor:
        start, length, shape = self.spans[index]
        return flat[start : start + length].view(shape)


class ParameterStore:
    """Owns the device copies of a state's parameters and wires them into the state."""

    def __init__(self, state: TrainingState, order: Sequence[str], shapes: Dict[str, Tuple[int, ...]], device: torch.device):
        self.state = state
        self.device = device
        extra = [name for name in state.parameters if name not in set(order)]
        self.order: List[str] = list(order) + extra
        self.groups: Dict[torch.dtype, FlatGroup] = {}
        self._build(shapes)

    def _initial_value(self, slot: ParameterSlot, shape: Optional[Tuple[int, ...]]) -> torch.Tensor:
        if slot.tensor is not None:
            return slot.tensor
        if shape is None or any(d is None for d in shape):
            raise ModelMismatchError(f"nominal parameter '{slot.name}' has no static shape in the training model")
        from ..codec.dtypes import torch_dtype

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
                slot.grad = None
        for dtype, names in by_dtype.items():
            total = sum(values[name].numel() for name in names)
            group = FlatGroup(dtype, torch.empty(total, dtype=dtype, device=self.device),
                              torch.zeros(total, dtype=dtype, device=self.device))
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
                view.grad = group.view(group.grad, index)
                slot = self.state.parameters[name]
                slot.tensor = view
                slot.grad = view.grad
            self.groups[dtype] = group

    # ---- gradients -------------------------------------------------------------------
    def zero_grads(self) -> None:
        for group in self.groups.values():
            group.grad.zero_()

    def rebind_grads(self) -> None:
        """Re-point `.grad` at the flat buffers (a user may have assigned `param.grad`)."""
        for group in self.groups.values():
            for index, name in enumerate(group.names):
                tensor = self.state.parameters[name].tensor
                if tensor.grad is None or tensor.grad.data_ptr() != group.view(group.grad, index).data_ptr():
                    tensor.grad = group.view(group.grad, index)

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
