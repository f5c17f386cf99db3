"""Where compiled train steps live on disk, and what makes an entry trusted.

An entry is a directory named by its cache key (`compile_key.graph_key`) holding the two
libraries and `meta.json`.  It is built in a scratch directory beside it and renamed into
place, so a reader sees a complete entry or none.  Scratch directories are named
`.KEY-HOST-PID-RANDOM`: whoever built one can be told apart, and one whose process is gone
(killed, or the machine went down) is removed by the next compile on that host.

Trust (the rule ssh applies to its keys): the cache root and an entry are used only when
they are real directories owned by the current user and not writable by group or others;
files in an entry only when they are regular files (no symlink, FIFO or device) with the
same owner and modes.  `meta.json` is the entry's manifest: the entry's key, the format,
the CPU features the compiler targeted, the SHA-256 of every other file in the entry (no
unlisted file may be there) and a SHA-256 of the manifest itself.  `open_entry` checks all
of it before anything is loaded; an entry that fails is reported and, when it is ours,
removed, so it is rebuilt.  The checks stop corruption (a truncated or bit-flipped library,
files moved between entries, a damaged manifest) and other users' files; they cannot stop
the current user, who can run code anyway.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import platform
import shutil
import socket
import stat
import tempfile
import time
from typing import Callable, Dict, List, NamedTuple, Optional

CACHE_ENV = "ORT_TORCH_COMPAT_CACHE_DIR"
MANIFEST = "meta.json"
FORMAT = 5  # bump when what is cached changes meaning
_KEY_LENGTH = 32
_MAX_MANIFEST_BYTES = 16 << 20
_UNSAFE_MODE = stat.S_IWGRP | stat.S_IWOTH
_UNNAMED_SCRATCH_AGE_S = 3600.0  # scratch of an older version (no host and pid): removed after an hour


def cache_root() -> pathlib.Path:
    """ORT_TORCH_COMPAT_CACHE_DIR/compiled, else $XDG_CACHE_HOME/ort_torch_compat/compiled,
    else ~/.cache/ort_torch_compat/compiled."""
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV]) / "compiled"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "ort_torch_compat" / "compiled"


@functools.lru_cache(maxsize=1)
def cpu_features() -> List[str]:
    """The CPU's instruction-set extensions (/proc/cpuinfo's flags or Features; elsewhere the
    machine name): the compiler targets the building CPU (-march=native), so a library
    needs every one of these that it was built with."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    return sorted(set(value.split()))
    except OSError:
        pass
    return [platform.machine() or "unknown"]


class CacheProblem(Exception):
    """An entry or the cache root cannot be trusted; the message says what and how to fix it."""


def _check_owned(path: pathlib.Path, what: str, directory: bool) -> os.stat_result:
    try:
        info = os.lstat(path)
    except OSError as error:
        raise CacheProblem(f"{what} {path} cannot be read ({error.strerror})") from None
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if not kind_ok:
        raise CacheProblem(
            f"{what} {path} is not a {'directory' if directory else 'regular file'} (a symlink, "
            "FIFO or device is never used)"
        )
    if info.st_uid != os.getuid():
        raise CacheProblem(
            f"{what} {path} is owned by another user (uid {info.st_uid}); use a cache of your own ({CACHE_ENV})"
        )
    if info.st_mode & _UNSAFE_MODE:
        raise CacheProblem(
            f"{what} {path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"fix it with chmod go-w {path}"
        )
    return info


def check_root(root: pathlib.Path) -> None:
    """Raise CacheProblem unless the cache root is a directory we own that others cannot write."""
    _check_owned(root, "the compile cache", directory=True)


