"""Sync between machines: conflict copies, ``resolve`` and ``adopt``.

A store may live in a Syncthing, Dropbox or Nextcloud folder, or be carried by rsync or Unison.
Those tools never merge: when both sides changed a file they keep one under its name and write the
other beside it as a *conflict copy* (names in ``_layout``). Listings skip conflict copies, so they
never pass for a session; this module shows each with its version (``versions``), and ``resolve``
keeps one version and moves every other into ``quarantine/`` — nothing is lost, and it is an event.

Node identity (``_layout.node_id``: ``FSDURABLE_NODE`` or a random id in the machine-local state
dir, never inside the store) is stamped on every marker; recovery runs only this node's markers.
``adopt`` takes a foreign node's interrupted turn over explicitly (an event) and resumes it —
unattended, like every recovered turn. Nothing machine-local is ever written inside the store.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import attrs

from . import _events as ev
from . import _fsio, _repair
from ._codec import parse_marker, parse_session
from ._errors import (
    HistoryUnavailable,
    InvalidState,
    SessionNotFound,
    TurnStateError,
    UnreadableState,
)
from ._layout import validate_session_id
from ._model import Marker, Session
from ._names import NameKind, classify
from ._store import Store

if TYPE_CHECKING:
    from ._recovery import Host, Outcome, RecoveryPolicy

KEEP_NEWEST = "newest"
KEEP_LOCAL = "local"
SESSION = "session"
MARKER = "marker"


def tool_of(name: str) -> str:
    """Which sync tool wrote a conflict copy, judged by its name."""
    low = name.lower()
    if ".sync-conflict-" in low:
        return "syncthing"
    if "conflicted copy" in low:
        return "dropbox/nextcloud"
    if "conflict_on_" in low or "conflict on" in low:
        return "unison"
    return "unknown"


@attrs.frozen
class Version:
    """One version of a session (or of its marker): the store's own file, or a conflict copy."""

    path: str
    kind: str  # "session" | "marker"
    local: bool  # the store's own file (``sessions/<id>.json``), not a copy
    tool: str | None  # the sync tool that wrote the copy; None for the store's own file
    size: int
    mtime: float  # shown to humans only: every decision is made on ``version``
    version: int | None = None  # the session's version (a marker: the version it was written at)
    updated_at: float | None = None
    in_progress: bool | None = None
    turn_id: str | None = None
    node_id: str | None = None  # markers: the node that owns the turn
    messages: int | None = None
    error: str | None = None  # why it could not be read (then it can only be quarantined)
    session: Session | None = attrs.field(default=None, repr=False, eq=False)
    marker: Marker | None = attrs.field(default=None, repr=False, eq=False)
    # the stat it was judged by: ``resolve`` moves only that exact file (the repair gate's rule)
    stat: os.stat_result | None = attrs.field(default=None, repr=False, eq=False)

    def describe(self) -> str:
        """One line for humans: ``version 7, in progress (turn t1), 12 messages, updated ...``."""
        if self.error is not None:
            return f"unreadable ({self.error})"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.updated_at or self.mtime))
        if self.kind == MARKER:
            return (f"marker at session version {self.version}, turn {self.turn_id}, "
                    f"node {self.node_id}, checkpoint {when}")
        state = f"in progress (turn {self.turn_id})" if self.in_progress else "idle"
        count = "history unreadable" if self.messages is None else f"{self.messages} messages"
        return f"version {self.version}, {state}, {count}, updated {when}"

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self, filter=lambda a, v: a.name not in ("session", "marker", "stat"))


