"""Translate between codec records (the file) and the TrainingState (the live state)."""

from __future__ import annotations

import contextlib
import os
from typing import List, Optional, Tuple, Union

import torch

from ..codec import (
    CheckpointFormatError,
    CheckpointRecord,
    OptimizerGroupRecord,
    ParameterOptimizerStateRecord,
    TensorRecord,
    decode_checkpoint,
    open_checkpoint,
    state_writer_record,
    tensor_record_from_torch,
    tensor_record_to_torch,
    write_checkpoint,
)
from ..codec.dtypes import torch_dtype
from ..codec.writer_layouts import ARTIFACT_EXTERNAL_THRESHOLD_BYTES, state_writer_external_min_bytes
from .state import OptimizerState, ParameterSlot, TrainingState

PathLike = Union[str, "os.PathLike[str]"]


def load_state(
    source: Union[PathLike, bytes, bytearray, memoryview], *, allow_external_symlinks: bool = False
) -> TrainingState:
    """Load a checkpoint file (or its bytes, like ORT's LoadCheckpointFromBuffer).

    ``allow_external_symlinks`` lets the ``.data`` companion be a symlink to a file outside
    the checkpoint's folder (refused by default: its bytes would become parameters).
    """
    # The records' tensor bytes are Payloads, read straight into each new tensor's memory
    # (from the file, or from the caller's buffer): no copy of the whole file is made.
    if isinstance(source, (bytes, bytearray, memoryview)):
        name = "<buffer>"
        opened = contextlib.nullcontext(decode_checkpoint(source, source=name, lazy=True))
    else:
        name = os.fsdecode(os.fspath(source))
        opened = open_checkpoint(name, allow_external_symlinks=allow_external_symlinks)
    with opened as record:
        try:
            return state_from_record(record)
        except CheckpointFormatError:
            raise  # e.g. the file was cut short while its tensors were read; it names the file
        except ValueError as error:  # well-formed file, impossible tensor (dtype/size): still a bad checkpoint
            raise CheckpointFormatError(name, str(error)) from error


def _tensor(record: TensorRecord, what: str) -> torch.Tensor:
    try:
        return tensor_record_to_torch(record)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None


def _check_dtype(record: TensorRecord, what: str) -> None:
    """A nominal tensor has no data yet, but its dtype must be one we can create later."""
    try:
        torch_dtype(record.data_type)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None


def state_from_record(record: CheckpointRecord) -> TrainingState:
    """The live state of a decoded checkpoint.

    A parameter name stored twice keeps its first entry (trainable before frozen), as ORT
    1.19.2 does (measured, tests/fixtures/reliability/ort_semantics.json).  A moment whose
    shape or dtype differs from its parameter's is refused here, naming both.
    """
    state = TrainingState()
    module = record.module_state
    if module is not None:
        state.is_nominal = module.is_nominal
        state.has_external_data = module.has_external_data
        for requires_grad, tensors in ((True, module.trainable), (False, module.frozen)):
            for tensor in tensors:
                if tensor.name in state.parameters:
                    continue
                what = f"parameter {tensor.name!r}"
                if module.is_nominal:
                    _check_dtype(tensor, what)
                    value = None
                else:
                    value = _tensor(tensor, what)
                state.parameters[tensor.name] = ParameterSlot(tensor.name, tensor.data_type, requires_grad, value)
    state.properties = dict(record.properties or {})
    for group in record.optimizer_groups or []:
        if group.group_name != "group0" and state.optimizer is not None:
            continue  # ORT keeps one group; group0 wins
        state.optimizer = OptimizerState(
            group_name=group.group_name,
            step=group.step,
            initial_learning_rate=group.initial_learning_rate,
            moments={
                entry.param_name: {
                    m.name: _tensor(m, f"optimizer state {m.name!r} of parameter {entry.param_name!r}")
                    for m in entry.momentums
                }
                for entry in group.states
            },
        )
    problem = moment_mismatch(state)
    if problem:
        raise ValueError(problem)
    return state


