"""THE commit function: every change to a session file goes through ``commit_locked``.

Invariant: on disk, ``session.in_progress`` is true  =>  ``markers/<id>.json`` exists, at every
crash point. The steps, in order: compare-and-swap on the commit's identity, the marker (when
the turn is in progress and the one on disk does not already say the same), the session, the
marker's removal (when not in progress). ``Store`` calls it under the session's commit lock
(``Store.commit``, ``Store.patch``); the repair gate and the quarantine restore too, and nothing
else writes a session file. It learns what is on disk through the store's ``FileCache``.
"""

from __future__ import annotations

import contextlib
import os

from . import _discovery, _fsio
from ._errors import ConflictError, DurabilityUnknown, InvalidState, StorageError, UnreadableState
from ._layout import validate_session_id
from ._recordcodec import encode_marker
from ._records import Marker

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from ._model import Session
    from ._store import Store

    _T = TypeVar("_T")


def evolve(inst: _T, **changes: Any) -> _T:
    """``attrs.evolve``, with attrs imported on first use (off the startup path): the store's
    sessions and turns are attrs classes, its startup path does not import attrs."""
    import attrs

    new: _T = attrs.evolve(inst, **changes)  # type: ignore[misc]
    return new


def commit_locked(store: Store, new: Session, base: int, *, at_least: int = 0,
                  owner: str | None = None, base_commit_id: str | None = None) -> Session:
    """THE commit: every change to a session file goes through here, under its commit lock.

    1. compare-and-swap on the commit's identity: the file on disk must be the commit
       ``new`` was derived from — version ``base`` (0 = absent) and commit id
       ``base_commit_id`` (default ``new.commit_id``) — else ConflictError: a file a sync
       tool replaced with another node's commit of the same version is told apart;
    2. entering or staying in progress: write the marker first (fsync, rename, dir fsync)
       unless the one on disk already says the same (``Config.marker_refresh``);
    3. write the session (temp, fsync, rename, dir fsync);
    4. not in progress: remove the marker if one exists (unlink, dir fsync).
    A crash between any two steps leaves "in progress => marker exists" true; the reverse gap
    (a marker without an in-progress session) is repaired by recovery and doctor.
    Returns the session at its new version: ``base + 1``, or ``at_least`` if that is higher
    (resolving a sync conflict keeps versions increasing across every copy that was seen).
    The marker's node is ``owner`` if given (a claim, an adoption), else the node that owns
    the turn already, else (a new turn) this node: a commit never moves a turn silently.
    Raises InvalidState (nothing written) if the file would exceed ``max_file_bytes``.
    """
    from ._codec import encode_session

    sid = validate_session_id(new.id)
    disk, disk_commit = store._disk_ident(sid)
    want = new.commit_id if base_commit_id is None else base_commit_id
    if disk != base:
        raise ConflictError(
            f"session {sid!r} is at version {disk} on disk, not {base}",
            session_id=sid, path=store.layout.session(sid), reason="version_mismatch",
            expected=base, actual=disk,
        )
    if disk and disk_commit != want:
        raise ConflictError(
            f"session {sid!r} on disk is another commit of version {disk} (commit "
            f"{disk_commit or '-'}, not {want or '-'}): replaced, e.g. by a sync tool",
            session_id=sid, path=store.layout.session(sid), reason="commit_mismatch",
            expected=base, actual=disk,
        )
    s = evolve(new, version=max(base + 1, at_least), updated_at=store.clock(),
                commit_id=os.urandom(8).hex())
    m: Marker | None = None
    if s.turn is not None:
        m, s = marker_due(store, sid, s, owner)
    data = encode_session(s)
    if len(data) > store.config.max_file_bytes:  # it could never be read back
        raise InvalidState(
            f"session {sid!r} would be {len(data)} bytes, over max_file_bytes "
            f"({store.config.max_file_bytes}): compact it", session_id=sid,
            reason="too_large")
    mdata = b""
    if m is not None:  # every marker a commit writes is one discovery reads: checked first
        mdata = encode_marker(m)
        cap = _discovery.marker_cap(store.config.max_file_bytes)
        if len(mdata) > cap:
            raise InvalidState(
                f"the marker of session {sid!r} would be {len(mdata)} bytes, over the {cap} "
                f"discovery reads (source {len(m.source)}, route_key {len(m.route_key)}, "
                f"turn id {len(m.turn_id)} characters)", session_id=sid, reason="too_large")
    mpath = store.layout.marker(sid)
    if m is not None:
        try:
            mst = _fsio.write_atomic(mpath, mdata, durable=store.config.fsync)
        except DurabilityUnknown as e:  # the marker is in place; the session is not written
            store._cache.saw_marker(sid, e.stat, m)
            raise StorageError(f"session {sid!r} was not committed: {e.message}",
                               path=mpath, session_id=sid, reason=e.reason,
                               errno=e.errno) from e
        store._cache.saw_marker(sid, mst, m)
    try:
        st = _fsio.write_atomic(store.layout.session(sid), data, durable=store.config.fsync)
    except DurabilityUnknown as e:  # renamed: committed, say so (the caller never retries)
        store._cache.saw_session(sid, e.stat, s)
        e.session, e.session_id = s, sid
        e.message = (f"session {sid!r} was committed at version {s.version} (err.session), "
                     f"but {e.message}")
        raise
    store._cache.saw_session(sid, st, s)
    # committed (the session's rename and its directory fsync are done): from here nothing
    # raises as if it had not. A marker the disk refuses to remove is an orphan, the harmless
    # reverse gap recovery and doctor repair.
    if not s.in_progress and _fsio.lstat(mpath) is not None:
        with contextlib.suppress(OSError):
            _fsio.unlink(mpath, durable=store.config.fsync)
        store._cache.forget_marker(sid)
    return s


def marker_due(store: Store, sid: str, s: Session, owner: str | None
               ) -> tuple[Marker | None, Session]:
    """For in-progress ``s``: (the marker to write, or None if the one on disk says the same —
    same turn, node, route, source and attempts, checkpoint within ``marker_refresh``; ``s``
    with its turn's owner node and route filled in).

    The owner is ``owner`` if given (a claim, an adoption), else the one the session names,
    else the one the marker of the same turn names (a session of format 2), else this node.
    The turn's route is the one it started under (the session's if not yet set)."""
    turn = s.turn
    assert turn is not None
    st = _fsio.lstat(store.layout.marker(sid))
    cur: Marker | None = None
    if st is not None:
        cur = store._cache.marker(sid, st)
        if cur is None:
            try:
                cur = store._marker_raw(sid)
            except UnreadableState as e:
                if e.reason == "unknown_version":
                    raise  # a newer fsdurable's marker: never written over
                cur = None  # ours, and corrupt: the rewrite below replaces it
    same_turn = cur is not None and cur.turn_id == turn.id
    node = (owner or turn.node_id or (cur.node_id if cur is not None and same_turn else None)
            or store.node_id)
    route = turn.route_key or s.route_key
    if node != turn.node_id or route != turn.route_key:
        s = evolve(s, turn=evolve(turn, node_id=node, route_key=route))
        turn = s.turn
        assert turn is not None
    if (cur is not None and same_turn and cur.node_id == node
            and cur.route_key == route and cur.source == s.source
            and cur.resume_attempts == turn.resume_attempts
            # a marker time ahead of the turn's (the clock stepped back since) is rewritten:
            # else the gate would judge the turn by a time from the future
            and 0 <= turn.checkpoint_at - cur.checkpoint_at < store.config.marker_refresh):
        return None, s
    return Marker.of(s, node), s


__all__ = ["commit_locked", "evolve", "marker_due"]
