"""The crash-state explorer: record a workload, then check every state a crash may leave.

1. ``record_workload`` runs >= 50 commits over >= 6 sessions (create, begin turn, checkpoint,
   attempt increment, ledger patch, metadata patch, turn end, cancel, abandon, delete and an
   orphan-marker repair after an injected I/O error) with ``_fsio``'s recorder logging every op,
   and notes when each commit was acknowledged (``_commit_locked`` returned) and what it wrote.
2. ``explore`` replays the log into ``FsModel`` and, before every op and after the last, builds
   every crash state the persistence model allows, materialises it on tmpfs, checks the raw
   state, runs startup (discovery, recovery, ``doctor --repair`` twice) and checks again.

Broken variants of the commit protocol (``MUTANTS``) must each produce a violation: the harness
has teeth.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import attrs

from fsdurable import _commit, _fsio, _repair, _segments
from fsdurable._codec import encode_marker, encode_session, parse_marker, parse_session
from fsdurable._commit import marker_due
from fsdurable._config import DAY, Config
from fsdurable._errors import (
    ConflictError,
    HistoryUnavailable,
    SessionNotFound,
    StorageError,
    UnreadableState,
)
from fsdurable._fsio import _write
from fsdurable._model import LedgerEntry, Marker, Session
from fsdurable._names import NameKind, classify
from fsdurable._store import Store

from .fsmodel import CrashState, FsModel, Snapshot, distinct_crash_states, snapshot

SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@attrs.define
class Ack:
    at: int  # number of ops done when it returned
    sid: str
    session: Session | None  # None: deleted
    start: int = 0  # number of ops done when it was called
    # the session's messages as acknowledged (read from its segments when it returned)
    messages: tuple[Any, ...] = ()
    # its lanes' values as acknowledged (an adapter's items: exactly these, a pop included)
    lanes: dict[str, tuple[Any, ...]] = attrs.Factory(dict)


@attrs.define
class Recording:
    root: str
    ops: list[tuple[str, tuple[Any, ...]]]
    acks: list[Ack]
    results: dict[tuple[str, int], bytes]  # every commit ever made: (id, version) -> file bytes
    commits: int
    sessions: int
    kinds: set[str]
    t0: float
    snap: Snapshot
    # file contents another node committed (put in place by a "sync tool" in the workload)
    foreign: set[bytes] = attrs.Factory(set)
    # the messages of every commit made, by commit id
    messages: dict[str, tuple[Any, ...]] = attrs.Factory(dict)
    # the lanes of every commit made, by commit id
    lanes: dict[str, dict[str, tuple[Any, ...]]] = attrs.Factory(dict)
    # broken promises the workload saw itself (a lost update is consistent on disk)
    violations: list[str] = attrs.Factory(list)
    # step 0's two paths (_inline_kinds): commits whose document has an inline tail, segments
    # written, and those of them that flushed an inline tail with new values
    inline_docs: int = 0
    segments_written: int = 0
    flushes: int = 0


CommitImpl = Callable[..., Session]  # (store, new, base, *, at_least=0) -> committed session


class RecordingStore(Store):
    """A Store whose commits (and deletes) are logged with the op count at which they returned."""

    commit_impl: CommitImpl | None = None
    rec_log: Any = None
    late_segments: list[tuple[Any, ...]] = []

    def _commit_locked(self, new: Session, base: int, **kw: Any) -> Session:
        impl = type(self).commit_impl
        s = (impl(self, new, base, **kw) if impl is not None
             else super()._commit_locked(new, base, **kw))
        rec: Recording = type(self).rec_log
        late = type(self).late_segments
        while late:  # the segment_after_document mutant: its segments written only now
            _write_segment_now(*late.pop(0))
        rec.results[(s.id, s.version)] = encode_session(s)
        msgs, lanes = _quiet_messages(s), _quiet_lanes(s)
        rec.messages[s.commit_id] = msgs
        rec.lanes[s.commit_id] = lanes
        rec.acks.append(Ack(len(rec.ops), s.id, s, messages=msgs, lanes=lanes))
        rec.commits += 1
        return s

    def delete(self, session_id: str, *, base_version: int | None = None) -> None:
        rec: Recording = type(self).rec_log
        start = len(rec.ops)
        super().delete(session_id, base_version=base_version)
        rec.acks.append(Ack(len(rec.ops), session_id, None, start))
        rec.kinds.add("delete")


# ---------------------------------------------------------------------- broken protocols

_write_segment_now = _commit.write_segment


def _quiet_messages(s: Session) -> tuple[Any, ...]:
    """The acknowledged messages, read without recording (the recorder sees only the store's
    own operations)."""
    prev = _fsio.set_recorder(None)
    try:
        return tuple(s.messages)
    finally:
        _fsio.set_recorder(prev)


def lanes_of(s: Session) -> dict[str, tuple[Any, ...]]:
    """Every non-empty lane's values (a lane an older session holds inline in its metadata
    included: the same values, whichever form the file has)."""
    from fsdurable._codec import INLINE_LANES

    out = {k: tuple(v) for k, v in s.lanes.items() if len(v)}
    for key, field in INLINE_LANES.items():
        ns = s.metadata.get(key)
        if (key not in out and isinstance(ns, dict) and isinstance(ns.get(field), list)
                and ns[field]):
            out[key] = tuple(ns[field])
    return out


def _quiet_lanes(s: Session) -> dict[str, tuple[Any, ...]]:
    prev = _fsio.set_recorder(None)
    try:
        return lanes_of(s)
    finally:
        _fsio.set_recorder(prev)


def _write_history(store: Store, s: Session) -> Session:
    """The commit function's step 0 (the messages not stored yet, as one segment)."""
    from fsdurable._history import History

    chain, segment = _commit.plan_history(store._ctx, s.id, s)
    lanes, segments = _commit.plan_lanes(store._ctx, s.id, s)
    for seg in ([segment] if segment is not None else []) + segments:
        _commit.write_segment(store._ctx, s.id, *seg)
    s = attrs.evolve(s, lanes={k: History(c) for k, c in lanes.items()})
    return attrs.evolve(s, messages=History(chain)) if chain is not None else s


