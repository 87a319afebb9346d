"""``quarantine/``: what is there (what it was, why, when), ``restore`` and ``purge``.

The repair gate names each file it moves ``<UTC time>-<random>-<kind>.<reason>-<original name>``
(older stores: without ``.<reason>``), so a listing needs no side file: it parses the name.
``restore`` puts a session back after a human fixed it — THROUGH THE COMMIT FUNCTION (its
version never goes backwards, a session already there is a ``ConflictError``), with an event.
Nothing here is ever deleted but by ``purge`` (``fsdurable quarantine --purge``), with an event
per file.
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
from ._errors import ConflictError, InvalidState, SessionNotFound
from ._model import Session
from ._names import classify
from ._store import Store

RESTORED = "quarantine_restored"
PURGED = "quarantine_purged"
_SESSION_KINDS = ("session", "conflict-session")


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
        return self.kind in _SESSION_KINDS and self.session_id is not None

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
    sid = classify(original)[1] if original.endswith(".json") else None
    return Quarantined(name, path, kind, original, reason, at, st.st_size if st else 0, sid)


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
    it follows its session (``fsdurable doctor --repair`` writes it)."""
    q = _find(store, name)
    if not q.restorable or q.session_id is None:
        raise InvalidState(
            f"{name} is a {q.kind} file: only sessions are restored (a marker is rebuilt from its "
            "session by `fsdurable doctor --repair`)", path=q.path, reason="not_restorable")
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
    store.emit(RESTORED, session_id=sid, path=q.path, version=new.version,
               from_version=s.version, kind=q.kind, cause=q.reason)
    return new


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


__all__ = ["PURGED", "RESTORED", "Quarantined", "listing", "purge", "restore"]
