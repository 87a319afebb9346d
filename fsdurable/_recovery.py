"""Startup recovery: find interrupted turns with one listing, gate each, resume or abandon it.

``recover(store, host)`` is what a host calls at daemon start. For each marker (oldest first):

1. ``enabled`` off -> reported, nothing run, nothing removed (an operator during an incident);
2. a marker of another node -> listed, never run (``adopt`` is the explicit way to take it over);
3. older than the staleness window -> abandoned (``stale``): a months-old intent never fires;
4. attempts at the cap -> abandoned (``exhausted``): no boot loop;
5. otherwise claim it under the turn's ORIGINAL route lock (the same lock a live turn holds, so
   the two never interleave and recovery never cancels a live turn), tried once: a route held
   (a live turn, another process resuming it) is ``busy``. Re-read the marker and the session; a
   turn that finished or moved on meanwhile supersedes the recovery; one whose attempt count
   moved since the listing was claimed elsewhere (``busy``); an in-doubt call that cannot be
   re-run safely (not idempotent, or it needs approval, or it is deny-listed unattended) parks
   the turn for review; a history the resume reads that is not on disk yet (a sync tool
   delivered the document before its segments, or a LangGraph thread's log) puts the resume off
   without spending an attempt (``waiting_for_sync``, marker kept); otherwise the incremented
   attempt count is COMMITTED before the model is called, then the host continues the turn,
   unattended.

Every decision is an event. A resume that fails below the cap keeps the marker for the next start;
at the cap the turn is abandoned. This module lists, plans and reports; claiming and resuming one
turn (step 5) is ``_resume``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from . import _repair
from ._errors import FsDurableError, SessionNotFound, UnreadableState
from ._gates import NOT_CLAIMED, VERDICTS, RecoveryPolicy, driven_by, plan, verdict
from ._model import Marker, in_doubt
from ._resume import (
    SKIPPED,
    Host,
    Outcome,
    aresume_one,
    bad_marker,
    host_driver,
    host_rerun_safe,
    policy_of,
    resume_one,
    waiting_for,
)
from ._store import Store


@attrs.frozen
class RecoveryReport:
    outcomes: tuple[Outcome, ...]
    dry_run: bool = False

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes if o.outcome == outcome)

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "outcomes": [o.to_dict() for o in self.outcomes]}


def assess(store: Store, policy: RecoveryPolicy | None = None, *,
           select: Callable[[Marker], bool] | None = None, loop: Host | None = None,
           resume: bool = True) -> list[Outcome]:
    """Dry run: what ``recover`` would do with each marker, from the same reads. Runs nothing,
    changes nothing on disk, emits nothing."""
    pol = policy_of(store, policy)
    markers, bad = store.scan_markers()
    out = [bad_marker(store, sid, why, dry_run=True) for sid, why in bad]
    for m in markers:
        if select is not None and not select(m):
            continue
        out.append(_plan(store, m, pol, loop, resume))
    return out


def _plan(store: Store, m: Marker, pol: RecoveryPolicy, loop: Host | None,
          resume: bool) -> Outcome:
    now = store.clock()
    v = verdict(m, node_id=store.node_id, now=now, policy=pol)
    base = Outcome(m.session_id, m.turn_id, m.node_id, v, now - m.checkpoint_at,
                   m.resume_attempts, "")
    if v in NOT_CLAIMED:
        return attrs.evolve(base, outcome=NOT_CLAIMED[v], reason=v)
    try:
        s = store.load(m.session_id)
    except SessionNotFound:
        s = None
    except UnreadableState as e:  # as the real run: the repair gate's plan for the session
        act = _repair.repair_session(store, m.session_id, dry_run=True)
        if act.action in (_repair.NEEDS_NEWER, _repair.WAITING, _repair.FAILED):
            return attrs.evolve(base, outcome=act.action, reason=act.reason or "unreadable",
                                error=act.detail)
        return attrs.evolve(base, outcome="would_abandon", reason="unreadable", error=e.reason)
    except (FsDurableError, OSError) as e:  # the disk refused the read: the real run's "error"
        return attrs.evolve(base, outcome="error", reason="error",
                            error=f"{type(e).__name__}: {e}")
    turn = None if s is None or s.turn is None or not s.in_progress else \
        (s.turn.id, s.turn.checkpoint_at, s.turn.resume_attempts)
    v, outcome, reason, exact = plan(m, v, turn, node_id=store.node_id, now=now, policy=pol,
                                     resume=resume)
    base = attrs.evolve(base, verdict=v, age=now - exact.checkpoint_at,
                        attempts=exact.resume_attempts, outcome=outcome, reason=reason)
    if outcome == "would_resume" and s is not None and \
            any(loop is None or not host_rerun_safe(loop, store, e.name) for e in in_doubt(s)):
        return attrs.evolve(base, outcome="would_review", reason="in_doubt")
    if outcome == "would_resume" and s is not None:  # as the real claim: the history it reads
        waiting = waiting_for(loop, s, store)
        if waiting is not None:
            cause, err = waiting
            return attrs.evolve(base, outcome="waiting_for_sync", reason=cause,
                                error=f"{type(err).__name__}: {err}")
    return base


def _bad_markers(store: Store, markers: list[Marker], bad: list[tuple[str, str]]
                 ) -> list[Outcome]:
    """Real recovery takes each bad marker to the repair gate first; one it rebuilt (this
    node's turn in progress) joins ``markers`` and is gated like the others. An unreadable
    ``fsdurable.json`` found when the store was opened is replaced there too."""
    if store.manifest_problem is not None:
        _repair.repair_manifest(store)  # never raises: a failure is its event
    out = []
    for sid, why in bad:
        o = bad_marker(store, sid, why, dry_run=False)
        if o.outcome == "rebuilt_marker":
            try:
                rebuilt = store.read_marker(sid)
            except (FsDurableError, OSError):
                rebuilt = None
            if rebuilt is not None:
                markers.append(rebuilt)
                continue
        out.append(o)
    return out


def _listed(store: Store, m: Marker, pol: RecoveryPolicy) -> tuple[Outcome, Outcome | None]:
    """The marker's verdict as listed, and its outcome if it is not to be claimed here."""
    now = store.clock()
    v = verdict(m, node_id=store.node_id, now=now, policy=pol)
    base = Outcome(m.session_id, m.turn_id, m.node_id, v, now - m.checkpoint_at,
                   m.resume_attempts, "")
    if v not in NOT_CLAIMED:
        return base, None
    store.emit(SKIPPED, session_id=m.session_id, turn_id=m.turn_id, reason=v,
               marker_node=m.node_id)
    return base, attrs.evolve(base, outcome=NOT_CLAIMED[v], reason=v)


def _errored(store: Store, base: Outcome, e: BaseException) -> Outcome:
    err = f"{type(e).__name__}: {e}"
    store.emit(SKIPPED, session_id=base.session_id, turn_id=base.turn_id, reason="error",
               error=err)
    return attrs.evolve(base, outcome="error", reason="error", error=err)


def _default_select(select: Callable[[Marker], bool] | None, host: Host
                    ) -> Callable[[Marker], bool]:
    """Only the markers of turns the host's driver owns (``Turn.driver``, in the marker), and of
    those the ones the caller's ``select`` takes: no host ever resumes another driver's turn."""
    mine = driven_by(host_driver(host))
    if select is None:
        return mine
    return lambda m: mine(m) and select(m)


def recover(store: Store, loop: Host, policy: RecoveryPolicy | None = None, *,
            dry_run: bool = False, resume: bool = True,
            select: Callable[[Marker], bool] | None = None,
            progress: Callable[[str, int, int], None] | None = None) -> RecoveryReport:
    """Recover every interrupted turn of this node (what a host calls at daemon start).

    Only the turns the host's driver owns are claimed (``host.driver``, default ``loop``:
    ``Turn.driver`` as the marker carries it; ``source`` never decides): a framework adapter's
    runs are left to that adapter's ``recover``. ``select(marker)`` limits recovery further
    (e.g. one host's routes).
    ``resume=False`` applies every gate (stale/exhausted abandoned, orphans repaired) but leaves
    the turns that would resume untouched (outcome ``left``) — for a process without the host's
    loop, like the CLI. A turn whose route lock is held (a live turn, or another process
    resuming it right now) is ``busy``: tried once, never waited for, so however many processes
    recover at one start, each turn is claimed — and spends an attempt — at most once.
    A marker that cannot be read goes to the repair gate first (this node's turn in progress:
    rebuilt from its session, then gated like the others). ``dry_run=True`` changes nothing
    and says what a real run would do. Never raises because of one turn: each outcome is in the
    report and the event log. ``progress("turns", done, total)``, if given, is called as each
    interrupted turn's marker is dealt with (``total``: the markers listed; it should return
    at once: a CLI draws it).
    """
    pol = policy_of(store, policy)
    select = _default_select(select, loop)
    if dry_run:
        return RecoveryReport(tuple(assess(store, pol, select=select, loop=loop,
                                           resume=resume)), dry_run=True)
    markers, bad = store.scan_markers()
    out = _bad_markers(store, markers, bad)
    for n, m in enumerate(markers, 1):
        if progress is not None:
            progress("turns", n, len(markers))
        if select is not None and not select(m):
            continue
        base, done = _listed(store, m, pol)
        if done is None:
            try:
                done = resume_one(store, loop, m, policy=pol, resume=resume, wait=False)
            except (FsDurableError, OSError) as e:  # e.g. the disk refuses the claim commit
                done = _errored(store, base, e)
        out.append(done)
    return RecoveryReport(tuple(out))


async def arecover(store: Store, host: Host, policy: RecoveryPolicy | None = None, *,
                   resume: bool = True,
                   select: Callable[[Marker], bool] | None = None) -> RecoveryReport:
    """``recover`` for asyncio: the same gates, in the same order, with the listing, the claims
    and the commits off the event loop. The host's ``aresume_claimed`` (``AgentLoop`` has one)
    or an ``async def resume_claimed`` is awaited on the caller's loop; a sync
    ``resume_claimed`` runs in a worker thread."""
    from ._aio import run_sync

    pol = policy_of(store, policy)
    select = _default_select(select, host)
    markers, bad = await run_sync(store.scan_markers)
    out = await run_sync(_bad_markers, store, markers, bad)
    for m in markers:
        if select is not None and not select(m):
            continue
        base, done = await run_sync(_listed, store, m, pol)
        if done is None:
            try:
                done = await aresume_one(store, host, m, policy=pol, resume=resume, wait=False)
            except (FsDurableError, OSError) as e:
                done = await run_sync(_errored, store, base, e)
        out.append(done)
    return RecoveryReport(tuple(out))


__all__ = ["VERDICTS", "Host", "Outcome", "RecoveryPolicy", "RecoveryReport", "arecover",
           "aresume_one", "assess", "recover", "resume_one", "verdict"]
