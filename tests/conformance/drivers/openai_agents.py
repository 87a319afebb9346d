"""The conformance suite's driver for the OpenAI Agents SDK (``fsdurable.openai_agents``), with
the SDK's own offline ``agents.testing.ScriptedModel`` and real ``FunctionTool``s.

``agents`` takes seconds to import on a loaded machine; ``recover`` imports it only once a turn is
claimed (``oa.recover`` touches the agent no sooner), so a recover racing a live run answers
before that run ends — as a host's startup with nothing to resume stays cheap.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no network, ever

from fsdurable import openai_agents as oa

from ..harness import CONTINUE, ModelFailure, Scenario, perform, step_of, store_for

DRIVER = "openai-agents"
# imported by the suite's fork server before it forks a child (``forkserver``)
WARM = ("agents", "agents.testing", "fsdurable._oarun")


def _answered(items: list[Any]) -> tuple[str | None, int]:
    """The turn's last user input and how many tool batches were answered since it."""
    last, outputs = None, 0
    for it in items:
        if not isinstance(it, dict):
            continue
        if it.get("role") == "user":
            c = it.get("content")
            last, outputs = (c if isinstance(c, str) else json.dumps(c)), 0
        elif it.get("type") == "function_call_output":
            outputs += 1
    return last, outputs


def _model(sc: Scenario, *, fail: bool = False) -> Any:
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    def respond(call: Any) -> Any:
        if fail:
            raise ModelFailure("the model is down")
        items = call.input if isinstance(call.input, list) else []
        last, outputs = _answered(items)
        if last == CONTINUE:
            return [assistant_message(sc.final)]
        n, seen = 0, 0  # the batch whose calls are not all answered yet
        while n < len(sc.steps) and seen + len(sc.steps[n]) <= outputs:
            seen += len(sc.steps[n])
            n += 1
        batch = step_of(n, sc)
        if batch is None:
            return [assistant_message(sc.final)]
        return [function_call(name, dict(args), call_id=f"c{n}-{i}")
                for i, (name, args) in enumerate(batch)]

    return ScriptedModel([ModelStep.respond(respond) for _ in range(40)])


def _tool(name: str, needs_approval: bool) -> Any:
    from agents import FunctionTool

    async def invoke(ctx: Any, raw: str) -> str:
        call = oa.current_call()
        assert call is not None, "a durable run's tool has its fsdurable call context"
        return perform(name, json.loads(raw or "{}"), call.idempotency_key, call.attended)

    return FunctionTool(name=name, description=f"the {name} test tool",
                        params_json_schema={"type": "object", "properties": {},
                                            "additionalProperties": True},
                        on_invoke_tool=invoke, strict_json_schema=False,
                        needs_approval=needs_approval)


def _agent(sc: Scenario, *, fail: bool = False) -> Any:
    from agents import Agent, ModelSettings

    return Agent(name=f"conformance-{sc.name}", model=_model(sc, fail=fail),
                 tools=[_tool(t.name, t.needs_approval) for t in sc.tools],
                 model_settings=ModelSettings(parallel_tool_calls=False))


def _effects(sc: Scenario) -> dict[str, str]:
    return {t.name: t.effect for t in sc.tools}


def _reply(r: Any) -> str | None:
    out = getattr(r, "final_output", None)
    return None if out is None else str(out)


def live(root: str, sid: str, sc: Scenario, *, attended: bool, approve: bool) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        store = store_for(root)
        if not store.exists(sid):
            store.create(sid, source="desktop")
        fs, agent = oa.FileSession(sid, store), _agent(sc)
        stream = oa.run_streamed(agent, "go", session=fs, attended=attended,
                                 effects=_effects(sc))
        async for _ in stream:
            pass
        while stream.status == "paused":  # the live caller answers each approval request
            state = await oa.paused_state(agent, fs)
            for item in state.get_interruptions():
                (state.approve if approve else state.reject)(item)
            stream = oa.run_streamed(agent, state, session=fs, attended=attended,
                                     effects=_effects(sc))
            async for _ in stream:
                pass
        return {"status": stream.status, "reply": _reply(stream.result)}

    return asyncio.run(main())


class _Lazy:
    """The scenario's agent, built (and ``agents`` imported) at its first use."""

    def __init__(self, sc: Scenario, fail: bool) -> None:
        self.sc, self.fail, self.agent = sc, fail, None

    def __call__(self, session_id: str) -> Any:  # oa.recover's agent factory
        if self.agent is None:
            self.agent = _agent(self.sc, fail=self.fail)
        return self.agent

    @property
    def tools(self) -> Any:
        return self("").tools


def recover(root: str, sc: Scenario, *, fail: bool) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        rep = await oa.recover(_Lazy(sc, fail), store_for(root), effects=_effects(sc))
        return [o.to_dict() for o in rep.outcomes]

    return asyncio.run(main())


def proceed(root: str, sid: str, sc: Scenario) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        fs = oa.FileSession(sid, store_for(root))
        stream = oa.run_streamed(_agent(sc), CONTINUE, session=fs, attended=True,
                                 effects=_effects(sc))
        async for _ in stream:
            pass
        return {"status": stream.status, "reply": _reply(stream.result)}

    return asyncio.run(main())