def read_version(store: Store, path: str, session_id: str, kind: str = SESSION, *,
                 local: bool = False) -> Version:
    """Read one file as a version of ``session_id`` WITHOUT changing anything (no quarantine, no
    migration write): conflict copies are evidence, and only ``resolve`` moves them."""
    name = os.path.basename(path)
    tool = None if local else tool_of(name)
    try:
        data, st = _fsio.read_bounded(path, store.config.max_file_bytes)
    except FileNotFoundError:
        raise
    except UnreadableState as e:
        ls = _fsio.lstat(path)
        return Version(path=path, kind=kind, local=local, tool=tool,
                       size=ls.st_size if ls else 0, mtime=ls.st_mtime if ls else 0.0,
                       error=e.reason or "unreadable", stat=ls)
    base = Version(path=path, kind=kind, local=local, tool=tool, size=st.st_size,
                   mtime=st.st_mtime, stat=st)
    try:
        if kind == MARKER:
            m = parse_marker(data, path=path, session_id=session_id)
            return attrs.evolve(base, version=m.session_version, updated_at=m.checkpoint_at,
                                in_progress=True, turn_id=m.turn_id, node_id=m.node_id,
                                marker=m)
        # its history is the store's history of that session, wherever the document lies
        s, _ = parse_session(data, path=path, session_id=session_id,
                             history_dir=store.layout.history_dir(session_id),
                             max_bytes=store.config.max_file_bytes)
    except UnreadableState as e:
        return attrs.evolve(base, error=e.reason or "unreadable")
    try:
        n: int | None = len(s.messages)
    except HistoryUnavailable:  # a summary naming more than its chain holds: shown, not counted
        n = None
    return attrs.evolve(base, version=s.version, updated_at=s.updated_at,
                        in_progress=s.in_progress, turn_id=s.turn.id if s.turn else None,
                        messages=n, session=s)


def versions(store: Store, session_id: str, kind: str = SESSION) -> list[Version]:
    """The store's own file (first, if present) and every conflict copy of one session or marker."""
    sid = validate_session_id(session_id)
    directory = store.layout.sessions if kind == SESSION else store.layout.markers
    out: list[Version] = []
    own: Version | None = None
    for name in sorted(_fsio.list_names(directory)):
        k, of = classify(name)
        if of != sid or k not in (NameKind.OWN, NameKind.CONFLICT):
            continue
        try:
            v = read_version(store, os.path.join(directory, name), sid, kind,
                             local=k is NameKind.OWN)
        except FileNotFoundError:
            continue  # gone between the listing and the read
        if v.local:
            own = v
        else:
            out.append(v)
    return ([own] if own is not None else []) + out


def conflict_copies(store: Store) -> dict[str, list[Version]]:
    """Every conflict copy in the store (sessions and markers), by session id: one listing each."""
    found: dict[str, list[Version]] = {}
    for kind, directory in ((SESSION, store.layout.sessions), (MARKER, store.layout.markers)):
        for name in sorted(_fsio.list_names(directory)):
            k, sid = classify(name)
            if k is not NameKind.CONFLICT or sid is None:
                continue
            try:
                v = read_version(store, os.path.join(directory, name), sid, kind)
            except FileNotFoundError:
                continue
            found.setdefault(sid, []).append(v)
    return found


# ---------------------------------------------------------------------- resolve


@attrs.frozen
class Resolution:
    """What ``resolve`` did: the version kept, and where every other one went."""

    session_id: str
    keep: str
    kept: str | None  # the path of the version kept (as it was before resolving)
    kept_version: int | None  # its version then
    version: int | None  # the session's version on disk now
    quarantined: tuple[str, ...]  # where the other versions (and stale marker copies) went
    changed: bool
    kept_moved_to: str | None = None  # a kept conflict copy, set aside once committed

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _pick(sess: list[Version], keep: str) -> Version:
    sid_path = sess[0].path if sess else "?"
    if keep == KEEP_NEWEST:
        readable = [v for v in sess if v.error is None and v.version is not None]
        if not readable:
            raise UnreadableState(f"no readable version of the session at {sid_path}",
                                  path=sid_path, reason="no_readable_version")
        # the newest COMMIT wins: its commit time (``updated_at``, written inside the file —
        # never the file's mtime, which a sync tool rewrites); a tie goes to the higher
        # version, then to the store's own file. Two nodes number their commits separately,
        # so the highest version is not the newest.
        return max(readable, key=lambda v: (v.updated_at or 0.0, v.version or 0, v.local))
    local = next((v for v in sess if v.local), None)
    if local is None:
        raise SessionNotFound("there is no local version to keep (only conflict copies): use "
                              "--keep newest or --keep PATH", path=sid_path, reason="missing")
    if local.error is not None:
        raise UnreadableState(f"the local version is unreadable ({local.error}): use --keep "
                              "newest or --keep PATH", path=local.path, reason=local.error)
    return local


