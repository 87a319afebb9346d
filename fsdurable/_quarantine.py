"""``quarantine/``: what is there (what it was, why, when), ``restore`` and ``purge``.

The repair gate names each file it moves ``<UTC time>-<random>-<kind>.<reason>-<original name>``
(older stores: without ``.<reason>``), so a listing needs no side file: it parses the name (and,
for an item log, whose name holds no session id, its header line: a bounded read).
``restore`` puts a session back after a human fixed it — THROUGH THE COMMIT FUNCTION (its
version never goes backwards, a session already there is a ``ConflictError``), with an event —
and with it the item logs its document names that sit in ``quarantine/`` (a session that
started over set its old log aside: docs/storage.md, "Item logs"). An item log is restored on
its own too, once its session's document names it: moved back through the repair gate, the log
in its place (another session's start over) set aside first. Nothing here is ever deleted but by
``purge`` (``fsdurable quarantine --purge``), with an event per file.
"""

from __future__ import annotations

import calendar
import os
import stat
import time
from typing import Any

import attrs

from . import _fsio, _repair
from ._codec import parse_session
from ._errors import ConflictError, FsDurableError, InvalidState, SessionNotFound, StorageError
from ._itemlog import header_line, log_name, named, refs, same_log, scan
from ._layout import validate_session_id
from ._model import Session
from ._names import classify
from ._store import Store

RESTORED = "quarantine_restored"
PURGED = "quarantine_purged"
SESSION_KINDS = ("session", "conflict-session")  # the kinds that are session documents
_LOG_KIND = "item-log"  # _oaitems: a log no document named when a session started over


@attrs.frozen
class Quarantined:
    """One file in ``quarantine/``."""

    name: str
    path: str
    kind: str  # session, marker, manifest, conflict-session, session-temp, events, ...
    original: str  # its name where it was
    reason: str | None  # why it was moved (None: not recorded in its name)
    at: float | None  # when (UTC seconds)
    size: int
    session_id: str | None = None

    @property
    def restorable(self) -> bool:
        return self.kind in (*SESSION_KINDS, _LOG_KIND) and self.session_id is not None

    def describe(self) -> str:
        when = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at))
                if self.at is not None else "at an unknown time")
        return (f"{self.kind} {self.original}, {self.reason or 'reason not recorded'}, "
                f"moved {when}")

    def to_dict(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "restorable": self.restorable}


def parse_name(store: Store, name: str) -> Quarantined:
    path = os.path.join(store.layout.quarantine, name)
    st = _fsio.lstat(path)
    m = _repair._NAME.match(name)
    if m is None:
        return Quarantined(name, path, "unknown", name, None, None, st.st_size if st else 0)
    stamp, _, dotted, reason, bare, original = m.groups()
    kind = dotted or bare
    try:
        at: float | None = calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%S"))
    except ValueError:
        at = None
    sid = (_log_session(path) if kind == _LOG_KIND else  # its header: a log's name has none
           classify(original)[1] if original.endswith(".json") else None)
    return Quarantined(name, path, kind, original, reason, at, st.st_size if st else 0, sid)


def _log_session(path: str) -> str | None:
    """The session an item log's header names (None: no valid header, or no valid id)."""
    try:
        sid = header_line(path)[0].get("session_id")
        return validate_session_id(sid)
    except (OSError, FsDurableError):
        return None


def listing(store: Store) -> list[Quarantined]:
    """Every file in ``quarantine/``, oldest first. Reads only."""
    out = [parse_name(store, n) for n in _fsio.list_names(store.layout.quarantine)
           if not n.startswith(("~", "."))]
    out.sort(key=lambda q: (q.at or 0.0, q.name))
    return out


