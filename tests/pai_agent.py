"""A deterministic Pydantic AI agent for the durable-run tests (no network): a ``FunctionModel``
whose answer is derived from the history so far (so a resumed run in a fresh process gets the
answer the dead one would have got).

As a script: ``python -m tests.pai_agent run|recover ROOT`` with ``PAI_LOG`` (a file that gets a
line per model call and per completed tool call), ``PAI_KILL`` (``node<k>``: SIGKILL right after
the k-th node boundary; ``model<n>``: inside the model call that has seen n tool returns;
``add<a>`` / ``send``: inside that tool, after its effect), ``PAI_SCRIPT`` (``sums`` or
``delete``) and ``PAI_DEBOUNCE`` (the checkpoint debounce, default 0). Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import fsdurable
from fsdurable import pydantic_ai as pai

EFFECTS = {"add": "none", "send": os.environ.get("PAI_SEND_EFFECT", "external"),
           "delete": "external"}
FINAL = "sums: 3 and 7, sent"


def _log(line: str) -> None:
    path = os.environ.get("PAI_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _kill_at(point: str) -> None:
    if os.environ.get("PAI_KILL") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)]


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    n = len(returns(messages))
    _log(f"model {n}")
    _kill_at(f"model{n}")
    if os.environ.get("PAI_SCRIPT", "sums") == "delete":
        if n == 0:
            return ModelResponse(parts=[ToolCallPart("delete", {"path": "/tmp/x"}, "d1")])
        return ModelResponse(parts=[TextPart("delete: " + str(returns(messages)[-1].content))])
    # the same call id at every step: the ledger must still tell the calls apart
    if n == 0:
        return ModelResponse(parts=[ToolCallPart("add", {"a": 1, "b": 2}, "c1")])
    if n == 1:
        return ModelResponse(parts=[ToolCallPart("send", {"to": "ana"}, "c1")])
    if n == 2:
        return ModelResponse(parts=[ToolCallPart("add", {"a": 3, "b": 4}, "c1")])
    return ModelResponse(parts=[TextPart(FINAL)])


def make_agent() -> Agent[None, Any]:
    agent: Agent[None, Any] = Agent(FunctionModel(respond), name="pai-test",
                                    output_type=[str, DeferredToolRequests])

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        _kill_at(f"add{a}")
        _log(f"add {a} {b}")
        return a + b

    @agent.tool_plain
    def send(to: str) -> str:
        ctx = pai.tool_context()
        assert ctx is not None
        _log(f"send {to} {ctx.idempotency_key}")
        _kill_at("send")
        return f"sent to {to}"

    @agent.tool_plain(requires_approval=True)
    def delete(path: str) -> str:
        _log(f"delete {path}")
        return f"deleted {path}"

    return agent


def store(root: str) -> fsdurable.Store:
    debounce = float(os.environ.get("PAI_DEBOUNCE", "0"))
    return fsdurable.Store(root, config=fsdurable.Config().replace(checkpoint_debounce=debounce))


async def main(mode: str, root: str) -> dict[str, Any]:
    st = store(root)
    durable = pai.FsDurableAgent(make_agent(), st, effects=EFFECTS)
    out: dict[str, Any] = {}
    if mode == "run":
        k = 0
        async with durable.iter("go", session_id="chat") as run:
            async for _node in run:
                k += 1
                _kill_at(f"node{k}")
        assert run.outcome is not None
        out["status"], out["final"] = run.outcome.status, run.outcome.output
        out["nodes"] = k
    else:
        report = await pai.recover(durable)
        out["report"] = report.to_dict()
    out["history"] = [[type(p).__name__ for p in m.parts] for m in pai.history(st, "chat")]
    out["returns"] = [str(p.content) for p in returns(pai.history(st, "chat"))]
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2])), default=str))
