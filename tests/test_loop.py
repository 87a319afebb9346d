"""AgentLoop: durable before the model, debounced checkpoints, the ledger, attendance, cancel."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import fsdurable
from fsdurable import AgentLoop, Reply, ScriptedModel, Store, Tool, ToolContext
from fsdurable._tools import call


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_turn_is_committed_in_progress_before_the_first_model_call(store: Store) -> None:
    seen: list[tuple[bool, bool]] = []

    def model(transcript: Any, specs: Any) -> Reply:
        s = store.load("s")
        seen.append((s.in_progress, store.read_marker("s") is not None))
        return Reply("hi")

    store.create("s")
    r = AgentLoop(store, model).run("s", "hello")
    assert seen == [(True, True)]
    assert r.status == "completed" and r.reply == "hi"
    s = store.load("s")
    assert not s.in_progress and store.read_marker("s") is None
    assert [m.role for m in s.messages] == ["user", "assistant"]
    assert [e.code for e in store.events("s")] == ["turn_started", "turn_completed"]


def test_debounce_coalesces_a_burst_yet_flushes_before_an_external_tool(root: Path) -> None:
    clock = FakeClock()
    store = Store(root, clock=clock)
    store.create("s")
    on_disk_at_charge: list[list[str]] = []

    def look(ctx: Any, n: int) -> str:
        return f"looked {n}"

    def charge(ctx: Any) -> str:
        s = store.load("s")  # what a crash right now would leave
        on_disk_at_charge.append([m.content for m in s.messages if m.role == "tool"])
        assert s.turn is not None and s.turn.entry(ctx.tool_call_id) is not None
        return "charged"

    burst = [Reply(f"step {i}", [call("look", f"l{i}", n=i)]) for i in range(10)]
    model = ScriptedModel([*burst, Reply("pay", [call("charge", "c1")])])
    loop = AgentLoop(store, model, [Tool("look", look), Tool("charge", charge, effect="external")],
                     clock=clock)
    r = loop.run("s", "go")
    assert r.status == "completed"
    # 20 boundaries (10 model replies + 10 batches) on a clock that does not move: none committed
    # on its own; the intent commit of the external tool carried all of them.
    assert on_disk_at_charge == [[f"looked {i}" for i in range(10)]]
    # create, begin, intent(+flush), outcome, end = 5 commits for 20+ boundaries
    assert store.load("s").version == 5


def test_debounce_commits_once_the_window_has_passed(root: Path) -> None:
    clock = FakeClock()
    store = Store(root, clock=clock)
    store.create("s")
    versions: list[int] = []

    def tick(ctx: Any) -> str:
        versions.append(store.load("s").version)
        clock.t += 2.5  # each tool takes longer than the debounce
        return "ok"

    model = ScriptedModel([Reply("", [call("tick", f"t{i}")]) for i in range(3)])
    AgentLoop(store, model, [Tool("tick", tick)], clock=clock).run("s", "go")
    # begin = v2. Each model reply comes at once (pending); each tool batch ends 2.5 s after the
    # last commit, so the batch boundary commits (and carries the pending model reply).
    assert versions == [2, 3, 4]
    assert store.load("s").version == 6  # batch 3 committed, then the end


def test_ledger_intent_before_the_call_and_outcome_after(store: Store) -> None:
    store.create("s")
    seen: list[str] = []

    def send(ctx: Any, to: str) -> str:
        s = store.load("s")
        assert s.turn is not None
        e = s.turn.entry(ctx.tool_call_id)
        assert e is not None
        seen.append(e.status)
        assert e.idempotency_key == ctx.idempotency_key == f"s:{ctx.turn_id}:{ctx.tool_call_id}"
        return f"sent to {to}"

    def after(ctx: Any) -> str:
        s = store.load("s")
        assert s.turn is not None
        e = s.turn.entry("e1")
        assert e is not None
        seen.append(f"{e.status}:{e.result}")
        return "ok"

    model = ScriptedModel([Reply("", [call("send", "e1", to="ana"), call("after", "a1")])])
    AgentLoop(store, model, [Tool("send", send, effect="idempotent"), Tool("after", after)]
              ).run("s", "go")
    assert seen == ["intent", "done:sent to ana"]


def test_a_failing_tool_is_a_failed_outcome_not_a_crash(store: Store) -> None:
    store.create("s")

    def boom(ctx: Any) -> str:
        raise ValueError("card declined")

    model = ScriptedModel([Reply("", [call("pay", "p1")])])
    r = AgentLoop(store, model, [Tool("pay", boom, effect="external")]).run("s", "go")
    assert r.status == "completed"
    tool_msgs = [m.content for m in store.load("s").messages if m.role == "tool"]
    assert tool_msgs == ["error: ValueError: card declined"]


def test_unattended_live_run_refuses_deny_listed_tools_and_denies_approval(store: Store) -> None:
    store.create("s", source="desktop")
    ran: list[str] = []
    tools = [Tool("delete_files", lambda ctx: ran.append("delete") or "gone", effect="external"),
             Tool("deploy", lambda ctx: ran.append("deploy") or "shipped", needs_approval=True)]
    model = ScriptedModel([Reply("", [call("delete_files", "d1"), call("deploy", "p1")])])
    asked: list[bool] = []
    loop = AgentLoop(store, model, tools, approve=lambda ctx, c: asked.append(ctx.attended) or True)
    r = loop.run("s", "go")  # the caller did not say a human is present
    assert ran == [] and asked == []
    assert r.refused == ("delete_files", "deploy")
    refusals = [e for e in store.events("s") if e.code == "tool_refused"]
    assert [(e.reason, e.detail["tool"]) for e in refusals] == [
        ("unattended_deny", "delete_files"), ("approval_denied", "deploy")]


def test_attended_run_asks_the_approver(store: Store) -> None:
    store.create("s")
    ran: list[str] = []
    tools = [Tool("delete_files", lambda ctx: ran.append("delete") or "gone", effect="external"),
             Tool("deploy", lambda ctx: ran.append("deploy") or "shipped", needs_approval=True),
             Tool("nuke", lambda ctx: ran.append("nuke") or "boom", needs_approval=True)]
    model = ScriptedModel([Reply("", [call("delete_files", "d1"), call("deploy", "p1"),
                                      call("nuke", "n1")])])
    loop = AgentLoop(store, model, tools, approve=lambda ctx, c: c.name == "deploy")
    r = loop.run("s", "go", attended=True)
    assert ran == ["delete", "deploy"]
    assert r.refused == ("nuke",)


def test_async_model(store: Store) -> None:
    store.create("s")

    async def model(transcript: Any, specs: Any) -> Reply:
        return Reply("async hello")

    assert AgentLoop(store, model).run("s", "hi").reply == "async hello"


def test_compaction_summary_is_committed_and_shown_to_the_model(store: Store) -> None:
    store.create("s")
    transcripts: list[list[str]] = []

    def model(transcript: Any, specs: Any) -> Reply:
        transcripts.append([m.content for m in transcript])
        n = ScriptedModel.step_index(transcript)
        return Reply(f"r{n}", [call("look", f"l{n}")]) if n < 4 else Reply("end")

    loop = AgentLoop(store, model, [Tool("look", lambda ctx: "x")], compact_after=4,
                     compactor=lambda msgs: ("earlier stuff", msgs[-2:]))
    loop.run("s", "go")
    s = store.load("s")
    assert s.summary == "earlier stuff"
    assert any(t[0].startswith("Summary of the earlier conversation") for t in transcripts)


def test_cancel_from_another_thread_flushes_clears_the_marker_and_stops(root: Path) -> None:
    clock = FakeClock()
    store = Store(root, clock=clock)
    store.create("s")
    started, release = threading.Event(), threading.Event()

    def slow(ctx: Any) -> str:
        started.set()
        release.wait(10)
        return "finished"

    after: list[str] = []
    model = ScriptedModel([Reply("", [call("quick", "q1"), call("slow", "s1")]),
                           Reply("", [call("after", "a1")])])
    loop = AgentLoop(store, model, [Tool("quick", lambda ctx: "quick done"), Tool("slow", slow),
                                    Tool("after", lambda ctx: after.append("x") or "x")],
                     clock=clock)
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(loop.run("s", "go")))
    t.start()
    assert started.wait(10)
    cancelled = loop.cancel("s")
    assert not cancelled.in_progress and store.read_marker("s") is None
    # the pending checkpoint (quick's result, still inside the debounce window) was flushed
    assert "quick done" in [m.content for m in cancelled.messages]
    release.set()
    t.join(10)
    assert result[0].status == "cancelled" and after == []
    assert store.load("s").version == cancelled.version  # nothing written after the cancel
    assert "turn_cancelled" in [e.code for e in store.events("s")]


def test_store_cancel_elsewhere_stops_the_loop_at_its_next_boundary(root: Path) -> None:
    store = Store(root)
    other = Store(root)  # another process's view of the same directory
    store.create("s")
    ran: list[str] = []

    def cancel_elsewhere(ctx: Any) -> str:
        other.cancel("s")
        return "cancelled it"

    model = ScriptedModel([Reply("", [call("stop", "x1"), call("more", "m1")]),
                           Reply("", [call("more", "m2")])])
    loop = AgentLoop(store, model, [Tool("stop", cancel_elsewhere),
                                    Tool("more", lambda ctx: ran.append("more") or "more")])
    r = loop.run("s", "go")
    assert r.status == "cancelled" and ran == []
    assert not store.load("s").in_progress and store.read_marker("s") is None


def test_resume_claimed_refuses_an_in_doubt_external_call(store: Store) -> None:
    import attrs

    from fsdurable import LedgerEntry, TurnStateError

    store.create("s")
    s = store.begin_turn("s", "go")
    assert s.turn is not None
    e = LedgerEntry("c1", "charge", "external", "k", "intent", 1.0)
    s = store.commit(attrs.evolve(s, turn=attrs.evolve(s.turn, ledger=(e,))), s.version)
    loop = AgentLoop(store, ScriptedModel([]), [Tool("charge", lambda ctx: "x", effect="external")])
    with pytest.raises(TurnStateError):
        loop.resume_claimed(s)


def test_public_names() -> None:
    for name in ("AgentLoop", "ScriptedModel", "Tool", "ToolContext", "Reply", "recover",
                 "RecoveryPolicy", "resume_one", "Host", "TurnResult", "arecover", "HostError"):
        assert name in fsdurable.__all__ and getattr(fsdurable, name) is not None


def test_another_writer_on_the_same_turn_is_rebased_not_fatal(store: Store) -> None:
    """A host renames the session (from another process) while a tool runs: the turn goes on,
    the rename stays, nothing is left in progress."""
    import subprocess

    from .conftest import PYTHON, subprocess_env

    store.create("s")
    code = ("import sys, attrs, fsdurable; st = fsdurable.Store(sys.argv[1]); "
            "st.patch('s', lambda s: attrs.evolve(s, metadata={'title': 'renamed'}))")

    def slow(ctx: ToolContext) -> str:
        subprocess.run([PYTHON, "-c", code, store.root], env=subprocess_env(), check=True,
                       timeout=60)
        return "ok"

    model = ScriptedModel([Reply("working", (call("slow", "c1"),))], final="done")
    r = AgentLoop(store, model, [Tool("slow", slow, effect="external")]).run(
        "s", "go", attended=True)
    assert r.status == "completed" and r.reply == "done"
    s = store.load("s")
    assert s.metadata == {"title": "renamed"} and not s.in_progress
    assert store.interrupted() == []


def test_a_reused_tool_call_id_is_a_new_call(store: Store) -> None:
    """A model that numbers calls per reply ("call_0" every time): the second call runs too,
    with its own idempotency key."""
    store.create("s")
    sent: list[tuple[str, str]] = []

    def send(ctx: ToolContext, to: str) -> str:
        sent.append((to, ctx.idempotency_key))
        return f"sent to {to}"

    model = ScriptedModel([Reply("1", (call("send_email", "call_0", to="alice"),)),
                           Reply("2", (call("send_email", "call_0", to="bob"),))])
    r = AgentLoop(store, model, [Tool("send_email", send, effect="external")]).run(
        "s", "alice then bob", attended=True)
    assert r.status == "completed"
    assert [to for to, _ in sent] == ["alice", "bob"]
    assert sent[0][1] != sent[1][1]
    answers = [m.content for m in store.load("s").messages if m.role == "tool"]
    assert answers == ["sent to alice", "sent to bob"]