def _write_marker(store: Store, s: Session, m: Marker | None) -> None:
    if m is not None:
        from fsdurable._codec import encode_marker

        mst = _fsio.write_atomic(store.layout.marker(s.id), encode_marker(m))
        store._cache.saw_marker(s.id, mst, m)


def _write_session(store: Store, s: Session, m: Marker | None) -> None:
    st = _fsio.write_atomic(store.layout.session(s.id), encode_session(s))
    store._cache.saw_session(s.id, st, s)


def _unmark(store: Store, s: Session, m: Marker | None) -> None:
    mpath = store.layout.marker(s.id)
    if not s.in_progress and _fsio.lstat(mpath) is not None:
        _fsio.unlink(mpath)
        store._cache.forget_marker(s.id)


def _commit_in_order(order: tuple[str, ...], *, by_number_only: bool = False) -> CommitImpl:
    """A copy of the commit function with its three steps in ``order`` (``by_number_only``: its
    compare-and-swap ignores the commit id)."""
    steps = {"marker": _write_marker, "session": _write_session, "unmark": _unmark}

    def commit(store: Store, new: Session, base: int, *, at_least: int = 0,
               owner: str | None = None, base_commit_id: str | None = None,
               turn: Any = None) -> Session:
        if turn is not None:  # a checkpoint's new turn (the commit function puts it in)
            new = attrs.evolve(new, turn=turn)
        disk, disk_commit = store._disk_ident(new.id)
        want = new.commit_id if base_commit_id is None else base_commit_id
        if disk != base or (disk and disk_commit != want and not by_number_only):
            raise ConflictError("version mismatch", session_id=new.id, reason="version_mismatch")
        s = attrs.evolve(new, version=max(base + 1, at_least), updated_at=store.clock(),
                         commit_id=os.urandom(8).hex())
        m: Marker | None = None
        if s.turn is not None:
            m, s = marker_due(store._ctx, s.id, s, owner)
        s = _write_history(store, s)
        for name in order:
            steps[name](store, s, m)
        return s

    return commit


@contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _sync_without_fsync(fd: int, path: str) -> None:
    """``_write._sync_written`` that never fsyncs (both write drivers call it)."""


def _delete_marker_first(self: Store, session_id: str, *, base_version: int | None = None) -> None:
    """Store.delete with its two unlinks swapped (the marker goes first)."""
    with self._commit_lock(session_id):
        if self._disk_version(session_id) == 0:
            raise SessionNotFound(f"no session {session_id!r}", session_id=session_id)
        _fsio.unlink(self.layout.marker(session_id))
        _fsio.unlink(self.layout.session(session_id))
        self._cache.forget(session_id)


@contextmanager
def mutant(name: str) -> Iterator[CommitImpl | None]:
    """Install one broken variant of the commit protocol; yields the commit impl to use."""
    if name == "correct":
        yield None
    elif name == "correct_copy":  # the test-side copy in the right order must pass
        yield _commit_in_order(("marker", "session", "unmark"))
    elif name == "no_file_fsync":
        with _patched(_write, "_sync_written", _sync_without_fsync):
            yield None
    elif name == "no_dir_fsync":
        # both lookups: the store's own calls (_fsio.fsync_dir) and _fsio's inside its writes
        with _patched(_fsio, "fsync_dir", lambda path: None), \
                _patched(_write, "fsync_dir", lambda path: None):
            yield None
    elif name == "session_before_marker":
        yield _commit_in_order(("session", "marker", "unmark"))
    elif name == "marker_removed_before_session":
        yield _commit_in_order(("marker", "unmark", "session"))
    elif name == "delete_marker_first":
        with _patched(Store, "delete", _delete_marker_first):
            yield None
    elif name == "cas_by_number_only":
        yield _commit_in_order(("marker", "session", "unmark"), by_number_only=True)
    elif name == "orphan_never_repaired":
        with _patched(_repair, "_remove_orphan",
                      lambda store, sid, path, jm, dry_run: _repair.Act(_repair.NOTHING, path)):
            yield None
    elif name == "segment_after_document":  # the history written after the file naming it
        def later(ctx: Any, sid: str, seg_name: str, data: bytes) -> None:
            RecordingStore.late_segments.append((ctx, sid, seg_name, data))

        with _patched(_commit, "write_segment", later):
            yield None
        RecordingStore.late_segments.clear()
    elif name == "segment_not_durable":  # the segment's fsyncs skipped
        def unsynced(ctx: Any, sid: str, seg_name: str, data: bytes) -> None:
            directory = ctx.layout.history_dir(sid)
            if _fsio.lstat(directory) is None:
                _fsio.makedirs(directory)
            _fsio.write_atomic(os.path.join(directory, seg_name), data, durable=False)

        with _patched(_commit, "write_segment", unsynced):
            yield None
    elif name == "repair_ignores_node":  # the repair gate treats every node's file as its own
        with _patched(_repair, "foreign", lambda store, node: False):
            yield None
    else:
        raise ValueError(name)


# the four the issue names, then: delete's unlinks swapped, orphan repair disabled, and a
# repair gate that ignores node ownership (issue 9: it would remove another node's marker)
MUTANTS = ("no_file_fsync", "no_dir_fsync", "session_before_marker",
           "marker_removed_before_session", "delete_marker_first", "orphan_never_repaired",
           "cas_by_number_only", "repair_ignores_node", "segment_after_document",
           "segment_not_durable")


# ---------------------------------------------------------------------- the workload