def _read_regular(path: pathlib.Path, limit: int) -> bytes:
    """A regular file's bytes, never following a symlink nor blocking on a FIFO."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        raise CacheProblem(f"{path} cannot be opened ({error.strerror})") from None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise CacheProblem(f"{path} is not a regular file")
        if info.st_size > limit:
            raise CacheProblem(f"{path} is {info.st_size} bytes, more than an entry holds")
        return handle.read(limit + 1)


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _manifest_digest(meta: Dict) -> str:
    body = {k: v for k, v in meta.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class Entry(NamedTuple):
    """A verified entry: its directory and its manifest (the build's own fields included)."""

    directory: pathlib.Path
    meta: Dict


def open_entry(root: pathlib.Path, key: str) -> Optional[Entry]:
    """The verified entry root/key, None where there is none; CacheProblem where one is there
    but cannot be trusted (see the module docstring)."""
    directory = root / key
    if not os.path.lexists(directory):
        return None
    _check_owned(directory, "compile cache entry", directory=True)
    raw = _read_regular(directory / MANIFEST, _MAX_MANIFEST_BYTES)
    try:
        meta = json.loads(raw)
    except ValueError:
        raise CacheProblem(f"{directory / MANIFEST} is not valid JSON (a damaged entry)") from None
    if not isinstance(meta, dict) or meta.get("digest") != _manifest_digest(meta):
        raise CacheProblem(f"{directory / MANIFEST} does not match its own digest (a damaged or edited entry)")
    if meta.get("format") != FORMAT or meta.get("key") != key:
        raise CacheProblem(
            f"{directory} holds the entry of key {meta.get('key')!r} (format {meta.get('format')!r}), "
            f"not of {key!r} (format {FORMAT}): moved or copied there"
        )
    missing = sorted(set(meta.get("cpu", [])) - set(cpu_features()))
    if missing:
        raise CacheProblem(f"{directory} was compiled for a CPU with {', '.join(missing[:8])}, which this CPU lacks")
    files = meta.get("files")
    if not isinstance(files, dict):
        raise CacheProblem(f"{directory / MANIFEST} lists no files")
    present = sorted(p.name for p in directory.iterdir() if p.name != MANIFEST)
    if present != sorted(files):
        raise CacheProblem(f"{directory} holds {present}, its manifest lists {sorted(files)}")
    for name, expected in files.items():
        _check_owned(directory / name, "compile cache file", directory=False)
        if _sha256(directory / name) != expected:
            raise CacheProblem(f"{directory / name} does not match the SHA-256 in its manifest (a damaged entry)")
    return Entry(directory, meta)


def discard(root: pathlib.Path, key: str) -> bool:
    """Remove an untrusted entry when it is ours (so it is rebuilt); False where it is not
    ours to remove, or could not be removed."""
    directory = root / key
    try:
        if os.lstat(directory).st_uid != os.getuid():
            return False
        if os.path.islink(directory) or not os.path.isdir(directory):
            os.unlink(directory)
        else:
            trash = pathlib.Path(tempfile.mkdtemp(prefix=_scratch_prefix(key, os.getpid()), dir=root))
            os.rename(directory, trash / "discarded")  # atomic: no reader sees half an entry
            shutil.rmtree(trash, ignore_errors=True)
    except OSError:
        return False
    return True


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
        parts = name[_KEY_LENGTH + 2 :].rsplit("-", 2)
        if len(parts) == 3 and parts[1].isdigit():
            stale = parts[0] == host and not _pid_alive(int(parts[1]))
        else:
            try:
                stale = time.time() - entry.stat().st_mtime > _UNNAMED_SCRATCH_AGE_S
            except OSError:
                stale = False
        if stale:
            shutil.rmtree(entry, ignore_errors=True)


def ensure_root(root: pathlib.Path) -> None:
    """Create the cache root (mode 0700) where it is missing; CacheProblem where it is not trusted."""
    if not os.path.lexists(root):
        try:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            raise CacheProblem(f"the compile cache {root} cannot be created ({error.strerror})") from None
    check_root(root)


def publish(root: pathlib.Path, key: str, build: Callable[[pathlib.Path], Dict]) -> pathlib.Path:
    """Run `build(scratch) -> meta` and move the result to root/key atomically, with its
    manifest (a concurrent process that got there first wins; its result is the same)."""
    ensure_root(root)
    sweep_scratch(root)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=_scratch_prefix(key, os.getpid()), dir=root))
    try:
        meta = build(scratch)
        files = {}
        for path in sorted(scratch.iterdir()):
            os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~_UNSAFE_MODE)
            files[path.name] = _sha256(path)
        meta.update(format=FORMAT, key=key, cpu=cpu_features(), files=files)
        meta["digest"] = _manifest_digest(meta)
        (scratch / MANIFEST).write_text(json.dumps(meta))
        os.chmod(scratch / MANIFEST, 0o644)
        try:
            os.rename(scratch, root / key)
        except OSError:
            try:
                existing = open_entry(root, key)
            except CacheProblem:
                existing = None
            if existing is None:
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return root / key
