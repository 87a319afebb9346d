"""The atomic replace of a file, ``write_atomic``: the one write of the commit function.

Durability contract: the bytes are written to a temp file beside the target
(``~<name>.<random>.tmp``, a name Dropbox, Nextcloud and our ``.stignore`` skip), the temp file
is fsynced (``F_FULLFSYNC`` on macOS), renamed over the target (never following a symlink
planted there: rename replaces the link itself), and the directory is fsynced. When it returns,
the new content survives a power cut. If it raises before the rename, the old content is still
under the target name and the temp file is removed; if only the final directory fsync fails
(EIO), the rename has happened but its durability is unknown — the caller sees
``DurabilityUnknown`` (a StorageError carrying the new file's stat): the change is made.

The steps are atomicwrites' ``AtomicWriter`` protocol; who drives them depends on the platform
(``_ATOMICWRITES``). The fsyncs and the Windows sharing retry are ``_write``'s, called through
that module so a test that patches them there reaches these calls too.
"""

from __future__ import annotations

import errno
import os

from .._errors import DurabilityUnknown
from .._layout import TEMP_SUFFIX, temp_prefix
from . import _base
from . import _write as _w
from ._base import _O_BINARY, _O_CLOEXEC, _O_NOFOLLOW, FILE_MODE, _rec, raise_typed, storage_errors

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import IO, Any

# Who drives a write's steps. POSIX: this module, directly — atomicwrites' protocol there is the
# same steps (temp file, write, fsync, rename, directory fsync), all of which ``_posix`` performs
# itself, and ``import atomicwrites`` (``tempfile``, ``shutil``, ``random``, ``bz2``, ``lzma``)
# cost a fresh process's first commit 3.3 ms in a clean venv, 4.4 times a warm commit
# (bench/commit.py). Elsewhere (Windows): atomicwrites' ``AtomicWriter`` drives them and its
# ``replace_atomic``/``move_atomic`` rename (``MoveFileEx`` with ``MOVEFILE_WRITE_THROUGH``: the
# rename is on disk when it returns, where no directory can be fsynced). Tests force it here too.
_ATOMICWRITES = os.name != "posix"
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC | _O_BINARY
# path -> (its directory, the prefix of its temp files): a store writes the same few paths over
# and over (a session's document every commit); cleared past _NAMES_MAX entries
_NAMES: dict[str, tuple[str, str]] = {}
_NAMES_MAX = 1024


class _Steps:
    """Our steps of atomicwrites' ``AtomicWriter`` protocol (temp file beside the target, write,
    fsync, rename or create-if-absent; the temp file removed on failure): our temp names, every
    step recorded, the inode's stat kept. ``AtomicWriter.open`` drives them (``_writer``: the
    class built on it, on the first write); on POSIX ``_posix`` performs the same steps in one
    function, its create-if-absent through ``commit_name``."""

    _path: str
    _overwrite: bool
    if TYPE_CHECKING:  # AtomicWriter's, which the built class inherits
        def open(self) -> AbstractContextManager[IO[bytes]]: ...

    def __init__(self, path: str, *, overwrite: bool, durable: bool) -> None:
        self._path = path
        self._overwrite = overwrite
        self._durable = durable
        names = _NAMES.get(path)
        if names is None:
            names = _names(path)
        self.directory, self._prefix = names
        self._tmp = ""
        self._keep = -1  # the temp file's descriptor, open across the rename (closed by us)
        self.final: os.stat_result | None = None

    def create_temp(self) -> int:
        """The temp file, created as mkstemp does: O_CREAT|O_EXCL, mode 0600, never through a
        link; but the name is chosen first so the recorder sees the create BEFORE it happens (an
        injected fault then leaves nothing behind, like a real ENOSPC). Its descriptor is kept
        (``_keep``) for the stat after the rename, instead of reopening by name as atomicwrites
        does. The random part is os.urandom's, as secrets.token_hex's is (without importing
        secrets, which the first commit of a process paid 0.5 ms for)."""
        while True:
            name = self._prefix + os.urandom(6).hex() + TEMP_SUFFIX
            _rec("create", name)
            try:
                fd = os.open(name, _TEMP_FLAGS, FILE_MODE)
                break
            except FileExistsError:  # 48 random bits: practically never
                continue
        self._tmp = name
        self._keep = fd
        return fd

    def get_fileobject(self, **kwargs: Any) -> IO[bytes]:
        # atomicwrites' step (its ``open`` calls it): our temp file, as an unbuffered file
        # object that leaves the descriptor open (closefd=False) for the stat after the rename
        return open(self.create_temp(), "wb", buffering=0, closefd=False)

    def sync(self, f: IO[bytes]) -> None:
        f.flush()
        self.sync_fd(f.fileno())

    def sync_fd(self, fd: int) -> None:
        """The temp file's fsync (unless not ``durable``): ``sync``'s."""
        if self._durable:
            _w._sync_written(fd, self._tmp)

    def commit(self, f: IO[bytes] | None) -> None:
        if self._overwrite:
            _rec("rename", self._tmp, self._path)
            _w._retry_sharing(self._replace, self._tmp, self._path)
        else:
            self.commit_name()
        # the stat of OUR inode after the rename (which changed its ctime), race-free; the
        # directory fsync follows in write_atomic (a failure there is DurabilityUnknown)
        self.final = os.fstat(self._keep)

    def commit_name(self) -> None:
        """The temp file under the target's name, failing if it exists (no overwrite)."""
        try:
            _rec("link", self._tmp, self._path)
            self._create(self._tmp, self._path)
        except OSError as e:
            if e.errno not in _w._NO_HARD_LINKS:
                raise
            self._claim_then_rename()

    def _replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def _create(self, src: str, dst: str) -> None:
        """``src`` under the name ``dst``, failing if ``dst`` exists (no overwrite)."""
        os.link(src, dst)
        _rec("unlink", src)
        os.unlink(src)

    def _claim_then_rename(self) -> None:
        """Create-if-absent where hard links do not exist (exFAT, FAT, some network and FUSE
        filesystems): claim the name with O_EXCL (FileExistsError if taken), then rename the
        written temp file over the empty claim. A crash between the two leaves an empty file
        under the name, which readers judge unreadable (never a half-written one)."""
        _rec("create", self._path)
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
                     FILE_MODE)
        os.close(fd)
        _rec("rename", self._tmp, self._path)
        os.replace(self._tmp, self._path)

    def close_keep(self) -> None:
        if self._keep >= 0:
            os.close(self._keep)
            self._keep = -1

    def rollback(self, f: IO[bytes] | None) -> None:
        if self._tmp:
            _rec("unlink", self._tmp)
            os.unlink(self._tmp)


