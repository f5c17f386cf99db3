"""float32 arithmetic (no TF32) inside an engine's calls on CUDA, unless TF32 is asked for.

Why: on Ampere and later GPUs torch runs float32 convolutions in TF32 by default
(`torch.backends.cudnn.allow_tf32` is True; matmuls are float32 by default).  TF32 keeps
float32's range with a 10-bit mantissa, about 1e-3 relative error per product, where ORT's
CPU reference computes in float32: measured on an H200, conv nets trained with
device="cuda" missed the CPU parity tolerance by up to 1.3e4x (ShuffleNetV2).  So a CUDA
engine's train, eval and optimizer steps run with TF32 off, for cuBLAS matmuls and for
cuDNN convolutions and RNNs.

Opt-in TF32 (faster on tensor cores, precision as above): the session options config
entry "ort_torch_compat.use_tf32" = "1", or the CUDA execution provider option
`use_tf32` = 1 where a session takes provider options (the legacy `TrainingSession`; it
wins over the config entry).  Then the steps run with TF32 on for matmuls and cuDNN.

How: the flags are switched on entry to each call and the caller's values are restored on
exit (also when the call raises), so the user's own torch code keeps its settings.  Only
flags whose effect differs from the wanted one are written.  On torch with the
`fp32_precision` API (2.9+) only that API's leaves (cuda matmul, cudnn conv, cudnn rnn)
are written, since mixing it with the legacy `allow_tf32` setters makes torch raise;
older torch gets the legacy `set_float32_matmul_precision` and `cudnn.allow_tf32`.
The engines of CPU devices never touch the flags: their calls are not wrapped at all.

Threads: the flags are process-global.  While a step runs, torch code on another thread
of the process sees the step's values (TF32 off), and on torch 2.9+ its reads of the
legacy getters (`torch.backends.cudnn.allow_tf32`, `torch.backends.cuda.matmul.allow_tf32`,
`torch.get_float32_matmul_precision()`) may raise torch's "mix of the legacy and new APIs"
error during the step.  Two engines stepping concurrently on different threads restore in
any order; each restores what it found, so interleaved steps can leave one engine's value
behind; run concurrent CUDA sessions with the same setting.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch

CONFIG_KEY = "ort_torch_compat.use_tf32"  # session options config entry (add_session_config_entry)
PROVIDER_KEY = "use_tf32"  # ORT's CUDA execution provider option
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")

# (backend, op) leaves of torch's fp32_precision tree, with the node they inherit from.
_LEAVES: Tuple[Tuple[Tuple[str, str], Tuple[str, str]], ...] = (
    (("cuda", "matmul"), ("cuda", "all")),
    (("cuda", "conv"), ("cuda", "all")),
    (("cuda", "rnn"), ("cuda", "all")),
)
_PARENTS = {("cuda", "all"): ("generic", "all"), ("generic", "all"): None}


def _new_api() -> bool:
    """Whether this torch has the per-backend `fp32_precision` settings (torch 2.9+)."""
    return hasattr(torch._C, "_get_fp32_precision_getter") and hasattr(torch._C, "_set_fp32_precision_setter")


def _flag(raw: Any, what: str) -> bool:
    value = str(raw).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{what} must be '1' or '0', got {raw!r}")


def tf32_requested(session_options: object = None, provider_options: Optional[Mapping[str, Any]] = None) -> bool:
    """Whether the user asked for TF32: the CUDA provider options' `use_tf32`, else the
    session options' "ort_torch_compat.use_tf32" config entry, else False (float32)."""
    if provider_options and PROVIDER_KEY in provider_options:
        return _flag(provider_options[PROVIDER_KEY], f"CUDA provider option {PROVIDER_KEY}")
    raw = None
    try:
        raw = session_options.get_session_config_entry(CONFIG_KEY)
    except (AttributeError, RuntimeError, KeyError):  # no options, or (ORT's) no such entry
        pass
    return False if raw is None else _flag(raw, f"session config entry {CONFIG_KEY}")


# ---- the switch ---------------------------------------------------------------------------
def _get(node: Tuple[str, str]) -> str:
    return torch._C._get_fp32_precision_getter(*node)


def _set(node: Tuple[str, str], value: str) -> None:
    torch._C._set_fp32_precision_setter(*node, value)


def _switch_new(tf32: bool) -> List[Tuple[Tuple[str, str], str]]:
    """Set the leaves that differ from `tf32`; return (leaf, value to restore) for each."""
    changed = []
    for leaf, parent in _LEAVES:
        current = _get(leaf)  # resolved through the parents
        if (current == "tf32") == tf32:
            continue
        # a leaf that reads as its parent is restored as inheriting ("none"): the common case
        # of a parent set by the user (torch.backends.fp32_precision = "tf32")
        restore = "none" if current == _get(parent) else current
        _set(leaf, "tf32" if tf32 else "ieee")
        changed.append((leaf, restore))
    return changed


def _restore_new(changed: List[Tuple[Tuple[str, str], str]]) -> None:
    for leaf, value in reversed(changed):
        _set(leaf, value)


def _switch_legacy(tf32: bool) -> Dict[str, Any]:
    changed: Dict[str, Any] = {}
    matmul = torch.get_float32_matmul_precision()
    if (matmul != "highest") != tf32:
        changed["matmul"] = matmul
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
    cudnn = torch.backends.cudnn.allow_tf32
    if cudnn != tf32:
        changed["cudnn"] = cudnn
        torch.backends.cudnn.allow_tf32 = tf32
    return changed


def _restore_legacy(changed: Dict[str, Any]) -> None:
    if "cudnn" in changed:
        torch.backends.cudnn.allow_tf32 = changed["cudnn"]
    if "matmul" in changed:
        torch.set_float32_matmul_precision(changed["matmul"])


@contextlib.contextmanager
def tf32_scope(tf32: bool) -> Iterator[None]:
    """Inside: TF32 on (`tf32`) or off for cuBLAS matmuls and cuDNN; the caller's settings after."""
    if _new_api():
        changed = _switch_new(tf32)
        try:
            yield
        finally:
            _restore_new(changed)
    else:
        changed_legacy = _switch_legacy(tf32)
        try:
            yield
        finally:
            _restore_legacy(changed_legacy)


def precision_of(
    device: torch.device,
    session_options: object = None,
    provider_options: Optional[Mapping[str, Any]] = None,
    use_tf32: Optional[bool] = None,
) -> Optional[bool]:
    """The TF32 setting an engine on `device` runs its calls with, or None where nothing is
    switched (non-CUDA devices).  `use_tf32` overrides the options when not None."""
    if device.type != "cuda":
        return None
    return tf32_requested(session_options, provider_options) if use_tf32 is None else bool(use_tf32)


def with_precision(call: Callable, tf32: Optional[bool]) -> Callable:
    """`call` running under `tf32_scope(tf32)`; `call` itself when `tf32` is None (CPU: no cost)."""
    if tf32 is None:
        return call

    @functools.wraps(call)
    def wrapper(*args, **kwargs):
        with tf32_scope(tf32):
            return call(*args, **kwargs)

    return wrapper
