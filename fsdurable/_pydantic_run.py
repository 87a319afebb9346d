"""Durable Pydantic AI runs: ``FsDurableAgent(agent, store)``, the turn protocol's Pydantic AI
driver (``driver="pydantic-ai"``), and ``recover(agent, store)``.

Pydantic AI's own durable execution (``pydantic_ai.durable_exec``: DBOS, Temporal, Prefect) is a
journal REPLAY: the run is a workflow whose model requests and tool calls are named durable units,
and a resume re-runs the workflow from its start, answering each unit from the engine's journal.
fsdurable is not a replay engine — its truth is the session file, checkpointed at boundaries —
so this driver is not one more backend there: it drives ``agent.iter()`` node by node and
translates the run into ``_turns.TurnRun`` calls, re-implementing none of its rules:

- the turn begins (route lock held for the whole run, in progress with its marker, the run record
  in the same commit) BEFORE the first model request;
- at every node boundary (before a ``ModelRequestNode``, before a ``CallToolsNode``, at the end)
  the message history is checkpointed (``TurnRun.boundary``: debounced, never skipped);
- every tool call goes through the ledger (``_ledger.Ledger``, a capability around tool
  execution); a tool learns its idempotency key from ``tool_context()``;
- the run ends ``completed``; a run whose output is ``DeferredToolRequests`` waits for a human
  (``TurnRun.pause``: not interrupted) when attended, and, unattended, has every approval and
  every deferred call refused (``tool_refused``) and goes on;
- a resume (``recover``, unattended) continues from the last checkpointed history: a history
  ending with the model's tool calls runs them (the ledger answers those with an outcome), one
  ending with a request sends it, one ending with the final reply ends the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_graph import End

from . import _pydantic_history as hist
from ._aio import run_sync
from ._async import StoreLike, as_store
from ._errors import HostError, InvalidState, TurnStopped
from ._model import EFFECTS, Session
from ._pydantic_ledger import Ledger, call_key, tool_context
from ._store import Store
from ._turns import Approver, ToolRequest, TurnRun

DRIVER = "pydantic-ai"


@attrs.frozen
class RunOutcome:
    """How a durable run ended: ``completed`` or ``paused`` (waiting for a human), the
    framework's ``AgentRunResult`` (None for a resume that found the run already over)."""

    status: str
    result: Any = None

    @property
    def output(self) -> Any:
        return None if self.result is None else self.result.output


def _check_effects(effects: Mapping[str, str]) -> dict[str, str]:
    for name, e in effects.items():
        if e not in EFFECTS:
            raise InvalidState(f"tool {name!r}: effect must be one of {EFFECTS}, got {e!r}",
                               reason="bad_effect")
    return dict(effects)


def _approval_tools(agent: Any) -> frozenset[str]:
    """The agent's function tools declared ``requires_approval`` (recovery parks such a call in
    doubt: an unattended resume could only refuse it, and it may have run)."""
    names: set[str] = set()
    for ts in getattr(agent, "toolsets", ()):
        for name, tool in (getattr(ts, "tools", None) or {}).items():
            if getattr(tool, "requires_approval", False):
                names.add(name)
    return frozenset(names)


