"""Every disk operation of the store, and nothing else.

All writes, fsyncs, renames, links, unlinks, mkdirs and directory fsyncs of fsdurable pass through
this package, each announced to an optional *recorder* first (``set_recorder``). The crash-state
explorer records a workload this way; fault tests make the recorder raise ``OSError`` (ENOSPC,
EIO, ...) to inject a failure at an exact operation.

Four modules, one concept each:

- ``_base``: the recorder, the typed translation of the disk's refusals (``storage_errors``),
  the open flags and file modes;
- ``_read``: bounded reads, streamed lines, ``lstat``, listings, the store's own directories
  (``own_dirs``; never through a symlink, never blocking) and whether the filesystem keeps
  modes (``holds_modes``, ``MODES_HELD``);
- ``_write``: appends, renames, links, unlinks, directories and modes, with the fsyncs that
  make them durable and the Windows sharing-violation retry;
- ``_atomic``: the atomic replace, ``write_atomic`` (its durability contract is there), on
  ``_write``'s fsyncs.

Callers outside the package call ``_fsio.<name>``: a test that patches ``_fsio.<name>`` reaches
them. Inside, a module calls its own (or an imported) function directly, so a test that must
reach those calls too patches the defining module (``_fsio._write.fsync_dir``,
``_fsio._write._fsync_fd``, ``_fsio._write._SHARING_RETRY``, ``_fsio._read.MODES_HELD``).

``_write`` and ``_atomic`` are imported on the first use of one of their names
(``__getattr__``): opening a store whose directories exist and listing its markers writes
nothing, and never loads them.
"""

from __future__ import annotations

from ._base import DIR_MODE, FILE_MODE, set_recorder, storage_errors
from ._read import (
    holds_modes,
    is_dir,
    iter_lines,
    list_names,
    lstat,
    own_dirs,
    read_bounded,
    read_head,
    read_prefix,
    read_span,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from typing import Any

    from . import _write as _write
    from ._atomic import move_new, write_atomic
    from ._write import (
        append_at,
        append_line,
        chmod,
        fsync_dir,
        fsync_file,
        link,
        makedirs,
        open_lock,
        rename,
        rmdir,
        unlink,
        write_new,
    )

_WRITES = frozenset({"append_at", "append_line", "chmod", "fsync_dir", "fsync_file", "link",
                     "makedirs", "move_new", "open_lock", "rename", "rmdir", "unlink",
                     "write_atomic", "write_new"})
_ATOMIC = frozenset({"move_new", "write_atomic"})  # _atomic's (the rest: _write's)


def __getattr__(name: str) -> Any:
    """``_write``, ``_atomic`` and their names, imported on first use (then module attributes
    like the rest)."""
    if name in ("_write", "_atomic") or name in _WRITES:
        import sys

        # not `from . import`: its hasattr would come back here
        __import__(__name__ + "._write")
        write = sys.modules[__name__ + "._write"]
        if name == "_write":  # as _atomic's own import of it asks, before _atomic is complete
            return write
        __import__(__name__ + "._atomic")
        atomic = sys.modules[__name__ + "._atomic"]
        for n in _WRITES:
            globals().setdefault(n, getattr(atomic if n in _ATOMIC else write, n))
        return globals()[name] if name in _WRITES else atomic
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DIR_MODE", "FILE_MODE", "append_at", "append_line", "chmod", "fsync_dir",
           "fsync_file", "holds_modes", "is_dir", "iter_lines", "link", "list_names", "lstat",
           "makedirs", "move_new", "open_lock", "own_dirs", "read_bounded", "read_head",
           "read_prefix", "read_span", "rename", "rmdir", "set_recorder", "storage_errors",
           "unlink", "write_atomic", "write_new"]
