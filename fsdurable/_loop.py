"""The reference agent loop: the turn protocol's driver for fsdurable's own model/tool loop.

Every rule of a turn — the route lock held for the whole run, in progress with its marker before
the first model call, debounced checkpoints flushed before an effectful tool, a model call of a
resumed turn, the end and a cancel, the unattended policy decided at execution time, the ledger
(intent with arguments before an effectful call, outcome after), cancel, end — is the turn
protocol's (``_turns.TurnRun``). This module only translates its loop's steps into protocol calls:
model call -> tool batch -> ... -> final reply, with the transcript as the loop sees it (the
working copy each commit writes back, keeping whatever a host patched meanwhile).

Attendance: ``run(..., attended=)`` is the live caller's word; ``resume_claimed`` (the recovery
path) is unattended, always — nothing read from disk changes it.

``run`` and ``arun`` share one step logic (``AgentLoop._steps``, a coroutine); ``_drivers`` says
where each blocking step runs — in the caller's thread, or off the caller's event loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from ._config import Config
from ._drivers import IO, SYNC, AsyncIO, complete
from ._errors import HostError, TurnStateError, TurnStopped
from ._model import (
    Message,
    Session,
    ToolCall,
    extended,
    in_doubt,
    turn_driver,
    unanswered_calls,
    unique_calls,
)
from ._store import Store
from ._tools import Model, Reply, Tool, ToolContext
from ._turns import ToolDecision, ToolRequest, TurnRun, rerun_safe

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


DRIVER = "loop"


class _Run:
    """One turn being driven: the protocol's ``TurnRun`` and the loop's working copy of the
    session (its transcript and summary, written back by every commit)."""

    def __init__(self, turn: TurnRun, session: Session) -> None:
        self.t = turn
        self.session = session
        self.turn_id = turn.turn_id
        self.resumed = turn.resumed
        self.refused: list[str] = []
        self.mu = threading.RLock()
        self.fresh_intent: str | None = None  # the call whose intent _prepare just committed
        self.unstarted: str | None = None  # ... and whose tool an arun cancel kept from starting

    def mine(self, disk: Session) -> Session:
        """What this run owns, put on the session as it is on disk: the transcript, the summary."""
        s = self.session
        return attrs.evolve(disk, messages=s.messages, summary=s.summary)


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

    driver = DRIVER

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
        """May an in-doubt call of this tool be re-run on an unattended resume? (``_turns.
        rerun_safe``: idempotent, and the resume would run it — no approval, not deny-listed.)"""
        t = self.tools.get(name)
        return t is not None and rerun_safe(t.effect, t.needs_approval,
                                            name in self.config.unattended_deny)

    def resume_claimed(self, session: Session) -> TurnResult:
        """Continue a turn that recovery claimed (it holds the route lock and has committed the
        attempt). Always unattended: this path has no way to say otherwise."""
        self._resumable(session)
        return complete(self._drive(self._claimed(session), SYNC))

    async def aresume_claimed(self, session: Session) -> TurnResult:
        """``resume_claimed`` on the caller's event loop (what ``arecover`` calls)."""
        self._resumable(session)
        return await self._drive(self._claimed(session), AsyncIO())

    def _claimed(self, session: Session) -> TurnRun:
        return TurnRun.claimed(self.store, session, clock=self.clock)

    def _resumable(self, session: Session) -> None:
        if not session.in_progress:
            raise TurnStateError(f"session {session.id!r} has no turn to resume",
                                 session_id=session.id, reason="not_in_progress")
        if turn_driver(session) != DRIVER:
            raise TurnStateError(f"session {session.id!r}'s turn belongs to the "
                                 f"{turn_driver(session)} driver, not the agent loop",
                                 session_id=session.id, reason="wrong_driver")
        for e in in_doubt(session):
            if not self.rerun_safe(e.name):
                raise TurnStateError(f"tool call {e.tool_call_id!r} ({e.name}) is in doubt and "
                                     "cannot be re-run safely", session_id=session.id,
                                     reason="in_doubt")

    # ------------------------------------------------------------------ live turns

    def run(self, session_id: str, content: str | None, *, attended: bool = False) -> TurnResult:
        """Run a live turn under the session's route lock (held for the whole turn). ``attended``:
        a human is present now (the caller knows; nothing stored decides it). The turn is
        committed in progress before the model is called. An async model or tool is run on a
        fresh event loop; inside a running loop that cannot work: the turn ends ``failed`` and
        ``HostError`` is raised (use ``arun``)."""
        t = TurnRun.begin(self.store, session_id, content, driver=DRIVER, attended=attended,
                          clock=self.clock)
        with t:
            return complete(self._drive(t, SYNC))

    async def arun(self, session_id: str, content: str | None, *,
                   attended: bool = False) -> TurnResult:
        """``run`` for asyncio: the model (if ``async def``) and async tools are awaited on the
        caller's event loop; commits, lock waits and sync models/tools run off it. The route
        lock wait is cancellable. A cancelled ``arun`` leaves no half state: a commit in flight
        completes, then the turn is cancelled (marker removed, ``turn_cancelled``) — also when
        the cancel came during the begin commit."""
        from ._aio import run_sync

        t = await TurnRun.abegin(self.store, session_id, content, driver=DRIVER,
                                 attended=attended, clock=self.clock)
        try:
            return await self._drive(t, AsyncIO())
        finally:
            await run_sync(t.release)

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
            if not run.t.cancelled and run.t.pending is None and run.t.open:
                run.t.defer(run.mine)  # the transcript as the loop has it goes with the cancel
            return run.t.cancel(unstarted=run.unstarted)

    # ------------------------------------------------------------------ the turn

    async def _drive(self, t: TurnRun, io: IO) -> TurnResult:
        t.debounce = self.config.checkpoint_debounce  # the loop's config, not the store's
        run = _Run(t, t.session)
        sid = t.session_id
        with self._mu:
            self._runs[sid] = run
        try:
            try:
                return await self._steps(run, io)
            except TurnStopped as stop:
                return self._result(run, stop.status, None)
            except HostError as e:
                await io.disk(t.fail, e, run.mine)
                raise
            except BaseException as e:
                if isinstance(e, io.cancel_error):  # arun's task was cancelled
                    await io.disk(self._cancel_run, run)
                raise
        finally:
            with self._mu:
                if self._runs.get(sid) is run:
                    del self._runs[sid]

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
            await io.disk(run.t.boundary, "tool_batch", run.mine)

    def _transcript(self, s: Session) -> tuple[Message, ...]:
        if s.summary:
            return (Message("system", f"Summary of the earlier conversation: {s.summary}"),
                    *s.messages)
        return tuple(s.messages)

    def _before_model(self, run: _Run) -> None:
        run.t.check()
        self._maybe_compact(run)
        if run.resumed:
            run.t.flush("before_model")

    def _take_reply(self, run: _Run, reply: Reply) -> tuple[ToolCall, ...] | TurnResult:
        """Append the model's reply: the turn's end if it calls no tool, else its calls."""
        with run.mu:
            run.t.check()
            calls = unique_calls(run.session, reply.tool_calls)
            msg = Message("assistant", reply.content, calls)
            run.session = attrs.evolve(run.session, messages=extended(run.session.messages, msg))
            if not calls:
                return self._end(run)
            run.t.boundary("model_reply", run.mine)
            return calls

    def _maybe_compact(self, run: _Run) -> None:
        if self.compactor is None or len(run.session.messages) <= self.compact_after:
            return
        summary, kept = self.compactor(run.session.messages)
        with run.mu:
            run.session = attrs.evolve(run.session, summary=summary, messages=tuple(kept))
            # the summary was expensive: losing it means paying for it twice, so it is not
            # left pending behind the debounce
            run.t.commit(run.mine, phase="compaction")

    async def _batch(self, run: _Run, io: IO, calls: Sequence[ToolCall]) -> None:
        for c in calls:
            try:
                plan = await io.disk(self._prepare, run, c)
            except io.cancel_error:
                run.unstarted = run.fresh_intent
                raise
            if plan is None:
                continue
            if run.t.cancelled:  # cancelled during the intent commit: never start it
                raise TurnStopped("cancelled", run.t.session_id, run.turn_id)
            t, decision = plan
            ok = True
            try:
                text = _text(await io.tool(t, decision.context, c.arguments))
            except HostError:
                raise
            except Exception as e:  # a tool's failure is the model's business, not the loop's
                ok, text = False, f"error: {type(e).__name__}: {e}"
            await io.disk(self._answer, run, c, text, decision, ok)

    def _prepare(self, run: _Run, c: ToolCall) -> tuple[Tool, ToolDecision] | None:
        """Everything before a tool call, decided by the protocol: answered from the ledger,
        refused, or its intent committed (durable before the call, carrying any pending
        checkpoint). None: answered."""
        run.fresh_intent = None
        run.t.check()
        t = self.tools.get(c.name)
        if t is None:
            self._answer(run, c, f"error: unknown tool {c.name!r}", None, True)
            return None
        req = ToolRequest(c.id, c.name, c.arguments, t.effect, t.needs_approval)
        approve = self.approve
        d = run.t.before_tool(req, deny=self.config.unattended_deny,
                              approve=None if approve is None else
                              (lambda ctx, _r: approve(ctx, c)))
        if d.action == "answered":
            self._answer(run, c, d.text or "", None, True)
            return None
        if d.action == "refused":
            run.refused.append(t.name)
            self._answer(run, c, d.text or "", None, True)
            return None
        if t.effect != "none" and not d.rerun:
            run.fresh_intent = c.id
        return t, d

    def _answer(self, run: _Run, c: ToolCall, text: str, decision: ToolDecision | None,
                ok: bool) -> None:
        with run.mu:
            run.t.check()
            s = run.session
            run.session = attrs.evolve(s, messages=extended(
                s.messages, Message("tool", text, tool_call_id=c.id)))
            if decision is None:
                run.t.defer(run.mine)
            else:
                run.t.after_tool(decision, ok=ok, result=text, change=run.mine)

    # ------------------------------------------------------------------ ends

    def _end(self, run: _Run, *, status: str = "completed") -> TurnResult:
        with run.mu:
            s = run.t.end(run.mine, status=status)
        return self._result(run, status, s)

    def _result(self, run: _Run, status: str, s: Session | None) -> TurnResult:
        reply = next((m.content for m in reversed(run.session.messages)
                      if m.role == "assistant"), None)
        return TurnResult(run.session.id, run.turn_id, status, reply, s, run.resumed,
                          tuple(run.refused))


# the ledger queries live with the model; re-exported for the hosts that import them from here
__all__ = ["AgentLoop", "TurnResult", "in_doubt", "unanswered_calls"]
