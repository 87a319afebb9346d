"""The recorder that hears of every disk operation, the typed translation of the disk's refusals,
and the open flags and modes every operation of ``_fsio`` uses.

``set_recorder`` installs ``recorder(op, args)``, called just before each write, fsync, rename,
link, unlink, mkdir, rmdir, chmod and directory fsync (``_rec``, from ``_write``). The
crash-state explorer records a workload this way; fault tests make the recorder raise
``OSError`` (ENOSPC, EIO, ...) to inject a failure at an exact operation.
"""

from __future__ import annotations

import errno
import os

from .._errors import StorageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Recorder = Callable[[str, tuple[Any, ...]], None]

_recorder: Recorder | None = None

# Errors the disk gives that a caller can do nothing about but report: they become StorageError.
# EISDIR/ENOTDIR/ENOTEMPTY: a directory (or a file) planted where the other belongs, e.g. a
# directory at markers/<id>.json that no rename can replace.
_STORAGE_ERRNOS = frozenset(
    e for e in (errno.ENOSPC, errno.EIO, errno.EACCES, errno.EPERM, errno.EROFS,
                getattr(errno, "EDQUOT", None), errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY)
    if e is not None
)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# Reading: a FIFO planted under a session or marker name would block open() until a writer
# came — discovery would hang forever. With O_NONBLOCK open returns; fstat then refuses it.
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# Windows: without O_BINARY, os.open files translate "\n" and stop reading at Ctrl-Z.
_O_BINARY = getattr(os, "O_BINARY", 0)
FILE_MODE = 0o600
DIR_MODE = 0o700


def set_recorder(recorder: Recorder | None) -> Recorder | None:
    """Install ``recorder(op, args)`` (called before each operation); returns the previous one."""
    global _recorder
    previous, _recorder = _recorder, recorder
    return previous


def _rec(op: str, *args: Any) -> None:
    if _recorder is not None:
        _recorder(op, args)


class storage_errors:
    """Turn the disk's refusals into a typed StorageError carrying path and errno.

    A class, not a generator-based context manager: it wraps every disk call of the startup path
    and costs a third as much."""

    __slots__ = ("path", "what")

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, e: BaseException | None,
                 tb: object) -> None:
        if isinstance(e, OSError):
            raise_typed(e, self.path, self.what)


def raise_typed(e: OSError, path: str, what: str) -> None:
    """Raise ``e`` as ``storage_errors`` does — a typed StorageError carrying path and errno,
    from ``e`` — if the disk refused (ENOSPC, EIO, EACCES, ...); else return (the caller
    re-raises ``e`` or judges it). For the hottest reads, which catch the error themselves
    (``try`` costs nothing until something is raised)."""
    if isinstance(e, StorageError) or e.errno not in _STORAGE_ERRNOS:
        return
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    raise StorageError(f"{what} failed on {path}: {e.strerror or name}", path=path, reason=name,
                       errno=e.errno) from e

