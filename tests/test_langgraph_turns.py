"""fsdurable.langgraph graph runs through the one turn protocol (issue 17, LangGraph items 1-9):
real graphs, real child processes and SIGKILL (tests/lg_cases.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.graph import START, StateGraph
from langgraph.types import RetryPolicy

import fsdurable
from fsdurable._errors import UnreadableState
from fsdurable._lgstore import thread_session_id
from fsdurable.langgraph import FsDurableSaver, recover

from . import lg_cases
from .conftest import PYTHON, REPO, subprocess_env


def child(*args: str, log: Path, wait: bool = True, **env: str) -> Any:
    cmd = [PYTHON, "-m", "tests.lg_cases", *args]
    kw: dict[str, Any] = {"cwd": REPO, "text": True, "env": subprocess_env(LG_LOG=str(log), **env)}
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    return subprocess.run(cmd, capture_output=True, timeout=180, **kw)


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def codes(store: fsdurable.Store, tid: str) -> list[str]:
    return [e.code for e in store.events(thread_session_id(tid))]


def test_a_live_run_holds_its_route_lock_so_a_second_process_recover_is_busy(
        tmp_path: Path) -> None:
    """Item 1: a second process's recover never re-runs the node a live run is running."""
    root, log = tmp_path / "store", tmp_path / "nodes.log"
    p = child("charge", "run", str(root), "t", log=log, wait=False)
    try:
        deadline = time.monotonic() + 60
        while "charge-start" not in lines(log):
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.stderr \
                else ""
            time.sleep(0.02)
        saver = FsDurableSaver(root)
        report = recover(lg_cases.build("charge", saver), saver)
        [o] = report.outcomes
        assert (o.outcome, o.reason) == ("busy", "route_busy")
        assert lines(log).count("charge-start") == 1  # never run a second time, concurrently
    finally:
        (tmp_path / "nodes.log.go").touch()
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert json.loads(out) == {"n": 2}
    assert lines(log) == ["charge-start", "charge-done"]
    store = fsdurable.Store(root)
    assert store.interrupted() == []
    started = [e for e in store.events(thread_session_id("t")) if e.code == "turn_started"]
    assert len(started) == 1 and started[0].detail["driver"] == "langgraph"  # item 9


def test_an_external_tool_killed_after_it_ran_is_parked_for_review_never_rerun(
        tmp_path: Path) -> None:
    """Item 2: a send_email tool node is not run again after a kill (durability="sync"); the
    call is parked for review with its arguments; the tool saw its idempotency key."""
    root, log = tmp_path / "store", tmp_path / "nodes.log"
    out = child("email", "run", str(root), "t", log=log, LG_KILL="email")
    assert out.returncode == -9, out.stderr
    [sent] = [x for x in lines(log) if x.startswith("email-sent")]
    assert sent.startswith("email-sent bob key=") and "call-e" in sent
    out = child("email", "recover", str(root), log=log)
    assert out.returncode == 0, out.stderr
    [o] = json.loads(out.stdout)["report"]["outcomes"]
    assert (o["outcome"], o["reason"]) == ("review_required", "in_doubt")
    assert [x for x in lines(log) if x.startswith("email-sent")] == [sent]  # never re-run
    store = fsdurable.Store(root)
    assert store.interrupted() == []
    s = store.load(thread_session_id("t"))
    [call] = s.metadata["review_required"]["calls"]
    assert call["tool"] == "send_email" and call["tool_call_id"] == "call-e"
    rr = [e for e in store.events(thread_session_id("t"))
          if e.code == "interrupted_turn_review_required"]
    assert len(rr) == 1


def test_a_failed_resume_costs_one_attempt_and_recover_takes_the_graphs_context(
        tmp_path: Path) -> None:
    """Item 3: a resume without the graph's context fails once and keeps the marker (attempt
    1 of 3); recover(..., context=...) then completes the run."""
    root, log = tmp_path / "store", tmp_path / "nodes.log"
    out = child("ctx", "run", str(root), "t", log=log, LG_KILL="greet")
    assert out.returncode == -9, out.stderr
    out = child("ctx", "recover", str(root), log=log)  # no context: greet fails
    assert out.returncode == 0, out.stderr
    [o] = json.loads(out.stdout)["report"]["outcomes"]
    assert o["outcome"] == "failed"
    [m] = fsdurable.Store(root).interrupted()  # the marker stays until the cap
    assert m.resume_attempts == 1
    out = child("ctx", "recover", str(root), "grace", log=log)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    [o] = res["report"]["outcomes"]
    assert (o["outcome"], o["status"], o["attempts"]) == ("resumed", "completed", 2)
    assert res["states"]["t"] == {"n": 2 + len("grace")}
    assert fsdurable.Store(root).interrupted() == []


