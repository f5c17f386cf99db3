"""ORT checkpoints <-> flat PyTorch state dicts (`.pt` / `.safetensors`).

A checkpoint becomes a dict of CPU tensors keyed by parameter name (trainable and frozen
alike: `torch.nn.Module.state_dict()` has no such split either).  With the optimizer
state, each moment is stored as `optimizer/<parameter>/<moment>` (`momentum0`,
`momentum1`) and the group's scalars as `optimizer/step` (int64) and
`optimizer/initial_learning_rate` (float64), the two numbers ORT's file keeps.

Going back needs a template checkpoint: it supplies what a flat dict cannot express (which
parameters are trainable, dtypes, properties, the optimizer group) and every value is
checked against it.  The written file is exactly what `CheckpointState.save_checkpoint`
writes for the resulting state.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch

from ..atomic_files import atomic_write
from ..codec.dtypes import torch_dtype
from ..engine.checkpoint_io import load_state, save_state
from ..engine.state import OptimizerState, ParameterSlot, TrainingState
from ..errors import OrtTorchCompatError

OPTIMIZER_PREFIX = "optimizer/"
STEP_KEY = "optimizer/step"
INITIAL_LR_KEY = "optimizer/initial_learning_rate"
_SCALAR_KEYS = (STEP_KEY, INITIAL_LR_KEY)
SAFETENSORS_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")

PathLike = Union[str, "os.PathLike[str]"]
Progress = Callable[[Iterable], Iterable]


class MigrationError(OrtTorchCompatError, ValueError):
    """A state dict does not fit a checkpoint, or a file cannot be converted."""


def _no_progress(items: Iterable, **_: object) -> Iterable:
    return items


def progress_bar(items: Iterable, *, desc: str = "", total: Optional[int] = None) -> Iterable:
    """tqdm on an interactive terminal, nothing when stderr is piped or redirected."""
    from tqdm import tqdm

    return tqdm(items, desc=desc, total=total, unit="tensor", leave=False, disable=not sys.stderr.isatty())


def _as_state(checkpoint: Union[PathLike, bytes, TrainingState, object]) -> TrainingState:
    if isinstance(checkpoint, TrainingState):
        return checkpoint
    inner = getattr(checkpoint, "_state", None)  # api.CheckpointState
    if isinstance(inner, TrainingState):
        return inner
    if isinstance(checkpoint, (bytes, bytearray)):
        return load_state(checkpoint)
    return load_state(os.fspath(checkpoint))


# ---- checkpoint -> tensors ------------------------------------------------------------
def state_to_tensors(
    checkpoint: Union[PathLike, bytes, TrainingState, object],
    *,
    include_optimizer: bool = False,
    progress: Progress = _no_progress,
) -> Dict[str, torch.Tensor]:
    """A flat dict of CPU tensors (copies): parameters, and optionally the optimizer state."""
    state = _as_state(checkpoint)
    if state.is_nominal:
        raise MigrationError("the checkpoint is nominal: it holds parameter names and types but no values")
    tensors: Dict[str, torch.Tensor] = {}
    for name, slot in progress(list(state.parameters.items()), desc="parameters"):
        if name.startswith(OPTIMIZER_PREFIX):
            raise MigrationError(
                f"parameter '{name}' clashes with the '{OPTIMIZER_PREFIX}' keys of the optimizer state"
            )
        tensors[name] = slot.tensor.detach().to("cpu", copy=True).contiguous()
    if include_optimizer and state.optimizer is not None and state.optimizer.moments:
        group = state.optimizer
        tensors[STEP_KEY] = torch.tensor(int(group.step), dtype=torch.int64)
        tensors[INITIAL_LR_KEY] = torch.tensor(float(group.initial_learning_rate), dtype=torch.float64)
        for param, moments in progress(list(group.moments.items()), desc="optimizer state"):
            for moment, value in moments.items():
                tensors[f"{OPTIMIZER_PREFIX}{param}/{moment}"] = value.detach().to("cpu", copy=True).contiguous()
    return tensors


# ---- tensors -> checkpoint --------------------------------------------------------------
def _check(key: str, value: object, dtype: torch.dtype, shape: Optional[Tuple[int, ...]], problems: List[str]) -> bool:
    if not isinstance(value, torch.Tensor):
        problems.append(f"'{key}' is a {type(value).__name__}, not a tensor")
        return False
    if value.dtype != dtype:
        problems.append(
            f"'{key}' has dtype {str(value.dtype).replace('torch.', '')}, the checkpoint has "
            f"{str(dtype).replace('torch.', '')}"
        )
        return False
    if shape is not None and tuple(value.shape) != tuple(shape):
        problems.append(f"'{key}' has shape {list(value.shape)}, the checkpoint has {list(shape)}")
        return False
    return True


def _raise(problems: List[str], what: str, against: str) -> None:
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise MigrationError(f"{what} does not match {against}: {shown}")


def tensors_to_state(
    tensors: Mapping[str, object],
    template: Union[PathLike, bytes, TrainingState, object],
    *,
    drop_optimizer: bool = False,
    what: str = "the state dict",
    against: Optional[str] = None,
    progress: Progress = _no_progress,
) -> TrainingState:
    """A new TrainingState with `template`'s structure and `tensors`' values (strictly checked).

    Every parameter of the template must be present with the same dtype and shape (any
    shape for a nominal template) and no key may be left over.  Optimizer keys, when
    present, must match the template's moments exactly and replace them; when absent the
    template's optimizer state is kept.  `drop_optimizer` leaves the optimizer state out
    (and ignores optimizer keys).
    """
    base = _as_state(template)
    problems: List[str] = []
    keys = set(tensors)
    state = TrainingState(properties=dict(base.properties), is_nominal=False, has_external_data=base.has_external_data)
    for name, slot in progress(list(base.parameters.items()), desc="parameters"):
        if name not in tensors:
            problems.append(f"parameter '{name}' is missing")
            continue
        keys.discard(name)
        value = tensors[name]
        dtype = torch_dtype(slot.data_type)
        shape = None if slot.tensor is None else tuple(slot.tensor.shape)
        if _check(name, value, dtype, shape, problems):
            state.parameters[name] = ParameterSlot(
                name, slot.data_type, slot.requires_grad, value.detach().to("cpu", copy=True).contiguous()
            )

    optimizer_keys = sorted(k for k in keys if k.startswith(OPTIMIZER_PREFIX))
    keys -= set(optimizer_keys)
    if drop_optimizer:
        state.optimizer = None
    elif base.optimizer is None or not base.optimizer.moments:
        state.optimizer = None
        problems.extend(
            f"'{k}' is extra: the checkpoint has no optimizer state (use --drop-optimizer to ignore it)"
            for k in optimizer_keys
        )
    elif not optimizer_keys:
        state.optimizer = _copy_optimizer(base.optimizer)
    else:
        state.optimizer = _optimizer_from_tensors(tensors, base.optimizer, set(optimizer_keys), problems)
    problems.extend(f"'{k}' is extra: the checkpoint has no such parameter" for k in sorted(keys))
    if against is None:
        is_path = isinstance(template, (str, os.PathLike))
        against = f"checkpoint '{os.fspath(template)}'" if is_path else "the checkpoint"
    _raise(problems, what, against)
    return state


def _copy_optimizer(group: OptimizerState) -> OptimizerState:
    return OptimizerState(
        group_name=group.group_name,
        step=group.step,
        initial_learning_rate=group.initial_learning_rate,
        learning_rate=group.learning_rate,
        moments={p: {m: t.detach().to("cpu", copy=True) for m, t in ms.items()} for p, ms in group.moments.items()},
    )


def _scalar(tensors: Mapping[str, object], key: str, problems: List[str], integer: bool):
    value = tensors[key]
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.is_floating_point() == integer:
        problems.append(f"'{key}' must be a one-element {'integer' if integer else 'floating point'} tensor")
        return None
    return int(value.item()) if integer else float(value.item())


def _optimizer_from_tensors(tensors, base: OptimizerState, keys: set, problems: List[str]) -> OptimizerState:
    group = OptimizerState(
        group_name=base.group_name,
        step=base.step,
        initial_learning_rate=base.initial_learning_rate,
        learning_rate=base.learning_rate,
    )
    if STEP_KEY in keys:
        keys.discard(STEP_KEY)
        step = _scalar(tensors, STEP_KEY, problems, integer=True)
        group.step = base.step if step is None else step
    if INITIAL_LR_KEY in keys:
        keys.discard(INITIAL_LR_KEY)
        lr = _scalar(tensors, INITIAL_LR_KEY, problems, integer=False)
        group.initial_learning_rate = base.initial_learning_rate if lr is None else lr
        group.learning_rate = group.initial_learning_rate
    for param, moments in base.moments.items():
        group.moments[param] = {}
        for moment, reference in moments.items():
            key = f"{OPTIMIZER_PREFIX}{param}/{moment}"
            if key not in keys:
                problems.append(f"optimizer state '{key}' is missing")
                continue
            keys.discard(key)
            value = tensors[key]
            if _check(key, value, reference.dtype, tuple(reference.shape), problems):
                group.moments[param][moment] = value.detach().to("cpu", copy=True).contiguous()
    problems.extend(f"'{k}' is extra: the checkpoint's optimizer state has no such moment" for k in sorted(keys))
    return group


# ---- files ----------------------------------------------------------------------------
def _suffix(path: PathLike) -> str:
    return os.path.splitext(os.fspath(path))[1].lower()


def save_tensor_file(
    tensors: Mapping[str, torch.Tensor], path: PathLike, metadata: Optional[Dict[str, str]] = None
) -> None:
    """`.safetensors` (safetensors.torch.save_file) or `.pt`/`.pth` (torch.save of the dict)."""
    path = os.fspath(path)
    suffix = _suffix(path)
    data = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    if suffix in SAFETENSORS_SUFFIXES:
        from safetensors.torch import save_file

        meta = {"format": "pt", **(metadata or {})}
        atomic_write(path, lambda tmp: save_file(data, tmp, metadata=meta), "state file")
    elif suffix in PICKLE_SUFFIXES:
        atomic_write(path, lambda tmp: torch.save(data, tmp), "state file")
    else:
        raise MigrationError(f"'{path}': the output must end with .safetensors or .pt")


def load_tensor_file(path: PathLike, *, allow_pickle: bool = False) -> Dict[str, torch.Tensor]:
    """Read a flat {name: tensor} dict from `.safetensors`, or (with allow_pickle) `.pt`.

    `.pt` files are pickles; they are read with `torch.load(weights_only=True)`, which
    refuses arbitrary objects, but only when the caller opts in.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"'{path}' does not exist")
    suffix = _suffix(path)
    if suffix in SAFETENSORS_SUFFIXES:
        from safetensors.torch import load_file

        try:
            return dict(load_file(path, device="cpu"))
        except Exception as error:  # safetensors raises its own SafetensorError
            raise MigrationError(f"'{path}' is not a readable safetensors file: {error}") from error
    if suffix not in PICKLE_SUFFIXES:
        raise MigrationError(f"'{path}': expected a .safetensors or .pt file")
    if not allow_pickle:
        raise MigrationError(
            f"'{path}' is a pickle-based PyTorch file; pass --allow-pickle (allow_pickle=True) to read it with "
            "torch.load(weights_only=True), or convert it to .safetensors"
        )
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise MigrationError(f"'{path}' cannot be loaded with torch.load(weights_only=True): {error}") from error
    if not isinstance(loaded, Mapping) or not all(isinstance(k, str) for k in loaded):
        raise MigrationError(f"'{path}' does not hold a dict of named tensors (got {type(loaded).__name__})")
    return dict(loaded)


