"""``doctor``'s look at the LangGraph threads (``langgraph/<thread dir>/``, ``_lgstore``).

Each thread directory is judged against the document that names it (docs/storage.md,
"LangGraph threads"), reading only; every repair is a move into ``quarantine/`` through the
repair gate (``_lgrepair``), taken under the thread's commit lock after the document is read
again, never a deletion:

- a directory whose session has no document (``langgraph_no_session``, information: a first
  put or a ``delete_thread`` a crash cut short, or another node's thread whose document a sync
  tool has not delivered yet — the thread's next first put sets it aside the same way);
- a log shorter than its document counts (``langgraph_log_short``: lost, or not delivered yet)
  or one that cannot be read (``langgraph_log_unreadable``): left as they are;
- bytes after the last acknowledged frame of the current log (``langgraph_torn_tail``,
  information: a put a crash cut short; readers ignore them, the next put cuts them);
- a log or record file the head does not name (``langgraph_stale_file``: a deletion's old log
  whose removal a crash cut short, or the new log of one that never committed);
- temp files, symlinks, foreign files and permissions, as in ``sessions/``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _fsio
from ._errors import UnreadableState
from ._layout import validate_session_id
from ._model import Session

if TYPE_CHECKING:
    from ._doctor import _Scan

_LOG = re.compile(r"^(\d+)\.lglog$")
_RECORD = re.compile(r"^(\d+)\.(ckpt|writes)$")
INFO = "info"


def _thread_id(name: str) -> str | None:
    try:
        return validate_session_id(name)
    except ValueError:
        return None


def threads(scan: _Scan, parsed: dict[str, Session | None]) -> None:
    """Judge every entry of ``langgraph/``; ``parsed``: the sessions doctor read (None: one it
    could not read, reported already)."""
    from ._lgstore import Threads

    base = scan.store.layout.langgraph
    names = sorted(_fsio.list_names(base, follow=False)) if _fsio.lstat(base) else []
    lg = Threads(scan.store)
    for n, name in enumerate(names, 1):
        scan.progress("langgraph threads", n, len(names))
        path = os.path.join(base, name)
        st = _fsio.lstat(path)
        if st is None:
            continue
        sid = _thread_id(name)
        if stat.S_ISLNK(st.st_mode):
            scan.add("symlink", path, "a symlink in langgraph/ (never followed)", session_id=sid,
                     repair="move to quarantine",
                     fix=scan.quarantine_fix(path, "langgraph", "symlink", sid, st))
        elif sid is None or not stat.S_ISDIR(st.st_mode):
            scan.add("foreign_file", path, "not a thread directory; the saver skips it",
                     severity=INFO)
        elif sid not in parsed:
            _orphan(scan, sid, path)
        elif parsed[sid] is not None:
            scan.permissions(path, st, 0o700)
            _thread(scan, lg, parsed[sid], path)  # type: ignore[arg-type]


def _locked(scan: _Scan, sid: str, still: Callable[[Session | None], bool],
            act: Callable[[], Any]) -> Callable[[], None]:
    """A repair that runs under the thread's commit lock, only if ``still(document)`` holds
    when the document is read again there (a saver may have written meanwhile)."""
    def fix() -> None:
        from ._errors import SessionNotFound

        with scan.store.commit_lock(sid, timeout=0):
            try:
                s = scan.store.load(sid)
            except SessionNotFound:
                s = None
            if not still(s):
                raise OSError("the thread changed while doctor looked: not repaired")
            act()

    return fix


def _orphan(scan: _Scan, sid: str, path: str) -> None:
    from ._lgrepair import set_aside_dir

    scan.add("langgraph_no_session", path, "a thread's files without its session document: a "
             "first put or a delete_thread a crash cut short, or another node's thread whose "
             "document has not arrived yet (the thread's next first put sets them aside too)",
             severity=INFO, session_id=sid, repair="move them to quarantine",
             fix=_locked(scan, sid, lambda s: s is None,
                         lambda: set_aside_dir(scan.store, sid, path, "no_session")))


def _thread(scan: _Scan, lg: Any, s: Session, directory: str) -> None:
    from ._lglog import head_of, log_name
    from ._lglog import scan as scan_log

    sid = s.id
    if "langgraph" not in s.metadata:
        scan.add("foreign_file", directory, f"session {sid!r} is no LangGraph thread; the saver "
                 "never reads this directory", severity=INFO, session_id=sid)
        return
    h = head_of(s)
    log = h.get("log")
    current = log_name(log["n"]) if log is not None else None
    if log is not None and current is not None:
        path = os.path.join(directory, current)
        try:
            lg.head(s)
            view = scan_log(path, None, scan.store.config.max_file_bytes)
        except UnreadableState as e:
            short = e.reason == "log_short"
            scan.add("langgraph_log_short" if short else "langgraph_log_unreadable", path,
                     f"{e.message}: " + ("lost, or not delivered by a sync tool yet; "
                                         if short else "") + "left as it is", session_id=sid)
            view = None
        st = _fsio.lstat(path)
        if view is not None and st is not None and st.st_size > view.head_end >= log["at"]:
            scan.add("langgraph_torn_tail", path, f"{st.st_size - view.head_end} byte(s) after "
                     "the last acknowledged frame (a put a crash cut short): every reader "
                     "ignores them, the thread's next put cuts them", severity=INFO,
                     session_id=sid)
    legacy = int(h.get("legacy", 0)) if log is not None else int(h.get("seq", 0))
    for name in sorted(_fsio.list_names(directory, follow=False)):
        _file(scan, sid, os.path.join(directory, name), name, current, legacy)


def _named(s: Session | None, name: str) -> bool:
    """Does the thread's document name this file of its directory?"""
    from ._lglog import head_of, log_name

    if s is None or "langgraph" not in s.metadata:
        return False
    h = head_of(s)
    log = h.get("log")
    if log is not None and name == log_name(log["n"]):
        return True
    m = _RECORD.match(name)
    legacy = int(h.get("legacy", 0)) if log is not None else int(h.get("seq", 0))
    return m is not None and int(m.group(1)) <= legacy