def test_a_run_killed_between_a_nodes_writes_and_the_next_checkpoint_is_resumed(
        tmp_path: Path) -> None:
    """Item 4: recover must not declare such a run finished: the rest of the graph runs."""
    root, log = tmp_path / "store", tmp_path / "nodes.log"
    # killed once a's writes (n, branch:to:b) are saved, before the checkpoint after it
    out = child("steps", "run", str(root), "t", log=log, LG_KILL_AFTER_WRITE="branch:to:b")
    assert out.returncode == -9, out.stderr
    assert lines(log) == ["a-start", "a-done"]
    out = child("steps", "recover", str(root), log=log)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    [o] = res["report"]["outcomes"]
    assert (o["outcome"], o["status"]) == ("resumed", "completed")
    assert res["states"]["t"] == {"n": 17}  # ((1 + 1) * 10) - 3, as an uncrashed run
    assert lines(log) == ["a-start", "a-done", "b-start", "b-done", "c-start", "c-done"]


class S(TypedDict):
    n: int


def test_a_subgraphs_failed_attempt_retried_by_a_retry_policy_keeps_the_run_open(
        root: Path) -> None:
    """Item 5: the subgraph's error write (its attempt failed, the parent retries) does not
    close the run: while the retry runs, the run is still an interrupted-if-killed turn."""
    saver = FsDurableSaver(root)
    tries: list[bool] = []

    def flaky(state: S) -> S:
        tries.append(bool(saver.store.interrupted()))
        if len(tries) == 1:
            raise ValueError("first attempt fails")
        return {"n": state["n"] + 1}

    sub = StateGraph(S)
    sub.add_node("flaky", flaky)
    sub.add_edge(START, "flaky")
    g = StateGraph(S)
    g.add_node("sub", sub.compile(), retry_policy=RetryPolicy(max_attempts=3,
                                                              initial_interval=0.01,
                                                              retry_on=ValueError))
    g.add_edge(START, "sub")
    graph = g.compile(checkpointer=saver)
    cfg: Any = {"configurable": {"thread_id": "t"}}
    assert graph.invoke({"n": 1}, cfg, durability="sync") == {"n": 2}
    assert tries == [True, True]  # the retry still ran inside the open run
    assert saver.store.interrupted() == []
    assert "turn_failed" not in codes(saver.store, "t")


