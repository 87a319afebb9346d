"""A small tool-calling StateGraph for fsdurable.langgraph's tests, run in child processes too.

The chat model is langchain_core's fake ``FakeMessagesListChatModel``, made deterministic: its
reply is chosen by the number of assistant messages already in the transcript, so a fresh
process continues the conversation exactly where the crashed one stopped. Every node start and
end is appended (fsync) to ``$LG_LOG``; ``$LG_CRASH_AT=<a>+<b>`` SIGKILLs the process inside that
tool call the first time it runs.

    python -m tests.lg_graph run ROOT THREAD      # one run (durability="sync")
    python -m tests.lg_graph recover ROOT         # fsdurable.langgraph.recover, then the state
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

RESPONSES: list[BaseMessage] = [
    AIMessage("", id="ai-0",
              tool_calls=[{"id": "call-0", "name": "add", "args": {"a": 2, "b": 3}}]),
    AIMessage("", id="ai-1",
              tool_calls=[{"id": "call-1", "name": "add", "args": {"a": 5, "b": 10}}]),
    AIMessage("the sum is 15", id="ai-2"),
]
PROMPT = "add 2 and 3, then add 10 to it"


class ScriptedChat(FakeMessagesListChatModel):
    """Deterministic: reply number n when the transcript holds n assistant messages."""

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> Any:
        self.i = sum(isinstance(m, AIMessage) for m in messages)
        return super()._generate(messages, stop, run_manager, **kwargs)


MODEL = ScriptedChat(responses=RESPONSES)


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


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    log(f"tool-start {a}+{b}")
    if os.environ.get("LG_CRASH_AT") == f"{a}+{b}":
        flag = os.environ["LG_LOG"] + ".crashed"
        if not os.path.exists(flag):
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    log(f"tool-done {a}+{b}")
    return a + b


def agent(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
    n = sum(isinstance(m, AIMessage) for m in state["messages"])
    log(f"agent-start {n}")
    reply = MODEL.invoke(state["messages"])
    unattended = config.get("configurable", {}).get("fsdurable_unattended", False)
    log(f"agent-done {n} unattended={unattended}")
    return {"messages": [reply]}


def build(saver: Any) -> Any:
    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([add]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


def summary(values: dict[str, Any]) -> list[list[Any]]:
    """The transcript without the ids LangGraph makes up (tool messages get random ids)."""
    return [[type(m).__name__, m.content, [[c["name"], c["args"], c["id"]]
                                           for c in getattr(m, "tool_calls", [])],
             getattr(m, "tool_call_id", None)] for m in values["messages"]]


def run(graph: Any, thread: str) -> dict[str, Any]:
    cfg: RunnableConfig = {"configurable": {"thread_id": thread}}
    out: dict[str, Any] = graph.invoke({"messages": [HumanMessage(PROMPT)]}, cfg,
                                       durability="sync")
    return out


def main(argv: list[str]) -> None:
    from fsdurable.langgraph import FsDurableSaver, recover

    saver = FsDurableSaver(argv[1])
    graph = build(saver)
    if argv[0] == "run":
        print(json.dumps(summary(run(graph, argv[2]))))
    else:
        report = recover(graph, saver)
        states = {t: summary(graph.get_state({"configurable": {"thread_id": t}}).values)
                  for _sid, t in saver.threads.thread_ids()}
        print(json.dumps({"report": report.to_dict(), "states": states}))


if __name__ == "__main__":
    main(sys.argv[1:])
