"""Cross-process, cross-thread exclusive locks on sidecar files (flock on POSIX; portalocker,
``LockFileEx``, on Windows).

Lock files live in the machine-local state dir (never in the store, so no sync tool carries them)
and are never the file that gets replaced: locking a file that a rename swaps out locks nothing.
``flock`` locks belong to an open file, so two threads of one process exclude each other as well as
two processes; a lock held by a process that died is released by the kernel.
Lock files are never deleted (deleting a lock file races with a waiter that opened it).

A ``flock`` lock belongs to the open file, and ``fork`` shares open files with the child: a tool
that starts a helper with ``multiprocessing`` (fork) would keep the turn's route lock for as long
as the helper lives, after the agent died — recovery would find the route busy. So a forked child
closes its copies of every lock file this process holds (``os.register_at_fork``); the parent's
locks are untouched (closing one descriptor of a shared open file releases nothing). ``exec``
closes them too (``O_CLOEXEC``).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import IO, Any

from . import _fsio
from ._errors import LockTimeout

try:
    import fcntl as _fcntl_mod

    _fcntl: Any = _fcntl_mod if hasattr(_fcntl_mod, "flock") else None
except ImportError:  # Windows: portalocker (LockFileEx)
    _fcntl = None
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


# the lock files this process has open (held or being waited for), by descriptor; a forked
# child closes them
_HELD: dict[int, IO[Any]] = {}
_HELD_MU = threading.Lock()


def _close_held_in_child() -> None:
    """``after_in_child`` of a fork: drop the inherited lock files (the only thread here is the
    forking one, so the registry is read without its mutex, which may have been held)."""
    global _HELD_MU
    _HELD_MU = threading.Lock()
    held = list(_HELD.values())
    _HELD.clear()
    for fh in held:
        with suppress(OSError):
            fh.close()


if hasattr(os, "register_at_fork"):
    # a fork waits while a lock file is being opened and registered: no descriptor escapes
    os.register_at_fork(before=lambda: _HELD_MU.acquire(),
                        after_in_parent=lambda: _HELD_MU.release(),
                        after_in_child=_close_held_in_child)


def _lock_name(kind: str, key: str) -> str:
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{kind}-{digest}.lock"


def _try_lock(fh: IO[Any]) -> bool:
    """One non-blocking attempt at the exclusive lock of ``fh``: True if it is ours now.

    POSIX: ``flock(LOCK_EX | LOCK_NB)``, the very call portalocker makes there, without importing
    portalocker: its import reads installed packages' metadata (``importlib.metadata``), 20-60 ms
    that were most of a fresh process's first commit. Elsewhere (Windows: ``LockFileEx``):
    portalocker, the mandated lock package. Both take the same lock, so processes of either path
    exclude each other."""
    if _fcntl is not None:
        try:
            _fcntl.flock(fh.fileno(), _fcntl.LOCK_EX | _fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    import portalocker

    try:
        portalocker.lock(fh, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
    except portalocker.exceptions.LockException:
        return False
    return True


def _unlock(fh: IO[Any]) -> None:
    if _fcntl is not None:
        _fcntl.flock(fh.fileno(), _fcntl.LOCK_UN)
        return
    import portalocker

    portalocker.unlock(fh)


class Locks:
    """The lock directory of one store."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._made = False
        self._mk = threading.Lock()

    def _path(self, kind: str, key: str) -> str:
        if not self._made:
            with self._mk:
                _fsio.makedirs(self.directory, durable=False)
                self._made = True
        return os.path.join(self.directory, _lock_name(kind, key))

    @contextmanager
    def hold(self, kind: str, key: str, *, timeout: float, poll: float = 0.002,
             session_id: str | None = None) -> Iterator[None]:
        """Hold the exclusive ``kind`` lock for ``key``; LockTimeout after ``timeout`` seconds."""
        path = self._path(kind, key)
        with _HELD_MU:  # registered from the start: a lock taken later is on this open file
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
            fh: IO[Any] = os.fdopen(fd, "r+b")
            _HELD[fd] = fh
        try:
            deadline = time.monotonic() + timeout
            delay = poll
            while not _try_lock(fh):
                now = time.monotonic()
                if now >= deadline:
                    raise LockTimeout(
                        f"{kind} lock for {key!r} still held after {timeout:g}s",
                        path=path, session_id=session_id, reason="timeout",
                    )
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 0.05)
            try:
                yield
            finally:
                if not fh.closed:  # closed: this is a forked child, which never held it
                    _unlock(fh)
        finally:
            with _HELD_MU:
                _HELD.pop(fd, None)
            fh.close()
