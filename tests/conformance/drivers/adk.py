"""The conformance suite's driver for Google ADK runs (``fsdurable.adk``: the ``adk`` driver),
with a scripted offline ``BaseLlm`` (ADK ships no offline test model) and real ADK
``FunctionTool``s (a tool needing approval is ADK's ``require_confirmation``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.tools import FunctionTool
from google.genai import types

from fsdurable import adk

from ..harness import CONTINUE, ModelFailure, Scenario, perform, step_of, store_for

DRIVER = "adk"
WARM = ("google.adk.agents", "google.adk.runners", "google.adk.tools", "fsdurable.adk",
        "fsdurable._adkrun")
APP, USER = "conformance", "user"


def _since_prompt(contents: list[types.Content]) -> tuple[str | None, int]:
    """The turn's user text and how many tool-call batches were answered since it."""
    n = 0
    for c in reversed(contents):
        parts = c.parts or []
        texts = [p.text for p in parts if p.text]
        if c.role == "user" and texts:
            return texts[-1], n
        if c.role == "user" and any(p.function_response for p in parts):
            n += 1
    return None, n


class ScriptedModel(BaseLlm):
    """The scenario's model: its step derived from the conversation it is sent."""

    model: str = "scripted"
    script: str = ""  # the Scenario, as JSON
    fail: bool = False

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        if self.fail:
            raise ModelFailure("the model is down")
        sc = Scenario.from_json(self.script)
        prompt, n = _since_prompt(list(llm_request.contents))
        batch = None if prompt == CONTINUE else step_of(n, sc)
        if batch is None:
            parts = [types.Part(text=sc.final)]
        else:
            parts = [types.Part(function_call=types.FunctionCall(name=name, args=dict(args),
                                                                 id=f"c{n}-{i}"))
                     for i, (name, args) in enumerate(batch)]
        usage = types.GenerateContentResponseUsageMetadata(prompt_token_count=1,
                                                           candidates_token_count=1,
                                                           total_token_count=2)
        yield LlmResponse(content=types.Content(role="model", parts=parts),
                          usage_metadata=usage)


def _tool(name: str, needs_approval: bool) -> FunctionTool:
    def body(**args: Any) -> str:
        call = adk.tool_context()
        assert call is not None, "a durable run's tool has its fsdurable call context"
        return perform(name, args, call.idempotency_key, call.attended)

    body.__name__ = name
    return FunctionTool(body, require_confirmation=needs_approval)


def _runner(root: str, sc: Scenario, *, fail: bool = False) -> adk.DurableRunner:
    agent = LlmAgent(name="conformance", model=ScriptedModel(script=sc.to_json(), fail=fail),
                     tools=[_tool(t.name, t.needs_approval) for t in sc.tools])
    return adk.DurableRunner(agent, app_name=APP, store=store_for(root),
                             effects={t.name: t.effect for t in sc.tools})


def _answer(out: adk.RunOutcome) -> dict[str, Any]:
    return {"status": out.status, "reply": out.reply}


def live(root: str, sid: str, sc: Scenario, *, attended: bool, approve: bool) -> dict[str, Any]:
    r = _runner(root, sc)
    if not r.store.exists(sid):
        r.store.create(sid, source="desktop")  # the source never decides who owns the turn
    return _answer(asyncio.run(r.run(user_id=USER, session_id=sid, new_message="go",
                                     attended=attended, approve=lambda ctx, req: approve)))


def recover(root: str, sc: Scenario, *, fail: bool) -> list[dict[str, Any]]:
    rep = asyncio.run(adk.recover(_runner(root, sc, fail=fail)))
    return [o.to_dict() for o in rep.outcomes]


def proceed(root: str, sid: str, sc: Scenario) -> dict[str, Any]:
    r = _runner(root, sc)
    return _answer(asyncio.run(r.run(user_id=USER, session_id=sid, new_message=CONTINUE,
                                     attended=True)))
