"""The one repair gate: every act on a file the store did not just write goes through here.

Quarantine, marker rebuild, orphan-marker removal, migration of an old format, the moves of a
sync-conflict resolution and the restore of a quarantined file — each is decided and done by this
module, under the session's commit lock, with one set of rules:

1. **The exact file judged.** A file is judged from its own stat (``lstat`` before it is read, the
   descriptor's ``fstat`` once it is open); it is moved only if it is still that file (same
   device, inode, size and mtime). No judged stat means "do nothing".
2. **Never another node's file.** A marker names its node; a session in progress names the node
   of its turn (``turn.node_id``). Another node's marker or turn is reported (``waiting_for_sync``:
   it may be in sync flight, or its node repairs it), never moved, rewritten or removed.
   A marker whose ``session_version`` is ahead of its session arrived before its session: it
   waits too.
3. **Never a newer format.** A file this fsdurable cannot read because a newer one wrote it is
   reported (``needs_newer``) and left; the commit function refuses to write over it.
4. **The replacement first.** A bad marker of a turn in progress is first kept aside (a hard
   link, else a copy, in ``quarantine/``) and then replaced by the commit function's rename, so a
   kill or a full disk between leaves the turn discoverable (the old marker is still there).
5. **An event for each act.**

Reads never repair: the store raises ``UnreadableState`` (or lists the file as bad) and recovery,
``doctor --repair``, ``resolve`` and the adapters call this gate. ``_store`` never imports it.
Every function takes ``dry_run``: then nothing is done and the returned ``Act`` says what would be.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from typing import Any

import attrs

from . import _events as ev
from . import _fsio
from ._codec import encode_manifest, parse_manifest, parse_marker, parse_session
from ._errors import ConflictError, DurabilityUnknown, FsDurableError, StorageError, UnreadableState
from ._layout import new_id
from ._model import Marker, Session
from ._records import Manifest
from ._store import Store

# what an act can be; "would_<x>" in a dry run for the first group
ACTING = ("quarantined", "rebuilt_marker", "wrote_marker", "removed_orphan", "migrated",
          "restored", "purged", "removed_segment")
WAITING = "waiting_for_sync"  # another node's file, or a file that arrived before its partner
NEEDS_NEWER = "needs_newer"  # a newer fsdurable's format: left in place, never written
NOTHING = "nothing"
FAILED = "failed"  # the disk refused (the file stays; the next look retries)

Key = tuple[int, int, int, int]
# <stamp>-<random>-<kind>.<reason>-<original> (``_dest``); a kind may hold hyphens
# (conflict-session, item-log) and a reason never does, so the dotted form is tried first.
# Names without a reason (older files) fall back to the shortest kind.
_NAME = re.compile(r"^(\d{8}T\d{6})-([0-9a-f]+)-(?:([a-z-]+)\.([a-z0-9_]+)|([a-z-]+?))-(.+)$")


def key(st: os.stat_result) -> Key:
    """What identifies one file's content: device, inode, size, mtime (not ctime: a link to it,
    made by the gate itself, changes that)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@attrs.frozen
class Act:
    """What the gate did (or, in a dry run, would do) about one file."""

    action: str
    path: str
    session_id: str | None = None
    reason: str | None = None
    moved_to: str | None = None
    detail: str | None = None

    @property
    def acted(self) -> bool:
        return self.action in ACTING

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class Judged:
    """One file as judged: its stat (None: nothing there), its bytes, or why it is bad."""

    path: str
    stat: os.stat_result | None
    data: bytes | None = None
    error: UnreadableState | None = None

    @property
    def reason(self) -> str:
        return (self.error.reason or "unreadable") if self.error is not None else ""