def _find(store: Store, name: str) -> Quarantined:
    if os.path.basename(name) != name or name in ("", ".", ".."):
        raise InvalidState(f"{name!r} is not a name in quarantine/", path=name,
                           reason="bad_name")
    q = parse_name(store, name)
    if _fsio.lstat(q.path) is None:
        raise SessionNotFound(f"no {name} in quarantine/ (see `fsdurable quarantine list`)",
                              path=q.path, reason="missing")
    return q


def restore(store: Store, name: str) -> Session:
    """Put a quarantined session back, once a human fixed it: it is parsed (UnreadableState if
    it still cannot be read), committed through the commit function as a new session (its
    version continues from the file's own, so it never goes backwards), and only then is the
    quarantined file removed — its content now lives in ``sessions/`` — with a
    ``quarantine_restored`` event. A session already under that id is a ``ConflictError``
    (choose between them with ``fsdurable resolve ID --keep PATH``). A marker is not restored:
    it follows its session (``fsdurable doctor --repair`` writes it). The item logs the
    document names that are not in place and sit in ``quarantine/`` come back with it
    (``restore_log``; the event's ``logs``); one that is nowhere leaves the session waiting
    for sync, as any missing log does.

    ``name`` an item log: ``restore_log``, and the session it belongs to is returned."""
    q = _find(store, name)
    if q.kind == _LOG_KIND and q.session_id is not None:
        return restore_log(store, q)
    if not q.restorable or q.session_id is None:
        raise InvalidState(
            f"{name} is a {q.kind} file: only sessions and item logs are restored (a marker is "
            "rebuilt from its session by `fsdurable doctor --repair`)", path=q.path,
            reason="not_restorable")
    sid = q.session_id
    data, st = _fsio.read_bounded(q.path, store.config.max_file_bytes)
    s, _ = parse_session(data, path=q.path, session_id=sid,
                         history_dir=store.layout.history_dir(sid),
                         max_bytes=store.config.max_file_bytes)
    with store.commit_lock(sid):
        if store.exists(sid):
            raise ConflictError(
                f"session {sid!r} exists: keep one with `fsdurable resolve {sid} --keep "
                f"{q.path}`", session_id=sid, path=store.layout.session(sid),
                reason="exists")
        owner = _repair.owner_of(s) if s.in_progress else None
        new = store._commit_locked(s, 0, at_least=s.version + 1, owner=owner)
        now = _fsio.lstat(q.path)
        if now is not None and stat.S_ISREG(now.st_mode) and _repair.key(now) == _repair.key(st):
            _fsio.unlink(q.path, durable=store.config.fsync)
        logs = _logs_back(store, new)
    store.emit(RESTORED, session_id=sid, path=q.path, version=new.version,
               from_version=s.version, kind=q.kind, cause=q.reason, logs=logs)
    return new


def restore_log(store: Store, q: Quarantined) -> Session:
    """Put a quarantined item log back where its session's document names it: the document
    must name that log (its number and generation: InvalidState ``not_named``) and the log must
    hold all the document has seen (``log_short``); a log already in place is a ConflictError
    (``exists``). Another log in its place (a session that started over) is set aside into
    ``quarantine/`` first (``file_quarantined``, reason ``displaced``); then the log is moved
    back through the repair gate, under the session's commit lock, with a
    ``quarantine_restored`` event. Returns the session."""
    sid = q.session_id
    if sid is None:
        raise InvalidState(f"{q.name} names no session in its header", path=q.path,
                           reason="not_restorable")
    with store.commit_lock(sid):
        s = store.load(sid)
        dest = _put_log_back(store, s, q)
    store.emit(RESTORED, session_id=sid, path=q.path, version=s.version, kind=q.kind,
               cause=q.reason, moved_to=dest)
    return s


