"""Changing the store's files durably: appends, renames, links, unlinks, directories and modes,
and the fsyncs (of files and directories) that make them last. The atomic replace of a file,
``write_atomic``, is ``_atomic``'s, on the fsyncs here.

Every operation is announced to the recorder first (``_base._rec``). The fsync primitives
(``_fsync_fd``, ``fsync_dir``) and the Windows sharing retry live here, and ``_atomic`` calls
them through this module, so a test that patches them here reaches every write.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from .._errors import UnreadableState
from ._base import (
    _O_BINARY,
    _O_CLOEXEC,
    _O_DIRECTORY,
    _O_NOFOLLOW,
    _O_NONBLOCK,
    DIR_MODE,
    FILE_MODE,
    _rec,
    storage_errors,
)
from ._read import _own_dir, lstat

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any

# Windows: replacing or removing a file that another process has open (a sync client, an
# antivirus scanner, the search indexer) fails with a sharing violation for a moment; a short,
# bounded retry rides it out. POSIX has no such thing (EACCES there is a real refusal).
_SHARING_RETRY = os.name == "nt"
_SHARING_WAITS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)  # 1.18 s in all, then the error stands
# F_FULLFSYNC (macOS only): the fsync that flushes the drive's cache. Elsewhere fcntl is not
# imported: opening a store never fsyncs, and loading the module costs startup a few 0.1 ms.
_F_FULLFSYNC: int | None = None
if sys.platform == "darwin":
    import fcntl

    _F_FULLFSYNC = getattr(fcntl, "F_FULLFSYNC", None)
# link() errors meaning "this filesystem has no hard links" (exFAT through FUSE: EPERM)
_NO_HARD_LINKS = frozenset(
    e for e in (errno.EPERM, errno.ENOTSUP, getattr(errno, "EOPNOTSUPP", None), errno.ENOSYS,
                errno.EMLINK) if e is not None
)


def _fsync_fd(fd: int) -> None:
    if _F_FULLFSYNC is not None:  # macOS: plain fsync does not flush the drive's cache
        import fcntl

        try:
            fcntl.fcntl(fd, _F_FULLFSYNC)
            return
        except OSError:
            pass  # not supported by this filesystem: fall back to fsync
    os.fsync(fd)


def _sync_written(fd: int, path: str) -> None:
    """The fsync of a file just written (announced, then ``_fsync_fd``): both drivers of
    ``write_atomic`` call it through this module (the crash explorer's ``no_file_fsync``
    variant replaces it, announcement and all)."""
    _rec("fsync", path)
    _fsync_fd(fd)


def _retry_sharing(fn: Callable[..., Any], *args: str) -> Any:
    """``fn(*args)`` (``os.replace``, ``os.unlink``), retried briefly on a Windows sharing
    violation (PermissionError while another process holds the file open)."""
    if not _SHARING_RETRY:
        return fn(*args)
    import time

    for wait in _SHARING_WAITS:
        try:
            return fn(*args)
        except PermissionError:
            time.sleep(wait)
    return fn(*args)


def fsync_dir(path: str) -> None:
    """Make the creates, renames and unlinks in directory ``path`` durable.

    Per OS: Linux (and the BSDs) — fsync of the directory's descriptor commits its entries.
    macOS — the same, with ``F_FULLFSYNC`` so the drive's cache is flushed too. Windows — a
    directory cannot be fsynced through ``os.open``, so this is a no-op there: ``write_atomic``'s
    rename is atomicwrites' ``MoveFileEx`` with ``MOVEFILE_WRITE_THROUGH`` (on disk when it
    returns); a plain rename, unlink or mkdir is journalled by NTFS and committed within
    seconds — a power cut inside that window can lose it, never tear a file."""
    _rec("fsync_dir", path)
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        _fsync_fd(fd)
    finally:
        os.close(fd)


def write_new(path: str, data: bytes, *, durable: bool = True) -> None:
    """Create ``path`` (never replacing anything, never through a link) holding ``data``:
    open O_EXCL, write, fsync, directory fsync — no temp file, no rename.

    For files only ever read once something durable names them (a LangGraph thread's records:
    the head that counts a record is committed after this returns). A crash mid-way may leave a
    short file under the name; nothing refers to it, and its writer replaces it. Raises
    FileExistsError if the name is taken; UnreadableState (reason ``symlink``) if the directory
    is a symlink (never written through: the files it points to are outside the store).
    """
    _own_dir(os.path.dirname(path))
    with storage_errors(path, "write"):
        _rec("create", path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
                     FILE_MODE)
        try:
            _rec("write", path, data)
            _write_all(fd, data, path, durable)
        finally:
            os.close(fd)
        if durable:
            fsync_dir(os.path.dirname(path))


def _write_all(fd: int, data: bytes, path: str, durable: bool, *,
               datasync: bool = False) -> None:
    """Write every byte (a short write — a signal, ENOSPC part-way — never cuts the data), then
    fsync the file if ``durable`` (``datasync``: its data and size, ``_fdatasync_fd``)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    if durable:
        _rec("fsync", path)
        (_fdatasync_fd if datasync else _fsync_fd)(fd)


