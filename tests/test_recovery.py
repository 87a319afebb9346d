"""recover(): the gates, the claim, in-doubt calls, attendance, the Host protocol.

A turn interrupted in-process (a tool raising a BaseException the loop does not catch, so nothing
is committed after it) leaves exactly what a SIGKILL at that point leaves on disk; the SIGKILL
versions with real processes are in test_recovery_procs.py and test_demo.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdurable import (
    AgentLoop,
    Config,
    RecoveryPolicy,
    Reply,
    ScriptedModel,
    Session,
    Store,
    Tool,
    recover,
    resume_one,
)
from fsdurable._tools import call


class Crash(BaseException):
    """Stands in for the process dying: the loop does not catch it, nothing more is written."""


class Provider:
    """An outside service; ``keys`` is every idempotency key it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.crash_on: set[str] = set()

    def tool(self, name: str, effect: str = "none") -> Tool:
        def fn(ctx: Any, **kw: Any) -> str:
            self.calls.append((name, ctx.idempotency_key))
            if name in self.crash_on:
                self.crash_on.discard(name)
                raise Crash(name)
            return f"{name} ok"

        return Tool(name, fn, effect=effect)

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]


def _tools(p: Provider) -> list[Tool]:
    return [p.tool("look"), p.tool("send_email", "idempotent"), p.tool("charge", "external"),
            p.tool("delete_files", "external")]


SCRIPT = [Reply("a", [call("look", "l1"), call("send_email", "e1")]),
          Reply("b", [call("charge", "c1")]),
          Reply("c", [call("delete_files", "d1")])]


def interrupt(store: Store, sid: str, crash_on: str, *, source: str = "desktop",
              metadata: dict[str, Any] | None = None) -> Provider:
    p = Provider()
    p.crash_on.add(crash_on)
    store.create(sid, source=source, metadata=metadata)
    with pytest.raises(Crash):
        AgentLoop(store, ScriptedModel(SCRIPT), _tools(p)).run(sid, "go", attended=True)
    assert store.load(sid).in_progress and store.read_marker(sid) is not None
    return p


def codes(store: Store, sid: str) -> list[str]:
    return [e.code for e in store.events(sid)]


def test_fresh_crash_resumes_unattended_and_completes(store: Store) -> None:
    p = interrupt(store, "s", "send_email")  # the email went out, its outcome did not land
    p2 = Provider()
    rep = recover(store, AgentLoop(store, ScriptedModel(SCRIPT), _tools(p2)))
    [o] = rep.outcomes
    assert (o.verdict, o.outcome, o.status, o.attempts) == ("resume", "resumed", "completed", 1)
    # completed calls are not re-run; the in-doubt idempotent one is, with the SAME key
    assert p2.names() == ["send_email", "charge"]
    assert p2.calls[0][1] == p.calls[-1][1]
    s = store.load("s")
    assert not s.in_progress and store.read_marker("s") is None
    refused = [e for e in store.events("s") if e.code == "tool_refused"]
    assert [(e.detail["tool"], e.detail["attended"]) for e in refused] == [("delete_files", False)]
    assert codes(store, "s")[-4:] == ["interrupted_turn_resuming", "tool_refused",
                                      "turn_completed", "interrupted_turn_resumed"]


def test_in_doubt_external_call_parks_the_turn_for_review(store: Store) -> None:
    interrupt(store, "s", "charge")
    p2 = Provider()
    [o] = recover(store, AgentLoop(store, ScriptedModel(SCRIPT), _tools(p2))).outcomes
    assert o.outcome == "review_required" and p2.calls == []
    s = store.load("s")
    assert not s.in_progress and store.read_marker("s") is None
    review = s.metadata["review_required"]
    assert [c["tool"] for c in review["calls"]] == ["charge"]
    assert "interrupted_turn_review_required" in codes(store, "s")
    assert "interrupted_turn_resuming" not in codes(store, "s")
    assert s.turn is None  # no attempt was spent on it either
    assert s.messages[-1].role == "tool" and s.messages[-1].tool_call_id == "c1"
    assert s.messages[-1].content.startswith("outcome unknown")


SOURCES = st.one_of(st.sampled_from(["desktop", "kocoro", "api", "cli", "attended", "human"]),
                    st.text(min_size=1, max_size=20))
