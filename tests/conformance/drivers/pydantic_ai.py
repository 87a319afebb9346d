"""The conformance suite's driver for Pydantic AI runs (``fsdurable.pydantic_ai``: the
``pydantic-ai`` driver), with Pydantic AI's own offline ``FunctionModel``."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import Tool

from fsdurable import pydantic_ai as pai

from ..harness import CONTINUE, ModelFailure, Scenario, perform, step_of, store_for

DRIVER = "pydantic-ai"


def _since_prompt(messages: list[ModelMessage]) -> tuple[str | None, int]:
    """The turn's user prompt and the tool-call batches the model made since it."""
    n = 0
    for m in reversed(messages):
        prompts = [p for p in m.parts if isinstance(p, UserPromptPart)]
        if prompts:
            return str(prompts[-1].content), n
        if isinstance(m, ModelResponse) and m.tool_calls:
            n += 1
    return None, n


def _model(sc: Scenario, *, fail: bool = False) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if fail:
            raise ModelFailure("the model is down")
        prompt, n = _since_prompt(messages)
        batch = None if prompt == CONTINUE else step_of(n, sc)
        if batch is None:
            return ModelResponse(parts=[TextPart(sc.final)])
        return ModelResponse(parts=[ToolCallPart(name, dict(args), f"c{n}-{i}")
                                    for i, (name, args) in enumerate(batch)])

    return FunctionModel(respond)


def _agent(sc: Scenario, *, fail: bool = False) -> Agent[None, Any]:
    def body(name: str) -> Any:
        def fn(**args: Any) -> str:
            ctx = pai.tool_context()
            assert ctx is not None
            return perform(name, args, ctx.idempotency_key, ctx.attended)

        return fn

    tools = []
    for t in sc.tools:
        tool: Tool[None] = Tool.from_schema(body(t.name), t.name, t.name,
                                            {"type": "object", "additionalProperties": True})
        tool.requires_approval = t.needs_approval
        tools.append(tool)
    return Agent(_model(sc, fail=fail), name="conformance", tools=tools,
                 output_type=[str, DeferredToolRequests])


def _durable(root: str, sc: Scenario, *, fail: bool = False) -> pai.FsDurableAgent:
    return pai.FsDurableAgent(_agent(sc, fail=fail), store_for(root),
                              effects={t.name: t.effect for t in sc.tools})


def _answer(out: pai.RunOutcome) -> dict[str, Any]:
    return {"status": out.status, "reply": out.output if isinstance(out.output, str) else None}


def live(root: str, sid: str, sc: Scenario, *, attended: bool, approve: bool) -> dict[str, Any]:
    d = _durable(root, sc)
    return _answer(d.run_sync("go", session_id=sid, attended=attended,
                              approve=lambda ctx, req: approve))


def recover(root: str, sc: Scenario, *, fail: bool) -> list[dict[str, Any]]:
    rep = asyncio.run(pai.recover(_durable(root, sc, fail=fail)))
    return [o.to_dict() for o in rep.outcomes]


def proceed(root: str, sid: str, sc: Scenario) -> dict[str, Any]:
    return _answer(_durable(root, sc).run_sync(CONTINUE, session_id=sid, attended=True))