def _fdatasync_fd(fd: int) -> None:
    """``_fsync_fd`` for a file whose data (and size) is what must last: fdatasync where there
    is one (Linux), F_FULLFSYNC on macOS, else fsync."""
    if _F_FULLFSYNC is None and hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:
        _fsync_fd(fd)


def append_at(path: str, offset: int, data: bytes, *, durable: bool = True) -> int:
    """Append ``data`` to the existing log file ``path`` at ``offset``, its valid end, and make
    it durable with ONE fdatasync; returns the new end.

    A file longer than ``offset`` has a tail no reader accepts (a frame a crash tore, or frames
    no head counts): it is cut first (``ftruncate``, then fsync, so the cut is durable before
    anything is written where the tail was). Never through a symlink; UnreadableState (reason
    ``log_short``) if the file is shorter than ``offset`` (it is not the file the caller read).
    """
    with storage_errors(path, "append"):
        fd = os.open(path, os.O_WRONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_BINARY)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnreadableState(f"{path} is not a regular file", path=path,
                                      reason="not_a_file")
            if st.st_size < offset:
                raise UnreadableState(f"{path} is {st.st_size} bytes, shorter than its valid "
                                      f"end {offset}", path=path, reason="log_short")
            if st.st_size > offset:
                _rec("truncate", path, offset)
                os.ftruncate(fd, offset)
                if durable:
                    _rec("fsync", path)
                    _fsync_fd(fd)
            os.lseek(fd, offset, os.SEEK_SET)
            _rec("append", path, data)
            _write_all(fd, data, path, durable, datasync=True)
        finally:
            os.close(fd)
    return offset + len(data)


def unlink(path: str, *, durable: bool = True, missing_ok: bool = True) -> bool:
    """Remove ``path`` (a link itself, never its target); True if something was removed."""
    with storage_errors(path, "unlink"):
        _rec("unlink", path)
        try:
            _retry_sharing(os.unlink, path)
        except FileNotFoundError:
            if not missing_ok:
                raise
            return False
        if durable:
            fsync_dir(os.path.dirname(path))
        return True


def rename(src: str, dst: str, *, durable: bool = True) -> None:
    """Move ``src`` to ``dst`` (replacing it) and make both directories durable."""
    with storage_errors(src, "rename"):
        _rec("rename", src, dst)
        _retry_sharing(os.replace, src, dst)
        if durable:
            fsync_dir(os.path.dirname(dst))
            if os.path.dirname(src) != os.path.dirname(dst):
                fsync_dir(os.path.dirname(src))


def link(src: str, dst: str, *, durable: bool = True) -> None:
    """A second name for ``src`` (the link itself if it is one; never followed): how a file is
    kept aside before it is replaced. OSError where the filesystem has no hard links (exFAT)."""
    with storage_errors(dst, "link"):
        _rec("link", src, dst)
        os.link(src, dst, follow_symlinks=False)
        if durable:
            fsync_dir(os.path.dirname(dst))


