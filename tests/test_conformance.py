"""The driver conformance suite: the chapter's pitfalls (§40.4-40.8), written once, run against
EVERY driver of the turn protocol with real child processes and SIGKILL (``tests/conformance``).

Each test below holds every driver to the same assertions; a driver that cannot meet one has a
bug. The drivers are the modules of ``tests/conformance/drivers`` (one per driver variant:
``langgraph_async`` runs the LangGraph driver through ``ainvoke``); ``REQUIRED`` names the ones
that must be there.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fsdurable
from tests.conformance import drivers as _drivers
from tests.conformance.harness import GUARDED, IDEM, PAY, World, forked, outcomes_for

REQUIRED = {"loop", "langgraph", "langgraph_async", "openai_agents", "adk"}
MODULES = sorted(m.name for m in pkgutil.iter_modules(_drivers.__path__))
SID = "conv-1"


def driver_id(module: str) -> str:
    return str(importlib.import_module(f"tests.conformance.drivers.{module}").DRIVER)


def test_every_required_driver_has_a_harness() -> None:
    assert set(MODULES) >= REQUIRED


@pytest.fixture(params=MODULES)
def drv(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path / "store", tmp_path / "effects.jsonl")


def store(w: World) -> fsdurable.Store:
    over = dict(w.config)
    if "unattended_deny" in over:
        over["unattended_deny"] = frozenset(over["unattended_deny"])
    return fsdurable.Store(w.root, config=fsdurable.Config().replace(**over))


def crashed(w: World, drv: str, sc: Any, at: str, *flags: str) -> None:
    c = w.run(drv, "live", SID, sc, *flags, FSDC_CRASH=at)
    assert c.returncode == -9, f"expected a SIGKILL at {at}: rc={c.returncode} {c.stderr}"
    st = store(w)
    [m] = st.interrupted()
    assert m.session_id == SID and m.owner_driver == driver_id(drv)


def events(w: World, code: str | None = None) -> list[fsdurable.Event]:
    return [e for e in store(w).events(SID) if code is None or e.code == code]


# 1. -------------------------------------------------------------------------------------


def test_a_live_run_holds_its_route_lock_for_its_whole_life(world: World, drv: str) -> None:
    """A second process's recover, while the run is live (inside a slow tool), reports the turn
    ``busy`` and never runs it: the tool runs once, the turn completes once."""
    # long enough for the second process to start: forked, at once; exec'd, it imports its
    # framework first (LangGraph: 5 s on a loaded machine)
    slow = 4 if forked(drv) else 15
    live = world.start(drv, "live", SID, PAY, FSDC_SLEEP=f"lookup:{slow}")
    try:
        world.wait_for("lookup")
        rec = world.run(drv, "recover", SID, PAY)
        [o] = outcomes_for(rec, SID)
        assert (o["outcome"], o["reason"]) == ("busy", "route_busy"), o
    finally:
        _out, err = live.communicate(timeout=120)
    assert live.returncode == 0, err
    assert len(world.effects_of("lookup")) == 1 and len(world.effects_of("charge")) == 1
    assert not store(world).interrupted()
    assert len(events(world, "turn_completed")) == 1


# 2. -------------------------------------------------------------------------------------


def test_a_resumed_run_is_unattended(world: World, drv: str) -> None:
    """The attended run approved ``publish``; it was killed inside it before its effect. The
    resume runs with nobody present: ``publish`` needs approval and is refused (the stored
    approval is not a human present), ``shell`` is on the deny-list and is refused — each with a
    ``tool_refused`` event; neither has an effect."""
    crashed(world, drv, GUARDED, "publish:before", "--attended", "--approve")
    assert [e["attended"] for e in world.effects_of("publish", "start")] == [True]
    rec = world.run(drv, "recover", SID, GUARDED)
    [o] = outcomes_for(rec, SID)
    assert o["outcome"] == "resumed", o
    assert world.effects_of("publish") == [] and world.effects_of("shell") == []
    refused = {(e.detail.get("tool"), e.reason) for e in events(world, "tool_refused")}
    assert ("publish", "approval_denied") in refused
    assert ("shell", "unattended_deny") in refused
    for e in world.effects_log():  # nothing ran attended after the crash
        if e["pid"] != world.effects_log()[0]["pid"]:
            assert e["attended"] is False


# 3. -------------------------------------------------------------------------------------


def test_an_effectful_call_in_doubt_is_parked_with_its_arguments(world: World, drv: str) -> None:
    """The process died after ``charge``'s effect and before its outcome: its intent (with its
    arguments) was durable before it ran; recovery parks the turn for review with the arguments
    visible and never runs it again."""
    crashed(world, drv, PAY, "charge:after")
    st = store(world)
    s = st.load(SID)
    assert s.turn is not None
    [entry] = [e for e in s.turn.ledger if e.name == "charge"]
    assert entry.status == "intent" and entry.arguments == {"amount": 5, "to": "acme"}
    rec = world.run(drv, "recover", SID, PAY)
    [o] = outcomes_for(rec, SID)
    assert (o["outcome"], o["reason"]) == ("review_required", "in_doubt"), o
    assert len(world.effects_of("charge")) == 1
    [q] = [c for c in fsdurable.review_queue(st) if c["session_id"] == SID]
    assert q["tool"] == "charge" and q["arguments"] == {"amount": 5, "to": "acme"}
    assert q["idempotency_key"] == entry.idempotency_key
    assert not st.interrupted() and events(world, "interrupted_turn_review_required")


def test_an_idempotent_call_in_doubt_is_rerun_with_the_same_key(world: World, drv: str) -> None:
    crashed(world, drv, IDEM, "charge:after")
    rec = world.run(drv, "recover", SID, IDEM)
    [o] = outcomes_for(rec, SID)
    assert (o["outcome"], o["status"]) == ("resumed", "completed"), o
    keys = [e["key"] for e in world.effects_of("charge")]
    assert len(keys) == 2 and keys[0] == keys[1]
    assert not store(world).interrupted()


# 4. -------------------------------------------------------------------------------------


def test_a_failing_resume_costs_one_attempt_until_the_cap(world: World, drv: str) -> None:
    crashed(world, drv, PAY, "lookup:after")
    for attempt in (1, 2):
        [o] = outcomes_for(world.run(drv, "recover", SID, PAY, "--fail"), SID)
        assert (o["outcome"], o["attempts"]) == ("failed", attempt), o
        [m] = store(world).interrupted()
        assert m.resume_attempts == attempt
    [o] = outcomes_for(world.run(drv, "recover", SID, PAY, "--fail"), SID)
    assert (o["outcome"], o["reason"], o["attempts"]) == ("abandoned", "exhausted", 3), o
    assert not store(world).interrupted()
    assert [e.reason for e in events(world, "interrupted_turn_abandoned")] == ["exhausted"]
    assert len(events(world, "interrupted_turn_resume_failed")) == 3


# 5. -------------------------------------------------------------------------------------


@pytest.mark.parametrize("at", ["lookup:before", "lookup:after", "charge:before", "charge:after"])
def test_a_crash_anywhere_resumes_to_the_uncrashed_end(world: World, drv: str, at: str,
                                                       tmp_path: Path) -> None:
    """Killed at any tool boundary and resumed: the same reply and the same effects as a run
    that never crashed; no step whose outcome was committed runs twice (only the step the crash
    cut short may run again — an idempotent one, with the same key)."""
    clean = World(tmp_path / "clean", tmp_path / "clean.jsonl")
    ref = clean.run(drv, "live", SID, IDEM)
    assert ref.returncode == 0, ref.stderr
    crashed(world, drv, IDEM, at)
    [o] = outcomes_for(world.run(drv, "recover", SID, IDEM), SID)
    assert (o["outcome"], o["status"]) == ("resumed", "completed"), o
    cut = at.split(":")[0]
    for tool in ("lookup", "charge"):
        done = world.effects_of(tool)
        if tool == cut:
            assert 1 <= len(done) <= 2 and len({e["key"] for e in done}) == 1, done
        else:
            assert len(done) == 1, (tool, done)
    assert _replies(world) == _replies(clean) == [IDEM.final]
    assert not store(world).interrupted()


def _replies(w: World) -> list[str]:
    s = store(w).load(SID)
    return [m.content for m in s.messages if m.role == "assistant" and not m.tool_calls
            and m.content]


# 6. -------------------------------------------------------------------------------------


def test_a_cancel_ends_the_turn_for_good(world: World, drv: str) -> None:
    """``fsdurable cancel`` from another process while a tool runs: the run stops at its next
    boundary, the charge never runs, and no later recover brings the turn back."""
    live = world.start(drv, "live", SID, PAY, FSDC_SLEEP="lookup:3")
    try:
        world.wait_for("lookup")
        out = subprocess.run([sys.executable, "-m", "fsdurable", "cancel", SID, "--root",
                              str(world.root), "--json"], env=world.env(), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        live.communicate(timeout=120)
    assert world.effects_of("charge") == []
    st = store(world)
    assert not st.load(SID).in_progress and not st.interrupted()
    assert len(events(world, "turn_cancelled")) == 1
    assert outcomes_for(world.run(drv, "recover", SID, PAY), SID) == []
    assert world.effects_of("charge") == []


# 7. -------------------------------------------------------------------------------------


def test_another_drivers_recover_never_resumes_the_run(world: World, drv: str) -> None:
    crashed(world, drv, PAY, "lookup:after")
    mine = driver_id(drv)
    for other in MODULES:
        if driver_id(other) == mine:
            continue
        assert outcomes_for(world.run(other, "recover", SID, PAY), SID) == [], other
    [m] = store(world).interrupted()
    assert m.resume_attempts == 0
    [o] = outcomes_for(world.run(drv, "recover", SID, PAY), SID)
    assert o["outcome"] == "resumed"


# 8. -------------------------------------------------------------------------------------


@pytest.mark.parametrize("ran", [True, False])
def test_a_parked_run_continues_after_a_human_answers(world: World, drv: str,
                                                      ran: bool) -> None:
    crashed(world, drv, PAY, "charge:after")
    [o] = outcomes_for(world.run(drv, "recover", SID, PAY), SID)
    assert o["outcome"] == "review_required"
    st = store(world)
    flag = "--ran" if ran else "--did-not-run"
    out = subprocess.run([sys.executable, "-m", "fsdurable", "review", SID, flag, "--root",
                          str(world.root), "--json"], env=world.env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert [c for c in fsdurable.review_queue(st) if c["session_id"] == SID] == []
    go = world.run(drv, "proceed", SID, PAY)
    assert go.returncode == 0, go.stderr
    assert go.answer["status"] == "completed", go.answer
    assert len(world.effects_of("charge")) == 1  # answered: never repeated by itself


# 9. -------------------------------------------------------------------------------------


def test_a_stale_turn_in_doubt_goes_to_review_never_dropped(world: World, drv: str) -> None:
    world.config = {"stale_after": 1.0}
    crashed(world, drv, PAY, "charge:after")
    time.sleep(1.3)
    [o] = outcomes_for(world.run(drv, "recover", SID, PAY), SID)
    assert (o["outcome"], o["reason"]) == ("abandoned", "stale"), o
    st = store(world)
    [q] = [c for c in fsdurable.review_queue(st) if c["session_id"] == SID]
    assert q["tool"] == "charge" and q["arguments"] == {"amount": 5, "to": "acme"}
    assert len(world.effects_of("charge")) == 1 and not st.interrupted()


def test_an_exhausted_turn_in_doubt_goes_to_review_never_dropped(world: World,
                                                                 drv: str) -> None:
    """Attempt 1 resumed the turn and died inside ``charge`` (in doubt now); with a cap of one
    attempt the next start abandons it as exhausted — and parks the charge for review."""
    world.config = {"max_resume_attempts": 1}
    crashed(world, drv, PAY, "lookup:after")
    died = world.run(drv, "recover", SID, PAY, FSDC_CRASH="charge:after")
    assert died.returncode == -9, died.stderr
    [o] = outcomes_for(world.run(drv, "recover", SID, PAY), SID)
    assert (o["outcome"], o["reason"]) == ("abandoned", "exhausted"), o
    st = store(world)
    [q] = [c for c in fsdurable.review_queue(st) if c["session_id"] == SID]
    assert q["tool"] == "charge" and q["arguments"] == {"amount": 5, "to": "acme"}
    assert not st.interrupted()



# 10. ------------------------------------------------------------------------------------


def test_a_run_ended_by_an_exception_never_drops_a_call_in_doubt(world: World, drv: str) -> None:
    """Ctrl-C inside ``charge`` after its effect: however the driver's framework ends the run —
    the turn left interrupted for recovery, or ended as failed — the call that may have run
    goes to the review queue with its arguments: never dropped, never run again."""
    live = world.run(drv, "live", SID, PAY, FSDC_RAISE="charge:after")
    assert live.returncode != 0, live.answer
    rec = world.run(drv, "recover", SID, PAY)
    assert rec.returncode == 0, rec.stderr
    st = store(world)
    [q] = [c for c in fsdurable.review_queue(st) if c["session_id"] == SID]
    assert q["tool"] == "charge" and q["arguments"] == {"amount": 5, "to": "acme"}
    assert len(world.effects_of("charge")) == 1
    assert not st.interrupted() and not st.load(SID).in_progress


# 11. ------------------------------------------------------------------------------------


def test_a_history_waiting_for_sync_costs_no_attempt(world: World, drv: str,
                                                     tmp_path: Path) -> None:
    """A sync tool delivered the run's session document and marker before the history they name
    (``history/`` segments; a LangGraph thread's ``langgraph/`` log: ``log_short``). That is
    "waiting for sync", never a failure: more starts than the attempt cap each put the resume
    off without spending an attempt (outcome ``waiting_for_sync``, marker kept) and the run
    resumes to its end once the history arrives. (On 6162f66 each start failed an attempt and
    the third abandoned the run as exhausted.)"""
    world.config = {"inline_tail_bytes": 0}  # every value in a segment, none inline
    crashed(world, drv, IDEM, "lookup:after")
    away = tmp_path / "in-flight"
    away.mkdir()
    moved = [d for d in ("history", "langgraph") if (world.root / d).is_dir()]
    assert moved
    for d in moved:
        (world.root / d).rename(away / d)
    for _ in range(3):
        [o] = outcomes_for(world.run(drv, "recover", SID, IDEM), SID)
        assert (o["outcome"], o["attempts"]) == ("waiting_for_sync", 0), o
        [m] = store(world).interrupted()
        assert m.resume_attempts == 0
    assert not events(world, "interrupted_turn_resume_failed")
    assert [e.reason for e in events(world, "interrupted_turn_skipped")] == \
        ["waiting_for_sync"] * 3
    for d in moved:
        (away / d).rename(world.root / d)
    [o] = outcomes_for(world.run(drv, "recover", SID, IDEM), SID)
    assert (o["outcome"], o["status"], o["attempts"]) == ("resumed", "completed", 1), o
    lookups = world.effects_of("lookup")  # the call the crash cut short: re-run, same key
    assert 1 <= len(lookups) <= 2 and len({e["key"] for e in lookups}) == 1, lookups
    assert len(world.effects_of("charge")) == 1
    assert not store(world).interrupted()