class FsDurableAgent:
    """A Pydantic AI ``Agent`` whose runs are durable turns of fsdurable sessions.

    ``effects``: tool name -> ``none`` | ``idempotent`` | ``external`` (undeclared: ``external``,
    the worst). One session is one conversation: each run continues the session's stored history.
    Extra keyword arguments of ``run``/``iter`` (``deps``, ``model_settings``, ``usage_limits``,
    ...) go to ``agent.iter``; ``recover`` passes ``deps`` alone."""

    def __init__(self, agent: Any, store: StoreLike = None, *,
                 effects: Mapping[str, str] | None = None) -> None:
        self.agent = agent
        self.store: Store = as_store(store)
        self.effects = _check_effects(effects or {})
        self.needs_approval = _approval_tools(agent)

    def __repr__(self) -> str:
        return f"FsDurableAgent({getattr(self.agent, 'name', None)!r}, {self.store.root!r})"

    def effect(self, name: str) -> str:
        return self.effects.get(name, "external")

    # ------------------------------------------------------------------ live runs

    async def run(self, user_prompt: str | None = None, *, session_id: str,
                  attended: bool = False,
                  deferred_tool_results: DeferredToolResults | None = None,
                  approve: Approver | None = None, lock_timeout: float | None = None,
                  **iter_kwargs: Any) -> RunOutcome:
        """One durable run of the session's conversation. ``attended``: a human is present NOW;
        then ``approve(ctx, request)`` (the live caller's answer) decides each approval the run
        asks for, in the run — or, without ``approve``, a run that asks ends ``paused``
        (continue it with ``deferred_tool_results``). Unattended, every approval and deferred
        call is refused. Returns the ``RunOutcome``."""
        async with self.iter(user_prompt, session_id=session_id, attended=attended,
                             deferred_tool_results=deferred_tool_results, approve=approve,
                             lock_timeout=lock_timeout, **iter_kwargs) as run:
            async for _ in run:
                pass
        assert run.outcome is not None
        return run.outcome

    def run_sync(self, user_prompt: str | None = None, **kw: Any) -> RunOutcome:
        """``run`` on a fresh event loop (not from inside a running one)."""
        return asyncio.run(self.run(user_prompt, **kw))

    @asynccontextmanager
    async def iter(self, user_prompt: str | None = None, *, session_id: str,
                   attended: bool = False,
                   deferred_tool_results: DeferredToolResults | None = None,
                   approve: Approver | None = None, lock_timeout: float | None = None,
                   **iter_kwargs: Any) -> AsyncIterator[DurableRun]:
        """``agent.iter`` as a durable turn: ``async for node in run`` yields each node once
        its boundary is checkpointed; ``run.outcome`` once it is over. Leaving the block early
        leaves the turn in progress (interrupted: recovery's to resume)."""
        store = self.store
        prompt = user_prompt if isinstance(user_prompt, str) else None
        await run_sync(hist.migrate, store, session_id)  # an older session: the gate first
        t = await TurnRun.abegin(store, session_id, prompt, driver=DRIVER, attended=attended,
                                 change=hist.begin_record(user_prompt), create=True,
                                 source=DRIVER, lock_timeout=lock_timeout)
        try:
            start = hist.messages(t.session)
            if deferred_tool_results is None:
                start = hist.settled(t.session, start)
            run = DurableRun(self, t, user_prompt, start, deferred_tool_results, iter_kwargs,
                             approve=approve)
            try:
                yield run
            finally:
                await run.aclose()  # left early: the turn stays in progress
        finally:
            t.release()

    # ------------------------------------------------------------------ the resume

    async def resume_claimed(self, session: Session, **iter_kwargs: Any) -> RunOutcome:
        t = TurnRun.claimed(self.store, session)
        try:
            rec = hist.record(session)
            start = hist.messages(session)
            prompt = None if rec.get("started") else rec.get("prompt")
            run = DurableRun(self, t, prompt, start, None, iter_kwargs)
            try:
                async for _ in run:
                    pass
            finally:
                await run.aclose()
            assert run.outcome is not None
            return run.outcome
        finally:
            t.release()


