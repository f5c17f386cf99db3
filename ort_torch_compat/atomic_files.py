"""Atomic file replacement: a reader sees the old file or the complete new one, never a
truncated mix.

ORT writes checkpoints in place, so a crash or a full disk can destroy the previous good
file.  Every file this library writes (checkpoints, their `.data` companions, converted
state dicts) goes through here: write a sibling temp file, fsync it, rename it over the
target, fsync the directory.  Stdlib only, so any layer may use it.
"""
from __future__ import annotations

import errno
import os
import secrets
from typing import Callable, Union

Content = Union[bytes, Callable[[str], None]]


def write_temp(path: str, content: Content, what: str = "checkpoint") -> str:
    """Write ``content`` (bytes, or a function that writes a file at the path it is given)
    to a fresh fsynced temp file beside ``path``; return the temp file's name.

    On failure the temp file is removed; errors name ``path`` (as a ``what``).
    """
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, f"cannot write {what} {path}: Is a directory", path)
    directory = os.path.dirname(path) or "."
    base = os.path.basename(path)
    fd = -1
    tmp = ""
    for _ in range(100):
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
        try:
            # 0o666 so the umask applies, as for a normally created file (mkstemp uses 0o600).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise type(exc)(exc.errno, f"cannot write {what} {path}: {exc.strerror}", path) from exc
    else:  # pragma: no cover - 100 random collisions
        raise FileExistsError(errno.EEXIST, f"cannot create a temp file for {path}", path)
    try:
        if callable(content):
            os.close(fd)
            fd = -1
            content(tmp)
            fd = os.open(tmp, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            fd = -1
        else:
            with os.fdopen(fd, "wb") as f:
                fd = -1
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        if fd >= 0:
            os.close(fd)
        _remove_quietly(tmp)
        raise
    return tmp


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def atomic_write(path: str, content: Content, what: str = "checkpoint") -> None:
    """Replace ``path`` with ``content`` atomically (temp file, fsync, rename)."""
    tmp = write_temp(path, content, what)
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    _fsync_dir(os.path.dirname(path) or ".")


def atomic_write_pair(path: str, main: bytes, data_path: str, data: bytes) -> None:
    """Replace a checkpoint and its ``.data`` file together.

    Both files are complete on disk before either rename; the old ``.data`` is kept aside
    until the main file is in place and is put back if that rename fails, so a failed save
    never pairs the old checkpoint with new data.
    """
    data_tmp = write_temp(data_path, data)
    try:
        main_tmp = write_temp(path, main)
    except BaseException:
        _remove_quietly(data_tmp)
        raise
    backup = None
    try:
        if os.path.exists(data_path):
            backup = f"{data_tmp}.previous"
            os.replace(data_path, backup)
        os.replace(data_tmp, data_path)
        try:
            os.replace(main_tmp, path)
        except BaseException:
            if backup is not None:
                os.replace(backup, data_path)
                backup = None
            else:
                _remove_quietly(data_path)
            raise
    except BaseException:
        for leftover in (data_tmp, main_tmp):
            _remove_quietly(leftover)
        raise
    finally:
        if backup is not None:
            _remove_quietly(backup)
    _fsync_dir(os.path.dirname(path) or ".")


def _fsync_dir(directory: str) -> None:
    """Persist the rename itself; best effort (not every platform can fsync a directory)."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
