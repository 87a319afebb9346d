"""Small LangGraph graphs for the graph-run tests of fsdurable.langgraph, run in child processes.

Every node/tool start and end is appended (fsync) to ``$LG_LOG``. ``$LG_KILL=<point>``
SIGKILLs the process at that point the first time it is reached (a flag file beside the log
remembers it); ``$LG_KILL_PUT=<n>`` SIGKILLs it at the start of the saver's n-th ``put``;
``$LG_KILL_AFTER_WRITE=<channel>`` right after a ``put_writes`` of that channel returned.

    python -m tests.lg_cases CASE run ROOT THREAD
    python -m tests.lg_cases CASE recover ROOT [CONTEXT_NAME]

Cases: ``charge`` (one slow node that waits for ``$LG_LOG.go``), ``email`` (a model calling an
external ``send_email`` tool through ``fsdurable.langgraph.tool_node``), ``ctx`` (a graph with a
``context_schema``), ``steps`` (three plain nodes).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, TypedDict

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.runtime import Runtime

from fsdurable.langgraph import FsDurableSaver

from .lg_graph import ScriptedChat


def log(line: str) -> None:
    path = os.environ.get("LG_LOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def kill_point(name: str) -> None:
    if os.environ.get("LG_KILL") != name:
        return
    flag = os.environ["LG_LOG"] + ".killed." + name
    if not os.path.exists(flag):
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


class KillSaver(FsDurableSaver):
    """SIGKILLs the process at the start of its ``$LG_KILL_PUT``-th put."""

    puts = 0

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        KillSaver.puts += 1
        if os.environ.get("LG_KILL_PUT") == str(KillSaver.puts):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        super().put_writes(config, writes, task_id, task_path)
        if os.environ.get("LG_KILL_AFTER_WRITE") in {ch for ch, _v in writes}:
            os.kill(os.getpid(), signal.SIGKILL)  # the writes are saved, the checkpoint not


class N(TypedDict):
    n: int


def _step(name: str, f: Any) -> Any:
    def node(state: N) -> N:
        log(f"{name}-start")
        kill_point(name)
        out: N = {"n": f(state["n"])}
        log(f"{name}-done")
        return out

    return node


def charge(state: N) -> N:
    log("charge-start")
    go = os.environ["LG_LOG"] + ".go"
    deadline = time.monotonic() + 8
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    log("charge-done")
    return {"n": state["n"] + 1}


@tool
def send_email(to: str) -> str:
    """Send an email."""
    from fsdurable.langgraph import tool_context

    ctx = tool_context()
    log(f"email-sent {to} key={ctx.idempotency_key if ctx else None}")
    kill_point("email")
    return f"sent to {to}"


EMAIL_REPLIES: list[BaseMessage] = [
    AIMessage("", id="ai-0", tool_calls=[{"id": "call-e", "name": "send_email",
                                          "args": {"to": "bob"}}]),
    AIMessage("done", id="ai-1"),
]


@dataclass
class Ctx:
    name: str


def greet(state: N, runtime: Runtime[Ctx]) -> N:
    log("greet-start")
    kill_point("greet")
    out: N = {"n": state["n"] + len(runtime.context.name)}
    log("greet-done")
    return out


def build(case: str, saver: Any) -> Any:
    if case == "charge":
        g: Any = StateGraph(N)
        g.add_node("charge", charge)
        g.add_edge(START, "charge")
    elif case == "email":
        from fsdurable.langgraph import tool_node

        model = ScriptedChat(responses=EMAIL_REPLIES)

        def agent(state: MessagesState) -> dict[str, Any]:
            log("agent-start")
            return {"messages": [model.invoke(state["messages"])]}

        g = StateGraph(MessagesState)
        g.add_node("agent", agent)
        g.add_node("tools", tool_node([send_email], effects={"send_email": "external"}))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
    elif case == "ctx":
        g = StateGraph(N, context_schema=Ctx)
        g.add_node("a", _step("a", lambda n: n + 1))
        g.add_node("greet", greet)
        g.add_edge(START, "a")
        g.add_edge("a", "greet")
    elif case == "steps":
        g = StateGraph(N)
        g.add_node("a", _step("a", lambda n: n + 1))
        g.add_node("b", _step("b", lambda n: n * 10))
        g.add_node("c", _step("c", lambda n: n - 3))
        g.add_edge(START, "a")
        g.add_edge("a", "b")
        g.add_edge("b", "c")
        g.add_edge("c", END)
    else:
        raise SystemExit(f"unknown case {case!r}")
    return g.compile(checkpointer=saver)


def first_input(case: str) -> Any:
    if case == "email":
        return {"messages": [HumanMessage("email bob")]}
    return {"n": 1}


def values(v: dict[str, Any]) -> Any:
    if "messages" in v:
        return [[type(m).__name__, m.content] for m in v["messages"]]
    return v


def main(argv: list[str]) -> None:
    from fsdurable.langgraph import recover

    case, cmd, root = argv[0], argv[1], argv[2]
    saver = KillSaver(root)
    graph = build(case, saver)
    if cmd == "run":
        cfg: Any = {"configurable": {"thread_id": argv[3]}}
        kw: dict[str, Any] = {"context": Ctx("ada")} if case == "ctx" else {}
        out = graph.invoke(first_input(case), cfg, durability="sync", **kw)
        print(json.dumps(values(out)))
        return
    kw = {"context": Ctx(argv[3])} if len(argv) > 3 else {}
    report = recover(graph, saver, **kw)
    states = {t: values(graph.get_state({"configurable": {"thread_id": t}}).values)
              for _sid, t in saver.threads.thread_ids()}
    print(json.dumps({"report": report.to_dict(), "states": states}))


if __name__ == "__main__":
    main(sys.argv[1:])
