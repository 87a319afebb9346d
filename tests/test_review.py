"""Humans in the loop: a parked call is visible (review, show, doctor), a human's answer is an
event, only "did not run" + an explicit re-run runs it again (attended, same key), and a cancel
while an effectful tool runs keeps the call on record, in the review queue."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fsdurable import AgentLoop, Reply, ScriptedModel, Store, recover, tool
from fsdurable import _events as ev
from fsdurable._tools import call
from fsdurable.cli import main
from fsdurable.demo import KILL_ENV, KILLED, World, build_loop

from .conftest import PYTHON, subprocess_env

WORLD_ENV = "FSDURABLE_TEST_WORLD"


def host(store: Store) -> Any:
    """``--host tests.test_review:host``: the demo agent, on the world the test names."""
    return build_loop(store, os.environ[WORLD_ENV])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def charge_killed_mid_call(root: Path, world: Path, sid: str) -> None:
    """A real process charges the card and is killed before the outcome is committed; a fresh
    process's recovery parks the in-doubt charge (it must never be repeated blindly)."""
    env = subprocess_env(**{KILL_ENV: "charge_card"})
    p = subprocess.run([PYTHON, "-m", "fsdurable.demo", "turn", "--root", str(root), "--world",
                        str(world), "--session", sid, "--scenario", "fresh_charge"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == KILLED, p.stderr
    st = Store(root)
    [o] = recover(st, build_loop(st, str(world))).outcomes
    assert o.outcome == "review_required"


@pytest.fixture
def parked(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Store, World]:
    world = tmp_path / "world"
    monkeypatch.setenv(WORLD_ENV, str(world))
    for sid in ("order-1", "order-2"):
        charge_killed_mid_call(root, world, sid)
    w = World(str(world))
    assert len(w.charges()) == 2
    return Store(root), w


def test_a_parked_call_is_listed_shown_and_reported(parked: tuple[Store, World], root: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "review", "--root", str(root))
    assert code == 1
    calls = out["review"]
    assert [c["session_id"] for c in calls] == ["order-1", "order-2"]
    c = calls[0]
    assert (c["tool"], c["tool_call_id"], c["arguments"]) == ("charge_card", "c1", {"amount": 42})
    assert c["idempotency_key"].startswith("order-1:") and c["answer"] is None
    code, shown = run(capsys, "show", "order-1", "--root", str(root))
    assert [x["tool"] for x in shown["review_required"]] == ["charge_card"]
    code, doc = run(capsys, "doctor", "--root", str(root))
    assert code == 1
    assert sorted(f["session_id"] for f in doc["findings"]
                  if f["code"] == "review_required") == ["order-1", "order-2"]


def test_ran_is_recorded_as_an_event_and_never_runs_again(
        parked: tuple[Store, World], root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st, world = parked
    r = str(root)
    code, _ = run(capsys, "review", "order-1", "--rerun", "--call", "c1", "--host",
                  "tests.test_review:host", "--root", r)
    assert code == 1 and len(world.charges()) == 2  # no answer yet: refused, nothing ran
    code, out = run(capsys, "review", "order-1", "--ran", "--note", "bank shows it", "--root", r)
    assert code == 0 and [a["tool_call_id"] for a in out["answered"]] == ["c1"]
    [e] = [e for e in st.events("order-1") if e.code == ev.REVIEW_ANSWERED]
    assert e.reason == "ran" and e.detail["note"] == "bank shows it"
    code, _ = run(capsys, "review", "order-1", "--did-not-run", "--root", r)
    assert code == 1  # an answer stands; nothing to answer any more
    code, _ = run(capsys, "review", "order-1", "--rerun", "--call", "c1", "--host",
                  "tests.test_review:host", "--root", r)
    assert code == 1 and len(world.charges()) == 2
    code, out = run(capsys, "review", "--root", r)
    assert code == 1 and [c["session_id"] for c in out["review"]] == ["order-2"]


def test_only_did_not_run_then_rerun_runs_it_again_attended_with_the_same_key(
        parked: tuple[Store, World], root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st, world = parked
    r = str(root)
    key = st.load("order-2").metadata["review_required"]["calls"][0]["idempotency_key"]
    code, _ = run(capsys, "review", "order-2", "--did-not-run", "--root", r)
    assert code == 0 and len(world.charges()) == 2  # the answer alone runs nothing
    code, out = run(capsys, "review", "order-2", "--rerun", "--host", "tests.test_review:host",
                    "--root", r)
    assert code == 0 and out["rerun"] == {"tool_call_id": "c1", "result": "charged 42"}
    assert len(world.charges()) == 3
    [e] = [e for e in st.events("order-2") if e.code == ev.REVIEW_RERUN]
    assert e.detail["attended"] is True and e.detail["idempotency_key"] == key
    capsys.readouterr()
    code = main(["review", "order-2", "--rerun", "--host", "tests.test_review:host", "--root", r,
                 "--json"])
    refused = capsys.readouterr()
    # once: the call is named and the re-run's check refuses it (it was a usage error saying
    # "none", which a second process racing the first also got: tests/test_review_turns.py)
    assert code == 1 and len(world.charges()) == 3
    assert "already run again" in refused.out + refused.err


def test_a_cancel_while_an_effectful_tool_runs_keeps_the_call_for_review(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st = Store(root)
    st.create("s")
    charged: list[str] = []

    @tool(effect="external")
    def charge(ctx: Any, amount: int) -> str:
        charged.append(ctx.idempotency_key)
        Store(root).cancel("s")  # the user presses stop (another process) while it runs
        return f"charged {amount}"

    model = ScriptedModel([Reply("", (call("charge", "k1", amount=7),))], final="done")
    res = AgentLoop(st, model, [charge]).run("s", "charge 7", attended=True)
    assert res.status == "cancelled" and len(charged) == 1
    s = st.load("s")
    assert not s.in_progress
    [c] = s.metadata["review_required"]["calls"]
    assert (c["tool"], c["tool_call_id"], c["idempotency_key"]) == ("charge", "k1", charged[0])
    assert c["reason"] == "cancelled"
    assert any(e.code == ev.REVIEW_REQUIRED and e.reason == "cancelled" for e in st.events("s"))
    code, out = run(capsys, "review", "--root", str(root))
    assert code == 1 and out["review"][0]["arguments"] == {"amount": 7}


def test_a_second_park_keeps_the_first_unanswered_call(
        root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Parked calls accumulate until answered: a later park (recovery) never overwrites an
    earlier one (a cancel) that nobody has answered yet."""
    world = tmp_path / "world"
    charge_killed_mid_call(root, world, "order")  # parked by recovery: c1 of turn 1
    st = Store(root)
    assert [c["tool_call_id"] for c in st.load("order").metadata["review_required"]["calls"]
            ] == ["c1"]
    env = subprocess_env(**{KILL_ENV: "charge_card"})  # the same session's next turn dies too
    p = subprocess.run([PYTHON, "-c", (
        "import sys; from fsdurable import Store; from fsdurable.demo import build_loop\n"
        "st = Store(sys.argv[1]); build_loop(st, sys.argv[2]).run('order', "
        "'[fresh_charge] Charge the order again.', attended=True)"), str(root), str(world)],
        env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == KILLED, p.stderr
    [o] = recover(st, build_loop(st, str(world))).outcomes
    assert o.outcome == "review_required"
    code, out = run(capsys, "review", "order", "--root", str(root))
    assert code == 0
    calls = out["review"]
    assert len(calls) == 2 and len({c["turn_id"] for c in calls}) == 2
    assert all(c["answer"] is None for c in calls)
