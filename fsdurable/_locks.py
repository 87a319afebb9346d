"""Cross-process, cross-thread exclusive locks on sidecar files (portalocker / flock).

Lock files live in the machine-local state dir (never in the store, so no sync tool carries them)
and are never the file that gets replaced: locking a file that a rename swaps out locks nothing.
``flock`` locks belong to an open file, so two threads of one process exclude each other as well as
two processes; a lock held by a process that died is released by the kernel.
Lock files are never deleted (deleting a lock file races with a waiter that opened it).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from . import _fsio
from ._errors import LockTimeout

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _lock_name(kind: str, key: str) -> str:
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{kind}-{digest}.lock"


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
        import portalocker

        path = self._path(kind, key)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
        fh: IO[Any] = os.fdopen(fd, "r+b")
        try:
            deadline = time.monotonic() + timeout
            delay = poll
            flags = portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING
            while True:
                try:
                    portalocker.lock(fh, flags)
                    break
                except portalocker.exceptions.LockException as e:
                    now = time.monotonic()
                    if now >= deadline:
                        raise LockTimeout(
                            f"{kind} lock for {key!r} still held after {timeout:g}s",
                            path=path, session_id=session_id, reason="timeout",
                        ) from e
                    time.sleep(min(delay, deadline - now))
                    delay = min(delay * 2, 0.05)
            try:
                yield
            finally:
                portalocker.unlock(fh)
        finally:
            fh.close()
