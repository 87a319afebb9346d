"""A deterministic Google ADK agent for the durable-run tests (no network, no API key): a
scripted ``BaseLlm`` whose answer is derived from the conversation it is sent (so a resumed run in
a fresh process gets the answer the dead one would have got).

The script: ``lookup(q="order-7")``, then ``pay(amount=5, to="acme")``, then the final reply.

As a script: ``python -m tests.adk_agent run|recover ROOT`` with ``ADK_LOG`` (a file that gets a
line per model call and per tool effect), ``ADK_KILL`` (``model<n>``: SIGKILL inside the model
call that has seen n tool responses; ``lookup`` / ``pay``: inside that tool, after its effect;
``event<k>``: when ADK hands the k-th event of the run to the plugins, before it is appended),
``ADK_PAY`` (pay's effect, default ``external``) and ``ADK_DEBOUNCE`` (the checkpoint debounce,
default 0). Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.genai import types

import fsdurable
from fsdurable import adk

FINAL = "paid 5 to acme"
SCRIPT = (("lookup", {"q": "order-7"}), ("pay", {"amount": 5, "to": "acme"}))


def _log(line: str) -> None:
    path = os.environ.get("ADK_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _kill_at(point: str) -> None:
    if os.environ.get("ADK_KILL") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def answered(contents: list[types.Content]) -> int:
    """How many tool calls were answered since the last user text."""
    n = 0
    for c in reversed(contents):
        parts = c.parts or []
        if c.role == "user" and any(p.text for p in parts):
            break
        n += sum(1 for p in parts if p.function_response)
    return n


class Scripted(BaseLlm):
    """The offline model: the next call of ``SCRIPT``, or the final reply. ``reply``: a
    different final reply (a plain chat model when ``calls`` is empty)."""

    model: str = "scripted"
    calls: tuple[tuple[str, dict[str, Any]], ...] = SCRIPT
    reply: str = FINAL

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        n = answered(list(llm_request.contents))
        _log(f"model {n}")
        _kill_at(f"model{n}")
        if n < len(self.calls):
            name, args = self.calls[n]
            parts = [types.Part(function_call=types.FunctionCall(name=name, args=args,
                                                                 id=f"call-{n}"))]
        else:
            parts = [types.Part(text=self.reply)]
        usage = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=1, candidates_token_count=1, total_token_count=2)
        yield LlmResponse(content=types.Content(role="model", parts=parts),
                          usage_metadata=usage)


def lookup(q: str) -> str:
    """Look an order up."""
    _log(f"lookup {q}")
    _kill_at("lookup")
    return f"{q}: 5 due to acme"


def pay(amount: int, to: str) -> dict[str, Any]:
    """Pay ``amount`` to ``to`` (the idempotency key goes to the payment provider)."""
    ctx = adk.tool_context()
    assert ctx is not None
    _log(f"pay {amount} {to} {ctx.idempotency_key}")
    _kill_at("pay")
    return {"paid": amount, "to": to}


class Killer(BasePlugin):
    """A user plugin (composed after fsdurable's): SIGKILL at the k-th event of the run."""

    def __init__(self) -> None:
        super().__init__(name="killer")
        self.n = 0

    async def on_event_callback(self, *, invocation_context: Any, event: Any) -> Any:
        self.n += 1
        _kill_at(f"event{self.n}")
        return None


def runner(root: str, **kw: Any) -> adk.DurableRunner:
    agent = LlmAgent(name="payer", model=Scripted(**kw), tools=[lookup, pay])
    store = fsdurable.Store(root, config=fsdurable.Config().replace(
        checkpoint_debounce=float(os.environ.get("ADK_DEBOUNCE", "0"))))
    return adk.DurableRunner(agent, app_name="shop", store=store, plugins=[Killer()],
                             effects={"lookup": "none",
                                      "pay": os.environ.get("ADK_PAY", "external")})


def summary(r: adk.DurableRunner) -> dict[str, Any]:
    s = r.store.load("chat")
    calls = [(p["function_call"]["name"], p["function_call"]["id"])
             for e in adk.events_of(s) for p in e.get("content", {}).get("parts", [])
             if "function_call" in p]
    responses = [(p["function_response"]["name"], p["function_response"]["response"])
                 for e in adk.events_of(s) for p in e.get("content", {}).get("parts", [])
                 if "function_response" in p]
    return {"messages": [[m.role, m.content] for m in s.messages], "calls": calls,
            "responses": responses, "in_progress": s.in_progress}


async def main(mode: str, root: str) -> dict[str, Any]:
    r = runner(root)
    if mode == "run":
        out = await r.run(user_id="ana", session_id="chat", new_message="pay order 7")
        return {"status": out.status, "reply": out.reply, **summary(r)}
    report = await adk.recover(r)
    return {"report": report.to_dict(), **summary(r)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))), flush=True)
