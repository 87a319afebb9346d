"""The Google ADK driver: an ADK run translated into turn-protocol calls (``_turns.TurnRun``).

Nothing here decides a rule of a turn; each ADK event becomes one protocol call:

- a live run begins with ``TurnRun.abegin(driver="adk")`` (the route lock held until the run
  ends; the run record — the ADK invocation id, the user, the message — in the begin commit,
  before ADK calls any model), or is a ``TurnRun.claimed`` resume (unattended, always);
- every event ADK appends to the session (``FileSessionService.append_event``) is a phase
  boundary, ``TurnRun.boundary("event")`` carrying the event (debounced: a pending one is
  flushed by the next tool intent, the next model call of a resumed run, and the end);
- a plugin's ``before_tool_callback`` asks ``TurnRun.before_tool`` (the deny-list, approvals,
  the ledger: intent with arguments before an effectful call); a call the ledger answered or the
  protocol refused is not run (the callback returns its response); ``after_tool_callback`` /
  ``on_tool_error_callback`` record the outcome (``after_tool``);
- the end: ``TurnRun.end`` (the final reply in the transcript); an attended run whose tool asks
  ADK for a human's confirmation: ``TurnRun.pause``; a cancel (the caller's task, or the event
  stream left early): ``TurnRun.cancel``. Any other exception leaves the turn interrupted, for
  recovery, which resumes it as an ADK resumable invocation (same invocation id).

This module imports ``google.adk``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
import warnings
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

import attrs
from google.adk.apps import App, ResumabilityConfig
from google.adk.events.event import Event
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.genai import types

from ._aio import run_sync
from ._errors import InvalidState, TurnStopped
from ._model import Session
from ._turns import Approver, ToolDecision, ToolRequest, TurnRun
from .adk import (
    CURRENT,
    DRIVER,
    KEY,
    SOURCE,
    DurableRunner,
    RunOutcome,
    _ns,
    appended,
    events_of,
    record,
    with_ns,
)

_RESUMABLE: ResumabilityConfig | None = None


def _resumable() -> ResumabilityConfig:
    """ADK's resumability (a resume continues the same invocation). ADK marks it experimental
    with a UserWarning at construction; fsdurable builds it once, with that one warning
    silenced (the feature is what recovery is built on, tested here on every release we pin)."""
    global _RESUMABLE
    if _RESUMABLE is None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"\[EXPERIMENTAL\] ResumabilityConfig",
                                    category=UserWarning)
            _RESUMABLE = ResumabilityConfig(is_resumable=True)
    return _RESUMABLE


class Driver:
    """One ADK run of one turn: the ``TurnRun`` and what the ADK callbacks tell it."""

    def __init__(self, owner: DurableRunner, t: TurnRun, approve: Approver | None) -> None:
        self.owner, self.t, self.approve = owner, t, approve
        t.debounce = owner.debounce
        self.mu = asyncio.Lock()  # parallel tool calls: one protocol call at a time
        self.decisions: dict[str, ToolDecision] = {}
        self.asked = False  # ADK asked a human to confirm a call (an attended run pauses)
        self.stopped: str | None = None  # the turn was stopped elsewhere (TurnStopped)
        self.events: list[Event] = []

    async def disk(self, fn: Callable[..., Any], /, *args: Any, **kw: Any) -> Any:
        async with self.mu:
            return await run_sync(fn, *args, **kw)

    @property
    def status(self) -> str | None:
        return self.t.status or self.stopped

    # ------------------------------------------------------------------ ADK -> protocol

    async def appended(self, doc: dict[str, Any], delta: dict[str, Any]) -> None:
        """ADK appended an event to the session: a checkpoint of the turn (debounced)."""
        if self.stopped is not None or not self.t.open:
            return  # the turn is over: nothing more is written for it
        try:
            await self.disk(self.t.boundary, "event", appended(doc, delta))
        except TurnStopped as e:
            self.stopped = e.status
            raise

    async def before_model(self) -> None:
        t = self.t
        if t.resumed:  # a resumed model call never repeats work a pending checkpoint holds
            await self.disk(t.flush, "before_model")
        else:
            await self.disk(t.check)

    async def before_tool(self, tool: Any, args: dict[str, Any], tctx: Any
                          ) -> dict[str, Any] | None:
        t, owner = self.t, self.owner
        call_id = str(getattr(tctx, "function_call_id", None) or "")
        name = str(tool.name)
        asks = await _adk_confirms(tool, args, tctx)  # ADK's own confirmation flow
        confirmation = getattr(tctx, "tool_confirmation", None)
        if asks and t.attended and confirmation is None and self.approve is None:
            self.asked = True  # ADK asks the human (the run then ends paused); nothing runs
            return None
        approve = self.approve
        if confirmation is not None:  # the human answered ADK's request in THIS run
            approve = _answer(bool(confirmation.confirmed))
        req = ToolRequest(call_id, name, dict(args), owner.effect(name),
                          asks or name in owner.approvals)
        d: ToolDecision = await self.disk(t.before_tool, req, approve=approve)
        if d.action == "answered":
            return _response(d.text or "")
        if d.action == "refused":
            return {"error": d.text or "refused"}
        if asks and confirmation is None:  # the live approver said yes: ADK must not ask
            from google.adk.tools.tool_confirmation import ToolConfirmation

            tctx.tool_confirmation = ToolConfirmation(confirmed=True)
        self.decisions[call_id] = d
        CURRENT.set(d.context)
        return None

    async def after_tool(self, tctx: Any, *, ok: bool, result: Any) -> None:
        CURRENT.set(None)
        d = self.decisions.pop(str(getattr(tctx, "function_call_id", None) or ""), None)
        if d is None:
            return
        await self.disk(self.t.after_tool, d, ok=ok, result=_text(result))

    # ------------------------------------------------------------------ the run

    async def drive(self, runner: Runner, user_id: str, sid: str,
                    **kw: Any) -> AsyncGenerator[Event, None]:
        """Run ADK to the turn's end, yielding its events as they come."""
        t, runs = self.t, self.owner.session_service._runs
        runs[sid] = self
        try:
            async with aclosing(runner.run_async(user_id=user_id, session_id=sid, **kw)) as agen:
                async for e in agen:
                    self.events.append(e)
                    yield e
            if self.stopped is None:
                await self.finish()
        except (asyncio.CancelledError, GeneratorExit):  # cancelled, or the stream dropped
            if t.open and self.stopped is None:
                await run_sync(t.cancel)
            raise
        except BaseException as e:
            stop = _stopped(e)  # cancelled or superseded elsewhere: the run just stops
            if stop is None:
                raise
            self.stopped = stop.status
        finally:
            if runs.get(sid) is self:
                del runs[sid]
            await run_sync(t.release)

    async def finish(self, reply: str | None = None) -> None:
        t = self.t
        done: Callable[[Session], Session] = lambda s: with_ns(s, run=None)  # noqa: E731
        if self.asked and t.attended:  # a human confirms later: the turn is over
            await self.disk(t.pause, done, why="confirmation")
            return
        await self.disk(t.end, done, reply=reply if reply is not None else
                        final_reply(self.events))