METADATA = st.dictionaries(st.sampled_from(["attended", "unattended", "human_present", "mode"]),
                           st.one_of(st.booleans(), st.text(max_size=5)), max_size=3)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=SOURCES, metadata=METADATA)
def test_a_recovered_turn_is_unattended_whatever_was_stored(source: str,
                                                            metadata: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = Store(d, config=Config(fsync=False))
        interrupt(store, "s", "look", source=source, metadata=metadata)
        seen: list[bool] = []
        ran: list[str] = []

        def spy(name: str, effect: str = "none") -> Tool:
            def fn(ctx: Any, **kw: Any) -> str:
                seen.append(ctx.attended)
                ran.append(name)
                return "ok"
            return Tool(name, fn, effect=effect, needs_approval=name == "charge")

        tools = [spy("look"), spy("send_email", "idempotent"), spy("charge", "external"),
                 spy("delete_files", "external")]
        [o] = recover(store, AgentLoop(store, ScriptedModel(SCRIPT), tools)).outcomes
        assert o.outcome == "resumed"
        assert seen and not any(seen)
        assert "delete_files" not in ran and "charge" not in ran  # deny-listed; approval denied
        reasons = {e.reason for e in store.events("s") if e.code == "tool_refused"}
        assert reasons == {"unattended_deny", "approval_denied"}


def test_disabled_reports_and_runs_nothing(store: Store) -> None:
    interrupt(store, "s", "look")
    before = store.load("s").version
    p2 = Provider()
    rep = recover(store, AgentLoop(store, ScriptedModel(SCRIPT), _tools(p2)),
                  RecoveryPolicy(enabled=False))
    [o] = rep.outcomes
    assert (o.verdict, o.outcome) == ("disabled", "kept") and p2.calls == []
    assert store.read_marker("s") is not None and store.load("s").version == before


def test_a_foreign_marker_is_listed_never_run(root: Path) -> None:
    there = Store(root, node_id="laptop-b")
    interrupt(there, "s", "look")
    here = Store(root)
    p2 = Provider()
    loop = AgentLoop(here, ScriptedModel(SCRIPT), _tools(p2))
    [o] = recover(here, loop).outcomes
    assert (o.verdict, o.outcome, o.node_id) == ("foreign", "listed", "laptop-b")
    assert p2.calls == [] and here.read_marker("s") is not None
    # adopting it (an explicit act) runs it here, with the same gates otherwise
    m = here.read_marker("s")
    assert m is not None
    out = resume_one(here, loop, m, adopt=True)
    assert out.outcome == "resumed" and here.read_marker("s") is None


def test_stale_turn_is_abandoned_with_an_event(root: Path) -> None:
    then = Store(root, clock=lambda: 1_000_000.0)
    interrupt(then, "s", "look")
    now = Store(root, clock=lambda: 1_000_000.0 + 4 * 3600 + 1)
    p2 = Provider()
    [o] = recover(now, AgentLoop(now, ScriptedModel(SCRIPT), _tools(p2))).outcomes
    assert (o.verdict, o.outcome, o.reason) == ("stale", "abandoned", "stale")
    assert p2.calls == [] and not now.load("s").in_progress and now.read_marker("s") is None
    [ev] = [e for e in now.events("s") if e.code == "interrupted_turn_abandoned"]
    assert ev.reason == "stale"


@pytest.mark.parametrize("skew", [301.0, 30 * 86400.0])
def test_a_checkpoint_from_the_future_is_stale(root: Path, skew: float) -> None:
    """A clock that was ahead when the turn was written must not keep it fresh for the skew."""
    then = Store(root, clock=lambda: 1_000_000.0 + skew)
    interrupt(then, "s", "look")
    now = Store(root, clock=lambda: 1_000_000.0)
    p2 = Provider()
    [o] = recover(now, AgentLoop(now, ScriptedModel(SCRIPT), _tools(p2))).outcomes
    assert (o.verdict, o.outcome, o.reason) == ("stale", "abandoned", "stale")
    assert p2.calls == []


def test_failed_resume_keeps_the_marker_until_the_cap(store: Store) -> None:
    interrupt(store, "s", "look")

    class Broken:
        def tool_effect(self, name: str) -> str | None:
            return "none"

        def resume_claimed(self, session: Session) -> Any:
            raise RuntimeError("model provider down")

    outs = [recover(store, Broken()).outcomes[0] for _ in range(3)]
    assert [(o.outcome, o.attempts) for o in outs] == [("failed", 1), ("failed", 2),
                                                        ("abandoned", 3)]
    assert outs[-1].reason == "exhausted" and store.read_marker("s") is None
    assert codes(store, "s").count("interrupted_turn_resume_failed") == 3
    assert recover(store, Broken()).outcomes == ()


def test_exhausted_marker_is_abandoned_without_running(store: Store) -> None:
    interrupt(store, "s", "look")
    s = store.load("s")
    assert s.turn is not None
    store.commit(attrs.evolve(s, turn=attrs.evolve(s.turn, resume_attempts=3)), s.version)
    p2 = Provider()
    [o] = recover(store, AgentLoop(store, ScriptedModel(SCRIPT), _tools(p2))).outcomes
    assert (o.verdict, o.outcome, o.reason) == ("exhausted", "abandoned", "exhausted")
    assert p2.calls == []


def test_a_host_with_its_own_loop_gets_the_attempt_committed_first(store: Store) -> None:
    interrupt(store, "s", "look")
    seen: list[tuple[int, int]] = []

    class MyHost:
        def tool_effect(self, name: str) -> str | None:
            return {"send_email": "idempotent"}.get(name, "external")

        def resume_claimed(self, session: Session) -> str:
            on_disk = store.load(session.id)
            marker = store.read_marker(session.id)
            assert on_disk.turn is not None and marker is not None
            seen.append((on_disk.turn.resume_attempts, marker.resume_attempts))
            store.end_turn(session, "host finished it")
            return "ok"

    [o] = recover(store, MyHost()).outcomes
    assert o.outcome == "resumed" and seen == [(1, 1)]
    assert store.load("s").messages[-1].content == "host finished it"


def test_dry_run_changes_nothing(root: Path) -> None:
    clock = [1_000_000.0]
    store = Store(root, clock=lambda: clock[0])
    interrupt(store, "old", "look")
    clock[0] += 5 * 3600
    interrupt(store, "fresh", "look")
    interrupt(Store(root, node_id="other", clock=lambda: clock[0]), "far", "look")
    snapshot = {p.name: p.read_bytes() for p in (Path(root) / "markers").iterdir()}
    snapshot.update({p.name: p.read_bytes() for p in (Path(root) / "sessions").iterdir()})
    n_events = len(store.events())
    rep = recover(store, AgentLoop(store, ScriptedModel(SCRIPT), []), dry_run=True)
    assert {o.session_id: o.verdict for o in rep.outcomes} == {
        "old": "stale", "fresh": "resume", "far": "foreign"}
    # what a real run would do, not "planned" for everything
    assert {o.session_id: o.outcome for o in rep.outcomes} == {
        "old": "would_abandon", "fresh": "would_resume", "far": "listed"}
    assert [round(o.age) for o in rep.outcomes] == [5 * 3600, 0, 0]
    after = {p.name: p.read_bytes() for p in (Path(root) / "markers").iterdir()}
    after.update({p.name: p.read_bytes() for p in (Path(root) / "sessions").iterdir()})
    assert after == snapshot and len(store.events()) == n_events


def test_orphan_marker_is_repaired_not_run(store: Store, root: Path) -> None:
    interrupt(store, "s", "look")
    marker = (Path(root) / "markers" / "s.json").read_bytes()
    store.cancel("s")  # the session is not in progress any more ...
    (Path(root) / "markers" / "s.json").write_bytes(marker)  # ... but its marker came back
    p2 = Provider()
    [o] = recover(store, AgentLoop(store, ScriptedModel(SCRIPT), _tools(p2))).outcomes
    assert o.outcome == "repaired" and p2.calls == []
    assert store.read_marker("s") is None and "marker_repaired" in codes(store, "s")


def test_unreadable_session_is_abandoned_and_quarantined(store: Store, root: Path) -> None:
    interrupt(store, "s", "look")
    (Path(root) / "sessions" / "s.json").write_bytes(b"{not json")
    [o] = recover(store, AgentLoop(store, ScriptedModel(SCRIPT), [])).outcomes
    assert (o.outcome, o.reason) == ("abandoned", "unreadable")
    assert store.read_marker("s") is None and any((Path(root) / "quarantine").iterdir())


def test_a_cancelled_turn_never_resumes(store: Store) -> None:
    interrupt(store, "s", "look")
    store.cancel("s")
    assert recover(store, AgentLoop(store, ScriptedModel(SCRIPT), [])).outcomes == ()


def test_a_turn_that_moved_on_supersedes_the_recovery(store: Store) -> None:
    interrupt(store, "s", "look")
    m = store.read_marker("s")
    assert m is not None
    store.cancel("s")
    AgentLoop(store, ScriptedModel([]), []).run("s", "again")  # a live turn finished first
    p2 = Provider()
    o = resume_one(store, AgentLoop(store, ScriptedModel(SCRIPT), _tools(p2)), m)
    assert o.outcome == "superseded" and p2.calls == []
    [ev] = [e for e in store.events("s") if e.code == "interrupted_turn_abandoned"]
    assert ev.reason == "superseded" and ev.turn_id == m.turn_id


def test_a_refused_disk_is_an_error_outcome_not_a_crash(store: Store) -> None:
    import errno

    from fsdurable import _fsio

    interrupt(store, "s", "look")
    interrupt(store, "t", "look")

    def refuse(op: str, args: tuple[Any, ...]) -> None:
        if op == "write" and "s.json" in str(args[0]):
            raise OSError(errno.ENOSPC, "No space left on device")

    p2 = Provider()
    prev = _fsio.set_recorder(refuse)
    try:
        rep = recover(store, AgentLoop(store, ScriptedModel(SCRIPT), _tools(p2)))
    finally:
        _fsio.set_recorder(prev)
    got = {o.session_id: o.outcome for o in rep.outcomes}
    assert got == {"s": "error", "t": "resumed"}  # one bad turn never stops the others
    m = store.read_marker("s")
    assert m is not None and m.resume_attempts == 0  # the claim did not land; nothing ran for s


def test_the_claim_takes_the_original_route_lock(store: Store) -> None:
    store.create("s", route_key="user:ana")
    p = Provider()
    p.crash_on.add("look")
    with pytest.raises(Crash):
        AgentLoop(store, ScriptedModel(SCRIPT), _tools(p)).run("s", "go")
    p2 = Provider()
    loop = AgentLoop(store, ScriptedModel(SCRIPT), _tools(p2))
    with store.lock("user:ana"):  # live traffic on that route (another session, say)
        [o] = recover(store, loop, RecoveryPolicy(lock_timeout=0.05)).outcomes
    assert (o.outcome, o.reason) == ("busy", "route_busy") and p2.calls == []
    m = store.read_marker("s")
    assert m is not None and m.resume_attempts == 0  # nothing claimed, nothing counted
    with store.lock("session:s"):  # not the turn's route: does not block it
        [o] = recover(store, loop).outcomes
    assert o.outcome == "resumed"


def test_a_generic_recover_leaves_the_framework_adapters_runs_alone(store: Store) -> None:
    """An AgentLoop host's recover() never resumes a LangGraph or OpenAI Agents run as one of
    its own turns (it would write its transcript into the thread); the adapter's own recover
    selects them. Before the fix both sessions below were claimed and resumed by the loop."""
    for sid, source in (("mine", "desktop"), ("lg", "langgraph"), ("oa", "openai-agents")):
        store.create(sid, source=source)
        store.begin_turn(sid, "go")
    loop = AgentLoop(store, ScriptedModel([], final="done"))
    rep = recover(store, loop)
    assert [(o.session_id, o.outcome) for o in rep.outcomes] == [("mine", "resumed")]
    for sid in ("lg", "oa"):
        s = store.load(sid)
        assert s.in_progress and s.turn is not None and s.turn.resume_attempts == 0
        assert store.read_marker(sid) is not None
    # a select cannot hand another driver's run to this host: the turn's driver decides
    picked = recover(store, loop, select=lambda m: m.source == "langgraph")
    assert picked.outcomes == ()
    s = store.load("lg")
    assert s.in_progress and s.turn is not None and s.turn.resume_attempts == 0
