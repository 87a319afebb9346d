"""The repair gate's acts on a LangGraph thread's files (``langgraph/<thread dir>/``).

The saver finds files no acknowledged document names in two places, and neither is its own
just-written file, so neither is removed: each goes through the repair gate's quarantine
(``_repair.quarantine``: the exact file judged by its stat, moved into ``quarantine/`` with a
``file_quarantined`` event, nothing deleted):

- a thread directory with files but no session document, found by the thread's next first put:
  a first put a crash cut short (nothing acknowledged), a ``delete_thread`` a crash cut short,
  or — where a sync tool carries the store — another node's thread whose document has not
  arrived yet. The saver cannot tell these apart (a log names no node), so it keeps them all;
- the thread's current log when it cannot be appended to: its header torn by a crash before
  anything was acknowledged in it, or a log of a migration that a crash cut short (a log the
  document does not name yet).

The caller holds the session's commit lock.
"""

from __future__ import annotations

from . import _fsio
from ._repair import quarantine
from ._store import Store

KIND = "langgraph"


def set_aside(store: Store, sid: str, path: str, reason: str) -> str | None:
    """Move one thread file into ``quarantine/`` (an event says so); where it went, or None if
    it is not there (or another process moved it first)."""
    return quarantine(store, path, kind=KIND, reason=reason, expect=_fsio.lstat(path),
                      session_id=sid)


def set_aside_dir(store: Store, sid: str, directory: str, reason: str) -> list[str]:
    """Every file of a thread directory that no document names, into ``quarantine/``; then the
    directory itself (empty) is removed. A planted symlink is refused, never followed."""
    moved = []
    for name in _fsio.list_names(directory, follow=False):
        dest = set_aside(store, sid, f"{directory}/{name}", reason)
        if dest is not None:
            moved.append(dest)
    if _fsio.lstat(directory) is not None and not _fsio.list_names(directory, follow=False):
        _fsio.rmdir(directory, durable=store.config.fsync)  # what stayed keeps it
    return moved


__all__ = ["KIND", "set_aside", "set_aside_dir"]
