"""Every end of a turn keeps its in-doubt calls: a turn that fails or pauses while an effectful
call is out (its intent committed, no outcome) puts that call in the review queue with its
arguments, as cancel and abandon do — it is never dropped with the turn (the turn protocol's
``TurnRun.fail``/``pause``; every driver ends its turns through them)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fsdurable
from fsdurable import AgentLoop, HostError, Reply, ScriptedModel, Store, tool
from fsdurable import _events as ev
from fsdurable._model import ToolCall
from fsdurable._turns import ToolDecision, ToolRequest, TurnRun


@pytest.fixture
def st(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def _queued(st: Store, sid: str) -> list[dict[str, Any]]:
    return [c for c in fsdurable.review_queue(st) if c["session_id"] == sid]


def _out(st: Store, sid: str) -> TurnRun:
    """A live turn whose ``charge`` intent is committed and whose outcome never came."""
    st.create(sid)
    r = TurnRun.begin(st, sid, "pay acme", driver="loop", attended=True)
    d = r.before_tool(ToolRequest("call_0", "charge", {"amount": 5, "to": "acme"},
                                  effect="external"))
    assert d.action == "run"
    return r


@pytest.mark.parametrize("end", ["fail", "pause"])
def test_a_turn_ended_while_a_call_is_out_parks_the_call(st: Store, end: str) -> None:
    r = _out(st, "s1")
    if end == "fail":
        assert r.fail(RuntimeError("the framework gave up")) is not None
    else:
        r.pause(why="approval")
    s = st.load("s1")
    assert not s.in_progress and not st.interrupted()
    [q] = _queued(st, "s1")
    assert (q["tool"], q["arguments"], q["reason"]) == ("charge", {"amount": 5, "to": "acme"},
                                                        "failed" if end == "fail" else "paused")
    assert q["idempotency_key"] == f"s1:{r.turn_id}:call_0"
    codes = [e.code for e in st.events("s1")]
    assert codes[-1] == ev.REVIEW_REQUIRED
    assert (ev.TURN_FAILED if end == "fail" else ev.TURN_PAUSED) in codes


def test_a_turn_that_fails_with_every_outcome_on_record_parks_nothing(st: Store) -> None:
    r = _out(st, "s1")
    [d] = [r.before_tool(ToolRequest("call_1", "lookup", {"q": "x"}, effect="external"))]
    r.after_tool(d, ok=True, result="found")
    assert len(_queued(st, "s1")) == 0 and r.session.turn is not None
    # call_0's outcome arrives too, then the run fails for another reason: nothing is in doubt
    r.after_tool(ToolDecision("run", ToolRequest("call_0", "charge", {"amount": 5, "to": "acme"},
                                                 effect="external"), r.context("call_0")),
                 ok=True, result="charged")
    assert r.fail(RuntimeError("later")) is not None
    assert _queued(st, "s1") == []
    assert ev.REVIEW_REQUIRED not in [e.code for e in st.events("s1")]


def test_the_loop_failing_inside_an_effectful_tool_parks_it(st: Store) -> None:
    """The reference loop: a tool raises ``HostError`` (the host's programming error) after its
    effect — the loop ends the turn ``failed`` (no retry) and the charge, which ran, is parked."""
    charged: list[int] = []

    @tool(effect="external")
    def charge(ctx: Any, amount: int) -> str:
        charged.append(amount)
        raise HostError("the host's ledger client is misconfigured", reason="host_bug")

    model = ScriptedModel([Reply("", (ToolCall("call_0", "charge", {"amount": 5}),))],
                          final="paid")
    loop = AgentLoop(st, model, [charge])
    st.create("s1")
    with pytest.raises(HostError):
        loop.run("s1", "pay", attended=True)
    assert charged == [5]
    [q] = _queued(st, "s1")
    assert (q["tool"], q["arguments"]) == ("charge", {"amount": 5})
    assert not st.load("s1").in_progress and not st.interrupted()


def test_a_graph_failing_while_a_parallel_tool_call_is_out_parks_it(tmp_path: Path) -> None:
    """LangGraph: in one step, the ``tools`` node runs ``charge`` (slow, external) while a
    parallel ``audit`` node raises: the graph run fails while ``charge`` is still out. The run
    ends ``failed`` — and the charge that was under way goes to the review queue."""
    pytest.importorskip("langgraph.graph")
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import START, MessagesState, StateGraph

    from fsdurable.langgraph import FsDurableSaver, tool_node

    started = threading.Event()
    done: list[str] = []

    @lc_tool
    def charge(amount: int) -> str:
        """Charge a card."""
        started.set()
        time.sleep(1.0)
        done.append("charge")
        return "charged"

    def audit(state: MessagesState) -> dict[str, Any]:
        started.wait(10)
        raise ValueError("the audit service is down")

    model = FakeMessagesListChatModel(responses=[AIMessage("", tool_calls=[
        {"id": "c1", "name": "charge", "args": {"amount": 5}}])])
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    g.add_node("tools", tool_node([charge], effects={"charge": "external"}))
    g.add_node("audit", audit)
    g.add_edge(START, "agent")
    g.add_edge("agent", "tools")
    g.add_edge("agent", "audit")
    st = Store(tmp_path / "store")
    graph = g.compile(checkpointer=FsDurableSaver(st, session_ids="thread"))
    with pytest.raises(ValueError, match="audit service is down"):
        graph.invoke({"messages": [HumanMessage("pay")]},
                     {"configurable": {"thread_id": "t1"}}, durability="sync")
    deadline = time.monotonic() + 10
    while not done and time.monotonic() < deadline:  # the charge thread finishes on its own
        time.sleep(0.05)
    s = st.load("t1")
    assert done == ["charge"]  # the charge ran
    assert not s.in_progress and not st.interrupted()
    [q] = _queued(st, "t1")
    assert (q["tool"], q["arguments"]) == ("charge", {"amount": 5})


@pytest.mark.parametrize("end", ["end", "step_limit", "fail", "pause"])
def test_only_a_completed_turns_line_waits_for_its_fsync(st: Store, end: str) -> None:
    # issue 18: turn_completed restates the commit that ended the turn (a note, fsynced with
    # the next decision); a failure or a pause is a decision of its own, fsynced at once, and
    # so is a turn ended for another reason (the loop's step limit, a host's status): the
    # document records no status, so the line is the only record of why the turn stopped
    from fsdurable import _fsio

    st.create("s1")
    TurnRun.begin(st, "s1", "warm the day file", driver="loop", attended=True).end()
    r = TurnRun.begin(st, "s1", "hi", driver="loop", attended=True)
    ops: list[str] = []

    def rec(op: str, args: tuple[Any, ...]) -> None:
        if op in ("append", "fsync") and "events" in str(args[0]):
            ops.append(op)

    old = _fsio.set_recorder(rec)
    try:
        if end == "end":
            r.end(reply="hello")
        elif end == "step_limit":
            r.end(status="step_limit")
        elif end == "fail":
            r.fail(RuntimeError("boom"))
        else:
            r.pause(why="approval")
    finally:
        _fsio.set_recorder(old)
    assert ops == (["append"] if end == "end" else ["append", "fsync"])
    code = {"end": ev.TURN_COMPLETED, "step_limit": ev.TURN_COMPLETED, "fail": ev.TURN_FAILED,
            "pause": ev.TURN_PAUSED}[end]
    assert st.events("s1")[-1].code == code
