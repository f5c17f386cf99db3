"""Atomic file replacement, and a crash-safe save protocol for a checkpoint with its `.data`.

ORT writes checkpoints in place, so a crash or a full disk can destroy the previous good
file.  Every file this library writes (checkpoints, their `.data` companions, converted
state dicts) goes through here.  Stdlib only, so any layer may use it.

**One file**: write a sibling temp file, fsync it, rename it over the target, fsync the
directory.  A reader sees the old file or the complete new one.

**A pair** (`checkpoint` + `checkpoint.data`): two renames cannot happen at once, and ORT's
format has no field that could tie a main file to one version of its companion (ORT always
reads ``<path>.data``).  A pair save is therefore journaled (docs/design.md, "Crash-safe
saves"):

1. both new files are written to temp files and fsynced (no lock held);
2. under the directory's exclusive lock, with SIGINT deferred, a journal ``.<name>.journal``
   naming the temp files is written (temp, fsync, rename, fsync directory);
3. the old main file, then the old ``.data``, move aside to temp names; the new ``.data``,
   then the new main file, are renamed into place; the directory is fsynced;
4. the moved-aside old files and then the journal are removed.

Whoever next loads or saves that checkpoint and finds a journal (a save was killed) holds
the same lock and completes the save if both new files still exist, else rolls it back
(`recover`).  Between steps 3's first and last rename the path has *no* main file, so ORT
loading it then fails cleanly instead of pairing old and new files.  Readers here hold the
lock shared while they open both files (`stable_pair`), so they never see the middle.

Temp files are flock'ed by their writer for as long as they are in use; a save removes
the unlocked (abandoned) temp files of its own path, which is how a killed save's files
go away without ever deleting a concurrent save's.  Without ``fcntl`` (Windows) or where
the filesystem refuses ``flock``, locking falls back to a lock inside this process and
abandoned temp files are left alone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import signal
import stat
import threading
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: bytes; a list of buffers written one after the other (streamed, never joined); or a
#: function that writes a file at the path it is given.
Content = Union[bytes, bytearray, memoryview, List[Union[bytes, bytearray, memoryview]], Callable[[str], None]]

__all__ = ["atomic_write", "atomic_write_pair", "AtomicSave", "recover", "stable_pair", "journal_path", "JournalError"]

_TOKEN_BYTES = 6
_JOURNAL_VERSION = 1
_JOURNAL_MAX_BYTES = 1 << 16
_WRITE_CHUNK = 1 << 30
# Serialises pair saves inside this process where flock is unavailable.
_FALLBACK_LOCK = threading.RLock()


class JournalError(ValueError):
    """A pair-save journal that this library did not write (corrupt or hostile)."""


# ---- names -----------------------------------------------------------------------------------
def _split(path: str):
    return os.path.dirname(path) or ".", os.path.basename(path)


def journal_path(path: str) -> str:
    """Where the journal of an interrupted pair save of ``path`` lives."""
    directory, base = _split(path)
    return os.path.join(directory, f".{base}.journal")


def _temp_name(base: str) -> str:
    return f".{base}.{secrets.token_hex(_TOKEN_BYTES)}.tmp"


def _temp_pattern(base: str) -> "re.Pattern[str]":
    """Our temp names for ``base`` (and the ``.previous`` backups older versions wrote)."""
    return re.compile(rf"\.{re.escape(base)}\.[0-9a-f]{{{2 * _TOKEN_BYTES}}}\.tmp(\.previous)?")


def _named(error: OSError, what: str, path: str) -> OSError:
    """The same kind of OSError, naming the file the user asked for instead of a temp file."""
    named = type(error)(error.errno, f"cannot write {what} {path}: {error.strerror or error}", path)
    named.__cause__ = error
    return named


def _check_directory(path: str, what: str) -> str:
    directory, _ = _split(path)
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, f"cannot write {what} {path}: Is a directory", path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            errno.ENOENT, f"cannot write {what} {path}: directory {directory} does not exist", directory
        )
    return directory


# ---- locks and signals -------------------------------------------------------------------------
@contextlib.contextmanager
def _directory_lock(directory: str, exclusive: bool) -> Iterator[None]:
    """flock on the directory: exclusive around a pair save's renames, recovery and cleanup;
    shared while a reader opens a pair or a writer creates (and locks) its temp files."""
    fd = -1
    if fcntl is not None:
        try:
            fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError:
            if fd >= 0:
                os.close(fd)
            fd = -1
    if fd < 0:
        with _FALLBACK_LOCK:
            yield
        return
    try:
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C until the block ends, then deliver it (KeyboardInterrupt after the save).

    Python runs signal handlers in the main thread only, so a block running in another
    thread is never interrupted by SIGINT and needs nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGINT)
    except (ValueError, OSError):  # pragma: no cover - no signal support
        previous = None
    if previous is None:  # a handler installed from C: cannot be restored, leave it alone
        yield
        return
    received = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, received[0])
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)


# ---- temp files --------------------------------------------------------------------------------
class _Temp:
    """A fresh temp file beside ``path``, flock'ed while it is ours.

    Create it under the directory's shared lock: the cleanup holds the exclusive one, so
    it never sees this file before the flock is taken.
    """

    def __init__(self, path: str, what: str) -> None:
        self.discarded = False
        self.directory, base = _split(path)
        directory = self.directory
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
        for _ in range(100):
            self.name = _temp_name(base)
            self.path = os.path.join(directory, self.name)
            try:
                # 0o666 so the umask applies, as for a normally created file (mkstemp uses 0o600).
                self.fd = os.open(self.path, flags, 0o666)
                break
            except FileExistsError:
                continue
            except OSError as exc:
                raise _named(exc, what, path) from exc
        else:  # pragma: no cover - 100 random collisions
            raise FileExistsError(errno.EEXIST, f"cannot create a temp file for {path}", path)
        _try_flock(self.fd)

    def write(self, content: Content) -> None:
        """Write and fsync; a function is given the temp path and writes the file itself."""
        self.fill(content)
        self.sync()

    def sync(self) -> None:
        os.fsync(self.fd)

    def fill(self, content: Content) -> None:
        """Write ``content`` (not yet fsynced).  A list of buffers goes to the file one
        after the other: nothing is joined or copied."""
        if callable(content):
            # The function may replace the file (safetensors writes a new one and renames
            # it): lock what is there now, with the cleanup kept out meanwhile.
            with _directory_lock(self.directory, exclusive=False):
                content(self.path)
                os.close(self.fd)  # our old lock would refuse the new one on the same file
                self.fd = -1
                self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                _try_flock(self.fd)
            return
        # A dup keeps our descriptor (and so the flock) open when the file object closes.
        # Writes larger than its buffer go straight from the caller's memory to the file.
        with os.fdopen(os.dup(self.fd), "wb") as handle:
            for chunk in content if isinstance(content, (list, tuple)) else (content,):
                view = memoryview(chunk)
                if view.format != "B" or view.ndim != 1:
                    view = view.cast("B")
                for start in range(0, len(view), _WRITE_CHUNK):
                    handle.write(view[start : start + _WRITE_CHUNK])
            handle.flush()

    def discard(self) -> None:
        """Close; remove the file if it still sits at its (unique) temp name, i.e. it was not
        renamed into place.  Idempotent, so that a normal exit and an error path may both call it."""
        if self.discarded:
            return
        self.discarded = True
        _remove_quietly(self.path)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _try_flock(fd: int) -> None:
    """Mark a temp file as in use (see `_remove_abandoned`); a no-op where flock is unavailable."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(directory: str) -> None:
    """Persist renames; best effort (not every platform can fsync a directory)."""
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


