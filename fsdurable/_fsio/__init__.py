"""Every disk operation of the store, and nothing else.

All writes, fsyncs, renames, links, unlinks, mkdirs and directory fsyncs of fsdurable pass through
this package, each announced to an optional *recorder* first (``set_recorder``). The crash-state
explorer records a workload this way; fault tests make the recorder raise ``OSError`` (ENOSPC,
EIO, ...) to inject a failure at an exact operation.

Three modules, one concept each:

- ``_base``: the recorder, the typed translation of the disk's refusals (``storage_errors``),
  the open flags and file modes;
- ``_read``: bounded reads, streamed lines, ``lstat``, listings (never through a symlink, never
  blocking) and whether the filesystem keeps modes (``holds_modes``, ``MODES_HELD``);
- ``_write``: atomic writes and appends, renames, links, unlinks, directories and modes, with
  the fsyncs that make them durable (``write_atomic``'s durability contract is there) and the
  Windows sharing-violation retry.

Callers outside the package call ``_fsio.<name>``: a test that patches ``_fsio.<name>`` reaches
them. Inside, a module calls its own (or an imported) function directly, so a test that must
reach those calls too patches the defining module (``_fsio._write.fsync_dir``,
``_fsio._write._fsync_fd``, ``_fsio._write._SHARING_RETRY``, ``_fsio._read.MODES_HELD``).

``_write`` is imported on the first use of one of its names (``__getattr__``): opening a store
whose directories exist and listing its markers writes nothing, and never loads it.
"""

from __future__ import annotations

from ._base import DIR_MODE, FILE_MODE, set_recorder, storage_errors
from ._read import (
    holds_modes,
    is_dir,
    iter_lines,
    list_names,
    lstat,
    read_bounded,
    read_prefix,
    read_span,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from typing import Any

    from . import _write as _write
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
        write_atomic,
        write_new,
    )

_WRITES = frozenset({"append_at", "append_line", "chmod", "fsync_dir", "fsync_file", "link",
                     "makedirs", "open_lock", "rename", "rmdir", "unlink", "write_atomic",
                     "write_new"})


def __getattr__(name: str) -> Any:
    """``_write`` and its names, imported on first use (then module attributes like the rest)."""
    if name == "_write" or name in _WRITES:
        import sys

        __import__(__name__ + "._write")  # not `from . import`: its hasattr would come back here
        write = sys.modules[__name__ + "._write"]
        for n in _WRITES:
            globals().setdefault(n, getattr(write, n))
        return globals()[name] if name in _WRITES else write
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DIR_MODE", "FILE_MODE", "append_at", "append_line", "chmod", "fsync_dir",
           "fsync_file", "holds_modes", "is_dir", "iter_lines", "link", "list_names", "lstat",
           "makedirs", "open_lock", "read_bounded", "read_prefix", "read_span", "rename", "rmdir",
           "set_recorder", "storage_errors", "unlink", "write_atomic", "write_new"]
