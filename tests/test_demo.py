"""`fsdurable demo` end to end (real child processes, real SIGKILLs), and the recovery CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import fsdurable
from fsdurable import cli
from tests.conftest import PYTHON, subprocess_env


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("demo") / "store"
    env = subprocess_env(FSDURABLE_STATE_DIR=str(tmp_path_factory.mktemp("demo-state")),
                         FSDURABLE_NODE="node-test")
    p = subprocess.run([PYTHON, "-m", "fsdurable", "demo", "--json", "--root",
                        str(root)], env=env, capture_output=True, text=True, timeout=120,
                       check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    data: dict[str, Any] = json.loads(p.stdout)
    data["_env"] = env
    return data


def _events(demo: dict[str, Any], scenario: str) -> list[dict[str, Any]]:
    sid = f"demo-{demo['run_id']}-{scenario}"
    return [e for e in demo["events"] if e["session_id"] == sid]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_each_scenario_behaves(demo: dict[str, Any], n: int) -> None:
    [row] = [r for r in demo["scenarios"] if r["n"] == n]
    assert row["ok"], row


def test_fresh_crash_scenario(demo: dict[str, Any]) -> None:
    email = [e["code"] for e in _events(demo, "fresh-email")]
    assert email[-4:] == ["interrupted_turn_resuming", "tool_refused", "turn_completed",
                          "interrupted_turn_resumed"]
    [refused] = [e for e in _events(demo, "fresh-email") if e["code"] == "tool_refused"]
    assert refused["detail"]["tool"] == "delete_files" and refused["detail"]["attended"] is False
    charge = [e["code"] for e in _events(demo, "fresh-charge")]
    assert charge == ["turn_started", "interrupted_turn_review_required"]


def test_boot_loop_scenario_stops_after_three_attempts(demo: dict[str, Any]) -> None:
    evs = _events(demo, "boot-loop")
    attempts = [e["detail"]["attempt"] for e in evs if e["code"] == "interrupted_turn_resuming"]
    assert attempts == [1, 2, 3]
    assert (evs[-1]["code"], evs[-1]["reason"]) == ("interrupted_turn_abandoned", "exhausted")


def test_stale_cancelled_and_disabled_never_run(demo: dict[str, Any]) -> None:
    for scenario in ("stale", "cancelled", "disabled"):
        assert "interrupted_turn_resuming" not in [e["code"] for e in _events(demo, scenario)]
    stale = _events(demo, "stale")
    assert (stale[-1]["code"], stale[-1]["reason"]) == ("interrupted_turn_abandoned", "stale")
    assert [e["code"] for e in _events(demo, "cancelled")] == ["turn_started", "turn_cancelled"]
    assert _events(demo, "disabled")[-1]["reason"] == "disabled"


def test_demo_cleans_up_its_sessions(demo: dict[str, Any]) -> None:
    store = fsdurable.Store(demo["root"])
    assert store.sessions() == [] and store.interrupted() == []  # incl. the disabled one's marker
    deleted = [e.session_id for e in store.events() if e.code == "session_deleted"]
    assert len(deleted) == 6


def test_the_table_renders(demo: dict[str, Any]) -> None:
    from fsdurable.demo import render

    text = render(demo)
    assert "all scenarios behaved" in text and "interrupted_turn_review_required" in text
    assert text.count(" ok\n") + text.count(" ok") >= 5


# ---------------------------------------------------------------------- recovery CLI


def _interrupted_store(root: Path) -> None:
    old = fsdurable.Store(root, clock=lambda: 1_000.0)
    old.create("old")
    old.begin_turn("old", "long ago")
    now = fsdurable.Store(root)
    now.create("new")
    now.begin_turn("new", "just now")
    far = fsdurable.Store(root, node_id="elsewhere")
    far.create("far")
    far.begin_turn("far", "on the other laptop")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def test_interrupted_shows_verdict_and_age(root: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    _interrupted_store(root)
    code, out = _run(capsys, "interrupted", "--root", str(root), "--json")
    assert code == 0
    rows = {d["session_id"]: d for d in json.loads(out)["interrupted"]}
    assert {k: v["verdict"] for k, v in rows.items()} == {
        "old": "stale", "new": "resume", "far": "foreign"}
    assert rows["old"]["age_seconds"] > 4 * 3600 and rows["new"]["age_seconds"] < 3600
    code, out = _run(capsys, "interrupted", "--root", str(root))
    assert "verdict" in out and "stale" in out and "foreign" in out


def test_recover_dry_run_then_recover(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _interrupted_store(root)
    code, out = _run(capsys, "recover", "--dry-run", "--json", "--root", str(root))
    assert code == 0
    data = json.loads(out)
    assert data["dry_run"] is True
    # what the real run below does, said beforehand
    assert {o["session_id"]: o["outcome"] for o in data["outcomes"]} == {
        "old": "would_abandon", "new": "would_leave", "far": "listed"}
    assert len(fsdurable.Store(root).interrupted()) == 3  # nothing changed
    code, out = _run(capsys, "recover", "--json", "--root", str(root))
    got = {o["session_id"]: (o["outcome"], o["reason"]) for o in json.loads(out)["outcomes"]}
    assert got == {"old": ("abandoned", "stale"), "new": ("left", "no_loop"),
                   "far": ("listed", "foreign")}
    assert sorted(m.session_id for m in fsdurable.Store(root).interrupted()) == ["far", "new"]