def _put_log_back(store: Store, s: Session, q: Quarantined) -> str:
    """Move the item log ``q`` (its header names session ``s``: ``parse_name``) to the place
    of the log of ``s``'s document it is (the caller holds the commit lock); where it went.
    A symlink (or a file) in place of ``history/`` or ``history/<id>/`` is refused before
    anything there is read or moved (UnreadableState ``not_a_directory``)."""
    sid, cap = s.id, store.config.max_file_bytes
    _fsio.own_dirs(store.layout.history, store.layout.history_dir(sid))
    st = _fsio.lstat(q.path)
    view = scan(q.path, None, cap) if st is not None else None
    if st is None or view is None:
        raise SessionNotFound(f"{q.name} left quarantine/ meanwhile: nothing restored",
                              session_id=sid, path=q.path, reason="missing")
    ref = next((r for r in refs(s).values() if same_log(view, r)), None)
    if ref is None:
        raise InvalidState(f"{q.name} is log {view.n} of session {sid!r}, which its document "
                           "does not name: nothing would read it", session_id=sid,
                           path=q.path, reason="not_named")
    if not named(view, ref):
        raise InvalidState(f"{q.name} holds less than session {sid!r}'s document has seen "
                           f"(byte {ref['at']})", session_id=sid, path=q.path,
                           reason="log_short")
    dest = os.path.join(store.layout.history_dir(sid), log_name(ref["n"]))
    there = _fsio.lstat(dest)
    if there is not None:
        try:
            in_place = stat.S_ISREG(there.st_mode) and named(scan(dest, None, cap), ref)
        except FsDurableError:
            in_place = False
        if in_place:
            raise ConflictError(f"session {sid!r}'s log {log_name(ref['n'])} is in place "
                                f"already: {q.name} stays in quarantine/", session_id=sid,
                                path=dest, reason="exists")
        if _repair.quarantine(store, dest, kind=_LOG_KIND, reason="displaced", expect=there,
                              session_id=sid) is None:
            raise StorageError(f"{dest} could not be set aside (see the event log): "
                               f"{q.name} stays in quarantine/", session_id=sid, path=dest,
                               reason="not_set_aside")
    try:
        _repair.put_back(store, q.path, dest, st)
    except FileNotFoundError:  # moved, purged or changed since it was judged
        raise SessionNotFound(f"{q.name} changed or left quarantine/ meanwhile: nothing "
                              "restored", session_id=sid, path=q.path, reason="missing") from None
    return dest


def _logs_back(store: Store, s: Session) -> list[str]:
    """The item logs restored with the document ``s``: each of its logs in ``quarantine/``
    that it names, holding all it has seen, and not in place already. Where each went."""
    try:  # a malformed reference, a symlinked history dir: nothing guessed, nothing read
        refs(s)
        _fsio.own_dirs(store.layout.history, store.layout.history_dir(s.id))
        quarantined = [q for q in listing(store) if q.kind == _LOG_KIND and q.session_id == s.id]
    except (OSError, FsDurableError):
        return []
    out: list[str] = []
    for q in quarantined:
        try:
            out.append(_put_log_back(store, s, q))
        except (OSError, FsDurableError):
            continue  # not one it names, short, in place already, moved meanwhile
    return out


def purge(store: Store, names: list[str] | None = None) -> list[str]:
    """Delete files from ``quarantine/`` — the named ones, or all of them — each with a
    ``quarantine_purged`` event. The one way anything fsdurable kept aside is ever deleted."""
    targets = [_find(store, n) for n in names] if names else listing(store)
    done = []
    for q in targets:
        st = _fsio.lstat(q.path)
        if st is None:
            continue
        if stat.S_ISDIR(st.st_mode):  # a symlinked events dir moved aside is a link, not this
            raise InvalidState(f"{q.name} is a directory: remove it by hand", path=q.path,
                               reason="directory")
        _fsio.unlink(q.path, durable=store.config.fsync)
        store.emit(PURGED, session_id=q.session_id, path=q.path, kind=q.kind, cause=q.reason,
                   size=q.size)
        done.append(q.path)
    return done


__all__ = ["PURGED", "RESTORED", "SESSION_KINDS", "Quarantined", "listing", "purge", "restore",
           "restore_log"]
