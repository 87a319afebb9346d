"""The Agents SDK driver: an SDK run translated into turn-protocol calls (``_turns.TurnRun``).

Nothing here decides a rule of a turn; each SDK event becomes one protocol call:

- the run begins with ``TurnRun.abegin(driver="openai-agents")`` (the route lock held until the
  run ends), or is a ``TurnRun.claimed`` resume (unattended, always);
- ``on_llm_start`` (a hook): a phase boundary, ``TurnRun.boundary("model_call")`` with the run's
  ``RunState`` and the number of session items it accounts for (debounced);
- every ``FunctionTool`` of the agent (and of its handoff agents) is wrapped: hooks cannot veto a
  tool, so the wrapper asks ``TurnRun.before_tool`` (deny-list, approvals, ledger: intent with
  arguments before an effectful call), then runs the tool, then ``after_tool`` (the outcome);
- an interruption (a tool needing approval): attended, the turn pauses (``TurnRun.pause``, the
  state kept for the human); unattended, each is put to ``before_tool`` (refused:
  ``approval_denied``) and rejected in the state, and the run goes on;
- the end: ``TurnRun.end``; a cancel (the caller's task, or an abandoned stream):
  ``TurnRun.cancel``; a programming error of the run: ``TurnRun.fail``. Any other exception
  leaves the turn interrupted, for recovery.

This module imports ``agents``: ``fsdurable.openai_agents`` imports it only when a run starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import attrs
from agents import Agent, FunctionTool, RunHooks, Runner, RunState
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError, UserError

from ._aio import run_sync
from ._errors import TurnStateError, TurnStopped
from ._model import LedgerEntry, Session, with_entry
from ._turns import ToolDecision, ToolRequest, TurnRun

DRIVER = "openai-agents"
# an error of the program or the model's output: the same resume would fail the same way
_FATAL = (UserError, MaxTurnsExceeded, ModelBehaviorError)


Storage = Any  # the adapter's storage functions (fsdurable.openai_agents): record, with_record


class Driver:
    """One SDK run of one turn: the ``TurnRun`` and the SDK objects it translates.

    ``storage`` gives the adapter's storage functions (``record(s)``, ``with_record(s,
    **changes)``) and ``session`` counts its items (``FileSession._mark``), so this module
    never knows how items are laid out."""

    def __init__(self, t: TurnRun, session: Any, storage: Storage, effects: Mapping[str, str],
                 answers: list[dict[str, Any]] | None = None) -> None:
        self.t, self.fs, self.st = t, session, storage
        self.effects = dict(effects)
        self.answers = list(answers or [])  # a human's answers for a continued run
        self.result: Any = None  # the current RunResultStreaming
        self.mu = asyncio.Lock()  # parallel tool calls: one protocol call at a time
        self._agents: dict[int, Any] = {}
        self.stopped: str | None = None  # the turn was stopped elsewhere (TurnStopped)
        self.first = True  # the next model call is its leg's first

    def effect(self, name: str) -> str:
        return self.effects.get(name, "external")  # undeclared: assume the worst

    # ------------------------------------------------------------------ the agent, wrapped

    def agent(self, agent: Any) -> Any:
        """``agent`` (and its handoff agents) with every FunctionTool wrapped by the protocol."""
        got = self._agents.get(id(agent))
        if got is not None:
            return got
        clone = agent.clone(tools=[self._tool(t) for t in agent.tools], handoffs=[])
        self._agents[id(agent)] = clone
        clone.handoffs = [self.agent(h) if isinstance(h, Agent) else h for h in agent.handoffs]
        return clone

    def _tool(self, tool: Any) -> Any:
        if not isinstance(tool, FunctionTool):
            return tool  # hosted/computer tools are not ours to run (README: not durable)
        inner = tool.on_invoke_tool

        async def invoke(ctx: Any, raw: str) -> Any:
            return await self.invoke(tool, inner, ctx, raw)

        return dataclasses.replace(tool, on_invoke_tool=invoke)

    async def invoke(self, tool: Any, inner: Callable[..., Any], ctx: Any, raw: str) -> Any:
        call_id = str(getattr(ctx, "tool_call_id", "") or "")
        args = _arguments(raw)
        req = ToolRequest(call_id, tool.name, args, self.effect(tool.name),
                          await _needs_approval(tool, ctx, args, call_id))
        async with self.mu:
            told = await run_sync(self._answered, req)
            if told is not None:
                return told
            # an approval-requiring tool is invoked by the SDK only once a human approved it in
            # THIS run's state; attended, that is the live caller's answer
            d: ToolDecision = await run_sync(self.t.before_tool, req,
                                             approve=lambda c, r: self.t.attended)
        if d.action != "run":
            return d.text or ""
        from .openai_agents import CURRENT

        token = CURRENT.set(d.context)
        try:
            out = await inner(ctx, raw)
        except Exception as e:
            async with self.mu:
                await run_sync(self.t.after_tool, d, ok=False, result=f"error: {e}")
            raise
        finally:
            CURRENT.reset(token)
        async with self.mu:
            await run_sync(self.t.after_tool, d, ok=True, result=str(out))
        return out

    def _answered(self, req: ToolRequest) -> str | None:
        """A continued run: the parked call a human said RAN is answered with that, never run
        (matched by call id, else by tool and arguments: a model asked again may renumber)."""
        for i, a in enumerate(self.answers):
            if a["call_id"] == req.call_id or (a["tool"], a["arguments"]) == (
                    req.name, dict(req.arguments)):
                del self.answers[i]
                if a["answer"] != "ran":
                    return None  # it did not run: it runs now, through the protocol
                text = str(a["text"])
                now = self.t.store.clock()
                entry = LedgerEntry(req.call_id, req.name, req.effect,
                                    self.t.context(req.call_id).idempotency_key, "done", now,
                                    now, text, arguments=dict(req.arguments))
                self.t.commit(_settled(self.st, entry, list(self.answers)),
                              phase="tool_outcome")
                return text
        return None

    # ------------------------------------------------------------------ boundaries

    async def before_model(self) -> None:
        """A phase boundary: the state holds every earlier tool output now. Not at a leg's
        first model call: that state is the leg's start, on record already — and a streamed
        run saves its input to the session only after this hook, so the items counted here
        would leave the input out (a resume would drop it)."""
        if self.first:
            self.first = False
            return
        state = self.result.to_state().to_string()
        await run_sync(self._boundary, state)

    def _boundary(self, state: str) -> None:
        n, seen = self.fs._mark()  # what the SDK saved to it so far, and the log that says so
        was = self.t.session
        self.t.boundary("model_call",
                        lambda s: self.st.with_record(s, state=state, items_at=n, seen=seen))
        if self.t.session is not was:  # committed: the SDK's next add_items starts from it
            self.fs._doc = self.t.session  # (unread while the file is still that commit)

    async def refuse(self, item: Any) -> str:
        """An approval asked for with nobody present: refused by the protocol (an event)."""
        raw = getattr(item, "raw_item", None)
        name = str(getattr(item, "tool_name", None) or getattr(raw, "name", "") or "")
        call_id = str(getattr(raw, "call_id", "") or "")
        req = ToolRequest(call_id, name, _arguments(getattr(raw, "arguments", "") or ""),
                          self.effect(name), True)
        async with self.mu:
            d = await run_sync(self.t.before_tool, req)
        return d.text or "denied"

    # ------------------------------------------------------------------ the run

    async def stream(self, agent: Any, start: Any, hooks: Any,
                     kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """Run to the turn's end, yielding the SDK's stream events as they come."""
        t = self.t
        try:
            async for e in self._legs(agent, start, hooks, kwargs):
                yield e
        except (asyncio.CancelledError, GeneratorExit):  # cancelled, or the stream dropped
            if self.result is not None:
                self.result.cancel()
            if t.open:
                await run_sync(t.cancel)
            raise
        except BaseException as e:
            stop = _stopped(e)  # cancelled or superseded elsewhere: the run just stops
            if stop is None:
                if isinstance(e, _FATAL):
                    await run_sync(t.fail, e)
                raise
            self.stopped = stop.status
        finally:
            await run_sync(t.release)

    @property
    def status(self) -> str | None:
        """How the turn ended here: completed, paused, failed, cancelled, superseded."""
        return self.t.status or self.stopped

    async def _legs(self, agent: Any, start: Any, user_hooks: Any,
                    kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        t, hooks = self.t, composed_hooks(self, user_hooks)
        wrapped = self.agent(agent)
        if isinstance(start, RunState):  # its agents must be the wrapped ones
            start = await RunState.from_string(wrapped, start.to_string())
        while True:
            self.first = True
            self.result = Runner.run_streamed(wrapped, start, session=self.fs, hooks=hooks,
                                              **kwargs)
            async for e in self.result.stream_events():
                yield e
            if not self.result.interruptions:
                out = self.result.final_output  # the transcript gets the final reply
                await run_sync(t.end, lambda s: self.st.with_record(s, run=None),
                               reply=None if out is None else str(out))
                return
            state = self.result.to_state()
            if t.attended:  # a human decides later: the turn is over, the state kept for them
                await run_sync(t.pause, _paused(self.st, state.to_string()), why="approval")
                return
            for item in self.result.interruptions:
                state.reject(item, rejection_message=await self.refuse(item))
            start = state


def _settled(st: Storage, entry: LedgerEntry, left: list[dict[str, Any]]
             ) -> Callable[[Session], Session]:
    return lambda s: st.with_record(with_entry(s, entry), answers=left)


def _paused(st: Storage, raw: str) -> Callable[[Session], Session]:
    return lambda s: st.with_record(s, run=None, paused=raw)


def _stopped(e: BaseException) -> TurnStopped | None:
    """The ``TurnStopped`` behind an SDK error (a tool or hook raised it inside the SDK)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, TurnStopped):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _arguments(raw: str) -> dict[str, Any]:
    try:
        got = json.loads(raw) if raw else {}
    except ValueError:
        return {"_raw": raw}
    return got if isinstance(got, dict) else {"_value": got}


