"""Cross-process, cross-thread exclusive locks on sidecar files (``flock``; portalocker where
there is no ``fcntl``).

Lock files live in the machine-local state dir (never in the store, so no sync tool carries them)
and are never the file that gets replaced: locking a file that a rename swaps out locks nothing.
A lock held by a process that died is released by the kernel. Lock files are never deleted
(deleting a lock file races with a waiter that opened it).

How a lock is taken. On POSIX: ``fcntl.flock(fd, LOCK_EX | LOCK_NB)``, tried again with a
growing pause until the timeout — the call portalocker (the declared lock dependency) makes on
POSIX, made directly. ``import portalocker`` cost 19.8 ms on the bench machine (portalocker
4.4's ``__about__`` reads the package's own version through ``importlib.metadata``, which
loads the ``email`` package), 24 times a warm commit, and the first commit of every process
paid it (bench/README.md, "first_commit_vs_warm"). Where there is no ``fcntl`` (Windows),
portalocker takes the lock (``LockFileEx``), imported on the first lock (``_FLOCK``: which one).

Open lock files are kept between holds, in one cache for the process (``_FILES``, by path,
least recently used closed past ``KEEP``): a commit then costs a lock and an unlock, not an
open and a close as well (bench/README.md, "Commit"). A ``flock`` belongs to the open file, and
holders of one open file do not exclude each other: so each cached file has a
``threading.Lock``, taken first (within the same timeout), and threads of this process — and two
``Store`` objects of one store in it — exclude each other through it; other processes through the
``flock``. A file is closed only when no thread holds or waits for it.

A ``flock`` lock belongs to the open file, and ``fork`` shares open files with the child: a tool
that starts a helper with ``multiprocessing`` (fork) would keep the turn's route lock for as long
as the helper lives, after the agent died — recovery would find the route busy. So a forked child
closes its copies of every lock file this process has open, held or cached
(``os.register_at_fork``), and starts with an empty cache; the parent's locks are untouched
(closing one descriptor of a shared open file releases nothing). ``exec`` closes them too
(``O_CLOEXEC``).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from contextlib import suppress
from typing import Any

from . import _fsio
from ._errors import LockTimeout

try:
    import fcntl

    _FLOCK = True  # POSIX: flock directly; False: portalocker (tests force it to keep it tested)
except ImportError:  # Windows
    _FLOCK = False

KEEP = 64  # lock files kept open when no one holds them (per process)


class _File:
    """One open lock file: its descriptor's file object, the threads' lock, and how many threads
    hold or wait for it (it is closed only at 0)."""

    __slots__ = ("fh", "mu", "path", "users")

    def __init__(self, path: str, fh: Any) -> None:
        self.path = path
        self.fh = fh
        self.mu = threading.Lock()
        self.users = 0


# the lock files this process has open, by path, least recently used first; a forked child
# closes them. _MU guards it (and is taken around a fork: no descriptor escapes mid-open).
_FILES: dict[str, _File] = {}
_MU = threading.Lock()


def _close_in_child() -> None:
    """``after_in_child`` of a fork: drop the inherited lock files (the only thread here is the
    forking one, so the cache is read without its mutex, which may have been held). A hold the
    forking thread is inside finds its file closed and releases nothing."""
    global _MU
    _MU = threading.Lock()
    files = list(_FILES.values())
    _FILES.clear()
    for f in files:
        with suppress(OSError):
            f.fh.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lambda: _MU.acquire(), after_in_parent=lambda: _MU.release(),
                        after_in_child=_close_in_child)


def _close_at_exit() -> None:
    """The idle lock files, closed before the interpreter's teardown finds them open (each
    was an unclosed-file ResourceWarning at the exit of a process run with warnings on)."""
    with _MU:
        files = [f for f in _FILES.values() if f.users == 0]
        for f in files:
            del _FILES[f.path]
            with suppress(OSError):
                f.fh.close()


atexit.register(_close_at_exit)


def _lock_name(kind: str, key: str) -> str:
    import hashlib

    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{kind}-{digest}.lock"


def _try_lock(fh: Any) -> BaseException | None:
    """One non-blocking try for the exclusive lock: None if taken, else why not."""
    if _FLOCK:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:  # EWOULDBLOCK: held elsewhere (portalocker's AlreadyLocked)
            return e
        return None
    import portalocker

    try:
        portalocker.lock(fh, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
    except portalocker.exceptions.LockException as e:
        return e
    return None


def _unlock(fh: Any) -> None:
    if _FLOCK:
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    else:
        import portalocker

        portalocker.unlock(fh)


def _release(f: _File, *, close: bool = False) -> None:
    """A thread is done with ``f``; close it if asked (then it is not cached any more), and the
    least recently used idle files past ``KEEP``."""
    drop: list[_File] = []
    with _MU:
        f.users -= 1
        if not close and len(_FILES) <= KEEP:  # every commit: nothing to close
            return
        if close and _FILES.get(f.path) is f:
            del _FILES[f.path]
        if close and f.users == 0:
            drop.append(f)
        if len(_FILES) > KEEP:
            for old in list(_FILES.values()):
                if len(_FILES) <= KEEP:
                    break
                if old.users == 0:
                    del _FILES[old.path]
                    drop.append(old)
        for old in drop:  # under _MU: a fork never sees a half-closed file in the cache
            with suppress(OSError):
                old.fh.close()


class Locks:
    """The lock directory of one store."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._made = False
        self._mk = threading.Lock()
        self._paths: dict[tuple[str, str], str] = {}

    def path(self, kind: str, key: str) -> str:
        """The lock file of the ``kind`` lock for ``key`` (``acquire``'s ``path``)."""
        path = self._paths.get((kind, key))
        if path is not None:
            return path
        if not self._made:
            with self._mk:
                _fsio.makedirs(self.directory, durable=False)
                self._made = True
        path = os.path.join(self.directory, _lock_name(kind, key))
        if len(self._paths) >= 4 * KEEP:
            self._paths.clear()
        self._paths[(kind, key)] = path
        return path

    def hold(self, kind: str, key: str, *, timeout: float, poll: float = 0.002,
             session_id: str | None = None) -> _Hold:
        """Hold the exclusive ``kind`` lock for ``key`` (a context manager); LockTimeout after
        ``timeout`` seconds."""
        return _Hold(self.path(kind, key), kind, key, timeout, poll, session_id)


