"""The compile cache's key: everything a compiled train step depends on, read without tracing."""

from __future__ import annotations

import functools
import hashlib
import inspect
import pathlib
import re
from typing import Sequence

import torch
from torch import fx

from . import compile_cache

# The compiling and running code: a change to either makes every entry stale.
_COMPILER_SOURCES = tuple(
    str(pathlib.Path(__file__).with_name(name))
    for name in ("compile_build.py", "compiled_step.py", "compile_key.py", "joint_graph.py", "step_check.py")
)


@functools.lru_cache(maxsize=None)
def _file_digest(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return "missing"


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _stable_repr(value: object) -> str:
    """repr without memory addresses (functions print as `<... at 0x7f...>`)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def graph_key(module: fx.GraphModule, tensors: Sequence[torch.Tensor]) -> str:
    """Everything the compiled code depends on, without tracing: torch version, CPU
    capability and instruction-set extensions, the converted graph (code, each module's class, attributes and buffers),
    the source files of those classes and of the compiler path (their contents: the same
    library installed elsewhere, or imported by a worker from another directory, gives the
    same key), and the inputs' shapes, dtypes and requires_grad flags (parameter values are
    inputs, not part of the key)."""
    from ..graph import dense_kernel, index_guard, specialize

    digest = hashlib.sha256()
    digest.update(f"{compile_cache.FORMAT}|{torch.__version__}|{torch.backends.cpu.get_cpu_capability()}".encode())
    digest.update(" ".join(compile_cache.cpu_features()).encode())
    digest.update(module.code.encode())
    sources = {*_COMPILER_SOURCES, specialize.__file__, dense_kernel.__file__, index_guard.__file__}
    for name, sub in module.named_modules():
        sources.add(inspect.getsourcefile(type(sub)) or "")
        digest.update(f"{name}|{type(sub).__module__}.{type(sub).__qualname__}".encode())
        for attribute, value in sorted(vars(sub).items()):
            if attribute.startswith("_") or attribute == "training":
                continue
            digest.update(attribute.encode())
            digest.update(tensor_bytes(value) if isinstance(value, torch.Tensor) else _stable_repr(value).encode())
        for buffer_name, buffer in sub.named_buffers(recurse=False):
            digest.update(f"{buffer_name}|{buffer.dtype}|{tuple(buffer.shape)}".encode())
            digest.update(tensor_bytes(buffer))
    for file_digest in sorted(_file_digest(path) for path in sources):  # by content, not by where it lies
        digest.update(file_digest.encode())
    for tensor in tensors:
        digest.update(f"{tuple(tensor.shape)}|{tensor.dtype}|{tensor.requires_grad}|{tensor.device.type}".encode())
    return digest.hexdigest()[:32]