def record_workload(base: str, *, commit_impl: CommitImpl | None = None,
                    scale: int = 1) -> Recording:
    """Run the workload on a fresh store under ``base``; returns the recording."""
    root = os.path.join(base, "store")
    t0 = time.time()
    clock = Clock(t0)
    Store(root, clock=clock)  # created (and synced) before recording starts
    rec = Recording(root=os.path.realpath(root), ops=[], acks=[], results={}, commits=0,
                    sessions=0, kinds=set(), t0=t0, snap=snapshot(root))
    model_check = FsModel(root)  # snapshot sanity: the model must accept every op
    inject: list[Callable[[str, tuple[Any, ...]], bool]] = []

    def recorder(op: str, args: tuple[Any, ...]) -> None:
        for fail in inject:
            if fail(op, args):
                inject.remove(fail)
                raise OSError(errno.EIO, "injected I/O error")
        rec.ops.append((op, args))
        model_check.record(op, args)

    class S(RecordingStore):
        pass

    # a small inline tail (docs/storage.md, "The inline tail"): the workload's commits keep
    # their messages in the document, and pass the bound often enough to flush it as a segment

    S.commit_impl = staticmethod(commit_impl) if commit_impl is not None else None  # type: ignore[assignment]
    S.rec_log = rec
    prev = _fsio.set_recorder(recorder)
    try:
        store = S(root, clock=clock, config=Config(inline_tail_bytes=INLINE_BOUND))
        _workload(store, rec, clock, inject, scale)
    finally:
        _fsio.set_recorder(prev)
    _inline_kinds(rec)
    return rec


# the workload's inline tail bound: two short messages fit, a third passes it
INLINE_BOUND = 200


def _inline_kinds(rec: Recording) -> None:
    """Which paths of step 0 the workload took: commits whose document carries an inline tail
    (``inline_tail``), and segments holding an inline tail flushed with new values
    (``tail_flushed``: two or more values, after the chain's first segment or not)."""
    import orjson

    rec.inline_docs = sum(1 for data in rec.results.values() if b'"inline":[' in data)
    pending: dict[str, bytes] = {}
    for op, args in rec.ops:
        if op == "write":
            pending[args[0]] = args[1]
        elif op in ("rename", "link") and os.sep + "history" + os.sep in args[1]:
            data = pending.get(args[0], b"")
            try:
                d = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            values = d.get("messages") or d.get("items") or []
            rec.segments_written += 1
            if len(values) >= 2:
                rec.flushes += 1
    if rec.inline_docs:
        rec.kinds.add("inline_tail")
    if rec.flushes:
        rec.kinds.add("tail_flushed")