def _put(writer: _Steps, fd: int, data: bytes) -> None:
    """``data`` into the temp file's descriptor (both drivers: atomicwrites' file object is
    unbuffered over it); a short write (a signal, ENOSPC part-way) goes on."""
    _rec("write", writer._tmp, data)
    n = os.write(fd, data)
    if n < len(data):
        view = memoryview(data)[n:]
        while view:
            view = view[os.write(fd, view):]


_WRITER: list[type[_Steps]] = []


def _writer() -> type[_Steps]:
    """``_Steps`` on atomicwrites' ``AtomicWriter`` (a mandated dependency), built once, on the
    first write where it drives them (``_ATOMICWRITES``): its ``open`` runs the steps and its
    ``replace_atomic``/``move_atomic`` rename."""
    if not _WRITER:
        import atomicwrites

        class _Writer(_Steps, atomicwrites.AtomicWriter):  # type: ignore[misc]
            def __init__(self, path: str, *, overwrite: bool, durable: bool) -> None:
                atomicwrites.AtomicWriter.__init__(self, path, mode="wb", overwrite=overwrite)
                _Steps.__init__(self, path, overwrite=overwrite, durable=durable)

            def _replace(self, src: str, dst: str) -> None:
                atomicwrites.replace_atomic(src, dst)

            def _create(self, src: str, dst: str) -> None:
                atomicwrites.move_atomic(src, dst)

        _WRITER.append(_Writer)
    return _WRITER[0]


def write_atomic(
    path: str, data: bytes, *, overwrite: bool = True, durable: bool = True,
    dir_sync: bool = True
) -> os.stat_result:
    """Durably replace (or, ``overwrite=False``, create) ``path`` with ``data``.

    ``dir_sync=False``: the file is fsynced, its directory is not — for a batch of files in one
    directory whose caller fsyncs it once (``fsync_dir``) before anything names them.

    Returns the stat of the new file as it stands after the rename (taken through a descriptor
    of the same inode, so no other writer can slip in), for the caller to recognise its own write
    later without re-reading it.
    """
    if _ATOMICWRITES:
        final, directory = _atomicwriter(path, data, overwrite, durable)
    else:
        final, directory = _posix(path, data, overwrite, durable)
    if durable and dir_sync:
        try:
            _w.fsync_dir(directory)
        except OSError as e:  # renamed already: the new content is in place, not proven durable
            name = errno.errorcode.get(e.errno or 0, str(e.errno))
            raise DurabilityUnknown(
                f"{path} was replaced, but the directory fsync failed ({e.strerror or name}): "
                "the new content is in place and may not survive a power cut",
                path=path, reason=name, errno=e.errno, stat=final) from e
    return final