def acquire(path: str, kind: str, key: str, timeout: float, poll: float = 0.002,
            session_id: str | None = None) -> _File:
    """Take the exclusive lock of the lock file at ``path`` (``Locks.path``): this process's
    threads first (they share the open file), then the other processes (``flock``). LockTimeout
    after ``timeout`` seconds (``kind`` and ``key`` name the lock in it). Returns the file, for
    ``release`` — which may run in another thread (``AsyncStore.lock`` enters and leaves in
    worker threads). One function, the file cache's steps inline: every commit takes one
    (bench/commit.py, ``part_commit_lock``). The uncontended case tries each lock once, without
    reading the clock: the deadline starts when a try is refused."""
    with _MU:
        f = _FILES.pop(path, None)
        if f is None or f.fh.closed:
            f = _File(path, _fsio.open_lock(path))
        _FILES[path] = f  # the most recently used last
        f.users += 1
    start = None
    try:
        # (an interrupt the moment the threads' lock is taken, before its result is stored, is
        # CPython's own window, as in ``with threading.Lock()``: no code can tell it apart)
        if not f.mu.acquire(False):
            start = time.monotonic()
            if not f.mu.acquire(True, min(max(timeout, 0.0), threading.TIMEOUT_MAX)):
                raise _timeout(path, kind, key, timeout, session_id, " (by this process)")
    except BaseException:
        _release(f)
        raise
    try:
        busy = _try_lock(f.fh)
        if busy is not None:
            deadline = (time.monotonic() if start is None else start) + timeout
            delay = poll
            while busy is not None:
                now = time.monotonic()
                if now >= deadline:
                    raise _timeout(path, kind, key, timeout, session_id) from busy
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 0.05)
                busy = _try_lock(f.fh)
    except BaseException:
        # an interrupt may have come as ``flock`` returned (a handler runs after the C call):
        # ``release`` gives back a file lock it may have taken (holding the threads' lock, no
        # other thread holds one on this file; unlocking none is a no-op), then the rest
        release(f)
        raise
    return f


def release(f: _File) -> None:
    """Give back the lock ``acquire`` took: the ``flock``, then the threads' lock."""
    close = False
    try:
        if not f.fh.closed:  # closed: this is a forked child, which never held it
            try:
                _unlock(f.fh)
            except Exception:  # closing the file releases it for sure
                close = True
    finally:
        f.mu.release()
        _release(f, close=close)


def _timeout(path: str, kind: str, key: str, timeout: float, session_id: str | None,
             why: str = "") -> LockTimeout:
    return LockTimeout(f"{kind} lock for {key!r} still held after {timeout:g}s{why}",
                       path=path, session_id=session_id, reason="timeout")


class _Hold:
    """One hold of a lock (``Locks.hold``): ``acquire`` and ``release`` as a context manager."""

    __slots__ = ("f", "key", "kind", "path", "poll", "session_id", "timeout")

    def __init__(self, path: str, kind: str, key: str, timeout: float, poll: float,
                 session_id: str | None) -> None:
        self.path, self.kind, self.key = path, kind, key
        self.timeout, self.poll, self.session_id = timeout, poll, session_id
        self.f: _File | None = None

    def __enter__(self) -> None:
        self.f = acquire(self.path, self.kind, self.key, self.timeout, self.poll,
                         self.session_id)

    def __exit__(self, *exc: object) -> None:
        f, self.f = self.f, None
        if f is not None:
            release(f)