def moment_mismatch(state: TrainingState) -> Optional[str]:
    """Why a stored optimizer moment cannot serve its parameter (other shape or dtype), or None.

    Checked at load and again when an Optimizer is created (a nominal parameter has its
    shape only once a Module has read it from the training graph).
    """
    if state.optimizer is None:
        return None
    for name, moments in state.optimizer.moments.items():
        slot = state.parameters.get(name)
        if slot is None or slot.tensor is None:
            continue
        for key, moment in moments.items():
            if moment.shape != slot.tensor.shape or moment.dtype != slot.tensor.dtype:
                return (
                    f"optimizer state {key!r} of parameter {name!r} is {moment.dtype} {list(moment.shape)} "
                    f"but the parameter is {slot.tensor.dtype} {list(slot.tensor.shape)}"
                )
    return None


def _tensor_record(name: str, slot_tensor: torch.Tensor, copy: bool) -> TensorRecord:
    return tensor_record_from_torch(name, slot_tensor.detach().to("cpu"), copy=copy)


def _parameter_records(state: TrainingState, copy: bool) -> Tuple[List[TensorRecord], List[TensorRecord]]:
    trainable, frozen = [], []
    for slot in state.parameters.values():
        tensor = slot.tensor
        if tensor is None:  # unfilled nominal state: ORT writes a 0-d placeholder
            tensor = torch.zeros((), dtype=torch_dtype(slot.data_type))
        (trainable if slot.requires_grad else frozen).append(_tensor_record(slot.name, tensor, copy))
    return trainable, frozen


def _optimizer_records(state: TrainingState, copy: bool) -> List[OptimizerGroupRecord]:
    optimizer = state.optimizer
    if optimizer is None or not optimizer.moments:
        return []
    entries = [
        ParameterOptimizerStateRecord(name, [_tensor_record(key, value, copy) for key, value in moments.items()])
        for name, moments in optimizer.moments.items()
    ]
    return [OptimizerGroupRecord(optimizer.group_name, optimizer.step, optimizer.initial_learning_rate, entries)]


def record_from_state(state: TrainingState, include_optimizer_state: bool, *, copy: bool = True) -> CheckpointRecord:
    """The record ORT's CheckpointState writer would produce for this state.

    ``copy=False``: the records' ``raw_data`` are views of the state's (CPU) tensors, valid
    only while the caller holds ``state.lock`` (a train step changes them in place)."""
    trainable, frozen = _parameter_records(state, copy)
    return state_writer_record(
        trainable,
        frozen,
        is_nominal=state.is_nominal,
        optimizer_groups=_optimizer_records(state, copy) if include_optimizer_state else [],
        properties=state.properties,
        include_optimizer_state=include_optimizer_state,
    )


def _needs_external_data(state: TrainingState) -> bool:
    """ORT's state writer uses external data exactly when the loaded state had it; a state
    too big for one flatbuffer (2 GiB) would make ORT fail, so past ORT's own artifact
    threshold we switch to the external layout (and it sticks, as ORT's flag does)."""
    if not state.has_external_data:
        size = sum(
            slot.tensor.numel() * slot.tensor.element_size()
            for slot in state.parameters.values()
            if slot.tensor is not None
        )
        state.has_external_data = size > ARTIFACT_EXTERNAL_THRESHOLD_BYTES
    return state.has_external_data


def save_state(state: TrainingState, path: PathLike, include_optimizer_state: bool = False) -> None:
    """Atomically write the state (external data: see `_needs_external_data`).

    The tensors are streamed from the state's own memory into the temp file(s) under the
    state's lock, so a save from another thread while a Module trains captures one
    consistent step (see `TrainingState`) without a copy of the state; fsync and the
    renames happen after the lock is released, so training waits only for the writes
    into the page cache (about as long as a copy of the state took).
    """
    with state.lock:
        external = _needs_external_data(state)
    target = os.fspath(path)
    try:
        write_checkpoint(
            lambda: record_from_state(state, include_optimizer_state, copy=False),
            target,
            external_min_bytes=state_writer_external_min_bytes(external),
            hold=state.lock,
        )
    except OSError as error:
        if error.filename is not None:
            raise  # the codec's message already names the file
        raise type(error)(
            error.errno, f"cannot save checkpoint {os.fsdecode(target)}: {error.strerror or error}", os.fsdecode(target)
        ) from error
