"""Reading the store's files: bounded reads, streamed lines, prefixes and spans, the ``lstat``
and directory listing every check starts from, and whether the filesystem keeps file modes.

Every open is no-follow and non-blocking: a symlink planted under a store name is refused
(``UnreadableState``, reason ``symlink``), never read through; a FIFO never hangs a reader; a
disk that refuses (EACCES, EIO) is a typed ``StorageError`` (``_base.storage_errors``).
"""

from __future__ import annotations

import errno
import os
import stat

from .._errors import StorageError, UnreadableState
from ._base import _O_BINARY, _O_CLOEXEC, _O_NOFOLLOW, _O_NONBLOCK, raise_typed, storage_errors

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Iterator

# POSIX holds 0600/0700; Windows keeps only a read-only bit (ACLs decide access), so there a mode
# is neither enforced nor reported as a problem (doctor).
MODES_HELD = os.name == "posix"
_READ = os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK | _O_BINARY


def _open_file(path: str) -> int:
    """A read-only descriptor of ``path``: no-follow, non-blocking. FileNotFoundError if it is
    missing, StorageError if the disk refuses (EACCES, EIO), UnreadableState (``symlink``,
    ``not_a_file``) if it must not be read."""
    try:
        return os.open(path, _READ)
    except OSError as e:
        if isinstance(e, (StorageError, FileNotFoundError)):
            raise
        raise_typed(e, path, "read")  # EACCES, EIO: a typed StorageError
        if e.errno == errno.ELOOP:
            raise UnreadableState(f"{path} is a symlink", path=path, reason="symlink") from e
        # a socket (ENXIO), a device, a directory on some systems...: never a file of ours
        raise UnreadableState(f"{path} cannot be opened as a file: {e.strerror}", path=path,
                              reason="not_a_file") from e