def test_a_symlink_at_a_threads_directory_is_never_followed(root: Path, tmp_path: Path) -> None:
    """Item 6: nothing outside the store is deleted or written through a planted link."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    saver = FsDurableSaver(root)
    sid = thread_session_id("t")
    (root / "langgraph").mkdir(exist_ok=True)
    os.symlink(outside, root / "langgraph" / sid)
    graph = lg_cases.build("steps", saver)
    with pytest.raises(UnreadableState) as e:
        graph.invoke({"n": 1}, {"configurable": {"thread_id": "t"}}, durability="sync")
    assert e.value.reason == "symlink"
    assert sorted(os.listdir(outside)) == ["precious.txt"]
    assert (outside / "precious.txt").read_text() == "keep me"


def _cfg(tid: str, ckid: str | None = None) -> Any:
    c: dict[str, Any] = {"thread_id": tid, "checkpoint_ns": ""}
    if ckid is not None:
        c["checkpoint_id"] = ckid
    return {"configurable": c}


def test_a_thread_deleted_and_restarted_elsewhere_is_never_read_from_old_records(
        root: Path) -> None:
    """Item 7: this process's saver caches records; another process deletes the thread and
    starts it again under the same id (its records are numbered from 1 again)."""
    here, there = FsDurableSaver(root), FsDurableSaver(root)
    cp = generate_checkpoint(channel_values={"who": "old"}, channel_versions={"who": 1})
    cp["updated_channels"] = ["who"]  # no node left to run: no graph run stays open
    here.put(_cfg("t"), cp, generate_metadata(step=0), {"who": 1})
    got = here.get_tuple(_cfg("t"))
    assert got is not None and got.checkpoint["channel_values"] == {"who": "old"}
    there.delete_thread("t")
    cp2 = generate_checkpoint(channel_values={"who": "new"}, channel_versions={"who": 1})
    cp2["updated_channels"] = ["who"]
    there.put(_cfg("t"), cp2, generate_metadata(step=0), {"who": 1})
    got = here.get_tuple(_cfg("t"))
    assert got is not None and got.checkpoint["id"] == cp2["id"]
    assert got.checkpoint["channel_values"] == {"who": "new"}


def test_prune_beside_a_running_graph_keeps_writes_that_came_before_their_checkpoint(
        root: Path) -> None:
    """Item 8: with durability="async" a task's writes may be saved before their checkpoint;
    a prune in between must keep them (the next put raised FileNotFoundError)."""
    saver = FsDurableSaver(root)
    first = saver.put(_cfg("t"), generate_checkpoint(), generate_metadata(), {})
    nxt = generate_checkpoint()
    saver.put_writes(_cfg("t", nxt["id"]), [("x", 1)], "task")  # before its checkpoint
    FsDurableSaver(root).prune(["t"])  # another process's maintenance
    saver.put(first, nxt, generate_metadata(step=1), {})
    tup = saver.get_tuple(_cfg("t"))
    assert tup is not None and tup.checkpoint["id"] == nxt["id"]
    assert [w[1:] for w in tup.pending_writes or []] == [("x", 1)]


# ---------------------------------------------------------------------- issue 19: adoption


def test_from_conn_string_is_a_context_manager_and_a_thread_describes_itself(
        tmp_path: Path) -> None:
    from fsdurable._lgstore import describe

    with FsDurableSaver.from_conn_string(str(tmp_path / "s")) as saver:
        graph = lg_cases.build("steps", saver)
        assert graph.invoke({"n": 1}, {"configurable": {"thread_id": "user-42/chat"}}) \
            == {"n": 17}
        s = saver.store.load(thread_session_id("user-42/chat"))
    d = describe(s)
    assert (d["thread_id"], d["run"], d["in_progress"]) == ("user-42/chat", "ended", False)
    assert set(d["checkpoints"]) == {""} and d["records"] > 3


def test_durability_exit_is_warned_once_per_process(root: Path) -> None:
    from fsdurable import _lgruns
    from fsdurable.langgraph import ExitDurabilityWarning

    _lgruns._warned_exit = False
    graph = lg_cases.build("steps", FsDurableSaver(root))
    with pytest.warns(ExitDurabilityWarning, match="nothing for fsdurable.langgraph.recover"):
        graph.invoke({"n": 1}, {"configurable": {"thread_id": "a"}}, durability="exit")
    graph.invoke({"n": 1}, {"configurable": {"thread_id": "b"}}, durability="exit")  # once


def test_an_unattended_run_refuses_deny_listed_and_approval_tools_attended_asks(
        root: Path) -> None:
    """Attendance is decided when the code runs: ``attended()`` around the live caller's
    invoke; without it a deny-listed tool is refused (``tool_refused``) and an approval too."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import MessagesState
    from langgraph.prebuilt import tools_condition

    from fsdurable.langgraph import attended, tool_node

    ran: list[str] = []

    @tool
    def shell(cmd: str) -> str:
        """Run a command."""
        ran.append(cmd)
        return "ok"

    @tool
    def publish(post: str) -> str:
        """Publish a post."""
        ran.append(post)
        return "published"

    from .lg_graph import ScriptedChat

    replies = [AIMessage("", id="a0", tool_calls=[
        {"id": "c-shell", "name": "shell", "args": {"cmd": "ls"}},
        {"id": "c-pub", "name": "publish", "args": {"post": "hi"}}]), AIMessage("end", id="a1")]

    def build(approve: Any) -> Any:
        model = ScriptedChat(responses=replies)
        g = StateGraph(MessagesState)
        g.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
        g.add_node("tools", tool_node([shell, publish], effects={"shell": "external",
                                                                  "publish": "external"},
                                      approval={"publish"}, approve=approve))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
        return g.compile(checkpointer=saver)

    saver = FsDurableSaver(root)
    asked: list[str] = []
    graph = build(lambda ctx, req: asked.append(req.name) is None)
    graph.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "u"}})
    assert ran == [] and asked == []  # nobody present: both refused, nobody asked
    refused = {(e.detail["tool"], e.reason) for e in saver.store.events(thread_session_id("u"))
               if e.code == "tool_refused"}
    assert refused == {("shell", "unattended_deny"), ("publish", "approval_denied")}
    with attended():
        graph.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "a"}})
    # ToolNode runs a message's calls in parallel threads: they finish in either order
    assert sorted(ran) == ["hi", "ls"] and asked == ["publish"]
    s = saver.store.load(thread_session_id("a"))
    assert [m.content for m in s.messages if m.role == "assistant"] == ["end"]  # the reply