def _file(scan: _Scan, sid: str, path: str, name: str, current: str | None,
          legacy: int) -> None:
    from ._lgrepair import set_aside

    st = _fsio.lstat(path)
    if st is None or name == current:
        if st is not None:
            scan.permissions(path, st, 0o600)
        return
    if stat.S_ISLNK(st.st_mode):
        scan.add("symlink", path, "a symlink in a thread directory (never followed)",
                 session_id=sid, repair="move to quarantine",
                 fix=scan.quarantine_fix(path, "langgraph", "symlink", sid, st))
        return
    if name.startswith("~"):
        scan.own_temp(path, sid, "langgraph", st)  # a deletion's copy of the log
        return
    m = _RECORD.match(name)
    if m is not None and int(m.group(1)) <= legacy:
        scan.permissions(path, st, 0o600)  # a record of the older layout, read in place
        return
    if _LOG.match(name) is None and m is None:
        scan.add("foreign_file", path, "not a thread file; the saver skips it", severity=INFO)
        return
    scan.add("langgraph_stale_file", path, "a thread file its document does not name: a "
             "deletion's old log whose removal a crash cut short, or the new log of one that "
             "never committed; no reader opens it", severity=INFO, session_id=sid,
             repair="move to quarantine",
             fix=_locked(scan, sid, lambda s: s is not None and not _named(s, name),
                         lambda: _moved(set_aside(scan.store, sid, path, "stale_file"), path)))


def _moved(dest: str | None, path: str) -> None:
    if dest is None:
        raise OSError(f"could not move {path} to quarantine (changed, or refused)")


__all__ = ["threads"]
