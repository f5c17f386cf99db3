"""Keep freed host memory for reuse, as ORT's arena allocator does.

A training step allocates and frees the same large activation and gradient buffers every
time.  glibc serves blocks above its mmap threshold with fresh mappings and returns them
on free, so every step pays page faults and kernel zeroing on megabytes of memory: on the
benchmark transformer that is ~15% of the step.  ONNX Runtime avoids it with its own
arena.  We ask glibc to keep such blocks in the heap (raise the mmap and trim thresholds)
once per process, when the first engine is created, whatever its device.  Peak RSS is
unchanged (it is the working set either way); memory freed after training is kept by the
process.  Set the environment variable ORT_TORCH_COMPAT_MALLOC_TUNING=0 to leave the
allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_KEEP_BYTES = 1 << 30
_tuned = False


def tune_host_allocator() -> bool:
    """Apply the glibc settings once; True if they are in effect."""
    global _tuned
    if _tuned:
        return True
    if os.environ.get("ORT_TORCH_COMPAT_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        return False
    _tuned = bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))
    return _tuned
