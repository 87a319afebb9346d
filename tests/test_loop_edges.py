"""Loop edges of issue 9: clock steps (9), in-doubt calls that need a human (7), a host's
programming error (14)."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import attrs

import fsdurable
from fsdurable import AgentLoop, Config, Reply, ScriptedModel, Store, Tool, recover
from fsdurable._tools import call


def test_a_wall_clock_step_back_does_not_stop_checkpoints(root: Path) -> None:
    """Item 9: the debounce measures elapsed time on a monotonic clock. The wall clock steps
    back 1 h right after the turn starts; the tools keep taking longer than the debounce, so
    every tool batch must still be checkpointed (on the wall clock none would be for an hour)."""
    wall = [1_000_000.0]
    cfg = Config(checkpoint_debounce=0.05)
    store = Store(root, config=cfg, clock=lambda: wall[0])
    store.create("s")
    versions: list[int] = []

    def work(ctx: Any) -> str:
        if not versions:
            wall[0] -= 3600.0  # NTP corrects a clock that was an hour ahead
        versions.append(store.load("s").version)
        time.sleep(0.08)  # longer than the debounce, on every clock but the stepped one
        wall[0] += 0.08
        return "ok"

    model = ScriptedModel([Reply("", [call("work", f"w{i}")]) for i in range(4)])
    assert AgentLoop(store, model, [Tool("work", work)]).run("s", "go").status == "completed"
    # begin = v2; each batch ends past the debounce and commits (carrying the model reply; a
    # slow machine may commit the reply on its own too): every tool sees a newer version
    assert versions[0] == 2 and all(b > a for a, b in itertools.pairwise(versions))


def _in_doubt(store: Store, name: str, effect: str) -> None:
    """A turn whose effectful call was approved and started, then the process died."""
    store.create("s", source="desktop")
    s = store.begin_turn("s", "deploy it")
    assert s.turn is not None
    c = call(name, "c1")
    key = f"s:{s.turn.id}:c1"
    s = attrs.evolve(s, messages=(*s.messages, fsdurable.Message("assistant", "", (c,))),
                     turn=attrs.evolve(s.turn, ledger=(fsdurable.LedgerEntry(
                         "c1", name, effect, key, "intent", 1.0),)))
    store.commit(s, s.version)


def test_an_in_doubt_call_that_needed_approval_is_parked_not_denied(root: Path) -> None:
    """Item 7: an idempotent tool that needs approval was approved and may have run. On resume
    (unattended: nobody can approve) it must not be recorded "refused"/"denied": the turn is
    parked for review."""
    store = Store(root)
    _in_doubt(store, "deploy", "idempotent")
    ran: list[str] = []
    tools = [Tool("deploy", lambda ctx: ran.append(ctx.idempotency_key) or "deployed",
                  effect="idempotent", needs_approval=True)]
    rep = recover(store, AgentLoop(store, ScriptedModel([]), tools))
    assert [o.outcome for o in rep.outcomes] == ["review_required"]
    s = store.load("s")
    assert ran == [] and not s.in_progress
    answers = [m.content for m in s.messages if m.role == "tool"]
    assert answers and not any("denied" in a or "refused" in a for a in answers)
    assert "tool_refused" not in [e.code for e in store.events("s")]


def test_an_in_doubt_deny_listed_call_is_parked_not_refused(root: Path) -> None:
    """Item 7: a deny-listed (unattended) idempotent tool that ran in an attended live turn."""
    store = Store(root)
    _in_doubt(store, "git_push", "idempotent")
    tools = [Tool("git_push", lambda ctx: "pushed", effect="idempotent")]
    rep = recover(store, AgentLoop(store, ScriptedModel([]), tools))
    assert [o.outcome for o in rep.outcomes] == ["review_required"]
    assert "tool_refused" not in [e.code for e in store.events("s")]


def test_resume_claimed_refuses_an_in_doubt_call_that_needs_approval(root: Path) -> None:
    """Item 7, the loop's own guard (a host that calls resume_claimed without recover)."""
    store = Store(root)
    _in_doubt(store, "deploy", "idempotent")
    tools = [Tool("deploy", lambda ctx: "deployed", effect="idempotent", needs_approval=True)]
    loop = AgentLoop(store, ScriptedModel([]), tools)
    try:
        loop.resume_claimed(store.load("s"))
    except fsdurable.TurnStateError as e:
        assert e.reason == "in_doubt"
    else:
        raise AssertionError("an in-doubt call needing approval was resumed")
    s = store.load("s")
    assert s.turn is not None and s.turn.ledger[0].status == "intent"  # nothing recorded


def test_an_async_model_in_a_running_loop_fails_the_turn_not_recovery(root: Path) -> None:
    """Item 14: sync ``run`` with an async model from inside a running event loop is the host's
    programming error: the turn ends ``failed`` with an event and a typed error; nothing is left
    for recovery to retry (no attempt burned)."""
    store = Store(root)
    store.create("s")

    async def model(transcript: Any, specs: Any) -> Reply:
        return Reply("hi")

    loop = AgentLoop(store, model)

    async def host() -> BaseException | None:
        try:
            loop.run("s", "hello")
        except Exception as e:  # the type is asserted below
            return e
        return None

    err = asyncio.run(host())
    assert isinstance(err, fsdurable.HostError) and err.reason == "async_in_running_loop"
    s = store.load("s")
    assert not s.in_progress and store.read_marker("s") is None
    assert [m.content for m in s.messages] == ["hello"]  # the request stays in the transcript
    codes = [e.code for e in store.events("s")]
    assert codes == ["turn_started", "turn_failed"]
    assert store.interrupted() == []


def test_a_host_error_during_a_resume_ends_the_turn_and_is_not_retried(root: Path) -> None:
    """Item 14, recovery's side: ``recover`` (sync) called inside a running loop with an async
    model. The one claimed attempt fails with HostError; the loop ended the turn ``failed``, so
    no later start spends more attempts on it."""
    store = Store(root)
    store.create("s")
    store.begin_turn("s", "interrupted request")

    async def model(transcript: Any, specs: Any) -> Reply:
        return Reply("hi")

    async def host() -> Any:
        return recover(store, AgentLoop(store, model))

    rep = asyncio.run(host())
    assert [(o.outcome, o.reason) for o in rep.outcomes] == [("failed", "async_in_running_loop")]
    s = store.load("s")
    assert not s.in_progress and store.interrupted() == []
    codes = [e.code for e in store.events("s")]
    assert codes[-2:] == ["turn_failed", "interrupted_turn_resume_failed"]
    assert codes.count("interrupted_turn_resuming") == 1
