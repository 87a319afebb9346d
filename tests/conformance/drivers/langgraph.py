"""The conformance suite's driver for LangGraph (``fsdurable.langgraph``): a ``StateGraph`` of a
scripted model node and ``tool_node(...)``, compiled with ``FsDurableSaver`` (thread sessions
named by their thread id), run with ``invoke`` (``durability="sync"``)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from fsdurable.langgraph import FsDurableSaver, attended, tool_context, tool_node
from fsdurable.langgraph import recover as lg_recover

from ..harness import CONTINUE, ModelFailure, Scenario, perform, step_of, store_for

DRIVER = "langgraph"
ASYNC = False  # langgraph_async: the same graph through ainvoke / arecover


def _perform(name: str, args: dict[str, Any]) -> str:
    ctx = tool_context()
    assert ctx is not None, "a tool_node tool runs inside the ledger"
    return perform(name, args, ctx.idempotency_key, ctx.attended)


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return _perform("lookup", {"q": q})


@tool
def charge(amount: int, to: str) -> str:
    """Charge a card."""
    return _perform("charge", {"amount": amount, "to": to})


@tool
def publish(post: str) -> str:
    """Publish a post."""
    return _perform("publish", {"post": post})


@tool
def shell(cmd: str) -> str:
    """Run a shell command."""
    return _perform("shell", {"cmd": cmd})


TOOLS: dict[str, BaseTool] = {t.name: t for t in (lookup, charge, publish, shell)}


def _reply(sc: Scenario, messages: list[BaseMessage], fail: bool) -> AIMessage:
    """The scripted model: the batch after the batches answered since the last user input."""
    if fail:
        raise ModelFailure("the model is down")
    n = 0
    for m in reversed(messages):
        if isinstance(m, HumanMessage):
            if m.content == CONTINUE:
                return AIMessage(sc.final)
            break
        if isinstance(m, AIMessage) and m.tool_calls:
            n += 1
    batch = step_of(n, sc)
    if batch is None:
        return AIMessage(sc.final)
    return AIMessage("", tool_calls=[{"id": f"c{n}-{i}", "name": name, "args": dict(args)}
                                     for i, (name, args) in enumerate(batch)])


def _graph(root: str, sc: Scenario, *, approve: bool = False, fail: bool = False
           ) -> tuple[Any, FsDurableSaver]:
    saver = FsDurableSaver(store_for(root), session_ids="thread")
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda state: {"messages": [_reply(sc, state["messages"], fail)]})
    g.add_node("tools", tool_node([TOOLS[t.name] for t in sc.tools],
                                  effects={t.name: t.effect for t in sc.tools},
                                  approval={t.name for t in sc.tools if t.needs_approval},
                                  approve=lambda ctx, req: approve))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver), saver


def _invoke(graph: Any, sid: str, text: str, *, present: bool) -> dict[str, Any]:
    import asyncio

    from fsdurable._errors import TurnStopped

    cfg: Any = {"configurable": {"thread_id": sid}}
    inp = {"messages": [HumanMessage(text)]}
    try:
        if present:
            with attended():
                out = (asyncio.run(graph.ainvoke(inp, cfg, durability="sync")) if ASYNC
                       else graph.invoke(inp, cfg, durability="sync"))
        else:
            out = (asyncio.run(graph.ainvoke(inp, cfg, durability="sync")) if ASYNC
                   else graph.invoke(inp, cfg, durability="sync"))
    except TurnStopped as stop:
        return {"status": stop.status, "reply": None}
    return {"status": "completed", "reply": out["messages"][-1].content}


def live(root: str, sid: str, sc: Scenario, *, attended: bool, approve: bool) -> dict[str, Any]:
    graph, _saver = _graph(root, sc, approve=approve)
    return _invoke(graph, sid, "go", present=attended)


def recover(root: str, sc: Scenario, *, fail: bool) -> list[dict[str, Any]]:
    graph, saver = _graph(root, sc, fail=fail)
    if ASYNC:
        import asyncio

        from fsdurable.langgraph import arecover

        rep = asyncio.run(arecover(graph, saver))
    else:
        rep = lg_recover(graph, saver)
    return [o.to_dict() for o in rep.outcomes]


def proceed(root: str, sid: str, sc: Scenario) -> dict[str, Any]:
    graph, _saver = _graph(root, sc)
    return _invoke(graph, sid, CONTINUE, present=True)