class _Plugin(BasePlugin):
    """fsdurable's ADK plugin: the model-call and tool callbacks of one durable run."""

    def __init__(self, d: Driver) -> None:
        super().__init__(name="fsdurable")
        self.d = d

    async def before_model_callback(self, *, callback_context: Any,
                                    llm_request: Any) -> Any:
        await self.d.before_model()
        return None

    async def before_tool_callback(self, *, tool: Any, tool_args: dict[str, Any],
                                   tool_context: Any) -> dict[str, Any] | None:
        return await self.d.before_tool(tool, tool_args, tool_context)

    async def after_tool_callback(self, *, tool: Any, tool_args: dict[str, Any],
                                  tool_context: Any, result: Any) -> dict[str, Any] | None:
        await self.d.after_tool(tool_context, ok=True, result=result)
        return None

    async def on_tool_error_callback(self, *, tool: Any, tool_args: dict[str, Any],
                                     tool_context: Any, error: Exception
                                     ) -> dict[str, Any] | None:
        if not isinstance(error, asyncio.CancelledError):
            await self.d.after_tool(tool_context, ok=False, result=f"error: {error}")
        return None


def _runner(owner: DurableRunner, d: Driver) -> Runner:
    app = App(name=owner.app_name, root_agent=owner.agent,
              plugins=[_Plugin(d), *owner.plugins], resumability_config=_resumable())
    return Runner(app=app, session_service=owner.session_service, **owner.services)


# ---------------------------------------------------------------------------------- live runs


def _content(message: Any) -> types.Content:
    if isinstance(message, str):
        return types.Content(role="user", parts=[types.Part(text=message)])
    if isinstance(message, types.Content):
        return message
    raise TypeError("new_message must be a str or a google.genai types.Content")


def _text_of(c: types.Content) -> str | None:
    texts = [p.text for p in c.parts or () if p.text]
    return "\n".join(texts) if texts else None