class DurableRun:
    """One durable run being driven (``FsDurableAgent.iter``): ``async for node in run``.

    An async iterator, not a generator: ``agent.iter`` is entered and left by the caller's own
    task, as Pydantic AI requires, so a caller may stop iterating at any node (the turn stays in
    progress: interrupted, recovery's to resume)."""

    def __init__(self, owner: FsDurableAgent, t: TurnRun, prompt: Any,
                 history: list[ModelMessage], deferred: DeferredToolResults | None,
                 iter_kwargs: dict[str, Any], *, approve: Approver | None = None) -> None:
        self.owner, self.turn = owner, t
        self.approve = approve
        self.prompt, self.history, self.deferred = prompt, history, deferred
        self.iter_kwargs = iter_kwargs
        self.outcome: RunOutcome | None = None
        self.mu = asyncio.Lock()  # one protocol call at a time (parallel tools share the turn)
        self.ledger = Ledger(self)
        self._stack: AsyncExitStack | None = None
        self._run: Any = None  # pydantic_ai's AgentRun of the current segment
        self._node: Any = None

    async def disk(self, fn: Callable[..., Any], /, *args: Any, **kw: Any) -> Any:
        async with self.mu:
            return await run_sync(fn, *args, **kw)

    def __aiter__(self) -> DurableRun:
        return self

    async def __anext__(self) -> Any:
        t = self.turn
        try:
            return await self._step()
        except TurnStopped as stop:
            self.outcome = RunOutcome(stop.status)
            await self.aclose()
            raise StopAsyncIteration from None
        except asyncio.CancelledError:
            await run_sync(t.cancel)
            raise
        except UserError as e:  # the host's programming error: a retry fails the same way
            await run_sync(t.fail, e)
            raise HostError(f"the Pydantic AI run failed: {e}", session_id=t.session_id,
                            reason="user_error") from e
        # any other error leaves the turn in progress: interrupted, recovery decides

    async def aclose(self) -> None:
        """Leave the current ``agent.iter`` (the turn stays as it is)."""
        stack, self._stack, self._run = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def _step(self) -> Any:
        if self.outcome is not None:
            raise StopAsyncIteration
        if self._run is None:  # a segment: the run, or its continuation after deferred calls
            self._stack = AsyncExitStack()
            self._run = await self._stack.enter_async_context(self.owner.agent.iter(
                self.prompt, message_history=self.history,
                deferred_tool_results=self.deferred, capabilities=[self.ledger],
                **self.iter_kwargs))
            self._node = self._run.next_node
        node = self._node = await self._run.next(self._node)
        await self.boundary(node, self._run.all_messages())
        if isinstance(node, End):
            result = self._run.result
            await self.aclose()
            await self._ended(result)
        return node

    async def _ended(self, result: Any) -> None:
        """A segment ended: the run is over, paused, or goes on with answers to its deferred
        calls (the next ``__anext__`` starts that segment)."""
        t = self.turn
        messages = result.all_messages()
        out = result.output
        if not isinstance(out, DeferredToolRequests):
            await self.disk(t.end, hist.end_record(messages),
                            reply=out if isinstance(out, str) else None)
            self.outcome = RunOutcome("completed", result)
            return
        if t.attended and self.approve is not None and not out.calls:
            self.deferred = await self.decide(out, messages, self.approve)
        elif t.attended:  # a human answers later: the turn is over, the requests kept
            await self.disk(t.pause, hist.paused_record(messages, out),
                            why="deferred_tool_requests")
            self.outcome = RunOutcome("paused", result)
            return
        else:  # nobody is present: every approval and deferred call refused, never granted
            self.deferred = await self.refuse_all(out, messages)
        self.prompt, self.history = None, messages

    async def boundary(self, node: Any, messages: list[ModelMessage]) -> None:
        """The checkpoint at a node boundary: the history as a resume must see it."""
        req = getattr(node, "request", None)
        if isinstance(req, ModelRequest) and (not messages or messages[-1] is not req):
            messages = [*messages, req]  # the request the next node sends
        phase = {"ModelRequestNode": "model_request", "CallToolsNode": "model_reply"}.get(
            type(node).__name__, "node")
        t = self.turn
        await self.disk(t.boundary, phase, hist.checkpoint_record(messages))
        if t.resumed and phase == "model_request":
            await self.disk(t.flush, "before_model")  # a resumed model call never repeats one

    def _requests(self, parts: Sequence[Any], messages: Sequence[ModelMessage]
                  ) -> list[tuple[Any, ToolRequest]]:
        n = sum(1 for m in messages if isinstance(m, ModelResponse))
        return [(p, ToolRequest(call_key(p.tool_call_id, n), p.tool_name, p.args_as_dict(),
                                self.owner.effect(p.tool_name), needs_approval=True))
                for p in parts]

    async def decide(self, requests: DeferredToolRequests, messages: Sequence[ModelMessage],
                     approve: Approver) -> DeferredToolResults:
        """Attended, with the live caller's ``approve``: an approved call runs in this run (the
        ledger asks the protocol again as it runs), a declined one is refused by the protocol
        (``tool_refused``, not_approved) and the model is told."""
        out = DeferredToolResults()
        t = self.turn
        for part, req in self._requests(requests.approvals, messages):
            if approve(t.context(req.call_id), req):
                out.approvals[part.tool_call_id] = True
                continue
            d = await self.disk(t.before_tool, req, approve=lambda c, r: False)
            out.approvals[part.tool_call_id] = ToolDenied(d.text or "denied")
        return out

    async def refuse_all(self, requests: DeferredToolRequests,
                         messages: Sequence[ModelMessage]) -> DeferredToolResults:
        out = DeferredToolResults()
        for kind, parts in (("approval", requests.approvals), ("call", requests.calls)):
            for part, req in self._requests(parts, messages):
                d = await self.disk(self.turn.before_tool, req)
                text = d.text or "refused: no human is present"
                if kind == "approval":
                    out.approvals[part.tool_call_id] = ToolDenied(text)
                else:
                    out.calls[part.tool_call_id] = text
        return out