def _preserve(store: Store, v: Version) -> str:
    """Copy a version that is about to be overwritten into ``quarantine/`` (not a move: the
    session file must never be absent while its marker says it is in progress)."""
    return _repair.copy_aside(store, v.path, f"conflict-{v.kind}", "conflict_resolved")


def _move(store: Store, v: Version, sid: str) -> str:
    where = _repair.quarantine(store, v.path, kind=f"conflict-{v.kind}",
                               reason="conflict_resolved", expect=v.stat, session_id=sid)
    if where is None:
        raise InvalidState(f"could not move {v.path} to quarantine (changed since it was "
                           "read, or the disk refused)", path=v.path, session_id=sid,
                           reason="quarantine_failed")
    return where


def resolve(store: Store, session_id: str, *, keep: str = KEEP_NEWEST) -> Resolution:
    """Resolve a session's conflict copies: keep one version, quarantine every other.

    ``keep``: ``"newest"`` (the latest commit, by the commit time written in each file; a tie
    goes to the higher version, then to the local file), ``"local"`` (the store's own file), or
    a PATH to one of the versions (a conflict copy, or a session file elsewhere, e.g. taken back
    out of ``quarantine/``). A kept copy is
    committed over the local file through the one commit function (compare-and-swap on the local
    version, marker first); the session's new version is above every version seen; the local
    file's old content is copied into ``quarantine/`` first. Every conflict copy of the session and
    of its marker ends in ``quarantine/`` and the marker is made to agree with the session.
    A version in a newer format than this fsdurable reads (another node's, upgraded) is never
    moved: ``resolve`` then refuses (``UnreadableState``, reason ``needs_newer``), changing
    nothing. ``quarantined`` lists the versions that lost (and stale marker copies); a kept conflict
    copy, whose content now is the session, is moved aside too but reported as ``kept_moved_to``,
    never among the losers. Every move goes through the repair gate (the exact file read).
    Emits ``conflict_resolved``. Holds the session's route lock, so a turn running here is never
    changed under its feet. Keeping an in-progress copy makes this node the owner of that turn
    (the event says which node had it).
    """
    sid = validate_session_id(session_id)
    # the route lock first (from what the files say now), then everything is read under it
    seen = [v for v in versions(store, sid, SESSION) if v.session is not None]
    route = seen[0].session.route_key if seen and seen[0].session else f"session:{sid}"
    with store.lock(route):
        return _resolve_locked(store, sid, keep)


