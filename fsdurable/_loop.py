"""The reference agent loop: durable turns, debounced checkpoints, a side-effect ledger, cancel.

A turn is committed in progress (marker first) BEFORE the first model call; then model call ->
tool batch -> ... -> final reply; it ends with a commit that clears in-progress (and the marker).
Every write goes through the store's one commit function.

Checkpoints happen at phase boundaries (model reply received, tool batch finished, compaction
summary written) and are debounced (``Config.checkpoint_debounce``, measured on the loop's
monotonic clock). A pending checkpoint is flushed — never skipped — before any
``idempotent``/``external`` tool (the ledger's intent commit carries it), before every model call
of a resumed turn, at turn end and on cancel. The ledger commits an effectful tool's intent before
the call and its outcome after, so a crash in between leaves the call *in doubt* for recovery.

Attendance is decided here, at execution time: ``run(..., attended=)`` is the live caller's word;
``resume_claimed`` (the recovery path) is unattended, always — nothing read from disk changes it.

``run`` and ``arun`` share one step logic (``AgentLoop._steps``, a coroutine); ``_drivers`` says
where each blocking step runs — in the caller's thread, or off the caller's event loop.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from . import _events as ev
from . import _fsio
from ._config import Config
from ._drivers import IO, SYNC, AsyncIO, complete
from ._errors import ConflictError, HostError, SessionNotFound, TurnStateError
from ._model import (
    LedgerEntry,
    Message,
    Session,
    ToolCall,
    in_doubt,
    unanswered_calls,
    unique_calls,
    with_entry,
)
from ._store import Store
from ._tools import Model, Reply, Tool, ToolContext

Approver = Callable[[ToolContext, ToolCall], bool]
Compactor = Callable[[Sequence[Message]], "tuple[str, Sequence[Message]]"]


@attrs.frozen
class TurnResult:
    """How a turn ended: ``completed``, ``cancelled`` (by a cancel, here or in another process),
    ``superseded`` (another turn took the session) or ``step_limit``."""

    session_id: str
    turn_id: str
    status: str
    reply: str | None = None
    session: Session | None = None
    resumed: bool = False
    refused: tuple[str, ...] = ()


class _Stop(Exception):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


class _Run:
    """One turn being driven: in-memory session (``version`` = last committed), pending flag."""

    def __init__(self, session: Session, *, attended: bool, resumed: bool, now: float) -> None:
        assert session.turn is not None
        self.session = session
        self.turn_id = session.turn.id
        self.attended = attended
        self.resumed = resumed
        self.committed_at = now
        self.pending = False
        self.phase = session.turn.phase
        self.cancelled = threading.Event()
        self.mu = threading.RLock()
        self.refused: list[str] = []
        self.fresh_intent: str | None = None  # the call whose intent _prepare just committed
        self.unstarted: str | None = None  # ... and whose tool an arun cancel kept from starting


def _text(out: Any) -> str:
    return out if isinstance(out, str) else repr(out) if out is not None else ""


class AgentLoop:
    """Runs durable turns on a store: ``AgentLoop(store, model, tools, config)``.

    ``run`` drives a turn in the caller's thread; ``await arun(...)`` drives the same steps on
    the caller's event loop. ``approve(ctx, call) -> bool`` answers approval requests of an
    attended run (without it every request is denied); an unattended run denies them all
    without asking. ``clock`` is the MONOTONIC clock the checkpoint debounce measures elapsed
    time on (default ``time.monotonic``: a wall-clock step never stops or floods checkpoints);
    the times written to disk come from the store's clock. Thread-safe for distinct sessions.
    """

    def __init__(self, store: Store, model: Model, tools: Iterable[Tool] = (),
                 config: Config | None = None, *, clock: Callable[[], float] | None = None,
                 approve: Approver | None = None, max_steps: int = 32,
                 compactor: Compactor | None = None, compact_after: int = 200) -> None:
        self.store = store
        self.model = model
        self.tools = {t.name: t for t in tools}
        self.config = config if config is not None else store.config
        self.clock = clock if clock is not None else time.monotonic
        self.approve = approve
        self.max_steps = max_steps
        self.compactor = compactor
        self.compact_after = compact_after
        self._runs: dict[str, _Run] = {}
        self._mu = threading.Lock()

    # ------------------------------------------------------------------ host protocol

    def tool_specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self.tools.values()]

    def tool_effect(self, name: str) -> str | None:
        """The declared effect of a tool (None: unknown here — recovery treats it as external)."""
        t = self.tools.get(name)
        return t.effect if t is not None else None

    def rerun_safe(self, name: str) -> bool:
        """May an in-doubt call of this tool be re-run on an unattended resume? Only if a repeat
        with the same idempotency key is a no-op (``idempotent``) AND the resume would run it:
        a tool that needs approval or is deny-listed unattended would be refused, and recording
        "refused" for a call that may have run is a lie — such a turn is parked for review."""
        t = self.tools.get(name)
        return (t is not None and t.effect == "idempotent" and not t.needs_approval
                and name not in self.config.unattended_deny)

    def resume_claimed(self, session: Session) -> TurnResult:
        """Continue a turn that recovery claimed (it holds the route lock and has committed the
        attempt). Always unattended: this path has no way to say otherwise."""
        self._resumable(session)
        return complete(self._drive(session, SYNC, attended=False, resumed=True))

    async def aresume_claimed(self, session: Session) -> TurnResult:
        """``resume_claimed`` on the caller's event loop (what ``arecover`` calls)."""
        self._resumable(session)
        return await self._drive(session, AsyncIO(), attended=False, resumed=True)

    def _resumable(self, session: Session) -> None:
        if not session.in_progress:
            raise TurnStateError(f"session {session.id!r} has no turn to resume",
                                 session_id=session.id, reason="not_in_progress")
        for e in in_doubt(session):
            if not self.rerun_safe(e.name):
                raise TurnStateError(f"tool call {e.tool_call_id!r} ({e.name}) is in doubt and "
                                     "cannot be re-run safely", session_id=session.id,
                                     reason="in_doubt")

    # ------------------------------------------------------------------ live turns

    def run(self, session_id: str, content: str | None, *, attended: bool = False) -> TurnResult:
        """Run a live turn under the session's route lock. ``attended``: a human is present now
        (the caller knows; nothing stored decides it). The turn is committed in progress before
        the model is called. An async model or tool is run on a fresh event loop; inside a
        running loop that cannot work: the turn ends ``failed`` and ``HostError`` is raised
        (use ``arun``)."""
        route = self.store.load(session_id).route_key
        while True:
            with self.store.lock(route):
                got = self._begin(session_id, content, route)
                if isinstance(got, Session):
                    return complete(self._drive(got, SYNC, attended=attended, resumed=False))
            route = got

    async def arun(self, session_id: str, content: str | None, *,
                   attended: bool = False) -> TurnResult:
        """``run`` for asyncio: the model (if ``async def``) and async tools are awaited on the
        caller's event loop; commits, lock waits and sync models/tools run off it. The route
        lock wait is cancellable. A cancelled ``arun`` leaves no half state: a commit in flight
        completes, then the turn is cancelled (marker removed, ``turn_cancelled``)."""
        from ._aio import run_sync
        from ._async import AsyncStore

        astore = AsyncStore(self.store)
        io = AsyncIO()
        route = (await run_sync(self.store.load, session_id)).route_key
        while True:
            async with astore.lock(route):
                got = await run_sync(self._begin, session_id, content, route)
                if isinstance(got, Session):
                    return await self._drive(got, io, attended=attended, resumed=False)
            route = got

    def _begin(self, session_id: str, content: str | None, route: str) -> Session | str:
        """Begin the turn under ``route`` (the lock the caller holds; it stays the turn's route
        whatever the session's field says later), unless the session was re-routed before the
        lock was taken: then the route to take instead."""
        current = self.store.load(session_id).route_key
        if current != route:
            return current
        return self.store.begin_turn(session_id, content, route_key=route)

    def cancel(self, session_id: str) -> Session:
        """Cancel the session's turn: flush its pending checkpoint, commit it not in progress
        (marker removed, ``turn_cancelled``); the running loop stops at its next boundary.
        From a coroutine, ``await loop.acancel(...)`` (this one blocks on the turn's commit)."""
        with self._mu:
            run = self._runs.get(session_id)
        if run is None:
            return self.store.cancel(session_id)
        return self._cancel_run(run)

    async def acancel(self, session_id: str) -> Session:
        """``cancel`` off the event loop."""
        from ._aio import run_sync

        return await run_sync(self.cancel, session_id)

    def _cancel_run(self, run: _Run) -> Session:
        with run.mu:
            turn = run.session.turn
            known = turn.entry(run.unstarted) if turn and run.unstarted else None
            if turn and known and known.status == "intent" and not run.cancelled.is_set():
                # its tool never started (the cancel came during the intent commit): not in
                # doubt, so it leaves no review record behind
                run.session = attrs.evolve(run.session, turn=attrs.evolve(turn, ledger=tuple(
                    e for e in turn.ledger if e is not known)))
                run.pending = True
            if run.pending and not run.cancelled.is_set():
                with contextlib.suppress(_Stop, ConflictError):
                    self._commit(run, run.phase)
            run.cancelled.set()
            return self.store.cancel(run.session.id)

    # ------------------------------------------------------------------ the turn

    async def _drive(self, s: Session, io: IO, *, attended: bool,
                     resumed: bool) -> TurnResult:
        run = _Run(s, attended=attended, resumed=resumed, now=self.clock())
        with self._mu:
            self._runs[s.id] = run
        try:
            try:
                return await self._steps(run, io)
            except _Stop as stop:
                return self._result(run, stop.status, None)
            except HostError as e:
                await io.disk(self._fail, run, e)
                raise
            except BaseException as e:
                if isinstance(e, io.cancel_error):  # arun's task was cancelled
                    await io.disk(self._cancel_run, run)
                raise
        finally:
            with self._mu:
                if self._runs.get(s.id) is run:
                    del self._runs[s.id]

    async def _steps(self, run: _Run, io: IO) -> TurnResult:
        """The turn's steps — one logic for ``run`` and ``arun``; ``io`` says where each
        blocking step runs."""
        if run.resumed:
            last = run.session.messages[-1] if run.session.messages else None
            if last is not None and last.role == "assistant" and not last.tool_calls:
                return await io.disk(self._end, run)  # the final reply was written already
            await self._batch(run, io, unanswered_calls(run.session))
        steps = 0
        while True:
            if steps >= self.max_steps:
                return await io.disk(self._end, run, status="step_limit")
            await io.disk(self._before_model, run)
            reply = await io.model(self.model, self._transcript(run.session), self.tool_specs())
            steps += 1
            got = await io.disk(self._take_reply, run, reply)
            if isinstance(got, TurnResult):
                return got
            await self._batch(run, io, got)
            await io.disk(self._boundary, run, "tool_batch")

    def _transcript(self, s: Session) -> tuple[Message, ...]:
        if s.summary:
            return (Message("system", f"Summary of the earlier conversation: {s.summary}"),
                    *s.messages)
        return s.messages

    def _before_model(self, run: _Run) -> None:
        self._check(run)
        self._maybe_compact(run)
        if run.resumed:
            self._commit(run, "before_model", only_if_pending=True)

    def _take_reply(self, run: _Run, reply: Reply) -> tuple[ToolCall, ...] | TurnResult:
        """Append the model's reply: the turn's end if it calls no tool, else its calls."""
        with run.mu:
            self._check(run)
            calls = unique_calls(run.session, reply.tool_calls)
            msg = Message("assistant", reply.content, calls)
            run.session = attrs.evolve(run.session, messages=(*run.session.messages, msg))
            if not calls:
                return self._end(run)
            self._boundary(run, "model_reply")
            return calls

    def _maybe_compact(self, run: _Run) -> None:
        if self.compactor is None or len(run.session.messages) <= self.compact_after:
            return
        summary, kept = self.compactor(run.session.messages)
        with run.mu:
            run.session = attrs.evolve(run.session, summary=summary, messages=tuple(kept))
            # the summary was expensive: losing it means paying for it twice, so it is not
            # left pending behind the debounce
            self._commit(run, "compaction")

    async def _batch(self, run: _Run, io: IO, calls: Sequence[ToolCall]) -> None:
        for c in calls:
            try:
                plan = await io.disk(self._prepare, run, c)
            except io.cancel_error:
                run.unstarted = run.fresh_intent
                raise
            if plan is None:
                continue
            if run.cancelled.is_set():  # cancelled during the intent commit: never start it
                raise _Stop("cancelled")
            t, ctx, entry = plan
            status = "done"
            try:
                text = _text(await io.tool(t, ctx, c.arguments))
            except HostError:
                raise
            except Exception as e:  # a tool's failure is the model's business, not the loop's
                status, text = "failed", f"error: {type(e).__name__}: {e}"
            if entry is not None:
                entry = attrs.evolve(entry, status=status, outcome_at=self.store.clock(),
                                     result=text)
            await io.disk(self._answer, run, c, text, entry)

    def _prepare(self, run: _Run, c: ToolCall
                 ) -> tuple[Tool, ToolContext, LedgerEntry | None] | None:
        """Everything before a tool call: answer it from the ledger, refuse it, or commit its
        intent (durable before the call, carrying any pending checkpoint). None: answered."""
        run.fresh_intent = None
        self._check(run)
        sid, tid = run.session.id, run.turn_id
        key = f"{sid}:{tid}:{c.id}"
        ctx = ToolContext(session_id=sid, turn_id=tid, tool_call_id=c.id, idempotency_key=key,
                          attended=run.attended, resumed=run.resumed,
                          is_cancelled=lambda: self._is_cancelled(run))
        t = self.tools.get(c.name)
        assert run.session.turn is not None
        known = run.session.turn.entry(c.id)
        if known is not None and known.status != "intent":  # outcome recorded: never re-run
            self._answer(run, c, known.result or "", None)
            return None
        if t is None:
            self._answer(run, c, f"error: unknown tool {c.name!r}", None)
            return None
        refusal = self._refusal(run, t, ctx, c)
        if refusal is not None:
            if known is not None:  # in doubt: it may have run, "refused" would be a lie
                raise TurnStateError(f"tool call {c.id!r} ({c.name}) is in doubt and would be "
                                     "refused on this run", session_id=sid, reason="in_doubt")
            reason, text = refusal
            run.refused.append(t.name)
            self.store.emit(ev.TOOL_REFUSED, session_id=sid, turn_id=tid, reason=reason,
                            tool=t.name, tool_call_id=c.id, attended=run.attended)
            entry = None
            if t.effect != "none":
                now = self.store.clock()
                entry = LedgerEntry(c.id, t.name, t.effect, key, "refused", now, now, text)
            self._answer(run, c, text, entry)
            return None
        entry = None
        if t.effect != "none":
            entry = LedgerEntry(c.id, t.name, t.effect, key, "intent", self.store.clock())
            with run.mu:
                run.session = with_entry(run.session, entry)
                self._commit(run, "tool_intent")
            if known is None:
                run.fresh_intent = c.id
        return t, ctx, entry

    def _answer(self, run: _Run, c: ToolCall, text: str, entry: LedgerEntry | None) -> None:
        with run.mu:
            self._check(run)
            s = run.session
            if entry is not None:
                s = with_entry(s, entry)
            run.session = attrs.evolve(s, messages=(*s.messages,
                                                    Message("tool", text, tool_call_id=c.id)))
            if entry is not None:
                self._commit(run, "tool_outcome")
            else:
                run.pending = True

    def _refusal(self, run: _Run, t: Tool, ctx: ToolContext,
                 c: ToolCall) -> tuple[str, str] | None:
        if not run.attended and t.name in self.config.unattended_deny:
            return ("unattended_deny",
                    f"refused: {t.name} is not allowed in an unattended run (nobody is present)")
        if t.needs_approval:
            if not run.attended:
                return ("approval_denied",
                        f"denied: {t.name} needs approval and no human is present")
            if self.approve is None or not self.approve(ctx, c):
                return ("not_approved", f"denied: {t.name} was not approved")
        return None

    # ------------------------------------------------------------------ checkpoints

    def _boundary(self, run: _Run, phase: str) -> None:
        with run.mu:
            run.pending = True
            run.phase = phase
            if self.clock() - run.committed_at >= self.config.checkpoint_debounce:
                self._commit(run, phase)

    def _commit(self, run: _Run, phase: str, *, only_if_pending: bool = False) -> None:
        with run.mu:
            if only_if_pending and not run.pending:
                return
            self._check(run)
            for tries in range(_REBASES, -1, -1):
                try:
                    s = self.store.checkpoint(run.session, phase=phase)
                    break
                except ConflictError:
                    self._rebase(run, give_up=tries == 0)
            run.session = s
            run.committed_at = self.clock()
            run.pending = False
            run.phase = phase

    def _end(self, run: _Run, *, status: str = "completed") -> TurnResult:
        with run.mu:
            self._check(run)
            for tries in range(_REBASES, -1, -1):
                try:
                    s = self.store.end_turn(run.session)
                    break
                except ConflictError:
                    self._rebase(run, give_up=tries == 0)
            run.pending = False
        return self._result(run, status, s)

    def _fail(self, run: _Run, error: HostError) -> None:
        """A host's programming error: end the turn (transcript kept, marker removed) with a
        ``turn_failed`` event. Retrying it at the next start would fail the same way."""
        with run.mu:
            try:
                self._check(run)
                for tries in range(_REBASES, -1, -1):
                    s = run.session
                    try:
                        self.store.commit(attrs.evolve(s, in_progress=False, turn=None),
                                          s.version)
                        break
                    except ConflictError:
                        self._rebase(run, give_up=tries == 0)
            except _Stop:
                return  # cancelled or superseded meanwhile: nothing of ours to end
            run.pending = False
        self.store.emit(ev.TURN_FAILED, session_id=run.session.id, turn_id=run.turn_id,
                        reason=error.reason, error=str(error))

    def _result(self, run: _Run, status: str, s: Session | None) -> TurnResult:
        reply = next((m.content for m in reversed(run.session.messages)
                      if m.role == "assistant"), None)
        return TurnResult(run.session.id, run.turn_id, status, reply, s, run.resumed,
                          tuple(run.refused))

    # ------------------------------------------------------------------ cancellation

    def _is_cancelled(self, run: _Run) -> bool:
        try:
            self._check(run)
        except _Stop:
            return True
        return False

    def _check(self, run: _Run) -> None:
        """Stop at this boundary if the turn was cancelled here or in another process."""
        if run.cancelled.is_set():
            raise _Stop("cancelled")
        if _fsio.lstat(self.store.layout.marker(run.session.id)) is None:
            self._stopped_elsewhere(run)  # no marker: cancelled or finished elsewhere?

    def _stopped_elsewhere(self, run: _Run) -> Session:
        """Stop if the turn was cancelled or replaced elsewhere; else the session on disk."""
        try:
            disk = self.store.load(run.session.id)
        except SessionNotFound:
            raise _Stop("cancelled") from None
        if not disk.in_progress or disk.turn is None:
            raise _Stop("cancelled")
        if disk.turn.id != run.turn_id:
            raise _Stop("superseded")
        return disk

    def _rebase(self, run: _Run, *, give_up: bool) -> None:
        """A commit met a newer version. Cancelled or superseded: stop. Still this turn (a
        host's patch, a marker repair, a migration): keep what the other writer committed and
        put back what this run owns — the turn, its transcript and summary — then retry. The
        route lock this run holds means no other loop or recovery wrote the turn itself."""
        disk = self._stopped_elsewhere(run)
        if give_up:
            raise ConflictError(f"session {disk.id!r} keeps changing under the running turn",
                                session_id=disk.id, reason="contended")
        mine = run.session
        run.session = attrs.evolve(disk, turn=mine.turn, messages=mine.messages,
                                   summary=mine.summary)


_REBASES = 3  # a session patched this often during one commit is contended, not merely touched


# the ledger queries live with the model; re-exported for the hosts that import them from here
__all__ = ["AgentLoop", "TurnResult", "in_doubt", "unanswered_calls"]