def checkpoint_to_file(
    checkpoint: Union[PathLike, TrainingState, object],
    out: PathLike,
    *,
    include_optimizer: bool = False,
    progress: Progress = _no_progress,
) -> Dict[str, torch.Tensor]:
    """`to-torch`: write the checkpoint's tensors to OUT (.pt or .safetensors); return them."""
    state = _as_state(checkpoint)
    tensors = state_to_tensors(state, include_optimizer=include_optimizer, progress=progress)
    metadata = {"ort_torch_compat.trainable": json.dumps([n for n, s in state.parameters.items() if s.requires_grad])}
    if state.properties:
        metadata["ort_torch_compat.properties"] = json.dumps(state.properties)
    save_tensor_file(tensors, out, metadata)
    return tensors


def state_dict_to_checkpoint(
    tensors: Mapping[str, object],
    template: Union[PathLike, bytes, TrainingState, object],
    out: PathLike,
    *,
    drop_optimizer: bool = False,
    what: str = "the state dict",
    progress: Progress = _no_progress,
) -> TrainingState:
    """Write a new ORT checkpoint at `out`: `template`'s structure, `tensors`' values.

    The bytes are those `CheckpointState.save_checkpoint(state, out, include_optimizer_state=True)`
    writes; an external-data template gives an external-data checkpoint (`out` + `.data`).
    """
    state = tensors_to_state(tensors, template, drop_optimizer=drop_optimizer, what=what, progress=progress)
    save_state(state, os.fspath(out), include_optimizer_state=state.optimizer is not None)
    return state


def file_to_checkpoint(
    state_file: PathLike,
    template: PathLike,
    out: PathLike,
    *,
    drop_optimizer: bool = False,
    allow_pickle: bool = False,
    progress: Progress = _no_progress,
) -> TrainingState:
    """`from-torch`: STATE file + template CHECKPOINT -> new checkpoint OUT."""
    tensors = load_tensor_file(state_file, allow_pickle=allow_pickle)
    return state_dict_to_checkpoint(
        tensors, template, out, drop_optimizer=drop_optimizer, what=f"'{os.fspath(state_file)}'", progress=progress
    )
