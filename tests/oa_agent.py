"""A deterministic Agents SDK agent for the durable-run tests (no network): the SDK's own
``agents.testing.ScriptedModel``, whose answer is derived from the conversation so far (so a
resumed run in a fresh process gets the answer the dead one would have got).

As a script: ``python -m tests.oa_agent MODE ROOT`` with ``OA_LOG`` (a file that gets a line per
model call and per completed tool call), ``OA_KILL`` (``model<n>``, ``add<a>``, ``send``,
``delete`` or ``shell``: the process SIGKILLs itself there), ``OA_SCRIPT`` (``sums``, ``delete``,
``shell``) and ``OA_SOURCE`` (the session is created with that source first). MODE: ``run``,
``stream`` (the same run through ``oa.run_streamed``), ``approve`` (an attended run paused for
approval, approved, continued), ``recover`` (``oa.recover``), ``recover_loop``
(``fsdurable.recover`` with an ``AgentLoop``: it must leave Agents SDK runs alone),
``continue`` (``oa.continue_run`` after a human answered a parked call). Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no network, ever

from agents import Agent, ModelSettings, function_tool
from agents.testing import (
    ModelStep,
    ScriptedModel,
    assistant_message,
    function_call,
)

EFFECTS = {"add": "none", "send": "external", "delete": "none", "shell": "external",
           **json.loads(os.environ.get("OA_EFFECTS") or "{}")}
FINAL = "sums: 3 and 7, sent"
SHELL = "rm -rf ~/build"


def _log(line: str) -> None:
    path = os.environ.get("OA_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _kill_at(point: str) -> None:
    if os.environ.get("OA_KILL") == point:
        os.kill(os.getpid(), signal.SIGKILL)


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    _kill_at(f"add{a}")
    _log(f"add {a} {b}")
    return a + b


@function_tool
def send(to: str) -> str:
    """Send the result (an external effect)."""
    _kill_at("send")
    _log(f"send {to}")
    return f"sent to {to}"


@function_tool(needs_approval=True)
def delete(path: str) -> str:
    """Delete a file (needs a human's approval)."""
    _kill_at("delete")
    _log(f"delete {path}")
    return f"deleted {path}"


@function_tool
def shell(cmd: str) -> str:
    """Run a shell command (on Config.unattended_deny)."""
    _kill_at("shell")
    _log(f"shell {cmd}")
    return "ran"


def _outputs(call: Any) -> int:
    items = call.input if isinstance(call.input, list) else []
    return sum(1 for it in items if isinstance(it, dict) and it.get("type") ==
               "function_call_output")


def respond(call: Any) -> Any:
    n = _outputs(call)
    _log(f"model {n}")
    _kill_at(f"model{n}")
    script = os.environ.get("OA_SCRIPT", "sums")
    if script == "shell":
        if n == 0:
            return [function_call("shell", {"cmd": SHELL}, call_id="s1")]
        return [assistant_message("shell: done")]
    if script == "delete":
        if n == 0:
            return [function_call("delete", {"path": "/tmp/x"}, call_id="d1")]
        return [assistant_message("delete: done")]
    if n == 0:
        return [function_call("add", {"a": 1, "b": 2}, call_id="c1")]
    if n == 1:
        return [function_call("add", {"a": 3, "b": 4}, call_id="c2")]
    if n == 2:
        return [function_call("send", {"to": "ana"}, call_id="c3")]
    return [assistant_message(FINAL)]


def make_agent() -> Agent[Any]:
    model = ScriptedModel([ModelStep.respond(respond) for _ in range(20)])
    return Agent(name="calc", model=model, tools=[add, send, delete, shell],
                 model_settings=ModelSettings(parallel_tool_calls=False))


async def _main(mode: str, root: str) -> dict[str, Any]:
    import fsdurable
    from fsdurable import openai_agents as oa

    store = fsdurable.Store(root)
    fs = oa.FileSession("chat", store)
    out: dict[str, Any] = {}
    source = os.environ.get("OA_SOURCE")
    if source and mode in ("run", "stream", "approve"):
        store.create("chat", source=source)
    debounce = float(os.environ.get("OA_DEBOUNCE", "0"))
    if mode == "run":
        r = await oa.run(make_agent(), "add things", session=fs, effects=EFFECTS,
                         debounce=debounce)
        out["final"] = r.final_output
    elif mode == "stream":
        stream = oa.run_streamed(make_agent(), "add things", session=fs, effects=EFFECTS,
                                 debounce=debounce)
        out["events"] = [type(e).__name__ async for e in stream]
        out["final"] = stream.final_output
    elif mode == "approve":
        agent = make_agent()
        r = await oa.run(agent, "clean up", session=fs, attended=True, effects=EFFECTS)
        state = await oa.paused_state(agent, fs)
        for item in state.get_interruptions():
            state.approve(item)
        r = await oa.run(agent, state, session=fs, attended=True, effects=EFFECTS)
        out["final"] = r.final_output
    elif mode == "continue":
        r = await oa.continue_run(make_agent(), session=fs, effects=EFFECTS)
        out["final"] = r.final_output
    elif mode == "recover_loop":
        loop = fsdurable.AgentLoop(store, lambda transcript, specs: fsdurable.Reply("mine"))
        out["report"] = fsdurable.recover(store, loop).to_dict()
    else:
        rep = await oa.recover(make_agent(), store, effects=EFFECTS, debounce=0)
        out["report"] = rep.to_dict()
    out["items"] = await fs.get_items()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_main(sys.argv[1], sys.argv[2]))))