def _answered_invocation(s: Session, c: types.Content) -> str | None:
    """The invocation a message of function responses answers (its calls' invocation)."""
    ids = {p.function_response.id for p in c.parts or () if p.function_response}
    for e in reversed(events_of(s)):
        for p in (e.get("content") or {}).get("parts") or ():
            fc = p.get("function_call") if isinstance(p, dict) else None
            if isinstance(fc, dict) and fc.get("id") in ids:
                return str(e.get("invocation_id"))
    return None


def settled(s: Session, now: float) -> Session:
    """The session a new run starts from. Function calls without a response belong to a turn
    that ended without finishing them (parked for review, cancelled, abandoned): each gets a
    response the model can read — the human's review answer, "in doubt" while parked, else "no
    result" — so the conversation stays valid and nothing runs them again by itself. (ADK's own
    confirmation requests are left to ADK.)"""
    from ._model import REVIEW
    from ._review import answer_of

    evs = events_of(s)
    answered = {p["function_response"].get("id") for e in evs
                for p in (e.get("content") or {}).get("parts") or ()
                if isinstance(p, dict) and isinstance(p.get("function_response"), dict)}
    turns: set[str] = set()  # the turns whose calls were parked (open or closed reviews)
    parked: set[str] = set()
    for k in (REVIEW, "review_closed"):
        got = s.metadata.get(k)
        if isinstance(got, dict):
            for c in got.get("calls") or ():
                if isinstance(c, dict):
                    turns.add(str(c.get("turn_id") or got.get("turn_id")))
                    if k == REVIEW:
                        parked.add(str(c.get("tool_call_id")))
    add = []
    for e in evs:
        for p in (e.get("content") or {}).get("parts") or ():
            fc = p.get("function_call") if isinstance(p, dict) else None
            if not isinstance(fc, dict) or fc.get("id") in answered or \
                    fc.get("name") == "adk_request_confirmation":
                continue
            cid = str(fc.get("id"))
            a = next((x for t in sorted(turns) if (x := answer_of(s, t, cid)) is not None),
                     None)
            if isinstance(a, dict) and a.get("answer") == "ran":
                text = "ran: a human confirmed this call ran (its result was not recorded)"
            elif isinstance(a, dict):
                text = "not run: a human confirmed this call did not run"
            elif cid in parked:
                text = ("outcome unknown: the process died during this call; it was not "
                        "repeated and waits for a human's review")
            else:
                text = "no result: the turn ended before this call's result was recorded"
            add.append({"invocation_id": e.get("invocation_id"), "author": e.get("author"),
                        "id": str(uuid.uuid4()), "timestamp": now,
                        "content": {"role": "user", "parts": [{"function_response": {
                            "id": cid, "name": fc.get("name"), "response": {"result": text}}}]}})
    return with_ns(s, events=[*evs, *add]) if add else s


async def live(owner: DurableRunner, user_id: str, sid: str, new_message: Any, attended: bool,
               approve: Approver | None, run_config: Any, lock_timeout: float | None,
               holder: list[Driver] | None = None) -> AsyncGenerator[Event, None]:
    content = _content(new_message)
    answers = any(p.function_response for p in content.parts or ())
    inv = "e-" + str(uuid.uuid4())
    doc = json.loads(content.model_dump_json(exclude_none=True))

    def change(s: Session) -> Session:
        assert s.turn is not None
        tid, ns = s.turn.id, _ns(s)
        if ns and (ns.get("app_name"), ns.get("user_id")) != (owner.app_name, user_id):
            raise InvalidState(f"session {s.id!r} is another app's or user's ADK session",
                               session_id=s.id, reason="not_this_session")
        if not ns:
            s = attrs.evolve(s, metadata={**s.metadata, KEY: {
                "app_name": owner.app_name, "user_id": user_id, "state": {}, "events": [],
                "updated": owner.store.clock()}})
        got = _answered_invocation(s, content) if answers else inv
        if not answers:
            s = settled(s, owner.store.clock())
        return with_ns(s, run={"invocation_id": got or inv, "user_id": user_id,
                               "input": doc, "turn_id": tid})

    t = await TurnRun.abegin(owner.store, sid, None if answers else _text_of(content),
                             driver=DRIVER, attended=attended, change=change, create=True,
                             source=SOURCE, lock_timeout=lock_timeout)
    try:
        d = Driver(owner, t, approve)
        if holder is not None:
            holder.append(d)
        kw: dict[str, Any] = {"new_message": content, "run_config": run_config}
        if not answers:
            kw["invocation_id"] = inv
        async with aclosing(d.drive(_runner(owner, d), user_id, sid, **kw)) as events:
            async for e in events:
                yield e
    finally:
        t.release()