def _workload(store: Store, rec: Recording, clock: Clock,
              inject: list[Callable[[str, tuple[Any, ...]], bool]], scale: int) -> None:
    ids = [f"s{i}" for i in range(6)]
    for sid in ids:
        store.create(sid, metadata={"n": 0})
        rec.kinds.add("create")
    rec.sessions = len(ids)
    for rnd in range(2 * scale):
        for i, sid in enumerate(ids if rnd == 0 else ids[:4]):
            s = store.begin_turn(sid, f"hello {rnd}")
            s = store.checkpoint(s, phase="model_reply")
            rec.kinds.add("checkpoint")
            s = store.patch(sid, lambda cur: attrs.evolve(cur, turn=attrs.evolve(
                cur.turn, resume_attempts=cur.turn.resume_attempts + 1)))
            rec.kinds.add("attempt")
            assert s.turn is not None
            entry = LedgerEntry(tool_call_id="c1", name="send", effect="external",
                                idempotency_key=f"{sid}:{s.turn.id}:c1", status="intent",
                                intent_at=clock())
            s = store.patch(sid, lambda cur, e=entry: attrs.evolve(
                cur, turn=attrs.evolve(cur.turn, ledger=(*cur.turn.ledger, e))))
            s = store.patch(sid, lambda cur, e=entry: attrs.evolve(cur, turn=attrs.evolve(
                cur.turn, ledger=(attrs.evolve(e, status="done", outcome_at=clock()),))))
            rec.kinds.add("patch")
            if i == 1:
                clock.now += 400  # past marker_refresh: the checkpoint rewrites the marker
            s = store.checkpoint(s, phase="tools_done")
            if i == 2 and rnd == 0:
                store.cancel(sid)
                rec.kinds.add("cancel")
            elif i == 3 and rnd == 1:
                store.abandon_turn(sid, s.turn.id if s.turn else "", reason="test")
                rec.kinds.add("abandon")
            else:
                store.end_turn(s, f"reply {rnd}")
                rec.kinds.add("end_turn")
            store.patch(sid, lambda cur: attrs.evolve(
                cur, metadata={**cur.metadata, "n": cur.metadata.get("n", 0) + 1}))
    # an I/O error right after the marker of a new turn: the session write fails, the marker is
    # an orphan, and repair_marker removes it
    inject.append(lambda op, args: op == "create" and os.sep + "sessions" + os.sep in args[0])
    with suppress(StorageError):
        store.begin_turn("s4", "doomed")
    if _repair.repair_marker(store, "s4").action == "removed_orphan":  # (a mutant may not)
        rec.kinds.add("repair")
    # a segment the disk refuses (the commit's first step): nothing is committed, no marker
    inject.append(lambda op, args: op == "create" and os.sep + "history" + os.sep in args[0])
    with suppress(StorageError):  # (longer than the inline bound: it goes to a segment)
        store.begin_turn("s0", "refused " * (INLINE_BOUND // 8))
    inject.clear()  # (a mutant that writes no segment there never met it)
    if store.load("s0").in_progress:  # the mutant's turn went through: end it
        store.cancel("s0")
    rec.kinds.add("segment_refused")
    # a compaction keeping the last message (the chain's start moves, nothing rewritten), then
    # a history rewritten (appended whole, the old one kept in the chain as archive)
    store.patch("s0", lambda cur: attrs.evolve(cur, summary="earlier",
                                               messages=tuple(cur.messages)[-1:]))
    store.patch("s0", lambda cur: attrs.evolve(cur, messages=tuple(
        attrs.evolve(m, content="rewritten") for m in cur.messages)))
    rec.kinds.add("compaction")
    # the archive's retention: the document says where its chain is kept from (a commit), then
    # this node's released segments go as unreferenced ones (the repair gate's unlinks); a store
    # of the same class and node whose clock is a month on, so every segment is old
    later = type(store)(store.root, node_id=store.node_id, clock=lambda: clock() + 30 * DAY,
                        config=store.config.replace(archive_retention=DAY))
    if _segments.prune_archive(later, "s0") is not None:
        _segments.repair_history(later, "s0")
        rec.kinds.add("archive_retention")
    _adapter_items(store, rec)
    _sync_replace(store, rec)
    # leave one turn in progress (recovery has something to do) and delete two sessions, one
    # idle and one in progress
    s = store.begin_turn("s5", "left running")
    store.checkpoint(s, phase="model_reply")
    store.begin_turn("s3", "deleted while running")
    store.delete("s3")
    store.delete("s2")


def _adapter_items(store: Store, rec: Recording) -> None:
    """An Agents SDK session's items (a lane: storage.md): appended, popped within a segment
    and across one (the document cut, nothing rewritten), appended after the cut, cleared and
    begun again; an older session's inline items migrated by the repair gate at a write."""
    import asyncio

    from fsdurable.openai_agents import FileSession

    fs = FileSession("oa", store)

    async def work() -> None:
        await fs.add_items([{"role": "user", "content": "hi"}])
        await fs.add_items([{"type": "message", "n": i} for i in range(3)])
        await fs.pop_item()
        await fs.pop_item()
        await fs.pop_item()  # the cut crosses into the first segment
        await fs.add_items([{"n": "after the cut"}])
        await fs.clear_session()
        await fs.add_items([{"n": "again"}])

    asyncio.run(work())
    store.create("legacy", metadata={"openai_agents": {"items": [{"n": 0}, {"n": 1}]}})
    asyncio.run(FileSession("legacy", store).add_items([{"n": 2}]))
    rec.kinds.add("adapter_items")


def _sync_replace(store: Store, rec: Recording) -> None:
    """Two nodes each commit the next version of s1; a sync tool puts the other node's under the
    name; this node's next save, based on its own commit, must be refused (issue 9 item 5)."""
    ours = store.patch("s1", lambda cur: attrs.evolve(cur, metadata={**cur.metadata, "by": "a"}))
    theirs = attrs.evolve(ours, commit_id="b" * 16, metadata={**ours.metadata, "by": "b"})
    data = encode_session(theirs)
    rec.foreign.add(data)
    _fsio.write_atomic(store.layout.session("s1"), data)  # the sync tool's temp-and-rename
    rec.acks.append(Ack(len(rec.ops), "s1", theirs))
    try:
        store.save(attrs.evolve(ours, metadata={**ours.metadata, "by": "a", "again": True}))
    except ConflictError:
        rec.kinds.add("sync_conflict")
    else:
        rec.violations.append(f"a save based on this node's v{ours.version} overwrote another "
                              f"node's v{theirs.version}: update lost")


# ---------------------------------------------------------------------- checking


@attrs.define
class Report:
    crash_points: int = 0
    states: int = 0
    violations: list[str] = attrs.Factory(list)
    ops: int = 0
    commits: int = 0
    sessions: int = 0
    kinds: set[str] = attrs.Factory(set)
    seconds: float = 0.0
    inline_docs: int = 0  # the recording's (step 0's two paths, _inline_kinds)
    segments_written: int = 0
    flushes: int = 0


def _own_files(root: str, sub: str) -> dict[str, str]:
    d = os.path.join(root, sub)
    out = {}
    for name in os.listdir(d) if os.path.isdir(d) else []:
        kind, sid = classify(name)
        if kind is NameKind.OWN and sid is not None:
            out[sid] = os.path.join(d, name)
    return out


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _parse_all(root: str, where: str) -> tuple[dict[str, Session], dict[str, Marker], list[str]]:
    bad: list[str] = []
    sessions: dict[str, Session] = {}
    markers: dict[str, Marker] = {}
    for sid, path in _own_files(root, "sessions").items():
        try:
            sessions[sid] = parse_session(_read(path), path=path)[0]
        except (UnreadableState, OSError) as e:
            bad.append(f"{where}: unreadable file under a final name: sessions/{sid}.json ({e})")
            continue
        try:  # a document on disk names segments that are on disk, whole, its archive too
            for seq in (sessions[sid].messages, *sessions[sid].lanes.values()):
                tuple(seq)
            chain = getattr(sessions[sid].messages, "chain", None)
            if chain is not None:
                chain.archive()
        except HistoryUnavailable as e:
            bad.append(f"{where}: the history of sessions/{sid}.json does not read: {e}")
    for sid, path in _own_files(root, "markers").items():
        try:
            markers[sid] = parse_marker(_read(path), path=path)
        except (UnreadableState, OSError) as e:
            bad.append(f"{where}: unreadable file under a final name: markers/{sid}.json ({e})")
    return sessions, markers, bad


def _marker_biconditional(sessions: dict[str, Session], markers: dict[str, Marker],
                          where: str, *, orphans_ok: bool) -> list[str]:
    out = []
    for sid, s in sessions.items():
        if s.in_progress:
            m = markers.get(sid)
            assert s.turn is not None
            if m is None:
                out.append(f"{where}: session {sid} in progress without a marker")
            elif m.turn_id != s.turn.id:
                out.append(f"{where}: marker of {sid} names turn {m.turn_id}, not {s.turn.id}")
            elif m.resume_attempts < s.turn.resume_attempts:
                out.append(f"{where}: marker of {sid} under-counts resume attempts")
    if not orphans_ok:
        for sid in markers:
            if markers[sid].node_id == FAR_NODE:
                continue  # another node's: never repaired here (checked byte for byte)
            s2 = sessions.get(sid)
            if s2 is None or not s2.in_progress:
                out.append(f"{where}: orphan marker {sid} not repaired")
    return out


def _acked_state(rec: Recording, k: int) -> dict[str, Ack]:
    """The last acknowledged commit of each session at crash point ``k``; a delete in flight
    counts as acknowledged once it started (the file may already be gone)."""
    last: dict[str, Ack] = {}
    for a in rec.acks:
        if a.at <= k or (a.session is None and a.start < k):
            last[a.sid] = a
    return last


def _check_acked(rec: Recording, acked: dict[str, Ack], sessions: dict[str, Session],
                 raw: dict[str, bytes], where: str, after_startup: bool, k: int) -> list[str]:
    out = []
    for sid, a in acked.items():
        cur = sessions.get(sid)
        if a.session is None:
            if sid in raw and a.at <= k:
                out.append(f"{where}: deleted session {sid} came back")
            continue
        if cur is None:
            out.append(f"{where}: acknowledged session {sid} v{a.session.version} lost")
            continue
        if cur.version < a.session.version:
            out.append(f"{where}: session {sid} rolled back from acknowledged "
                       f"v{a.session.version} to v{cur.version}")
        elif not after_startup:
            want = rec.results.get((sid, cur.version))
            if (want is None or raw.get(sid) != want) and raw.get(sid) not in rec.foreign:
                out.append(f"{where}: session {sid} v{cur.version} is not a committed state")
        else:
            # the messages of the commit on disk if the workload made it (one in flight may
            # have become durable: a compaction or a rewrite replaces messages), else (startup
            # committed on top) those acknowledged
            want = rec.messages.get(cur.commit_id, a.messages)
            try:
                lost = tuple(cur.messages[: len(want)]) != want
            except HistoryUnavailable as e:
                out.append(f"{where}: session {sid}'s history does not read: {e}")
                continue
            if lost:
                out.append(f"{where}: session {sid} lost acknowledged messages")
            if lanes_of(cur) != rec.lanes.get(cur.commit_id, a.lanes):
                out.append(f"{where}: session {sid}'s lanes are not those acknowledged")
    if not after_startup:
        for sid, cur in sessions.items():
            if (sid not in acked and rec.results.get((sid, cur.version)) != raw.get(sid)
                    and raw.get(sid) not in rec.foreign):
                out.append(f"{where}: session {sid} holds a state never committed")
    return out


StartupFn = Callable[[Store], list[str]]
FAR_NODE = "node-far-away"
FAR_MARKER = encode_marker(Marker(session_id="far", turn_id="t-far", session_version=3,
                                  node_id=FAR_NODE, route_key="session:far", source="api",
                                  started_at=1.0, checkpoint_at=1.0, resume_attempts=0))


def default_startup(store: Store) -> list[str]:
    """Discovery, recovery (``recover`` with the reference loop) and ``doctor --repair``; returns
    what doctor repaired."""
    from fsdurable._doctor import doctor, problems
    from fsdurable._recovery import recover

    from .agents import recovery_loop

    store.interrupted()
    recover(store, recovery_loop(store))
    findings = doctor(store, repair=True)
    # a call that may have run waits for a human (fsdurable review): reported, never "repaired"
    left = [f for f in problems(findings) if f.code != "review_required"]
    if left:
        raise AssertionError(f"doctor --repair left problems: {[f.code for f in left]}")
    return [f.code for f in findings if f.repaired]


def check_state(rec: Recording, state: CrashState, k: int, where_root: str,
                startup: StartupFn, *, late: bool = False) -> list[str]:
    """Check one crash state; ``late``: start up 5 h after the workload (past the staleness
    window, so recovery abandons instead of resuming)."""
    where = f"op {k} [{state.note}]"
    state.materialise(where_root)
    sessions, markers, out = _parse_all(where_root, where + " raw")
    raw = {sid: _read(p) for sid, p in _own_files(where_root, "sessions").items()}
    acked = _acked_state(rec, k)
    out += _marker_biconditional(sessions, markers, where + " raw", orphans_ok=True)
    out += _check_acked(rec, acked, sessions, raw, where + " raw", after_startup=False, k=k)
    # another node's marker, its session still in sync flight: no repair may touch it
    far = os.path.join(where_root, "markers", "far.json")
    with open(far, "wb") as f:
        f.write(FAR_MARKER)
    for attempt in (1, 2):  # startup twice: the second finds nothing left to do
        try:
            store = Store(where_root, config=Config(fsync=False),
                          clock=lambda: rec.t0 + (5 * 3600.0 if late else 7200.0))
            repaired = startup(store)
        except Exception:  # any escape is the violation we are looking for
            out.append(f"{where}: startup {attempt} raised\n{traceback.format_exc(limit=6)}")
            return out
        if attempt == 2 and repaired:
            out.append(f"{where}: second startup still repaired {repaired}")
    sessions, markers, bad = _parse_all(where_root, where + " after startup")
    out += bad
    if not os.path.exists(far) or _read(far) != FAR_MARKER:
        out.append(f"{where}: another node's marker (markers/far.json) was touched")
    out += _marker_biconditional(sessions, markers, where + " after startup", orphans_ok=False)
    raw = {sid: _read(p) for sid, p in _own_files(where_root, "sessions").items()}
    out += _check_acked(rec, acked, sessions, raw, where + " after startup", after_startup=True,
                        k=k)
    for sub in ("sessions", "markers"):
        for name in os.listdir(os.path.join(where_root, sub)):
            if classify(name)[0] is NameKind.TEMP:
                out.append(f"{where}: temp file {sub}/{name} left after doctor --repair")
    return out


def explore(rec: Recording, *, exhaustive: bool = False, stop_at_first: bool = False,
            startup: StartupFn = default_startup, max_violations: int = 20) -> Report:
    """Check every crash state of the recording."""
    t = time.monotonic()
    report = Report(ops=len(rec.ops), commits=rec.commits, sessions=rec.sessions,
                    kinds=set(rec.kinds), violations=list(rec.violations),
                    inline_docs=rec.inline_docs, segments_written=rec.segments_written,
                    flushes=rec.flushes)
    if stop_at_first and report.violations:
        return report
    # the event log's day files vary jointly (fsmodel: a note leaves lines to a later fsync)
    model = FsModel(rec.root, rec.snap, together=("events" + os.sep,))
    with tempfile.TemporaryDirectory(dir=SHM, prefix="fsd-crash-") as tmp:
        where_root = os.path.join(tmp, "state")
        states = distinct_crash_states(model, rec.ops,
                                       lambda k: sum(1 for a in rec.acks if a.at <= k),
                                       exhaustive=exhaustive)
        for k, _, state in states:
            report.states += 1
            # one state in four starts up past the staleness window: the abandon path
            v = check_state(rec, state, k, where_root, startup, late=report.states % 4 == 0)
            if v:
                report.violations.extend(v[:3])
                if stop_at_first or len(report.violations) >= max_violations:
                    report.crash_points = k + 1
                    report.seconds = time.monotonic() - t
                    return report
    report.crash_points = len(rec.ops) + 1
    report.seconds = time.monotonic() - t
    return report


def run(*, exhaustive: bool = False, commit_impl: CommitImpl | None = None,
        stop_at_first: bool = False, scale: int = 1) -> Report:
    with tempfile.TemporaryDirectory(dir=SHM, prefix="fsd-rec-") as base:
        rec = record_workload(base, commit_impl=commit_impl, scale=scale)
        return explore(rec, exhaustive=exhaustive, stop_at_first=stop_at_first)