def test_the_cli_names_threads_by_their_id_and_show_takes_a_thread_id(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fsdurable.cli import main

    root = tmp_path / "s"
    lg_cases.build("steps", FsDurableSaver(root)).invoke(
        {"n": 1}, {"configurable": {"thread_id": "user-42/chat"}})
    capsys.readouterr()
    assert main(["sessions", "--root", str(root), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    sid = thread_session_id("user-42/chat")
    assert listed["langgraph_threads"] == {sid: "user-42/chat"}
    assert main(["show", "user-42/chat", "--root", str(root), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["session_id"] == sid and shown["langgraph"]["thread_id"] == "user-42/chat"
    assert main(["show", "no-such-thread", "--root", str(root), "--json"]) != 0


def test_thread_sessions_may_be_named_by_their_thread_id(root: Path) -> None:
    saver = FsDurableSaver(root, session_ids="thread")
    graph = lg_cases.build("steps", saver)
    for tid in ("conv-1", "user-42/chat"):  # a valid session id, and one that is not
        assert graph.invoke({"n": 1}, {"configurable": {"thread_id": tid}}) == {"n": 17}
    assert saver.store.load("conv-1").metadata["langgraph"]["thread_id"] == "conv-1"
    assert sorted(saver.threads.thread_ids()) == sorted(
        [("conv-1", "conv-1"), (thread_session_id("user-42/chat"), "user-42/chat")])
    assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {
        "conv-1", "user-42/chat"}
    with pytest.raises(ValueError):
        FsDurableSaver(root, session_ids="plain")


def test_graph_runs_killed_at_random_moments_settle_to_their_end_state(tmp_path: Path) -> None:
    """The LangGraph kill torture's quick run (``python -m tests.torture.drivekills --kills 1000``
    is the long one): random SIGKILLs of real graph runs and of their recoveries."""
    from tests.torture import drivekills

    res = drivekills.run(str(tmp_path), kills=2, seed=7, max_rounds=4)
    assert res["violations"] == []
    assert res["rounds"] >= 1 and res["completed"] + res["abandoned"] + res["not_started"] \
        == res["rounds"]


@pytest.mark.parametrize("earlier", [False, True])
def test_a_run_killed_before_its_first_checkpoint_is_abandoned_with_an_event(
        tmp_path: Path, earlier: bool) -> None:
    """Found by the LangGraph kill torture: a run killed after its begin commit (in progress,
    marker) and before its first checkpoint was written left nothing to resume from — recovery
    must not call that turn ``completed`` (the user's input never became durable): it is
    abandoned with a visible ``interrupted_turn_abandoned`` (``nothing_saved``). ``earlier``: the
    thread already holds a finished run (its last checkpoint has nothing to run either)."""
    from fsdurable import _lgruns

    from .lg_graph import build
    from .lg_graph import run as run_graph

    saver = FsDurableSaver(tmp_path / "store")
    if earlier:
        run_graph(build(saver), "t1")
    run = _lgruns._begin(saver, "t1", lambda _s, _h: "running")  # then the process died
    assert run is not None
    run.release()
    saver.runs.forget(run)
    st = saver.store
    sid = thread_session_id("t1")
    assert [m.session_id for m in st.interrupted()] == [sid]
    report = recover(build(FsDurableSaver(st)), FsDurableSaver(st))
    [o] = [o for o in report.outcomes if o.session_id == sid]
    assert (o.outcome, o.reason) == ("abandoned", "nothing_saved"), o
    assert not st.interrupted() and not st.load(sid).in_progress
    assert "interrupted_turn_abandoned" in codes(st, "t1")
    assert codes(st, "t1").count("turn_completed") == (1 if earlier else 0)  # the earlier run
    assert codes(st, "t1")[-1] == "interrupted_turn_abandoned"


def test_a_run_killed_after_its_last_checkpoint_keeps_its_reply(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the LangGraph kill torture: a run killed after its final checkpoint was saved
    and before the end commit is ended by recovery (nothing left to run) WITH the graph's final
    reply, as the uncrashed run would have ended it (it was ended with no reply)."""
    from fsdurable._turns import TurnRun

    from .lg_graph import RESPONSES, build
    from .lg_graph import run as run_graph

    class Died(BaseException):
        """The process died inside the end commit."""

    ended: list[TurnRun] = []

    def died(self: TurnRun, *a: Any, **k: Any) -> Any:
        ended.append(self)
        raise Died

    saver = FsDurableSaver(tmp_path / "store", session_ids="thread")
    monkeypatch.setattr(TurnRun, "end", died)
    with pytest.raises(Died):
        run_graph(build(saver), "t1")
    monkeypatch.undo()
    [dead] = ended
    dead.release()  # the route lock goes with the dead process
    st = saver.store
    fresh = FsDurableSaver(st, session_ids="thread")
    report = recover(build(fresh), fresh)
    [o] = [o for o in report.outcomes if o.session_id == "t1"]
    assert (o.outcome, o.status) == ("resumed", "finished"), o
    s = st.load("t1")
    assert not s.in_progress
    assert [m.content for m in s.messages if m.role == "assistant"] == [RESPONSES[-1].content]