def _regular(fd: int, path: str) -> os.stat_result:
    """The open file's stat; UnreadableState (``not_a_file``) unless it is a regular file."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnreadableState(f"{path} is not a regular file", path=path, reason="not_a_file")
    return st


def read_span(path: str, offset: int, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """Up to ``max_bytes`` of a regular file from ``offset`` (to its end), and its stat; never
    through a symlink, never blocking. FileNotFoundError if it is missing."""
    fd = _open_file(path)
    try:
        st = _regular(fd, path)
        want = max(0, min(st.st_size - offset, max_bytes))
        chunks, got = [], 0
        while got < want:
            with storage_errors(path, "read"):
                chunk = os.pread(fd, want - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def read_bounded(path: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """Read a regular file, never following a symlink and never more than ``max_bytes``.

    Raises FileNotFoundError if it is missing, UnreadableState (reason ``symlink``,
    ``not_a_file`` or ``oversized``) if it must not be read, StorageError if the disk refuses
    (EACCES, EIO).
    """
    fd = _open_file(path)
    try:
        st = _regular(fd, path)
        if st.st_size > max_bytes:
            raise UnreadableState(
                f"{path} is {st.st_size} bytes, over the {max_bytes}-byte limit",
                path=path, reason="oversized",
            )
        chunks = []
        left = max_bytes + 1
        want = st.st_size + 1  # the whole file and one byte to see it did not grow
        try:  # storage_errors' translation, without a context manager per read (startup path)
            while left > 0:
                chunk = os.read(fd, min(left, want, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except OSError as e:
            raise_typed(e, path, "read")
            raise
        data = b"".join(chunks)
        if len(data) > max_bytes:  # grew while we read it
            raise UnreadableState(
                f"{path} is over the {max_bytes}-byte limit", path=path, reason="oversized"
            )
        return data, st
    finally:
        os.close(fd)


def read_head(path: str, size: int) -> tuple[bytes, os.stat_result]:
    """The first ``size`` bytes of a regular file and its stat, both through one descriptor (of
    one inode; never through a link, never blocking)."""
    fd = os.open(path, _READ)
    try:
        st = _regular(fd, path)
        return os.read(fd, size), st
    finally:
        os.close(fd)


def read_prefix(path: str, size: int) -> bytes:
    """The first ``size`` bytes of a regular file (never through a link, never blocking)."""
    return read_head(path, size)[0]


def lstat(path: str) -> os.stat_result | None:
    """The file's own stat (a link is not followed), or None if nothing is there."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def is_dir(path: str) -> bool:
    """Is a directory at ``path`` (itself: a symlink to one is not)? False if not, or if its
    ``lstat`` fails (the caller's ``makedirs`` then says why)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def iter_lines(path: str, max_line: int, chunk: int = 1 << 20) -> Iterator[bytes | None]:
    """The lines of a log file, streamed (never the whole file in memory, whatever its size);
    never through a symlink. A line longer than ``max_line`` is yielded as None (skipped, so the
    caller can count it). Raises FileNotFoundError, UnreadableState (``symlink``, ``not_a_file``)
    or StorageError (EACCES, EIO) before the first line."""
    fd = _open_file(path)
    return _lines(fd, path, max_line, chunk)


def _lines(fd: int, path: str, max_line: int, chunk: int) -> Iterator[bytes | None]:
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableState(f"{path} is not a regular file", path=path, reason="not_a_file")
        buf = b""
        skipping = False  # inside a line already over max_line: drop bytes up to its newline
        while True:
            with storage_errors(path, "read"):
                data = os.read(fd, chunk)
            if not data:
                break
            buf += data
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                if skipping:
                    skipping = False
                    yield None
                elif len(ln) > max_line:
                    yield None
                else:
                    yield ln
            if len(buf) > max_line:
                buf, skipping = b"", True
        if skipping:
            yield None
        elif buf:
            yield buf
    finally:
        os.close(fd)


def _own_dir(path: str) -> None:
    """Refuse a symlink (or a file) where a directory of the store belongs."""
    st = lstat(path)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        link = stat.S_ISLNK(st.st_mode)
        what = "a symlink" if link else "not a directory"
        raise UnreadableState(f"{path} is {what}: never followed", path=path,
                              reason="symlink" if link else "not_a_directory")


def own_dirs(*paths: str) -> bool:
    """Are the directories ``paths`` (each inside the one before it: ``history/``, then
    ``history/<id>/``) all there, each a directory itself? False at the first one missing;
    UnreadableState (reason ``not_a_directory``, as a symlinked ``sessions/`` at open) if a
    symlink or a file is in place of one: never followed, so nothing under it is read, written,
    listed or removed. One ``lstat`` each (StorageError if the disk refuses it)."""
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise_typed(e, path, "stat")
            raise
        if not stat.S_ISDIR(st.st_mode):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise UnreadableState(f"{path} is {what}, where a directory of the store belongs: "
                                  "never followed", path=path, reason="not_a_directory")
    return True


def list_names(path: str, *, follow: bool = True) -> list[str]:
    """One listing of a directory (``os.scandir``); [] if it does not exist. StorageError if the
    disk refuses it (a directory at mode 0000: EACCES; a file in its place: ENOTDIR).
    ``follow=False``: a symlink at ``path`` is refused (UnreadableState, reason ``symlink``)
    instead of listed through — for a directory whose entries the caller may delete."""
    if not follow:
        _own_dir(path)
    try:
        with os.scandir(path) as it:
            return [e.name for e in it]
    except FileNotFoundError:
        return []
    except OSError as e:  # storage_errors' translation, in the except clause (startup path)
        raise_typed(e, path, "list")
        raise


# Filesystems that cannot keep POSIX modes: every entry shows the mount's mask whatever chmod
# says (FAT, exFAT; "fuseblk" is exFAT or NTFS through FUSE, mounted without permissions).
_NO_MODES_FS = frozenset({"vfat", "msdos", "exfat", "fuseblk", "fuse.exfat", "fuse.ntfs-3g"})
_holds_modes: dict[int, bool] = {}


def holds_modes(path: str) -> bool:
    """Can the filesystem holding ``path`` keep a file mode (0600/0700)? Where it cannot, a wide
    mode is the mount's doing, not a problem to report or repair. Linux: the filesystem type from
    ``/proc/self/mountinfo`` (matched by device number); Windows never; elsewhere True."""
    if not MODES_HELD:  # Windows: ACLs and a read-only bit, on every filesystem
        return False
    try:
        dev = os.lstat(path).st_dev
    except OSError:
        return True
    got = _holds_modes.get(dev)
    if got is None:
        got = _fs_type(dev) not in _NO_MODES_FS
        _holds_modes[dev] = got
    return got


def _fs_type(dev: int) -> str | None:
    if not hasattr(os, "major"):  # Windows: no mountinfo; modes mean little there anyway
        return None
    want = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 3 and fields[2] == want and "-" in fields:
                    return fields[fields.index("-") + 1]
    except OSError:
        pass
    return None