def _posix(path: str, data: bytes, overwrite: bool, durable: bool
           ) -> tuple[os.stat_result, str]:
    """(the new inode's stat, its directory): atomicwrites' steps on POSIX, in one function,
    each announced to the recorder first — the temp file created ``O_EXCL`` (``_Steps``'s
    name), written, fsynced, renamed over ``path`` (or, not ``overwrite``, linked or claimed:
    ``_Steps._create``/``_claim_then_rename``), its stat through the descriptor kept; on any
    failure the temp file removed (a failure of that removal never hides the first). One
    function, not a call per step: every commit writes this way, and each call a checkpoint
    makes costs it most after an fsync's wait, when the processor's caches are cold
    (bench/README.md, "small_checkpoint_vs_floor_rename")."""
    names = _NAMES.get(path)
    if names is None:
        names = _names(path)
    rec = _base._recorder
    tmp = ""
    fd = -1
    try:
        while True:
            name = names[1] + os.urandom(6).hex() + TEMP_SUFFIX
            if rec is not None:
                rec("create", (name,))
            try:
                fd = os.open(name, _TEMP_FLAGS, FILE_MODE)
                break
            except FileExistsError:  # 48 random bits: practically never
                continue
        tmp = name
        if rec is not None:
            rec("write", (tmp, data))
        n = os.write(fd, data)
        if n < len(data):  # a short write (a signal, ENOSPC part-way) goes on
            view = memoryview(data)[n:]
            while view:
                view = view[os.write(fd, view):]
        if durable:
            _w._sync_written(fd, tmp)
        if not overwrite:
            _create(tmp, path)
        else:
            if rec is not None:
                rec("rename", (tmp, path))
            if _w._SHARING_RETRY:
                _w._retry_sharing(os.replace, tmp, path)
            else:
                os.replace(tmp, path)
        tmp = ""  # renamed: nothing to remove from here on
        return os.fstat(fd), names[0]
    except BaseException as e:
        if tmp:
            try:
                if rec is not None:
                    rec("unlink", (tmp,))
                os.unlink(tmp)
            except Exception:  # as atomicwrites: the first error is the one raised
                pass
        if isinstance(e, OSError):
            raise_typed(e, path, "write")
        raise
    finally:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError as e:  # typed, as every other step's (EIO at close on NFS)
                raise_typed(e, path, "write")
                raise


def _names(path: str) -> tuple[str, str]:
    """(``path``'s directory, the prefix of its temp files), kept in ``_NAMES``."""
    directory, name = os.path.split(path)
    if len(_NAMES) >= _NAMES_MAX:
        _NAMES.clear()
    names = _NAMES[path] = (directory, os.path.join(directory, temp_prefix(name)))
    return names


def move_new(src: str, dst: str, *, durable: bool = True) -> None:
    """Move ``src`` to the name ``dst``, never replacing anything there (FileExistsError if
    ``dst`` exists): ``write_atomic``'s create-if-absent (``_create``: a hard link, then
    ``src`` unlinked; where there are no hard links, ``dst`` claimed ``O_EXCL`` and ``src``
    renamed over the claim), then both directories fsynced. How the repair gate puts a
    quarantined file back (``_repair.put_back``)."""
    with storage_errors(dst, "rename"):
        _create(src, dst)
    if durable:
        _w.fsync_dir(os.path.dirname(dst))
        if os.path.dirname(src) != os.path.dirname(dst):
            _w.fsync_dir(os.path.dirname(src))


def _create(tmp: str, path: str) -> None:
    """The written temp file under the name ``path``, failing if ``path`` exists (a create
    that must not overwrite): a hard link, or where there are none a claim (``_Steps``)."""
    steps = _Steps(path, overwrite=False, durable=False)
    steps._tmp = tmp
    steps.commit_name()


def _atomicwriter(path: str, data: bytes, overwrite: bool, durable: bool
                  ) -> tuple[os.stat_result, str]:
    """(the new inode's stat, its directory): the steps driven by atomicwrites'
    ``AtomicWriter`` (``_ATOMICWRITES``: where there is no POSIX rename to drive them)."""
    with storage_errors(path, "write"):
        writer = _writer()(path, overwrite=overwrite, durable=durable)
        try:
            with writer.open() as f:  # atomicwrites: get_fileobject, sync, commit | rollback
                _put(writer, f.fileno(), data)
            final = writer.final
            assert final is not None
        finally:
            writer.close_keep()
    return final, writer.directory


__all__ = ["move_new", "write_atomic"]