async def _needs_approval(tool: Any, ctx: Any, args: dict[str, Any], call_id: str) -> bool:
    need = tool.needs_approval
    if not callable(need):
        return bool(need)
    try:
        return bool(await need(ctx, args, call_id))
    except Exception:
        return True  # cannot tell: the safe answer


_HOOKS: Any = None


def composed_hooks(d: Driver, user: Any) -> Any:
    """Our hooks (the model-call boundary) composed with the user's: ours first, then theirs,
    for every hook the SDK calls."""
    global _HOOKS
    if _HOOKS is None:
        class DurableHooks(RunHooks[Any]):
            def __init__(self, driver: Driver, user: Any) -> None:
                self.driver, self.user = driver, user

            async def on_llm_start(self, *a: Any, **kw: Any) -> None:
                await self.driver.before_model()
                if self.user is not None:
                    await self.user.on_llm_start(*a, **kw)

        def forward(name: str) -> Any:
            async def hook(self: Any, *a: Any, **kw: Any) -> None:
                if self.user is not None:
                    await getattr(self.user, name)(*a, **kw)

            hook.__name__ = name
            return hook

        for name in dir(RunHooks):
            if name.startswith("on_") and name != "on_llm_start":
                setattr(DurableHooks, name, forward(name))
        _HOOKS = DurableHooks
    return _HOOKS(d, user)


