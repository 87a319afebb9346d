"""Claim ONE interrupted turn and resume, abandon or park it: the part of recovery that acts.

``resume_one(store, host, marker)`` (and ``aresume_one``) is what ``recover`` does for each
marker that passed the listing's gates, and what ``fsdurable adopt`` does for one turn: under
the turn's ORIGINAL route lock (tried once by ``recover``: a held route is ``busy``), re-read the
marker and the session and gate them again on what is on disk now (superseded, orphan,
unreadable -> the repair gate; stale or exhausted -> abandoned, in-doubt calls to the review
queue first); an in-doubt call a repeat could duplicate parks the turn for review; a history the
resume needs that is not on disk yet (a sync tool delivered the document first) puts the resume
off — no attempt spent, the marker kept (``waiting_for_sync``); otherwise the incremented attempt
count is COMMITTED before the host is called, and the host continues the turn unattended.
``Host`` is what recovery needs of a driver; ``Outcome`` what it decided and did.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from . import _events as ev
from . import _repair
from ._errors import (
    FsDurableError,
    HistoryUnavailable,
    HostError,
    LockTimeout,
    SessionNotFound,
    UnreadableState,
)
from ._gates import NOT_CLAIMED, RecoveryPolicy, judged, verdict
from ._layout import new_id
from ._model import Marker, Message, Session, extended, in_doubt, unanswered_calls
from ._store import Store

SKIPPED = ev.SKIPPED  # disabled / foreign / route busy / error: listed, kept, not run


class Host(Protocol):
    """What recovery needs from a host's loop (``AgentLoop`` is one).

    ``resume_claimed(session)`` continues a claimed turn — the caller holds the route lock and
    has committed the attempt — and must run it UNATTENDED (deny-list on, approvals denied).
    ``tool_effect(name)`` is the declared effect (``none``/``idempotent``/``external``; None if
    unknown, treated as external) so an in-doubt call is re-run only when a repeat is a no-op.
    Optional: ``rerun_safe(name) -> bool`` (else: ``idempotent`` and not deny-listed) — a call
    that needed approval may have run and cannot be approved unattended, so it is parked;
    ``aresume_claimed(session)`` (or an ``async def resume_claimed``) for ``arecover``;
    ``history_ready(session)``: read what resuming ``session`` reads and raise if it is not on
    disk yet — ``HistoryUnavailable`` (reason ``waiting_for_sync``) or ``UnreadableState``
    (reason ``log_short``) — called under the route lock BEFORE the attempt is committed
    (default: ``read_history``, the messages and every lane, whole).
    """

    def tool_effect(self, name: str) -> str | None: ...

    def resume_claimed(self, session: Session) -> Any: ...


@attrs.frozen
class Outcome:
    """What recovery decided (``verdict``, from the marker alone) and did (``outcome``) for one
    marker. Outcomes: resumed, failed, abandoned, review_required, superseded, repaired, kept
    (disabled, or a marker the disk refused to read), listed (foreign), busy (route held — a
    live turn, or a resume in flight elsewhere — or the turn claimed by another process since it
    was listed), left (``resume=False``: would resume, left for the host), error (the disk
    refused a write; the marker stays for the next start), and from the repair gate for a bad
    marker (verdict ``unreadable``): waiting_for_sync (another node's, or ahead of its
    session), needs_newer (a newer fsdurable's format: left in place), quarantined; and
    waiting_for_sync for a turn whose history the resume needs is not on disk yet (reason
    ``history_missing``, or ``log_short`` for a LangGraph thread's log): no attempt spent.
    A dry run says what a real run would do: would_resume, would_abandon, would_repair,
    would_supersede, would_review, would_leave, would_rebuild_marker, would_quarantine, ... —
    or the same kept / listed / waiting_for_sync / needs_newer a real run would report."""

    session_id: str
    turn_id: str
    node_id: str
    verdict: str
    age: float
    attempts: int
    outcome: str
    reason: str | None = None
    error: str | None = None
    status: str | None = None  # the resumed turn's end: completed / cancelled / ...

    def to_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["age"] = round(self.age, 3)
        return d


def policy_of(store: Store, policy: RecoveryPolicy | None) -> RecoveryPolicy:
    return policy if policy is not None else RecoveryPolicy.from_config(store.config)


def bad_marker(store: Store, sid: str, why: str, *, dry_run: bool) -> Outcome:
    """A marker the listing could not read: the repair gate decides (a dry run only asks)."""
    base = Outcome(sid, "", "", "unreadable", 0.0, 0, "", reason=why)
    if why == "refused":  # EACCES/EIO: kept, reported, never moved
        if not dry_run:
            store.emit(SKIPPED, session_id=sid, reason="unreadable", cause=why,
                       path=store.layout.marker(sid))
        return attrs.evolve(base, outcome="kept")
    try:
        act = _repair.repair_marker(store, sid, dry_run=dry_run)
    except (FsDurableError, OSError) as e:
        return attrs.evolve(base, outcome="error", reason="error",
                            error=f"{type(e).__name__}: {e}")
    if not dry_run and act.action in (_repair.WAITING, _repair.NEEDS_NEWER):
        store.emit(SKIPPED, session_id=sid, reason=act.action, cause=act.reason,
                   path=act.path)
    return attrs.evolve(base, outcome=act.action, reason=act.reason or why, error=act.detail)


def host_driver(host: Host) -> str:
    """The driver a host is (``AgentLoop``: ``loop``; an adapter's host: its framework)."""
    return str(getattr(host, "driver", "loop"))


def resume_one(store: Store, loop: Host, marker: Marker, *, adopt: bool = False,
               policy: RecoveryPolicy | None = None, resume: bool = True,
               wait: bool = True) -> Outcome:
    """Claim one marker under its ORIGINAL route lock and resume, abandon or park it.

    ``adopt=True`` (an explicit operator action, e.g. ``fsdurable adopt``) skips the ``enabled``
    and foreign-node gates; staleness and the attempt cap still apply. The route lock is waited
    for up to ``lock_timeout`` (``wait=False``: tried once) — a live turn on the route finishes
    first; a route still held leaves the marker for later (``busy``). ``marker`` is the one the
    caller listed: if its attempt count moved since, another process claimed the turn
    meanwhile and it is ``busy`` here, not claimed twice.
    """
    pol = policy_of(store, policy)
    base = _base(store, marker, pol, adopt)
    try:
        with store.lock(marker.route_key, timeout=pol.lock_timeout if wait else 0):
            claim = _claim(store, loop, marker, pol, adopt, base, resume)
            if isinstance(claim, Outcome):
                return claim
            try:
                result: Any = loop.resume_claimed(claim.session)
            except Exception as e:  # one bad turn never stops recovery of the others
                return _resumed(store, pol, claim, None, e)
            return _resumed(store, pol, claim, result, None)
    except LockTimeout:
        return _busy(store, marker, base)


async def aresume_one(store: Store, host: Host, marker: Marker, *, adopt: bool = False,
                      policy: RecoveryPolicy | None = None, resume: bool = True,
                      wait: bool = True) -> Outcome:
    """``resume_one`` for asyncio (the lock wait is cancellable, the disk work off the loop)."""
    from ._aio import run_sync
    from ._async import AsyncStore

    pol = policy_of(store, policy)
    base = await run_sync(_base, store, marker, pol, adopt)
    try:
        async with AsyncStore(store).lock(marker.route_key,
                                          timeout=pol.lock_timeout if wait else 0):
            claim = await run_sync(_claim, store, host, marker, pol, adopt, base, resume)
            if isinstance(claim, Outcome):
                return claim
            try:
                result = await _aresume(host, claim.session)
            except Exception as e:
                return await run_sync(_resumed, store, pol, claim, None, e)
            return await run_sync(_resumed, store, pol, claim, result, None)
    except LockTimeout:
        return await run_sync(_busy, store, marker, base)


async def _aresume(host: Host, s: Session) -> Any:
    import inspect

    from ._aio import run_sync

    fn = getattr(host, "aresume_claimed", None)
    if fn is not None:
        return await fn(s)
    if inspect.iscoroutinefunction(host.resume_claimed):
        return await host.resume_claimed(s)
    out = await run_sync(host.resume_claimed, s)
    return await out if inspect.isawaitable(out) else out


def _base(store: Store, marker: Marker, pol: RecoveryPolicy, adopt: bool) -> Outcome:
    now = store.clock()
    return Outcome(marker.session_id, marker.turn_id, marker.node_id,
                   verdict(marker, node_id=store.node_id, now=now, policy=pol, adopt=adopt),
                   now - marker.checkpoint_at, marker.resume_attempts, "")


def _busy(store: Store, marker: Marker, base: Outcome) -> Outcome:
    store.emit(SKIPPED, session_id=marker.session_id, turn_id=marker.turn_id,
               reason="route_busy", route_key=marker.route_key)
    return attrs.evolve(base, outcome="busy", reason="route_busy")


@attrs.frozen
class _Claim:
    """A turn claimed for a resume: its attempt is committed, the route lock is held."""

    session: Session
    attempt: int
    base: Outcome


def _repaired(store: Store, sid: str, base: Outcome, reason: str) -> Outcome:
    """The marker disagrees with its session: the repair gate makes them agree (or reports why
    it may not: another node's, ahead of its session, a newer format)."""
    act = _repair.repair_marker(store, sid)
    if act.acted or act.action == _repair.NOTHING:
        return attrs.evolve(base, outcome="repaired", reason=reason)
    return attrs.evolve(base, outcome=act.action, reason=act.reason, error=act.detail)


def host_rerun_safe(host: Host, store: Store, name: str) -> bool:
    """May an in-doubt call of ``name`` be re-run on an unattended resume? The host says so
    (``rerun_safe``), else: only an ``idempotent`` tool that the deny-list does not refuse."""
    says = getattr(host, "rerun_safe", None)
    if says is not None:
        return bool(says(name))
    return host.tool_effect(name) == "idempotent" and name not in store.config.unattended_deny


def _claim(store: Store, loop: Host, marker: Marker, pol: RecoveryPolicy, adopt: bool,
           base: Outcome, resume: bool) -> Outcome | _Claim:
    """Under the route lock: re-read, re-gate, and either decide (an Outcome) or commit the
    attempt (a _Claim, to resume)."""
    sid, tid = marker.session_id, marker.turn_id
    try:
        fresh = store.read_marker(sid)
    except UnreadableState as e:  # went bad since the listing: the gate, then the next start
        o = bad_marker(store, sid, e.reason or "unreadable", dry_run=False)
        return attrs.evolve(base, outcome=o.outcome, reason=o.reason, error=o.error)
    if fresh is not None and fresh.turn_id == tid and fresh.route_key != marker.route_key:
        # the route changed since the listing: the lock held is not the turn's; next start
        store.emit(SKIPPED, session_id=sid, turn_id=tid, reason="route_changed",
                   route_key=fresh.route_key)
        return attrs.evolve(base, outcome="busy", reason="route_changed")
    if fresh is None or fresh.turn_id != tid:
        # a live turn (or another recovery) finished or replaced it while we waited
        store.emit(ev.ABANDONED, session_id=sid, turn_id=tid, reason="superseded",
                   detail_reason="marker_gone" if fresh is None else "new_turn")
        return attrs.evolve(base, outcome="superseded", reason="superseded")
    try:
        s = store.load(sid)
    except SessionNotFound:
        return _repaired(store, sid, base, "orphan")  # marker_repaired (orphan)
    except UnreadableState:  # the gate quarantines it (an event), then the marker goes
        act = _repair.repair_session(store, sid)
        if not act.acted:  # a newer format, another node's, or the disk refused: left
            return attrs.evolve(base, outcome=act.action, reason=act.reason or "unreadable",
                                error=act.detail)
        store.abandon_turn(sid, tid, reason="unreadable", moved_to=act.moved_to)
        _repair.repair_marker(store, sid)
        return attrs.evolve(base, outcome="abandoned", reason="unreadable")
    if _repair.migrate_session(store, sid, loaded=s).action == "migrated":
        s = store.load(sid)  # an older format: rewritten by the gate, not by our next commit
    if not s.in_progress or s.turn is None:
        # a crash between the session write and the marker removal
        return _repaired(store, sid, base, "orphan")
    if s.turn.id != tid:
        _repaired(store, sid, base, "superseded")
        store.emit(ev.ABANDONED, session_id=sid, turn_id=tid, reason="superseded",
                   detail_reason="session_on_other_turn", current_turn=s.turn.id)
        return attrs.evolve(base, outcome="superseded", reason="superseded")
    if (fresh.resume_attempts != marker.resume_attempts
            or s.turn.resume_attempts > marker.resume_attempts):
        # another process claimed it since we listed it (its resume failed or is over): one
        # start spends at most one attempt per turn, however many processes recover
        store.emit(SKIPPED, session_id=sid, turn_id=tid, reason="claimed_elsewhere",
                   listed_attempts=marker.resume_attempts, attempts=s.turn.resume_attempts)
        return attrs.evolve(base, outcome="busy", reason="claimed_elsewhere")
    # re-gate on what is on disk now (the session's checkpoint time is exact, the marker's may
    # lag by Config.marker_refresh)
    now = store.clock()
    j = judged(fresh, s.turn.checkpoint_at, s.turn.resume_attempts, now=now, policy=pol)
    exact = j.marker
    if j.ahead > pol.max_clock_skew:  # a time from the future never decides staleness
        store.emit(ev.CLOCK_STEP, session_id=sid, turn_id=tid, ahead=round(j.ahead, 3),
                   marker_checkpoint_at=fresh.checkpoint_at,
                   session_checkpoint_at=s.turn.checkpoint_at, trusted_checkpoint_at=j.trusted)
    v = verdict(exact, node_id=store.node_id, now=now, policy=pol, adopt=adopt)
    age = now - exact.checkpoint_at
    base = attrs.evolve(base, verdict=v, age=age, attempts=exact.resume_attempts)
    if v in NOT_CLAIMED:
        store.emit(SKIPPED, session_id=sid, turn_id=tid, reason=v, marker_node=fresh.node_id)
        return attrs.evolve(base, outcome=NOT_CLAIMED[v], reason=v)
    if v == "stale":
        store.abandon_turn(sid, tid, reason="stale", age=round(age, 3),
                           window=pol.stale_after)
        return attrs.evolve(base, outcome="abandoned", reason="stale")
    if v == "exhausted":
        store.abandon_turn(sid, tid, reason="exhausted", attempts=exact.resume_attempts,
                           cap=pol.max_attempts)
        return attrs.evolve(base, outcome="abandoned", reason="exhausted")
    if not resume:
        return attrs.evolve(base, outcome="left", reason="no_loop")
    doubtful = [e for e in in_doubt(s) if not host_rerun_safe(loop, store, e.name)]
    if doubtful:  # parking answers the transcript's unanswered calls: it reads its end
        try:
            return _park(store, s, doubtful, base)
        except (HistoryUnavailable, UnreadableState) as e:
            cause = waiting_cause(e)
            if cause is None:
                raise
            return _waiting(store, s, base, cause, e)
    # the history the resume reads must be on disk BEFORE the attempt is spent: a document
    # that a sync tool delivered before its segments (or a LangGraph thread's log) is
    # waiting for sync, never a failed attempt (read at execution time: no gate reads it)
    waiting = waiting_for(loop, s, store)
    if waiting is not None:
        return _waiting(store, s, base, *waiting)
    attempt = s.turn.resume_attempts + 1
    # the attempt is durable BEFORE the model call: a crash inside the call still counts
    # the claim makes this node the turn's owner (it already is, unless this is an adoption)
    # a new attempt id, in the same commit; the run id stays: it survives every resume
    s = store.commit(attrs.evolve(s, turn=attrs.evolve(s.turn, resume_attempts=attempt,
                                                       attempt_id=new_id())),
                     s.version, owner=store.node_id)
    assert s.turn is not None
    store.emit(ev.RESUMING, session_id=sid, turn_id=tid, attempt=attempt, cap=pol.max_attempts,
               adopted=adopt, rerun_in_doubt=[e.tool_call_id for e in in_doubt(s)],
               driver=s.turn.driver or host_driver(loop), run_id=s.turn.run_id,
               attempt_id=s.turn.attempt_id)
    return _Claim(s, attempt, attrs.evolve(base, attempts=attempt))


def read_history(s: Session) -> None:
    """Read what a resume of ``s`` reads (``Host.history_ready``'s default): its messages from
    the summary's start and every lane, whole, each segment verified. The segments read stay in
    the chains the claimed session shares, so the resume does not read them again."""
    for values in (s.messages, *s.lanes.values()):
        tuple(values)


def history_ready(host: Host | None, s: Session, store: Store) -> None:
    """Raise if the history resuming ``s`` needs is not readable (the host says what that is;
    every item log the document names must reach what it has seen too)."""
    check = getattr(host, "history_ready", None)
    if check is not None:
        check(s)
    else:
        read_history(s)
    from ._itemlog import logs_ready

    logs_ready(store.layout.history_dir(s.id), s, store.config.max_file_bytes)


def waiting_for(host: Host | None, s: Session, store: Store) -> tuple[str, Exception] | None:
    """(why the history resuming ``s`` needs is waiting for sync, the error met), or None: it
    reads — or it fails another way (corrupt, short, the disk's EIO, a host's own check that
    raised), which the resume itself then meets and fails its attempt on, as it did before this
    check: the check only ever puts a resume off, it never stops recovery of the others."""
    try:
        history_ready(host, s, store)
    except Exception as e:  # the resume meets it again, inside its own guard
        cause = waiting_cause(e)
        return None if cause is None else (cause, e)
    return None


def waiting_cause(e: Exception) -> str | None:
    """Why ``e`` is a history waiting for sync (None: it is not — corrupt, short, ...)."""
    if isinstance(e, HistoryUnavailable) and e.reason == "waiting_for_sync":
        return "history_missing"
    if isinstance(e, UnreadableState) and e.reason == "log_short":
        return "log_short"
    return None


def _waiting(store: Store, s: Session, base: Outcome, cause: str, e: Exception) -> Outcome:
    """The resume is put off until the history arrives: nothing committed, no attempt spent,
    the marker kept for the next start (the staleness window still bounds the wait)."""
    err = f"{type(e).__name__}: {e}"
    store.emit(SKIPPED, session_id=s.id, turn_id=base.turn_id, reason=_repair.WAITING,
               cause=cause, path=getattr(e, "path", None), error=err)
    return attrs.evolve(base, outcome=_repair.WAITING, reason=cause, error=err)


def _resumed(store: Store, pol: RecoveryPolicy, claim: _Claim, result: Any,
             error: Exception | None) -> Outcome:
    """The events and the outcome of a claimed turn's resume."""
    attempt, base = claim.attempt, claim.base
    sid, tid = base.session_id, base.turn_id
    if error is not None:
        err = f"{type(error).__name__}: {error}"
        store.emit(ev.RESUME_FAILED, session_id=sid, turn_id=tid, attempt=attempt,
                   cap=pol.max_attempts, error=err)
        if isinstance(error, HostError):  # the loop ended the turn (turn_failed): no retry
            return attrs.evolve(base, outcome="failed", reason=error.reason, error=err)
        if attempt >= pol.max_attempts:
            store.abandon_turn(sid, tid, reason="exhausted", attempts=attempt,
                               cap=pol.max_attempts)
            return attrs.evolve(base, outcome="abandoned", reason="exhausted", error=err)
        return attrs.evolve(base, outcome="failed", error=err)
    status = getattr(result, "status", None)
    if status == "abandoned":  # the host found nothing to resume from (TurnRun.abandon: its
        # interrupted_turn_abandoned is the event)
        return attrs.evolve(base, outcome="abandoned", reason=getattr(result, "reason", None),
                            status=status)
    store.emit(ev.RESUMED, session_id=sid, turn_id=tid, attempt=attempt, status=status)
    return attrs.evolve(base, outcome="resumed", status=status)


def _park(store: Store, s: Session, doubtful: list[Any], base: Outcome) -> Outcome:
    """An in-doubt call that a repeat could duplicate: stop the turn, never re-run it, and leave
    the facts for a human (event + ``metadata["review_required"]``)."""
    from ._model import REVIEW, review_record

    assert s.turn is not None
    tid = s.turn.id
    calls: list[dict[str, Any]] = []

    def park(cur: Session) -> Session:
        if not cur.in_progress or cur.turn is None or cur.turn.id != tid:
            return cur
        # calls parked earlier and not yet answered stay in the record (one shape: _review)
        rr = review_record(tid, doubtful, at=store.clock(), reason="in_doubt",
                           previous=cur.metadata.get(REVIEW))
        calls[:] = rr["calls"][-len(doubtful):]
        meta = {**cur.metadata, REVIEW: rr}
        # every tool call keeps an answer, so the transcript stays valid for the next turn
        doubt = {e.tool_call_id for e in doubtful}
        answers = tuple(Message("tool", "outcome unknown: the process died during this call; "
                                "it was not repeated and needs a human's review"
                                if c.id in doubt else "not run: the turn was interrupted",
                                tool_call_id=c.id) for c in unanswered_calls(cur))
        return attrs.evolve(cur, in_progress=False, turn=None, metadata=meta,
                            messages=extended(cur.messages, *answers))

    store.patch(s.id, park)
    store.emit(ev.REVIEW_REQUIRED, session_id=s.id, turn_id=tid, reason="in_doubt",
               calls=calls)
    return attrs.evolve(base, outcome="review_required", reason="in_doubt")


__all__ = ["SKIPPED", "Host", "Outcome", "aresume_one", "bad_marker", "history_ready",
           "host_driver", "host_rerun_safe", "policy_of", "read_history", "resume_one",
           "waiting_cause"]
