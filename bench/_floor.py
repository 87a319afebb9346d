"""The floor's write, in one place: ``put`` is a temp file, its fsync, the rename over the target
and the directory's fsync, with nothing else; ``locked_put`` is the same under a ``flock`` (what
the least commit path imported on first use does: bench/commit.py, ``floor_lazy``).

``AppendFloor`` is an append-only design's floor: one append of the new bytes to a file kept
open, and one fdatasync (bench/growth.py, bench/langgraph.py, bench/lgput.py,
bench/adapters.py).

The standard library alone, and no import of ``bench``: ``Floor`` (bench/commit.py) and the
adapters' floors (bench/adapters.py) call it in process, and the first commit's fresh processes,
which run in the clean venv where ``bench`` is not installed, import a copy of this very file
(``first_commit`` puts it beside them), so every floor writes with the same code.
"""

from __future__ import annotations

import fcntl
import os

_lock: int | None = None  # locked_put's lock file, opened by its first call


def put(directory: str, name: str, data: bytes) -> None:
    """``data`` as ``directory/name``: temp, fsync, rename, directory fsync."""
    tmp = os.path.join(directory, "~" + name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(directory, name))
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def locked_put(directory: str, name: str, data: bytes) -> None:
    """``put`` under an exclusive ``flock`` of ``directory/floor.lock`` (kept open)."""
    global _lock
    if _lock is None:
        _lock = os.open(os.path.join(directory, "floor.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(_lock, fcntl.LOCK_EX)
    try:
        put(directory, name, data)
    finally:
        fcntl.flock(_lock, fcntl.LOCK_UN)


class AppendFloor:
    """One append of ``data`` to ``path`` (opened once, O_APPEND) and one fdatasync a call."""

    def __init__(self, path: str, data: bytes) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.data = data

    def __call__(self) -> None:
        os.write(self.fd, self.data)
        os.fdatasync(self.fd)

    put = __call__  # as a putter of bench/langgraph.py (``bytes_per_put``)

    def close(self) -> None:
        os.close(self.fd)