def _resolve_locked(store: Store, sid: str, keep: str) -> Resolution:
    sess = versions(store, sid, SESSION)
    marks = versions(store, sid, MARKER)
    copies = [v for v in sess if not v.local]
    mcopies = [v for v in marks if not v.local]
    local = next((v for v in sess if v.local), None)
    newer = [v.path for v in (*sess, *marks) if v.error == "unknown_version"]
    if newer:  # the repair gate's rule: a newer format is never moved (nor judged "older")
        raise UnreadableState(f"{', '.join(newer)}: written by a newer fsdurable (needs_newer);"
                              f" nothing was moved — resolve {sid} on the upgraded node, or "
                              "upgrade fsdurable here", path=newer[0], session_id=sid,
                              reason="needs_newer")
    mode = keep if keep in (KEEP_NEWEST, KEEP_LOCAL) else "path"
    if mode != "path" and not copies and not mcopies:
        if local is None:
            raise SessionNotFound(f"no session {sid!r}", session_id=sid, reason="missing")
        return Resolution(session_id=sid, keep=mode, kept=local.path, kept_version=local.version,
                          version=local.version, quarantined=(), changed=False)
    external = False
    if mode == "path":
        want = os.path.realpath(keep)
        match = next((v for v in sess if os.path.realpath(v.path) == want), None)
        if match is None:
            if any(os.path.realpath(v.path) == want for v in marks):
                raise InvalidState("keep a version of the session: its marker follows it",
                                   path=keep, session_id=sid, reason="marker_path")
            try:
                match = read_version(store, want, sid, SESSION)
            except FileNotFoundError as e:
                raise SessionNotFound(f"no file {keep}", path=keep, session_id=sid,
                                      reason="missing") from e
            external = True
        if match.error is not None:
            raise UnreadableState(f"{keep} cannot be kept: {match.error}", path=keep,
                                  session_id=sid, reason="unreadable")
        winner = match
    else:
        winner = _pick(sess, mode)
    assert winner.session is not None
    prev_owner = next((v.node_id for v in marks if v.local and v.error is None), None)
    moved: list[str] = []
    version = winner.version
    if winner is not local:
        if local is not None and local.error is None:
            moved.append(_preserve(store, local))
            base = local.version or 0
            base_commit = local.session.commit_id if local.session is not None else ""
        elif local is not None:
            moved.append(_move(store, local, sid))  # unreadable: nothing to compare with
            base, base_commit = 0, ""
        else:
            base, base_commit = 0, ""
        # ConflictError if it moved meanwhile; the result is above every version seen, so
        # versions keep increasing on every machine the copies came from
        top = max((v.version or 0 for v in (*sess, winner)), default=0)
        s = store.commit(winner.session, base, at_least=top + 1, base_commit_id=base_commit)
        version = s.version
    elif mode == KEEP_NEWEST and any((v.version or 0) >= (local.version or 0) for v in copies):
        # the local file is the latest commit but a copy carries a version as high: re-commit
        # it above every version seen (the same content), so no copy's number is ever reused
        # (``--keep local`` leaves the local file untouched, as its name says)
        assert local is not None and local.session is not None
        top = max(v.version or 0 for v in sess)
        s = store.commit(local.session, local.version or 0, at_least=top + 1,
                         base_commit_id=local.session.commit_id)
        version = s.version
    kept_moved = None
    for v in copies:
        if v is winner:
            if not external:
                kept_moved = _move(store, v, sid)  # its content is the session now
            continue
        moved.append(_move(store, v, sid))
    for v in mcopies:
        moved.append(_move(store, v, sid))
    _repair.repair_marker(store, sid)
    adopted = (winner is not local and winner.in_progress and prev_owner is not None
               and prev_owner != store.node_id)
    store.emit(ev.CONFLICT_RESOLVED, session_id=sid, turn_id=winner.turn_id, reason=mode,
               kept=winner.path, kept_version=winner.version, version=version,
               quarantined=moved, versions=[_brief(v) for v in sess + marks],
               **({"adopted_from": prev_owner} if adopted else {}))
    return Resolution(session_id=sid, keep=mode, kept=winner.path, kept_version=winner.version,
                      version=version, quarantined=tuple(moved), changed=True,
                      kept_moved_to=kept_moved)


def _brief(v: Version) -> dict[str, Any]:
    return {"path": v.path, "kind": v.kind, "local": v.local, "version": v.version,
            "in_progress": v.in_progress, "error": v.error}


# ---------------------------------------------------------------------- adopt


def foreign_turns(store: Store) -> list[Marker]:
    """Interrupted turns owned by other nodes (listed, never run here unless adopted)."""
    me = store.node_id
    return [m for m in store.interrupted() if m.node_id != me]


def take_over(store: Store, session_id: str) -> Marker:
    """Make this node the owner of another node's interrupted turn, under the turn's route lock.

    The session is re-committed unchanged (same turn, same checkpoint time, same attempt count:
    adopting never makes a stale turn fresh, nor resets the attempt cap); the commit rewrites the
    marker with this node's id (``owner=``: no other commit ever moves a turn). Emits
    ``interrupted_turn_adopted``. Raises TurnStateError if no turn is interrupted there, if it is
    already this node's, or if the session moved on.
    """
    sid = validate_session_id(session_id)
    m = store.read_marker(sid)
    if m is None:
        raise TurnStateError(f"session {sid!r} has no interrupted turn", session_id=sid,
                             reason="no_marker")
    me = store.node_id
    with store.lock(m.route_key):
        m2 = store.read_marker(sid)
        if m2 is None or m2.turn_id != m.turn_id:
            raise TurnStateError(f"the interrupted turn of {sid!r} changed meanwhile",
                                 session_id=sid, reason="superseded")
        if m2.node_id == me:
            raise TurnStateError(f"the interrupted turn of {sid!r} is already this node's "
                                 f"({me}): recovery runs it", session_id=sid, reason="not_foreign")
        s = store.load(sid)
        if not s.in_progress or s.turn is None or s.turn.id != m2.turn_id:
            raise TurnStateError(f"session {sid!r} is no longer on turn {m2.turn_id}",
                                 session_id=sid, reason="superseded")
        store.commit(s, s.version, owner=me)  # the one explicit change of a turn's owner
        mine = store.read_marker(sid)
        assert mine is not None and mine.node_id == me
    store.emit(ev.ADOPTED, session_id=sid, turn_id=m2.turn_id, reason="explicit",
               from_node=m2.node_id, to_node=me)
    return mine


