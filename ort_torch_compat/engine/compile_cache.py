"""Where compiled train steps live on disk, and how an entry appears there whole or not at all.

An entry is a directory named by its cache key (`compiled.graph_key`) holding the two
libraries and `meta.json`.  It is built in a scratch directory beside it and renamed into
place, so a reader sees a complete entry or none.  Scratch directories are named
`.KEY-HOST-PID-RANDOM`: whoever built one can be told apart, and one whose process is gone
(killed, or the machine went down) is removed by the next compile on that host.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import tempfile
import time
from typing import Callable, Dict, Optional

CACHE_ENV = "ORT_TORCH_COMPAT_CACHE_DIR"
_KEY_LENGTH = 32
_UNNAMED_SCRATCH_AGE_S = 3600.0  # scratch of an older version (no host and pid): removed after an hour


def cache_root() -> pathlib.Path:
    """ORT_TORCH_COMPAT_CACHE_DIR/compiled, else $XDG_CACHE_HOME/ort_torch_compat/compiled,
    else ~/.cache/ort_torch_compat/compiled."""
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV]) / "compiled"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "ort_torch_compat" / "compiled"


def read_meta(directory: pathlib.Path) -> Optional[Dict]:
    """The entry's meta.json, or None where there is no readable one."""
    try:
        return json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


def _scratch_prefix(key: str, pid: int) -> str:
    return f".{key}-{_host()}-{pid}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_scratch_of(root: pathlib.Path, key: str, pid: int) -> None:
    """Remove the scratch directories process `pid` made for `key` (it was killed or gave up)."""
    for scratch in root.glob(_scratch_prefix(key, pid) + "*"):
        shutil.rmtree(scratch, ignore_errors=True)


def sweep_scratch(root: pathlib.Path) -> None:
    """Remove scratch directories whose builder is gone: on this host, a process that no
    longer exists; without a host and pid (older versions), older than an hour."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    host = _host()
    for entry in entries:
        name = entry.name
        if not name.startswith(".") or not entry.is_dir() or entry.is_symlink():
            continue
        parts = name[_KEY_LENGTH + 2:].rsplit("-", 2)
        if len(parts) == 3 and parts[1].isdigit():
            stale = parts[0] == host and not _pid_alive(int(parts[1]))
        else:
            try:
                stale = time.time() - entry.stat().st_mtime > _UNNAMED_SCRATCH_AGE_S
            except OSError:
                stale = False
        if stale:
            shutil.rmtree(entry, ignore_errors=True)


def publish(root: pathlib.Path, key: str, build: Callable[[pathlib.Path], Dict]) -> pathlib.Path:
    """Run `build(scratch) -> meta` and move the result to root/key atomically (a concurrent
    process that got there first wins; its result is the same)."""
    root.mkdir(parents=True, exist_ok=True)
    sweep_scratch(root)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=_scratch_prefix(key, os.getpid()), dir=root))
    try:
        meta = build(scratch)
        (scratch / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(scratch, root / key)
        except OSError:
            if read_meta(root / key) is None:
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return root / key