def _remove_abandoned(directory: str, base: str) -> None:
    """Remove temp files of ours for ``base`` that no live save holds (flock), e.g. a killed
    save's.  Call with the directory's exclusive lock held, after `recover`."""
    if fcntl is None:
        return
    patterns = [_temp_pattern(name) for name in (base, base + ".data", f".{base}.journal")]
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not any(pattern.fullmatch(name) for pattern in patterns):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while a save holds it
                os.unlink(path)
        except OSError:
            pass
        finally:
            os.close(fd)


# ---- streaming saves ----------------------------------------------------------------------------
class AtomicSave:
    """A save of ``path`` (and, when `write_data` is called, ``path.data``) written in steps.

    Use as a context manager: inside it, `write_data` and `write_main` write the new
    contents into temp files (each at most once, the data file first); a clean exit fsyncs
    them and commits them as `atomic_write` or `atomic_write_pair` would; an exception
    removes them and leaves the old files.  This lets a caller hold a lock only while the
    bytes are written (e.g. from a live training state), not during fsync and the renames.
    """

    def __init__(self, path: str, what: str = "checkpoint") -> None:
        self.path = path
        self.what = what
        self.directory: Optional[str] = None
        self.main: Optional[_Temp] = None
        self.data: Optional[_Temp] = None

    def __enter__(self) -> "AtomicSave":
        return self

    def _fill(self, attribute: str, path: str, content: Content) -> None:
        if getattr(self, attribute) is not None:
            raise RuntimeError(f"{attribute} of {self.path} written twice")
        if self.directory is None:
            self.directory = _check_directory(self.path, self.what)  # names the directory
        try:
            with _directory_lock(self.directory, exclusive=False), _sigint_deferred():
                # Recorded before a deferred Ctrl-C can be delivered, so __exit__ removes it.
                setattr(self, attribute, _Temp(path, self.what))
            getattr(self, attribute).fill(content)
        except OSError as exc:
            raise _renamed(exc, self.what, self.path) from None

    def write_data(self, content: Content) -> None:
        """The new ``path.data`` (makes this a pair save)."""
        self._fill("data", self.path + ".data", content)

    def write_main(self, content: Content) -> None:
        self._fill("main", self.path, content)

    def __exit__(self, exc_type, exc, tb) -> None:
        temps = [temp for temp in (self.data, self.main) if temp is not None]
        try:
            if exc_type is None:
                if self.main is None:
                    raise RuntimeError(f"save of {self.path}: no main file was written")
                try:
                    for temp in temps:
                        temp.sync()
                    if self.data is None:
                        _commit_single(self.path, self.main)
                    else:
                        _commit_pair_files(self.path, self.main, self.data)
                except OSError as error:
                    raise _renamed(error, self.what, self.path) from None
        finally:
            _discard(temps)