class _LeaveForHost:
    """Stands in for a host loop when ``adopt`` is given none: the gates that need no loop are
    applied (stale / exhausted abandoned), a resumable turn is left for this node's host."""

    def tool_effect(self, name: str) -> str | None:
        return None  # unknown: an in-doubt call parks the turn, never a blind re-run

    def resume_claimed(self, session: Session) -> Any:
        raise TurnStateError("no host loop to resume the turn with", session_id=session.id,
                             reason="no_loop")


def adopt(store: Store, session_id: str, loop: Host | None = None, *,
          policy: RecoveryPolicy | None = None) -> Outcome:
    """Take another node's interrupted turn over (``take_over``, an ``interrupted_turn_adopted``
    event) and resume it through recovery's ``resume_one`` — under its original route lock, with
    the attempt committed before the model call, and UNATTENDED like every recovered turn (the
    loop's ``resume_claimed`` has no way to run it attended). Staleness and the attempt cap
    still apply: adopting an expired turn abandons it, with its event.

    Without ``loop`` (the CLI has no host tools) the turn becomes this node's and is left
    (outcome ``left``) for the host's next ``fsdurable.recover(store, loop)``.
    Returns recovery's ``Outcome``.
    """
    from ._recovery import resume_one

    marker = take_over(store, session_id)
    host = loop if loop is not None else _LeaveForHost()
    return resume_one(store, host, marker, adopt=True, policy=policy, resume=loop is not None)


def conflict_detail(store: Store, path: str, session_id: str, kind: str = SESSION) -> str:
    """What ``doctor`` says about one conflict copy: both versions, and what resolve would keep."""
    sid = validate_session_id(session_id)
    try:
        copy = read_version(store, path, sid, kind)
    except FileNotFoundError:
        return f"a conflict copy of {kind} {sid} (gone since the listing)"
    own = store.layout.session(sid) if kind == SESSION else store.layout.marker(sid)
    try:
        local: Version | None = read_version(store, own, sid, kind, local=True)
    except FileNotFoundError:
        local = None
    text = (f"{copy.tool} conflict copy of {kind} {sid}: copy {copy.describe()}; local "
            f"{local.describe() if local is not None else 'missing'}")
    if kind == MARKER:
        return text + f"; the marker follows the session: run `fsdurable resolve {sid}`"
    try:
        pick = _pick([v for v in (local, copy) if v is not None], KEEP_NEWEST)
        which = "the local file" if pick.local else "the copy"
        hint = f" (--keep newest keeps {which}, version {pick.version}: the latest commit)"
    except UnreadableState:
        hint = " (neither is readable: --keep PATH)"
    return text + f"; run `fsdurable resolve {sid}`{hint}"


IGNORE_FILES = ("stignore", "rsync-filter", "unison.prf", "dropbox-nextcloud.txt")


def ignore_file(name: str) -> str:
    """Path of a shipped ignore file: ``stignore`` (Syncthing), ``rsync-filter``, ``unison.prf``,
    ``dropbox-nextcloud.txt`` (a note). They keep half-written files out of sync."""
    if name not in IGNORE_FILES:
        raise InvalidState(f"no ignore file {name!r}; there are {', '.join(IGNORE_FILES)}",
                           reason="unknown_ignore_file")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "ignore", name)