class _Host:
    """fsdurable's recovery ``Host`` for Pydantic AI runs (``fsdurable.arecover`` awaits each
    claimed run here, on the caller's loop)."""

    driver = DRIVER

    def __init__(self, agent: Callable[[str], FsDurableAgent], store: Store,
                 effects: Mapping[str, str], iter_kwargs: dict[str, Any]) -> None:
        self.agent_for, self.store = agent, store
        self.effects = dict(effects)
        self.iter_kwargs = iter_kwargs
        self.approval: frozenset[str] = frozenset()

    def tool_effect(self, name: str) -> str | None:
        return self.effects.get(name)

    def rerun_safe(self, name: str) -> bool:
        from ._turns import rerun_safe

        return rerun_safe(self.effects.get(name), name in self.approval,
                          name in self.store.config.unattended_deny)

    async def resume_claimed(self, session: Session) -> RunOutcome:
        return await self.agent_for(session.id).resume_claimed(session, **self.iter_kwargs)


async def recover(agent: Any, store: StoreLike = None, *,
                  effects: Mapping[str, str] | None = None, policy: Any = None,
                  select: Callable[[Any], bool] | None = None, **iter_kwargs: Any) -> Any:
    """Resume this node's interrupted Pydantic AI runs (call at startup, on the loop that will
    run them), through fsdurable's gates, unattended. ``agent``: an ``FsDurableAgent``, a
    Pydantic AI ``Agent`` (with ``effects``), or ``fn(session_id) -> either``; ``iter_kwargs``
    (e.g. ``deps``) go to every resumed ``agent.iter``. Returns the ``RecoveryReport``."""
    from ._recovery import arecover

    st = agent.store if store is None and isinstance(agent, FsDurableAgent) else as_store(store)
    eff = _check_effects(effects or {})

    def wrap(a: Any) -> FsDurableAgent:
        if isinstance(a, FsDurableAgent):
            return a if a.store is st else FsDurableAgent(a.agent, st, effects=a.effects)
        return FsDurableAgent(a, st, effects=eff)

    fixed = None if callable(agent) and not hasattr(agent, "iter") else wrap(agent)
    host = _Host((lambda sid: fixed) if fixed is not None else (lambda sid: wrap(agent(sid))),
                 st, fixed.effects if fixed is not None else eff, iter_kwargs)
    if fixed is not None:
        host.approval = fixed.needs_approval
    return await arecover(st, host, policy, select=select)


__all__ = ["DRIVER", "DurableRun", "FsDurableAgent", "RunOutcome", "recover", "tool_context"]