def _commit_single(path: str, temp: "_Temp") -> None:
    directory, _ = _split(path)
    with _sigint_deferred():
        with _directory_lock(directory, exclusive=True):
            _recover_locked(path)  # an interrupted pair save must not finish over this file later
            _remove_abandoned(directory, os.path.basename(path))
            os.replace(temp.path, path)
        _fsync_dir(directory)
        temp.discard()


def _commit_pair_files(path: str, main_temp: "_Temp", data_temp: "_Temp") -> None:
    directory, _ = _split(path)
    with _sigint_deferred():
        with _directory_lock(directory, exclusive=True):
            _recover_locked(path)
            _remove_abandoned(directory, os.path.basename(path))
            _commit_pair(path, main_temp, data_temp)
        _discard([main_temp, data_temp])


# ---- one file ----------------------------------------------------------------------------------
def atomic_write(path: str, content: Content, what: str = "checkpoint") -> None:
    """Replace ``path`` with ``content`` atomically (temp file, fsync, rename).

    ``content`` is bytes, a list of buffers (streamed one after the other), or a function
    that writes a file at the path it is given.  On failure the previous file is
    untouched, the temp file removed, and the OSError names ``path`` (or its missing
    directory).
    """
    directory = _check_directory(path, what)
    temps: List[_Temp] = []
    try:
        with _directory_lock(directory, exclusive=False), _sigint_deferred():
            temps.append(_Temp(path, what))
        temps[0].write(content)
        _commit_single(path, temps[0])
    except OSError as exc:
        raise _renamed(exc, what, path)
    finally:
        _discard(temps)


def _discard(temps: List[_Temp]) -> None:
    for temp in temps:
        temp.discard()


def _renamed(error: OSError, what: str, path: str) -> OSError:
    """Errors from our own temp files are reported against ``path``."""
    if error.filename is None or error.filename == path:
        return error
    return _named(error, what, path)


# ---- a pair ------------------------------------------------------------------------------------
def atomic_write_pair(path: str, main: Content, data: Content, what: str = "checkpoint") -> None:
    """Replace ``path`` and ``path + ".data"`` together (the journaled protocol above).

    A failure that raises here leaves the old pair (unless even undoing the renames fails:
    then the journal stays and the next load or save completes the new pair).  After a kill
    or power loss, the next load or save finds the complete old or the complete new pair.
    Errors name ``path``.
    """
    directory = _check_directory(path, what)
    temps: List[_Temp] = []
    try:
        with _directory_lock(directory, exclusive=False), _sigint_deferred():
            temps.append(_Temp(path + ".data", what))
            temps.append(_Temp(path, what))
        data_temp, main_temp = temps
        data_temp.write(data)
        main_temp.write(main)
        _commit_pair_files(path, main_temp, data_temp)
    except OSError as exc:
        raise _renamed(exc, what, path)
    finally:
        _discard(temps)


def _commit_pair(path: str, main_temp: _Temp, data_temp: _Temp) -> None:
    """Steps 2-4 of the protocol; the caller holds the exclusive lock with SIGINT deferred."""
    base = os.path.basename(path)
    journal = {
        "version": _JOURNAL_VERSION,
        "main": base,
        "new_main": main_temp.name,
        "new_data": data_temp.name,
        "old_main": _temp_name(base),
        "old_data": _temp_name(base + ".data"),
    }
    _write_journal(path, journal)
    done: List[Tuple[str, str]] = []
    try:
        _renames_forward(path, journal, done)
    except BaseException:
        try:  # undo in reverse order; the new temp files stay until the journal is gone
            for source, target in reversed(done):
                os.replace(target, source)
            _fsync_dir(_split(path)[0])
            _remove_journal(path)
        except OSError:
            pass  # the journal stays: the next load or save completes the new pair instead
        raise
    _finish(path, journal)