def continuation(s: Session, *, at: float) -> tuple[Session, list[dict[str, Any]]]:
    """The begin change of ``continue_run``: the parked run's record (its last checkpoint: the
    items are cut back to it once the turn has begun) with the human's answer to each of its
    parked calls; a "did not run" answer is marked re-run here (``fsdurable review --rerun``
    then refuses it)."""
    from . import _review
    from ._oaitems import record, with_record
    from .openai_agents import RAN_TEXT

    rec = record(s)
    tid = rec.get("turn_id")
    calls = [c for c in _review._closed_or_open_calls(s) if c.get("turn_id") == tid]
    if not tid or not calls:
        raise TurnStateError(f"session {s.id!r} has no run parked for review to continue",
                             session_id=s.id, reason="nothing_to_continue")
    given = _review._answers(s)
    answers, waiting = [], []
    for c in calls:
        cid, key = str(c.get("tool_call_id")), _review._key(c)
        a = given.get(key)
        if not isinstance(a, dict):
            waiting.append(cid)
            continue
        ran = a.get("answer") != _review.DID_NOT_RUN or "rerun_at" in a
        answers.append({"call_id": cid, "tool": c.get("tool"),
                        "arguments": c.get("arguments") or {},
                        "answer": "ran" if ran else "did_not_run",
                        "text": a.get("rerun_result") or RAN_TEXT})
        if not ran:
            given[key] = {**a, "rerun_at": at, "rerun_result": "run again by continue_run"}
    if waiting:
        raise TurnStateError(f"session {s.id!r}: parked call(s) {', '.join(waiting)} wait for "
                             f"a human's answer (fsdurable review {s.id} --ran / "
                             "--did-not-run)", session_id=s.id, reason="review_pending")
    turn = s.turn
    assert turn is not None
    s = attrs.evolve(s, metadata={**s.metadata, _review.ANSWERS: given})
    s = with_record(s, run={**rec, "turn_id": turn.id, "answers": answers})
    return s, answers


async def start_of(d: Driver, agent: Any, rec: Mapping[str, Any]) -> Any:
    """Where a run record says the run goes on from: its last checkpointed ``RunState``, else
    (no checkpoint yet) its input."""
    state = rec.get("state")
    if isinstance(state, str):
        return await RunState.from_string(d.agent(agent), state)
    return rec.get("input")


__all__ = ["DRIVER", "Driver", "composed_hooks", "continuation", "start_of"]