def outcome(d: Driver) -> RunOutcome:
    return RunOutcome(d.status or "completed", final_reply(d.events), tuple(d.events))


# ---------------------------------------------------------------------------------- recovery


class Host:
    """fsdurable's recovery host for ADK runs (``fsdurable.arecover`` claims the turns this
    driver owns and awaits each resume here, on the caller's loop)."""

    driver = DRIVER

    def __init__(self, owner: DurableRunner, run_config: Any) -> None:
        self.owner, self.run_config = owner, run_config

    def tool_effect(self, name: str) -> str | None:
        return self.owner.effects.get(name)

    def rerun_safe(self, name: str) -> bool:
        """An in-doubt call is re-run only if a repeat is a no-op and the resume would run it;
        a tool this host cannot see (a toolset's) may need approval for all it knows."""
        from ._turns import rerun_safe

        o = self.owner
        needs = name in o.approvals or _may_confirm(o.agent, name)
        return rerun_safe(o.effects.get(name), needs, name in o.store.config.unattended_deny)

    def resume_claimed(self, s: Session) -> Any:
        return self.aresume_claimed(s)

    async def aresume_claimed(self, s: Session) -> RunOutcome:
        owner = self.owner
        rec = record(s)
        inv, user_id = rec.get("invocation_id"), rec.get("user_id")
        if not isinstance(inv, str) or not isinstance(user_id, str):
            raise InvalidState(f"session {s.id!r}: the interrupted run has no run record",
                               session_id=s.id, reason="no_run_record")
        t = TurnRun.claimed(owner.store, s)
        d = Driver(owner, t, None)
        try:
            mine = [Event.model_validate_json(json.dumps(e)) for e in events_of(s)
                    if e.get("invocation_id") == inv]
            if any(e.actions.end_of_agent and e.author == owner.agent.name for e in mine):
                await d.finish(final_reply(mine))  # ADK had finished; only the end was lost
                return outcome(d)
            kw: dict[str, Any] = {"invocation_id": inv, "run_config": self.run_config}
            if not any(e.author == "user" for e in mine):  # died before ADK saved the input
                kw["new_message"] = types.Content.model_validate(rec.get("input"))
            async with aclosing(d.drive(_runner(owner, d), user_id, s.id, **kw)) as events:
                async for _ in events:
                    pass
            return outcome(d)
        finally:
            t.release()


# ---------------------------------------------------------------------------------- helpers


async def _adk_confirms(tool: Any, args: dict[str, Any], tctx: Any) -> bool:
    check = getattr(tool, "check_require_confirmation", None)
    if check is None:
        return False
    try:
        return bool(await check(args, tctx))
    except Exception:
        return True  # cannot tell: the safe answer


def _may_confirm(agent: Any, name: str) -> bool:
    """Might tool ``name`` of ``agent``'s tree ask for a confirmation? (unknown: yes)."""
    seen: set[int] = set()
    todo = [agent]
    while todo:
        a = todo.pop()
        if id(a) in seen:
            continue
        seen.add(id(a))
        for tool in getattr(a, "tools", None) or ():
            tname = getattr(tool, "name", None) or getattr(tool, "__name__", None)
            if tname == name:
                return bool(getattr(tool, "_require_confirmation", False))
        todo.extend(getattr(a, "sub_agents", None) or ())
    return True


def final_reply(events: list[Event]) -> str | None:
    for e in reversed(events):
        if e.author == "user" or e.partial or not e.content or e.get_function_calls():
            continue
        text = "".join(p.text for p in e.content.parts or () if p.text and not p.thought)
        if text:
            return text
    return None


def _answer(yes: bool) -> Approver:
    return lambda ctx, req: yes


def _text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


def _response(text: str) -> dict[str, Any]:
    """A recorded result as the response ADK gives the model (a tool's dict comes back)."""
    try:
        got = json.loads(text)
    except ValueError:
        return {"result": text}
    return got if isinstance(got, dict) else {"result": got}


def _stopped(e: BaseException) -> TurnStopped | None:
    """The ``TurnStopped`` behind an ADK error (a callback raised it inside ADK)."""
    seen: set[int] = set()
    todo: list[BaseException] = [e]
    while todo:
        cur = todo.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, TurnStopped):
            return cur
        todo.extend(x for x in (cur.__cause__, cur.__context__) if x is not None)
        todo.extend(getattr(cur, "exceptions", ()))  # an ExceptionGroup of parallel calls
    return None


__all__ = ["Driver", "Host", "final_reply", "live", "outcome"]