def _renames_forward(path: str, journal: Dict, done: Optional[List[Tuple[str, str]]] = None) -> None:
    """Step 3, resumable: each rename runs only if it has not happened yet, which the files
    present tell exactly (the new main temp file exists until the very last rename)."""
    directory, _ = _split(path)
    at = lambda name: os.path.join(directory, name)  # noqa: E731
    data_path = path + ".data"
    if not os.path.lexists(at(journal["new_main"])):
        return  # the last rename happened: step 3 is complete
    steps = []
    if not os.path.lexists(at(journal["old_main"])) and os.path.lexists(path):
        steps.append((path, at(journal["old_main"])))
    if (
        not os.path.lexists(at(journal["old_data"]))
        and os.path.lexists(data_path)
        and os.path.lexists(at(journal["new_data"]))
    ):
        steps.append((data_path, at(journal["old_data"])))
    if os.path.lexists(at(journal["new_data"])):
        steps.append((at(journal["new_data"]), data_path))
    steps.append((at(journal["new_main"]), path))
    for source, target in steps:
        os.replace(source, target)
        if done is not None:
            done.append((source, target))
    _fsync_dir(directory)


def _finish(path: str, journal: Dict) -> None:
    """Step 4: drop the moved-aside old files, then the journal."""
    directory, _ = _split(path)
    for old in (journal["old_main"], journal["old_data"]):
        _remove_quietly(os.path.join(directory, old))
    _remove_journal(path)


def _write_journal(path: str, journal: Dict) -> None:
    target = journal_path(path)
    temp = _Temp(target, "checkpoint journal")
    try:
        temp.write(json.dumps(journal).encode())
        os.replace(temp.path, target)
    finally:
        temp.discard()
    _fsync_dir(_split(path)[0])


def _remove_journal(path: str) -> None:
    os.unlink(journal_path(path))
    _fsync_dir(_split(path)[0])


def _read_journal(path: str) -> Optional[Dict]:
    """The journal of ``path``, checked to name only our own temp files; None if there is none."""
    target = journal_path(path)
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"cannot read the save journal {target}: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JournalError(f"save journal {target} is not a regular file")
        raw = os.read(fd, _JOURNAL_MAX_BYTES + 1)
    finally:
        os.close(fd)
    base = os.path.basename(path)
    try:
        journal = json.loads(raw.decode())
        ok = (
            len(raw) <= _JOURNAL_MAX_BYTES
            and journal["version"] == _JOURNAL_VERSION
            and journal["main"] == base
            and all(_names_ours(journal[key], base) for key in ("new_main", "old_main"))
            and all(_names_ours(journal[key], base + ".data") for key in ("new_data", "old_data"))
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise JournalError(
            f"save journal {target} was not written by ort_torch_compat (or is damaged); "
            f"check {path} and {path}.data, then remove the journal"
        )
    return journal


def _names_ours(name: object, base: str) -> bool:
    """Only our own temp names of this checkpoint, so a hostile journal cannot rename other files."""
    return isinstance(name, str) and _temp_pattern(base).fullmatch(name) is not None and ".previous" not in name


def _recover_locked(path: str) -> None:
    """Complete an interrupted pair save of ``path`` (exclusive lock held).

    A journal exists only after both new files were complete and fsynced, so recovery
    always goes forward: it resumes the renames and the cleanup where the save stopped.
    """
    journal = _read_journal(path)
    if journal is None:
        return
    try:
        _renames_forward(path, journal)
        _finish(path, journal)
    except OSError as exc:
        raise type(exc)(
            exc.errno,
            f"checkpoint {path}: completing an interrupted save (journal {journal_path(path)}) failed: "
            f"{exc.strerror or exc}",
            path,
        ) from exc


def recover(path: str) -> None:
    """Complete an interrupted pair save of ``path``; nothing without a journal.

    Raises JournalError for a journal we did not write and OSError (naming ``path``) when
    the files cannot be renamed (e.g. a read-only directory).
    """
    if not os.path.lexists(journal_path(path)):
        return
    with _directory_lock(_split(path)[0], exclusive=True), _sigint_deferred():
        _recover_locked(path)


@contextlib.contextmanager
def stable_pair(path: str) -> Iterator[None]:
    """Open ``path`` and ``path.data`` inside this block: no pair save is between its renames
    meanwhile (an interrupted one is completed first), so both files come from one save."""
    directory, _ = _split(path)
    for _ in range(100):
        recover(path)
        with _directory_lock(directory, exclusive=False):
            if not os.path.lexists(journal_path(path)):
                yield
                return
    raise OSError(errno.EAGAIN, f"checkpoint {path}: saves keep being interrupted; cannot read a complete pair", path)