def judge(store: Store, path: str, max_bytes: int | None = None) -> Judged:
    """Read ``path`` once (bounded, never through a link) and keep the stat of what was read."""
    st0 = _fsio.lstat(path)
    if st0 is None:
        return Judged(path, None)
    try:
        data, st = _fsio.read_bounded(path, max_bytes or store.config.max_file_bytes)
    except FileNotFoundError:
        return Judged(path, None)
    except UnreadableState as e:  # rejected before or at its fstat: the lstat is the judged one
        return Judged(path, st0, error=e)
    return Judged(path, st, data=data)


def _case_alias(directory: str, sid: str) -> bool:
    """On a case-insensitive filesystem ``chat.json`` opens ``Chat.json``: another session's
    file, never judged as ``chat``'s (it would look like a file about the wrong session)."""
    want = sid + ".json"
    names = _fsio.list_names(directory)
    return want not in names and any(n.lower() == want.lower() for n in names)


def _about(j: Judged, e: UnreadableState, directory: str, sid: str) -> Judged:
    if e.reason == "wrong_id" and _case_alias(directory, sid):
        return Judged(j.path, None)  # not there: the name is another id's
    return attrs.evolve(j, error=e)


def judge_session(store: Store, sid: str) -> tuple[Judged, Session | None, bool]:
    j = judge(store, store.layout.session(sid))
    if j.data is None:
        return j, None, False
    try:
        s, migrated = parse_session(j.data, path=j.path, session_id=sid)
    except UnreadableState as e:
        return _about(j, e, store.layout.sessions, sid), None, False
    return j, s, migrated


def judge_marker(store: Store, sid: str) -> tuple[Judged, Marker | None]:
    # the bound discovery reads markers with: what it cannot read is bad here too
    j = judge(store, store.layout.marker(sid), min(store.config.max_file_bytes, 1 << 20))
    if j.data is None:
        return j, None
    try:
        return j, parse_marker(j.data, path=j.path, session_id=sid)
    except UnreadableState as e:
        return _about(j, e, store.layout.markers, sid), None


def owner_of(s: Session) -> str | None:
    """The node that owns the session's turn in progress (None: not recorded, format 2)."""
    return s.turn.node_id if s.turn is not None else None


_WOULD = {"quarantined": "would_quarantine", "rebuilt_marker": "would_rebuild_marker",
          "wrote_marker": "would_write_marker", "removed_orphan": "would_remove_orphan",
          "migrated": "would_migrate", "restored": "would_restore", "purged": "would_purge"}


def foreign(store: Store, node: str | None) -> bool:
    """Is ``node`` another node than this one? (None: not recorded — a format-2 turn, treated as
    this node's, as before turns recorded their owner.) The one ownership rule of the gate."""
    return node is not None and node != store.node_id


def _act(action: str, path: str, sid: str | None, dry_run: bool, **kw: Any) -> Act:
    return Act(_WOULD[action] if dry_run else action, path, sid, **kw)


# ---------------------------------------------------------------------- quarantine


def _dest(store: Store, path: str, kind: str, reason: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(store.clock()))
    why = re.sub(r"[^a-z0-9_]", "_", reason.lower())[:40] or "unreadable"
    # a random part: two processes quarantining at once never pick the same name
    return os.path.join(store.layout.quarantine,
                        f"{stamp}-{os.urandom(3).hex()}-{kind}.{why}-{os.path.basename(path)}")


def quarantine(store: Store, path: str, *, kind: str, reason: str,
               expect: os.stat_result | None, session_id: str | None = None,
               code: str = ev.FILE_QUARANTINED, keep: bool = False) -> str | None:
    """Move ``path`` into ``quarantine/`` if it is still the file judged (``expect``), with an
    event; ``keep=True`` keeps it in place and puts a second name (or a copy) there instead —
    what a rebuild does before the commit's rename replaces the original. Returns where it
    went, or None if nothing was done (no judged stat, gone, replaced, or the disk refused:
    then the file stays and an event says so). A session's or marker's file is handled under
    that session's commit lock."""
    if expect is None:
        return None
    if session_id is not None:
        try:
            with store.commit_lock(session_id):
                return _quarantine(store, path, kind, reason, expect, session_id, code, keep)
        except FsDurableError as e:  # the lock: left for the next look
            store.emit(code, session_id=session_id, reason=reason, path=path,
                       quarantine_failed=str(e))
            return None
    return _quarantine(store, path, kind, reason, expect, session_id, code, keep)


