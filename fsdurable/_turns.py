"""THE turn protocol: every turn, whichever driver runs it, goes through ``TurnRun``.

As every write goes through the one commit function and every repair through the repair gate,
every turn — the reference ``AgentLoop``, a LangGraph graph run, an Agents SDK run, a Pydantic AI
run — goes through this module. A driver translates its framework's events into these calls and
re-implements none of the rules:

- ``TurnRun.begin`` (a live turn): the turn's route lock is taken and HELD for the whole run, in
  this process; the session is committed in progress, marker first, before the driver calls any
  model (``turn_started`` names the driver, the run id and the attempt id). A session re-routed
  while the lock was awaited is begun under its new route instead.
- ``TurnRun.claimed`` (a resume): recovery holds the route lock and has committed the attempt
  (``resume_attempts`` + 1, a new ``attempt_id``) before calling the driver. A claimed run is
  UNATTENDED, always: nothing read from disk and no argument can say otherwise.
- ``commit``/``boundary``/``flush``: checkpoints. ``boundary`` is debounced
  (``Config.checkpoint_debounce``) and keeps the driver's change pending; a pending change is
  flushed — never skipped — by the next tool intent, ``flush``, ``end`` and ``cancel``. Every
  commit is a read-modify-write of the session through the store's commit function, refused
  (``TurnStopped``) once the turn was cancelled or superseded, here or in another process.
- ``before_tool``/``after_tool``: the unattended policy and the ledger. Decided at execution
  time: an unattended run refuses the deny-list (``tool_refused``) and every approval (a stored
  approval is not a human present); an attended run asks the live caller's ``approve``. An
  effectful call's intent, with its arguments and its idempotency key
  (``<session>:<turn>:<call>``), is committed before it runs and its outcome after; a call with
  an outcome on record is answered from the ledger, never run again; an in-doubt call is re-run
  (same key) only if a repeat is a no-op, else the turn is parked for review by recovery.
- ``end`` / ``pause`` / ``fail`` / ``cancel``: the turn ends (marker removed after the session),
  waits for a human (not interrupted), fails with ``turn_failed`` (never retried), or is
  cancelled — it never comes back; an in-doubt call goes to the review queue, never dropped.

Every end releases the route lock a live run holds. A ``TurnRun`` is used from one thread at a
time (its lock guards the debounce state for a ``cancel`` from another thread).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from . import _events as ev
from . import _fsio
from ._begin import abegin_locked, begin_locked
from ._errors import ConflictError, SessionNotFound, TurnStateError, TurnStopped
from ._model import LedgerEntry, Message, Session, closed_turn, extended, with_entry
from ._policy import Approver, ToolDecision, ToolRequest, refusal_of, rerun_safe
from ._store import Store
from ._tools import ToolContext

Change = Callable[[Session], Session]


def _compose(first: Change | None, then: Change | None) -> Change | None:
    if first is None:
        return then
    if then is None:
        return first
    return lambda s: then(first(s))


class TurnRun:
    """One turn of one session, driven by any driver (see the module doc)."""

    def __init__(self, store: Store, session: Session, *, driver: str, attended: bool,
                 resumed: bool, clock: Callable[[], float] | None = None,
                 hold: contextlib.ExitStack | None = None) -> None:
        turn = session.turn
        if turn is None or not session.in_progress:
            raise TurnStateError(f"session {session.id!r} has no turn in progress",
                                 session_id=session.id, reason="not_in_progress")
        self.store = store
        self.session = session  # as last committed
        self.session_id = session.id
        self.turn_id = turn.id
        self.run_id = turn.run_id
        self.attempt_id = turn.attempt_id
        self.driver = driver
        self.attended = attended and not resumed
        self.resumed = resumed
        self.clock = clock if clock is not None else time.monotonic
        self.committed_at = self.clock()
        self.pending: Change | None = None
        self.pending_phase: str | None = None
        # the checkpoint debounce of this run (None: ``Config.checkpoint_debounce``); a driver
        # whose API takes a per-run debounce sets it
        self.debounce: float | None = None
        self.status: str | None = None  # set when the turn ended here
        self._hold = hold
        self._cancelled = threading.Event()
        self._mu = threading.RLock()

    # ------------------------------------------------------------------ construction

    @classmethod
    def begin(cls, store: Store, session_id: str, content: str | None = None, *, driver: str,
              attended: bool, change: Change | None = None, create: bool = False,
              source: str = "api", lock_timeout: float | None = None,
              clock: Callable[[], float] | None = None, resume: bool = False) -> TurnRun:
        """Begin a live turn: take the session's route lock (held until the turn ends), commit
        the session in progress with its marker (``content``: a user message appended; ``change``
        applied in the same commit — a driver's run record), emit ``turn_started``.
        ``create``: a missing session is created first (with ``source``). ``attended``: a human
        is present NOW (the live caller's word; nothing stored decides it). ``resume``: a turn
        of this driver left in progress by a run that died (nobody holds its route lock, or we
        could not have taken it) is continued by this live run instead of refused — its run id,
        ledger and attempt count kept, a new attempt id (``turn_started`` says
        ``continued``): a framework whose user re-invokes an interrupted run (LangGraph's
        ``invoke(None)``) runs the same turn, so an in-doubt call stays in doubt."""
        s, hold = begin_locked(store, session_id, content, driver=driver, attended=attended,
                               change=change, create=create, source=source,
                               lock_timeout=lock_timeout, resume=resume)
        return cls(store, s, driver=driver, attended=attended, resumed=False, clock=clock,
                   hold=hold)

    @classmethod
    async def abegin(cls, store: Store, session_id: str, content: str | None = None, *,
                     driver: str, attended: bool, change: Change | None = None,
                     create: bool = False, source: str = "api",
                     lock_timeout: float | None = None,
                     clock: Callable[[], float] | None = None) -> TurnRun:
        """``begin`` on an event loop: the lock wait is cancellable, the disk work off the loop.
        A task cancelled while its begin commit runs gets no turn: the commit happened (it is
        never stopped half-way), so the turn it began is cancelled at once (``turn_cancelled``)
        — it never comes back at the next start."""
        s, hold = await abegin_locked(store, session_id, content, driver=driver,
                                      attended=attended, change=change, create=create,
                                      source=source, lock_timeout=lock_timeout)
        return cls(store, s, driver=driver, attended=attended, resumed=False, clock=clock,
                   hold=hold)

    @classmethod
    def claimed(cls, store: Store, session: Session, *,
                clock: Callable[[], float] | None = None) -> TurnRun:
        """The run of a turn recovery claimed (it holds the route lock and committed the
        attempt). Unattended, always; the driver is the one the turn records."""
        from ._model import turn_driver

        return cls(store, session, driver=turn_driver(session), attended=False, resumed=True,
                   clock=clock)

    # ------------------------------------------------------------------ state

    @property
    def mutex(self) -> threading.RLock:
        """The run's mutex (re-entrant; every commit of the run holds it). A driver that
        commits through the run while holding a lock of its own around it (the LangGraph
        saver: the thread's commit lock, held while it writes its records) takes this one
        first, so that two threads always take the two in the same order."""
        return self._mu

    @property
    def open(self) -> bool:
        return self.status is None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def context(self, call_id: str) -> ToolContext:
        """The ``ToolContext`` of a call of this turn (its idempotency key is per turn)."""
        return ToolContext(session_id=self.session_id, turn_id=self.turn_id,
                           tool_call_id=call_id,
                           idempotency_key=f"{self.session_id}:{self.turn_id}:{call_id}",
                           attended=self.attended, resumed=self.resumed,
                           is_cancelled=self.is_cancelled)

    def is_cancelled(self) -> bool:
        try:
            self.check()
        except TurnStopped:
            return True
        return False

    def check(self) -> None:
        """Raise ``TurnStopped`` if the turn was cancelled or superseded (here or elsewhere)."""
        if self._cancelled.is_set():
            raise TurnStopped("cancelled", self.session_id, self.turn_id)
        if self.status is not None:
            raise TurnStopped(self.status, self.session_id, self.turn_id)
        if _fsio.lstat(self.store.layout.marker(self.session_id)) is None:
            self._ours(self._disk())  # no marker: cancelled or finished elsewhere?

    def _disk(self) -> Session | None:
        try:
            return self.store.load(self.session_id)
        except SessionNotFound:
            return None

    def _ours(self, disk: Session | None) -> Session:
        if disk is None or not disk.in_progress or disk.turn is None:
            raise TurnStopped("cancelled", self.session_id, self.turn_id)
        if disk.turn.id != self.turn_id:
            raise TurnStopped("superseded", self.session_id, self.turn_id)
        return disk

    # ------------------------------------------------------------------ checkpoints

    def commit(self, change: Change | None = None, *, phase: str) -> Session:
        """Commit the pending change and ``change`` (read-modify-write of the session on disk,
        through the commit function) as a checkpoint at ``phase``."""
        with self._mu:
            if self._cancelled.is_set():
                raise TurnStopped("cancelled", self.session_id, self.turn_id)
            todo = _compose(self.pending, change)

            def step(cur: Session) -> Session:
                cur = self._ours(cur)
                new = todo(cur) if todo is not None else cur
                turn = new.turn
                if turn is None or turn.id != self.turn_id or not new.in_progress:
                    raise TurnStateError("a checkpoint change must keep the turn in progress",
                                         session_id=self.session_id, reason="bad_change")
                return new

            self.session = self._patch(step, phase=phase)
            self.pending, self.pending_phase = None, None
            self.committed_at = self.clock()
            return self.session

    def _patch(self, fn: Change, *, phase: str | None = None) -> Session:
        """Read-modify-write of the session under its commit lock, through the store's commit
        function (``Store.checkpoint`` at ``phase``, else ``Store.commit``); a file replaced
        between the read and the write (a sync tool) is read again, a few times, then
        ``contended``."""
        store, sid = self.store, self.session_id
        for tries in range(_REBASES, -1, -1):
            try:
                with store.commit_lock(sid):
                    cur = store.load(sid)
                    new = fn(cur)
                    if phase is not None:
                        return store.checkpoint(new, phase=phase)
                    return store.commit(new, cur.version)
            except SessionNotFound:
                raise TurnStopped("cancelled", sid, self.turn_id) from None
            except ConflictError as e:
                if tries == 0:
                    raise ConflictError(f"session {sid!r} keeps changing under the running "
                                        "turn", session_id=sid, reason="contended") from e
        raise AssertionError("unreachable")

    def defer(self, change: Change) -> None:
        """Keep ``change`` pending for the next commit (no commit now, whatever the debounce)."""
        with self._mu:
            self.check()
            self.pending = _compose(self.pending, change)

    def boundary(self, phase: str, change: Change | None = None) -> None:
        """A phase boundary (model reply received, tool batch finished, ...): ``change`` is
        committed now if the debounce allows, else kept pending for the next commit."""
        with self._mu:
            self.check()
            self.pending = _compose(self.pending, change)
            self.pending_phase = phase
            wait = self.store.config.checkpoint_debounce if self.debounce is None \
                else self.debounce
            if self.clock() - self.committed_at >= wait:
                self.commit(phase=phase)
            elif self.pending is None:
                self.pending = lambda s: s  # the checkpoint time itself is due

    def flush(self, phase: str | None = None) -> None:
        """Commit a pending checkpoint now (before a model call on a resumed turn, ...)."""
        with self._mu:
            if self.pending is not None:
                self.commit(phase=phase or self.pending_phase or "checkpoint")

    # ------------------------------------------------------------------ tools

    def before_tool(self, req: ToolRequest, *, approve: Approver | None = None,
                    deny: frozenset[str] | None = None) -> ToolDecision:
        """Decide a tool call at execution time (see the module doc). ``approve(ctx, req)``: the
        live caller's answer to an approval request — asked only when a human is present;
        ``deny``: the unattended deny-list (default ``Config.unattended_deny``)."""
        self.check()
        ctx = self.context(req.call_id)
        known = self.session.turn.entry(req.call_id) if self.session.turn else None
        if known is not None and known.status != "intent":  # an outcome: never run again
            return ToolDecision("answered", req, ctx, text=known.result or "")
        denied = self.store.config.unattended_deny if deny is None else deny
        refusal = refusal_of(req, attended=self.attended, ctx=ctx, approve=approve,
                             denied=denied)
        if refusal is not None:
            if known is not None:  # in doubt: it may have run, "refused" would be a lie
                raise TurnStateError(f"tool call {req.call_id!r} ({req.name}) is in doubt and "
                                     "would be refused on this run", session_id=self.session_id,
                                     reason="in_doubt")
            reason, text = refusal
            self.store.emit(ev.TOOL_REFUSED, session_id=self.session_id, turn_id=self.turn_id,
                            reason=reason, tool=req.name, tool_call_id=req.call_id,
                            attended=self.attended, driver=self.driver)
            if req.effect != "none":
                now = self.store.clock()
                self._ledger(LedgerEntry(req.call_id, req.name, req.effect, ctx.idempotency_key,
                                         "refused", now, now, text,
                                         arguments=dict(req.arguments)), phase="tool_refused")
            return ToolDecision("refused", req, ctx, text=text, reason=reason)
        if known is not None:  # in doubt and the repeat is a no-op: same key, again
            if not rerun_safe(req.effect, req.needs_approval, req.name in denied):
                raise TurnStateError(f"tool call {req.call_id!r} ({req.name}) is in doubt and "
                                     "cannot be re-run safely", session_id=self.session_id,
                                     reason="in_doubt")
            self.flush("tool_intent")
            return ToolDecision("run", req, ctx, rerun=True)
        if req.effect != "none":  # durable BEFORE the call, carrying any pending checkpoint
            self._ledger(LedgerEntry(req.call_id, req.name, req.effect, ctx.idempotency_key,
                                     "intent", self.store.clock(),
                                     arguments=dict(req.arguments)), phase="tool_intent")
        return ToolDecision("run", req, ctx)

    def after_tool(self, decision: ToolDecision, *, ok: bool, result: str,
                   change: Change | None = None) -> None:
        """Record a call's outcome (an effectful one committed now; ``change``, e.g. the tool
        message, in the same commit) — or, for a call without effect, keep ``change`` pending."""
        req = decision.request
        if req.effect == "none" or decision.action != "run":
            if change is not None:
                self.defer(change)
            return
        now = self.store.clock()
        entry = LedgerEntry(req.call_id, req.name, req.effect, decision.context.idempotency_key,
                            "done" if ok else "failed",
                            self._intent_at(req.call_id, now), now, result,
                            arguments=dict(req.arguments))
        self._ledger(entry, phase="tool_outcome", change=change)

    def _intent_at(self, call_id: str, default: float) -> float:
        known = self.session.turn.entry(call_id) if self.session.turn else None
        return known.intent_at if known is not None else default

    def _ledger(self, entry: LedgerEntry, *, phase: str, change: Change | None = None) -> None:
        def put(s: Session) -> Session:
            s = with_entry(s, entry)
            return change(s) if change is not None else s

        self.commit(put, phase=phase)

    # ------------------------------------------------------------------ ends

    def end(self, change: Change | None = None, *, status: str = "completed",
            reply: str | None = None) -> Session:
        """The turn is over: one commit not in progress (the pending change and ``change`` in
        it; the marker removed after the session), ``turn_completed``; the route lock released."""
        return self._close(change, status=status, code=ev.TURN_COMPLETED, reply=reply)

    def pause(self, change: Change | None = None, *, why: str) -> Session:
        """The run waits for a human (an approval, an interrupt): its turn is over — not
        interrupted, so nothing resumes it — and ``change`` keeps what the human answers to."""
        return self._close(change, status="paused", code=ev.TURN_PAUSED, why=why)

    def fail(self, error: BaseException, change: Change | None = None) -> Session | None:
        """A programming error of the host or the framework: end the turn (what it did is kept,
        the marker removed) with ``turn_failed``; retrying at the next start would fail the
        same way. None if the turn had stopped meanwhile."""
        try:
            return self._close(change, status="failed", code=ev.TURN_FAILED,
                               reason=getattr(error, "reason", None) or "error",
                               error=f"{type(error).__name__}: {error}")
        except TurnStopped:
            return None

    def _close(self, change: Change | None, *, status: str, code: str,
               reply: str | None = None, reason: str | None = None, **detail: Any) -> Session:
        doubt: list[dict[str, Any]] = []
        with self._mu:
            try:
                if self._cancelled.is_set():
                    raise TurnStopped("cancelled", self.session_id, self.turn_id)
                todo = _compose(self.pending, change)

                def finish(cur: Session) -> Session:
                    cur = self._ours(cur)
                    new = todo(cur) if todo is not None else cur
                    if reply is not None:
                        new = attrs.evolve(new, messages=extended(new.messages,
                                                                  Message("assistant", reply)))
                    # a call still at its intent may have run: to the review queue, never
                    # dropped with the turn (a run failed or paused while a tool was out)
                    new, doubt[:] = closed_turn(new, at=self.store.clock(), reason=status)
                    return new

                s = self._patch(finish)
                self.session, self.pending, self.status = s, None, status
            finally:
                if self.status is not None or self._cancelled.is_set():
                    self.release()
        # a completion restates the commit just made (a note: EventLog.note); a pause, a failure
        # or an end for another reason (a step limit: the document records no status, the line
        # is the only record of why the turn stopped) is a decision, fsynced as it is appended
        say = self.store._note if status == "completed" else self.store.emit
        say(code, session_id=self.session_id, turn_id=self.turn_id, reason=reason,
            status=status, driver=self.driver, run_id=self.run_id, attempt_id=self.attempt_id,
            **detail)
        if doubt:
            self.store.emit(ev.REVIEW_REQUIRED, session_id=self.session_id,
                            turn_id=self.turn_id, reason=status, calls=doubt)
        return s

    def abandon(self, reason: str, **detail: Any) -> Session | None:
        """A claimed run that finds nothing to resume from (its process died before the run
        saved anything it could continue: a graph killed before its first checkpoint): the turn
        ends without running on, ``interrupted_turn_abandoned`` (``reason``), in-doubt calls to
        the review queue — never reported as completed. None if the turn had moved on."""
        with self._mu:
            try:
                s = self.store.abandon_turn(self.session_id, self.turn_id, reason=reason,
                                            driver=self.driver, run_id=self.run_id,
                                            attempt_id=self.attempt_id, **detail)
            finally:
                self.status = self.status or "abandoned"
                self.release()
        return s

    def cancel(self, *, unstarted: str | None = None) -> Session:
        """Cancel the turn: the pending checkpoint flushed, the session committed not in
        progress (marker removed, ``turn_cancelled``; an in-doubt call to the review queue);
        the driver stops at its next boundary. It never comes back. ``unstarted``: a call whose
        intent was committed but whose tool the driver never started (the cancel came during
        the intent commit): not in doubt, so it leaves no review record."""
        with self._mu:
            if not self._cancelled.is_set() and self.status is None:
                drop = None if unstarted is None else _without_intent(unstarted)
                with contextlib.suppress(TurnStopped, ConflictError):
                    if drop is not None or self.pending is not None:
                        self.commit(drop, phase=self.pending_phase or "cancelled")
            self._cancelled.set()
            try:
                return self.store.cancel(self.session_id, turn_id=self.turn_id)
            finally:
                self.status = self.status or "cancelled"
                self.release()

    def release(self) -> None:
        """Release the route lock a live run holds (every end does; idempotent)."""
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.close()

    def __enter__(self) -> TurnRun:
        return self

    def __exit__(self, *exc: object) -> None:
        # an exception leaves the turn in progress (interrupted: recovery's to decide); the
        # route lock goes with this process's run either way
        self.release()


def _without_intent(call_id: str) -> Change:
    def drop(s: Session) -> Session:
        t = s.turn
        if t is None:
            return s
        keep = tuple(e for e in t.ledger
                     if not (e.tool_call_id == call_id and e.status == "intent"))
        return attrs.evolve(s, turn=attrs.evolve(t, ledger=keep))

    return drop


_REBASES = 3  # a session replaced this often during one commit is contended, not merely touched


__all__ = ["Approver", "Change", "ToolDecision", "ToolRequest", "TurnRun", "TurnStopped",
           "rerun_safe"]