def makedirs(path: str, *, durable: bool = True) -> None:
    """Create ``path`` and missing parents, mode 0700; refuse a symlink or a file in the way."""
    with storage_errors(path, "mkdir"):
        st = lstat(path)
        if st is not None:
            if not stat.S_ISDIR(st.st_mode):
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
                raise UnreadableState(f"{path} is {kind}", path=path, reason="not_a_directory")
            return
        parent = os.path.dirname(path)
        if parent and parent != path:
            makedirs(parent, durable=durable)
        _rec("mkdir", path)
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            return makedirs(path, durable=durable)  # raced with another process: re-check it
        os.chmod(path, DIR_MODE)  # the umask may have narrowed or widened it
        if durable and parent:
            fsync_dir(parent)


def append_line(path: str, line: bytes, *, durable: bool = True, lazy: bool = False) -> bool:
    """Append one line to a log file (created 0600, never through a symlink).

    The line always starts on a fresh line: a file whose last byte is not a newline (a crash
    mid-append, a zero-filled tail after a power cut, an ENOSPC short write) first gets one, so
    the torn line stays one bad line and this one is read whole.

    ``lazy`` (with ``durable``): the file's fsync is left to the caller (``fsync_file``, before
    anything needs the line to last) unless this append created the file, which is then made
    durable here, its directory too. Returns True if the fsync was left to the caller."""
    with storage_errors(path, "append"):
        _rec("append", path, line)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | _O_BINARY
        existed = os.path.lexists(path)
        fd = os.open(path, flags, FILE_MODE)
        try:
            size = os.fstat(fd).st_size
            if size:
                os.lseek(fd, size - 1, os.SEEK_SET)  # O_APPEND: the write still goes to the end
                if os.read(fd, 1) != b"\n":
                    line = b"\n" + line
            left = durable and lazy and existed
            _write_all(fd, line, path, durable and not left)
        finally:
            os.close(fd)
        if durable and not existed:
            fsync_dir(os.path.dirname(path))
        return left


def open_lock(path: str) -> IO[bytes]:
    """A lock file, open for ``flock`` (created 0600 if absent, never through a symlink, closed
    on exec): the sidecar file ``_locks`` holds its locks on. Its bytes are never written."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | _O_BINARY, FILE_MODE)
    return os.fdopen(fd, "r+b", buffering=0)


def fsync_file(path: str) -> bool:
    """fsync an existing file (its data and metadata), never through a symlink: the appends a
    ``lazy`` ``append_line`` left unsynced. False (nothing done) if it is gone."""
    with storage_errors(path, "fsync"):
        try:
            fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK)
        except FileNotFoundError:
            return False
        try:
            _rec("fsync", path)
            _fsync_fd(fd)
        finally:
            os.close(fd)
        return True


def rmdir(path: str, *, durable: bool = True) -> bool:
    """Remove an empty directory (never through a symlink); False if missing or not empty."""
    with storage_errors(path, "rmdir"):
        st = lstat(path)
        if st is None or not stat.S_ISDIR(st.st_mode):
            return False
        _rec("rmdir", path)
        try:
            os.rmdir(path)
        except (FileNotFoundError, OSError) as e:
            if isinstance(e, FileNotFoundError) or e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        if durable:
            fsync_dir(os.path.dirname(path))
        return True


def chmod(path: str, mode: int) -> None:
    """Narrow a file's or directory's mode (doctor's permission repair); never through a link:
    the file is opened with O_NOFOLLOW and changed through its descriptor."""
    with storage_errors(path, "chmod"):
        _rec("chmod", path, mode)
        try:
            fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnreadableState(f"{path} is a symlink", path=path, reason="symlink") from e
            raise
        try:
            if hasattr(os, "fchmod"):
                os.fchmod(fd, mode)
            else:  # Windows before 3.13: no fchmod (and only a read-only bit to set)
                os.chmod(path, mode)
        finally:
            os.close(fd)