def _quarantine(store: Store, path: str, kind: str, reason: str, expect: os.stat_result,
                sid: str | None, code: str, keep: bool) -> str | None:
    now = _fsio.lstat(path)
    if now is None or key(now) != key(expect):
        return None  # moved by another process, or replaced by a good commit: not ours to move
    dest = _dest(store, path, kind, reason)
    durable = store.config.fsync
    try:
        if keep:
            _keep_aside(store, path, dest, expect)
        else:
            _fsio.rename(path, dest, durable=durable)
    except FileNotFoundError:
        return None  # another process moved it first (and reported it)
    except (OSError, FsDurableError) as e:
        store.emit(code, session_id=sid, reason=reason, path=path, quarantine_failed=str(e))
        return None
    if sid is not None:
        store._cache.forget(sid)
    store.emit(code, session_id=sid, reason="unreadable" if code == ev.ABANDONED else reason,
               kind=kind, cause=reason, path=path, moved_to=dest, kept_in_place=keep)
    return dest


def _keep_aside(store: Store, path: str, dest: str, expect: os.stat_result) -> None:
    """A second name for the judged file in quarantine/ (a hard link: exact, any file type), or
    a byte copy where the filesystem has no links (exFAT); the original stays until replaced."""
    try:
        _fsio.link(path, dest, durable=store.config.fsync)
    except (StorageError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        data, st = _fsio.read_bounded(path, store.config.max_file_bytes)
        if key(st) != key(expect):
            raise FileNotFoundError(path) from e  # replaced meanwhile: nothing to keep
        _fsio.write_atomic(dest, data, overwrite=False, durable=store.config.fsync)
        return
    got = _fsio.lstat(dest)
    if got is None or key(got) != key(expect):  # linked a replacement: undo our own name
        _fsio.unlink(dest, durable=store.config.fsync)
        raise FileNotFoundError(path)


def put_back(store: Store, src: str, dest: str, expect: os.stat_result) -> None:
    """Move a quarantined file back to ``dest`` (the restore of an item log its session's
    document names), if it is still the file judged (``expect``), never over a file at
    ``dest`` (``_fsio.move_new``); ``history/<id>/`` made if needed (never through a symlink).
    The caller holds the session's commit lock and emits the event. ConflictError (``exists``)
    if ``dest`` is taken, FileNotFoundError if the file moved or changed since it was judged."""
    now = _fsio.lstat(src)
    if now is None or key(now) != key(expect):
        raise FileNotFoundError(src)
    directory = os.path.dirname(dest)
    durable = store.config.fsync
    if not _fsio.own_dirs(store.layout.history, directory):
        _fsio.makedirs(directory, durable=durable)
    try:
        _fsio.move_new(src, dest, durable=durable)
    except FileExistsError:
        raise ConflictError(f"{dest} exists: set it aside first", path=dest,
                            reason="exists") from None


def copy_aside(store: Store, path: str, kind: str, reason: str) -> str:
    """A copy of a file that is about to be replaced through the commit function (conflict
    resolution keeps the local session's old content this way). Never a move."""
    data, _ = _fsio.read_bounded(path, store.config.max_file_bytes)
    dest = _dest(store, path, kind, reason)
    _fsio.write_atomic(dest, data, overwrite=False, durable=store.config.fsync)
    return dest


# ---------------------------------------------------------------------- sessions


def _foreign_marker(store: Store, sid: str) -> Marker | None:
    _, m = judge_marker(store, sid)
    return m if m is not None and foreign(store, m.node_id) else None


def repair_session(store: Store, sid: str, *, dry_run: bool = False) -> Act:
    """An unreadable session goes to quarantine (``session_quarantined``) unless it is in a
    newer format or another node's marker says the turn is theirs; an older format is
    migrated through the commit function (``session_migrated``)."""
    path = store.layout.session(sid)
    with store.commit_lock(sid):
        j, s, migrated = judge_session(store, sid)
        if j.stat is None:
            return Act(NOTHING, path, sid, reason="missing")
        if j.error is not None:
            if j.reason == "unknown_version":
                return Act(NEEDS_NEWER, path, sid, reason=j.reason, detail=j.error.message)
            other = _foreign_marker(store, sid)
            if other is not None:
                return Act(WAITING, path, sid, reason="foreign_turn",
                           detail=f"node {other.node_id} has a turn in progress here")
            if dry_run:
                return _act("quarantined", path, sid, True, reason=j.reason)
            where = _quarantine(store, path, "session", j.reason, j.stat, sid,
                                ev.SESSION_QUARANTINED, False)
            return Act("quarantined" if where else FAILED, path, sid, reason=j.reason,
                       moved_to=where)
        assert s is not None
        if not migrated:
            return Act(NOTHING, path, sid)
        owner = owner_of(s)
        if s.in_progress and owner is None:  # format 2 did not record it: its marker does
            _, m = judge_marker(store, sid)
            owner = m.node_id if m is not None else None
        if s.in_progress and foreign(store, owner):
            return Act(WAITING, path, sid, reason="foreign_turn",
                       detail=f"node {owner} owns its turn in progress")
        if dry_run:
            return _act("migrated", path, sid, True)
        new = store._commit_locked(s, s.version)
        store.emit(ev.SESSION_MIGRATED, session_id=sid, version=new.version)
        return Act("migrated", path, sid)


_FORMAT_RE = re.compile(rb'^\s*\{\s*"format"\s*:\s*"([^"\\]{1,64})"')


def migrate_session(store: Store, sid: str, *, dry_run: bool = False,
                    loaded: Session | None = None) -> Act:
    """A session of an older format is migrated here (``repair_session``: the gate's rules,
    ``session_migrated``) before recovery commits anything to it — its own commit would rewrite
    the file silently, outside the gate. The file's first bytes decide: one in the current
    format (the usual case) costs a 1 KiB read and is left alone — unless ``loaded`` (the
    session as the caller just read it) holds an adapter's values inline (``inline_lanes``, an
    older adapter session); anything else is judged whole.
    Reads never migrate: only recovery and ``doctor --repair`` call this."""
    from ._codec import SESSION_FORMAT, inline_lanes

    path = store.layout.session(sid)
    try:
        m = _FORMAT_RE.match(_fsio.read_prefix(path, 1024))
    except (OSError, UnreadableState):
        m = None  # gone, or not a file: the full judgement says what it is
    if m is not None and m.group(1) == SESSION_FORMAT.encode() and not (
            loaded is not None and inline_lanes(loaded)):
        return Act(NOTHING, path, sid)
    return repair_session(store, sid, dry_run=dry_run)


# ---------------------------------------------------------------------- markers


def repair_marker(store: Store, sid: str, *, dry_run: bool = False) -> Act:
    """Make the marker agree with the session, within the rules above:

    - a bad marker of this node's turn in progress is kept aside, then rebuilt through the
      commit function (``marker_repaired``; the owner is kept);
    - a missing or wrong-turn marker of this node's turn in progress is written;
    - this node's marker of a session not in progress (or gone) is removed (``orphan``);
    - a bad marker of a session not in progress is quarantined (moved, nothing lost);
    - anything of another node, or ahead of its session, is ``waiting_for_sync``; a newer
      format is ``needs_newer``.
    """
    path = store.layout.marker(sid)
    with store.commit_lock(sid):
        jm, m = judge_marker(store, sid)
        if jm.error is not None and jm.reason == "unknown_version":
            return Act(NEEDS_NEWER, path, sid, reason=jm.reason, detail=jm.error.message)
        js, s, _ = judge_session(store, sid)
        if js.error is not None:
            if js.reason == "unknown_version":
                return Act(NEEDS_NEWER, store.layout.session(sid), sid, reason=js.reason)
            return Act(NOTHING, path, sid, reason="session_unreadable")
        if s is None:  # no session (yet)
            if jm.stat is None:
                return Act(NOTHING, path, sid)
            if m is None:  # a bad marker, no session to say whose: moved aside, nothing lost
                return _set_aside(store, sid, path, jm, dry_run)
            if foreign(store, m.node_id):
                return Act(WAITING, path, sid, reason="no_session",
                           detail=f"node {m.node_id}'s marker; its session has not arrived")
            return _remove_orphan(store, sid, path, jm, dry_run)
        if not s.in_progress or s.turn is None:
            if jm.stat is None:
                return Act(NOTHING, path, sid)
            if m is None:  # a bad marker of an idle session: moved aside, nothing lost
                return _set_aside(store, sid, path, jm, dry_run)
            if foreign(store, m.node_id):  # this node's own marker ahead: its write died
                if m.session_version > s.version:
                    return Act(WAITING, path, sid, reason="marker_ahead",
                               detail=f"node {m.node_id}'s marker of session version "
                                      f"{m.session_version}, the session is at {s.version}: "
                                      "its session is on its way")
                return Act(WAITING, path, sid, reason="foreign_marker",
                           detail=f"node {m.node_id}'s marker: that node removes it")
            return _remove_orphan(store, sid, path, jm, dry_run)
        owner = owner_of(s) or (m.node_id if m is not None else store.node_id)
        if foreign(store, owner):
            return Act(WAITING, path, sid, reason="foreign_turn",
                       detail=f"node {owner} owns the turn in progress")
        if m is not None and m.turn_id == s.turn.id:
            return Act(NOTHING, path, sid)
        why = "missing" if jm.stat is None else ("wrong_turn" if m is not None else jm.reason)
        if dry_run:
            return _act("rebuilt_marker" if jm.stat is not None else "wrote_marker", path, sid,
                        True, reason=why)
        kept = None
        if jm.stat is not None:  # keep the old one aside FIRST; the commit's rename replaces it
            kept = _quarantine(store, path, "marker", why, jm.stat, sid, ev.FILE_QUARANTINED,
                               True)
            if kept is None:
                return Act(FAILED, path, sid, reason=why, detail="could not keep it aside")
        store._commit_locked(s, s.version, owner=owner)
        store.emit(ev.MARKER_REPAIRED, session_id=sid, turn_id=s.turn.id, reason=why,
                   **({"cause": jm.reason} if jm.error is not None else {}))
        return Act("rebuilt_marker" if kept else "wrote_marker", path, sid, reason=why,
                   moved_to=kept)


def _set_aside(store: Store, sid: str, path: str, jm: Judged, dry_run: bool) -> Act:
    """A bad marker no turn in progress needs: into quarantine/ (``file_quarantined``)."""
    if dry_run:
        return _act("quarantined", path, sid, True, reason=jm.reason)
    assert jm.stat is not None
    where = _quarantine(store, path, "marker", jm.reason, jm.stat, sid, ev.FILE_QUARANTINED,
                        False)
    return Act("quarantined" if where else FAILED, path, sid, reason=jm.reason, moved_to=where)


def _remove_orphan(store: Store, sid: str, path: str, jm: Judged, dry_run: bool) -> Act:
    if dry_run:
        return _act("removed_orphan", path, sid, True, reason="orphan")
    now = _fsio.lstat(path)
    if now is None or jm.stat is None or key(now) != key(jm.stat):
        return Act(NOTHING, path, sid, reason="changed")
    if not _fsio.unlink(path, durable=store.config.fsync):
        return Act(NOTHING, path, sid)
    store._cache.forget_marker(sid)
    store.emit(ev.MARKER_REPAIRED, session_id=sid, reason="orphan")
    return Act("removed_orphan", path, sid, reason="orphan")


# ---------------------------------------------------------------------- the manifest

_MANIFEST_MAX = 1 << 16  # the bound Store reads fsdurable.json with


def repair_manifest(store: Store, *, dry_run: bool = False) -> Act:
    """An unreadable ``fsdurable.json`` (the store's id and creation time; no user data) is kept
    aside in ``quarantine/`` and a new one is renamed over it: the old bytes are in quarantine
    before the new ones land, and only the very file judged is replaced (under a lock, its stat
    checked again). What is not a regular file there (a directory, a FIFO) has no bytes to keep:
    it is moved into quarantine whole, then the new manifest is written. A newer store format is
    never touched (``needs_newer``). One ``file_quarantined`` event (kind ``manifest``). Never
    raises: a disk that refuses is a ``failed`` act with its event."""
    path = store.layout.manifest
    try:
        j = judge(store, path, _MANIFEST_MAX)
    except (OSError, FsDurableError) as e:  # the disk refused the read (EACCES, EIO)
        return Act(FAILED, path, reason="refused", detail=str(e))
    if j.stat is None:
        return Act(NOTHING, path)
    err = j.error
    if err is None:
        try:
            parse_manifest(j.data or b"", path=path)
            return Act(NOTHING, path)
        except UnreadableState as e:
            err = e
    why = err.reason or "unreadable"
    if why == "unknown_version":
        return Act(NEEDS_NEWER, path, reason=why, detail=err.message)
    if dry_run:
        return _act("quarantined", path, None, True, reason=why)
    dest: str | None = None
    try:
        with store._lockdir().hold("repair", "manifest", timeout=store.config.commit_lock_timeout,
                                   poll=0.01):
            now = _fsio.lstat(path)
            if now is None or key(now) != key(j.stat):
                return Act(NOTHING, path, reason="replaced meanwhile")
            dest = _dest(store, path, "manifest", why)
            if stat.S_ISREG(j.stat.st_mode):
                _keep_aside(store, path, dest, j.stat)
            else:
                _fsio.rename(path, dest, durable=store.config.fsync)
            m = Manifest(store_id=new_id(), created_at=store.clock())
            # DurabilityUnknown: renamed into place, only its directory's fsync is in doubt
            with contextlib.suppress(DurabilityUnknown):
                _fsio.write_atomic(path, encode_manifest(m), durable=store.config.fsync)
    except FileNotFoundError:
        return Act(NOTHING, path, reason="replaced meanwhile")
    except (OSError, FsDurableError) as e:
        store.emit(ev.FILE_QUARANTINED, reason=why, kind="manifest", path=path,
                   quarantine_failed=str(e), kept_at=dest)
        return Act(FAILED, path, reason=why, detail=str(e), moved_to=dest)
    store.manifest, store.manifest_problem = m, None
    store.emit(ev.FILE_QUARANTINED, reason=why, kind="manifest", cause=why, path=path,
               moved_to=dest, replaced=True)
    return Act("quarantined", path, reason=why, moved_to=dest)


def repair_markers(store: Store, *, dry_run: bool = False) -> list[Act]:
    """``repair_marker`` for every bad marker of one listing of ``markers/``."""
    _, bad = store.scan_markers()
    return [repair_marker(store, sid, dry_run=dry_run) for sid, _ in bad]


__all__ = ["ACTING", "NEEDS_NEWER", "WAITING", "Act", "Judged", "copy_aside", "foreign", "judge",
           "judge_marker", "judge_session", "key", "migrate_session", "owner_of", "quarantine",
           "repair_manifest", "repair_marker", "repair_markers", "repair_session"]
