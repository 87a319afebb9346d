"""The child processes of ``bench/pydantic_ai.py``: one Pydantic AI agent (an offline
``FunctionModel`` that calls the tool ``step`` ``STEPS`` times, then answers) run durably by
fsdurable or by DBOS (the ``DBOSDurability`` capability, on SQLite).

``python -m bench._pai_child ROLE ENGINE PATH N``:
  prepare   N finished runs (fsdurable: real ``FsDurableAgent`` runs of one model request;
            DBOS: workflows of a one-line ``@DBOS.workflow``: the status rows a finished run
            leaves), then K (``PAI_BENCH_KILLED``) runs at once; each blocks in its tool at
            step ``BLOCK``; once all K are there the process SIGKILLs itself
  recover   this engine's startup recovery of the N (= K) interrupted runs, timed from before
            the store / DBOS is opened to the end of the last resumed run; prints JSON
            ``{"seconds", "outputs", "tool_reruns"}`` (``tool_reruns``: steps before ``BLOCK``
            that ran again). ``PAI_BENCH_EFFECT``: the tool's declared effect for fsdurable
            (``none`` by default: a step after the last checkpoint then runs again)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

STEPS = 20
BLOCK = 10
_state = {"blocked": 0, "want": 0, "reruns": 0, "recovering": False}


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    n = sum(1 for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
    if n < STEPS:
        return ModelResponse(parts=[ToolCallPart("step", {"i": n}, f"c{n}")])
    return ModelResponse(parts=[TextPart(f"done after {n} steps")])


def make_agent(capabilities: Any = ()) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(FunctionModel(respond), name="bench",
                                    capabilities=list(capabilities))

    @agent.tool_plain
    async def step(i: int) -> int:
        if _state["recovering"] and i < BLOCK:
            _state["reruns"] += 1
        if _state["want"] and i == BLOCK:
            _state["blocked"] += 1
            if _state["blocked"] >= _state["want"]:
                os.kill(os.getpid(), signal.SIGKILL)
            await asyncio.sleep(3600)
        return i

    return agent


def dbos_config(path: str) -> Any:
    return {"name": "fsdurable-bench", "system_database_url": f"sqlite:///{path}",
            "application_version": "fsdurable-bench", "log_level": "ERROR",
            "console_log_level": "ERROR"}


def fsdurable_agent(root: str, *, fsync: bool = True) -> Any:
    import fsdurable
    from fsdurable.pydantic_ai import FsDurableAgent

    cfg = fsdurable.Config() if fsync else fsdurable.Config().replace(fsync=False)
    effect = os.environ.get("PAI_BENCH_EFFECT", "none")
    return FsDurableAgent(make_agent(), fsdurable.Store(root, config=cfg),
                          effects={"step": effect})


def run_fsdurable(role: str, root: str, n: int) -> dict[str, Any]:
    if role == "prepare":
        from fsdurable.pydantic_ai import FsDurableAgent

        quick = fsdurable_agent(root, fsync=False)  # setup only: the measured store fsyncs
        one = FsDurableAgent(Agent(FunctionModel(lambda m, i: ModelResponse(
            parts=[TextPart("hi")]))), quick.store)
        for i in range(n):
            one.run_sync("hello", session_id=f"done-{i}")
        d = fsdurable_agent(root)
        _state["want"] = killed = int(os.environ["PAI_BENCH_KILLED"])

        async def kill() -> None:
            await asyncio.gather(*(d.run("go", session_id=f"live-{i}") for i in range(killed)))

        asyncio.run(kill())
        raise AssertionError("not killed")
    t = time.perf_counter()
    from fsdurable.pydantic_ai import recover

    d = fsdurable_agent(root)
    _state["recovering"] = True
    rep = asyncio.run(recover(d))
    seconds = time.perf_counter() - t
    outs = [o.status for o in rep.outcomes]
    return {"seconds": seconds, "outputs": outs, "tool_reruns": _state["reruns"]}


def run_dbos(role: str, path: str, n: int) -> dict[str, Any]:
    t = time.perf_counter()
    from dbos import DBOS, SetWorkflowID
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    DBOS(config=dbos_config(path))
    agent = make_agent([DBOSDurability()])

    @DBOS.workflow()
    async def agent_run(prompt: str) -> str:
        return (await agent.run(prompt)).output

    @DBOS.workflow()
    async def finished_run(i: int) -> int:
        return i

    DBOS.launch()  # at startup: recovers this executor's PENDING workflows, in the background
    if role == "prepare":
        _state["want"] = killed = int(os.environ["PAI_BENCH_KILLED"])

        async def one(i: int) -> Any:
            with SetWorkflowID(f"live-{i}"):
                return await agent_run("go")

        async def fill() -> None:
            for i in range(n):
                with SetWorkflowID(f"done-{i}"):
                    await finished_run(i)
            await asyncio.gather(*(one(i) for i in range(killed)))

        asyncio.run(fill())
        raise AssertionError("not killed")
    _state["recovering"] = True

    async def wait() -> list[Any]:
        outs = []
        for i in range(n):
            h: Any = await DBOS.retrieve_workflow_async(f"live-{i}")
            outs.append(str(await h.get_result()))
        return outs

    outs = asyncio.run(wait())
    seconds = time.perf_counter() - t
    DBOS.destroy()
    return {"seconds": seconds, "outputs": outs, "tool_reruns": _state["reruns"]}


def main(argv: list[str]) -> int:
    role, engine, path, n = argv[0], argv[1], argv[2], int(argv[3])  # recover: n = K
    fn = run_fsdurable if engine == "fsdurable" else run_dbos
    print(json.dumps(fn(role, path, n)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
