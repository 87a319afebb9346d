"""Kill torture: three processes run agent loops on one shared store (own and shared sessions)
and are SIGKILLed at random and restarted; after every kill and at the end the invariants hold
(tests/torture/kills.py lists them). CI runs 200 kills; ``--torture`` adds a 2,000-kill run and
``python -m tests.torture --kills 10000`` is the long one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, subprocess_env
from tests.torture import kills


def _torture(tmp_path: Path, n: int, seed: int, rotate: int = kills.ROTATE
             ) -> dict[str, object]:
    env = subprocess_env(FSDURABLE_STATE_DIR=str(tmp_path / "state"))
    out = subprocess.run([PYTHON, "-m", "tests.torture.kills", "--kills", str(n), "--seed",
                          str(seed), "--dir", str(tmp_path), "--rotate", str(rotate)],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
    res: dict[str, object] = json.loads(out.stdout)
    assert res["violations"] == [], res["violations"]
    assert out.returncode == 0
    return res


def test_200_kills(tmp_path: Path) -> None:
    res = _torture(tmp_path, 200, seed=7, rotate=80)  # three generations of session ids
    assert res["kills"] == 200
    assert res["sessions"] == 3 * (3 * 3 + len(kills.SHARED))
    stats = res["stats"]
    assert isinstance(stats, dict)
    # the kills landed where it matters: turns were interrupted and recovered, in-doubt calls
    # parked, idempotent calls re-sent and dropped by the provider, tools refused unattended
    assert stats["event_interrupted_turn_resuming"] > 0
    assert stats["event_turn_completed"] > 100
    assert stats.get("tool_calls_in_resumed_turns", 0) > 0
    assert stats["acknowledged_commits"] > 200


@pytest.mark.slow
def test_2000_kills(tmp_path: Path) -> None:
    res = _torture(tmp_path, 2000, seed=11)
    assert res["kills"] == 2000


def _oa_torture(tmp_path: Path, n: int, seed: int) -> dict[str, object]:
    if os.environ.get("CI") != "true":  # CI installs the extra: a missing SDK fails there
        pytest.importorskip("agents", reason="the openai-agents extra is not installed")
    env = subprocess_env(FSDURABLE_STATE_DIR=str(tmp_path / "state"))
    out = subprocess.run([PYTHON, "-m", "tests.torture.oakills", "--kills", str(n), "--seed",
                          str(seed), "--dir", str(tmp_path)],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
    res: dict[str, object] = json.loads(out.stdout)
    assert res["violations"] == [], res["violations"]
    assert out.returncode == 0
    return res


def test_agents_sdk_runs_under_30_kills(tmp_path: Path) -> None:
    """Durable Agents SDK runs SIGKILLed mid-run and recovered (tests/torture/oakills.py lists
    the end-state checks). ``--torture`` adds 1,000 kills."""
    res = _oa_torture(tmp_path, 30, seed=5)
    assert res["kills"] == 30
    stats = res["stats"]
    assert isinstance(stats, dict)
    # the kills landed mid-run: runs were interrupted and resumed, and runs got to their end
    assert stats["event_interrupted_turn_resuming"] > 0 and stats["event_turn_completed"] > 0
    assert stats.get("refused_unattended_deny", 0) + stats.get("refused_approval_denied", 0) > 0


@pytest.mark.slow
def test_agents_sdk_runs_under_1000_kills(tmp_path: Path) -> None:
    res = _oa_torture(tmp_path, 1000, seed=13)
    assert res["kills"] == 1000


def _world(tmp_path: Path, tools: list[dict[str, object]]) -> str:
    world = tmp_path / "world"
    world.mkdir()
    (world / "tools-0.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tools))
    return str(world)


def _call(kind: str, **kw: object) -> dict[str, object]:
    d: dict[str, object] = {"kind": kind, "sid": "s", "tid": "t", "cid": "c1",
                            "key": "s:t:c1", "attended": False, "resumed": False}
    d.update(kw)
    return d


def test_pydantic_ai_runs_under_kills(tmp_path: Path) -> None:
    """Durable Pydantic AI runs (``FsDurableAgent``, the conformance driver) SIGKILLed at random
    and recovered by fresh processes settle to their end state (``tests/torture/drivekills.py``;
    ``python -m tests.torture.drivekills --driver pydantic_ai --kills 1000`` is the long run)."""
    pytest.importorskip("pydantic_ai")
    from tests.torture import drivekills

    res = drivekills.run(str(tmp_path), kills=6, seed=5, max_rounds=12, driver="pydantic_ai")
    assert res["violations"] == []
    assert res["kills"] >= 1
    assert res["completed"] + res["abandoned"] + res["not_started"] == res["rounds"]


def test_adk_runs_under_kills(tmp_path: Path) -> None:
    """Durable Google ADK runs (``fsdurable.adk.DurableRunner``, the conformance driver)
    SIGKILLed at random and recovered by fresh processes settle to their end state
    (``python -m tests.torture.drivekills --driver adk --kills 1000`` is the long run)."""
    pytest.importorskip("google.adk")
    from tests.torture import drivekills

    res = drivekills.run(str(tmp_path), kills=6, seed=5, max_rounds=12, driver="adk")
    assert res["violations"] == []
    assert res["kills"] >= 1
    assert res["completed"] + res["abandoned"] + res["not_started"] == res["rounds"]


@pytest.mark.parametrize(("tools", "needle"), [
    ([_call("external"), _call("external", resumed=True)], "external call run 2 times"),
    ([_call("apply"), _call("apply", resumed=True)], "idempotent effect applied 2 times"),
    ([_call("none", resumed=True, attended=True)], "resumed turn ran attended"),
    ([_call("approved", resumed=True)], "approval was granted in a resumed"),
    ([_call("apply", key="s:other:c1")], "is not <session>:<turn>:<call>"),
])
def test_the_final_check_has_teeth(tmp_path: Path, tools: list[dict[str, object]],
                                   needle: str) -> None:
    from fsdurable import Store

    st = Store(tmp_path / "store")
    violations, _ = kills.check_final(st, _world(tmp_path, tools))
    assert any(needle in v for v in violations), violations


def test_the_final_check_catches_a_lost_update(tmp_path: Path) -> None:
    from fsdurable import Store

    st = Store(tmp_path / "store")
    st.create("shared-0", metadata={"n": 1})
    world = _world(tmp_path, [])
    acks = [{"sid": "shared-0", "version": 1, "n": 1}, {"sid": "shared-0", "version": 2, "n": 1}]
    Path(world, "acks-0.jsonl").write_text("".join(json.dumps(a) + "\n" for a in acks))
    violations, _ = kills.check_final(st, world)
    assert any("lost update" in v for v in violations)
    assert any("v2 lost" in v for v in violations)


def test_the_live_check_catches_a_missing_marker(tmp_path: Path) -> None:
    import os

    from fsdurable import Store

    st = Store(tmp_path / "store")
    st.create("a")
    st.begin_turn("a", "x")
    os.unlink(st.layout.marker("a"))
    assert kills.check_live(st) == ["session a in progress without a marker"]


def test_the_cached_live_check_rechecks_what_changed(tmp_path: Path) -> None:
    """The driver's check after each kill skips the files it checked unchanged; a marker that
    goes away since the last check must still be found."""
    import os

    from fsdurable import Store

    st = Store(tmp_path / "store")
    st.create("a")
    st.create("b")
    st.begin_turn("a", "x")
    seen: dict[str, object] = {}
    assert kills.check_live(st, seen) == []
    assert seen == {}  # files younger than a timestamp granule are never taken as unchanged
    for f in (st.layout.session("a"), st.layout.session("b"), st.layout.marker("a")):
        os.utime(f, (1e9, 1e9))
    assert kills.check_live(st, seen) == []
    assert set(seen) == {"a", "b"}
    assert kills.check_live(st, seen) == []  # unchanged: nothing parsed, nothing found
    os.unlink(st.layout.marker("a"))
    assert kills.check_live(st, seen) == ["session a in progress without a marker"]


def test_workers_rotate_to_new_session_ids() -> None:
    assert kills.own_ids(1, 0) == ["w1-0", "w1-1", "w1-2"]
    assert kills.shared_ids(0) == kills.SHARED
    assert kills.own_ids(1, 3) == ["w1-0-g3", "w1-1-g3", "w1-2-g3"]
    assert set(kills.shared_ids(3)).isdisjoint(kills.SHARED)


def test_the_agents_sdk_final_checks_catch_each_violation(tmp_path: Path) -> None:
    """oakills.check_final on hand-made worlds: each broken invariant is reported."""
    import fsdurable
    from tests.torture import oakills

    def rec(kind: str, **kw: object) -> dict[str, object]:
        d: dict[str, object] = {"tool": kind, "kind": kind, "sid": "s", "tid": "t", "cid": "c1",
                                "key": "s:t:c1", "attended": False, "resumed": False}
        d.update(kw)
        return d

    cases = {
        "external call run 2 times": [rec("charge"), rec("charge")],
        "idempotent effect applied 2 times": [rec("apply"), rec("apply")],
        "approval was honoured": [rec("approve_me", resumed=True)],
        "deny-listed tool ran unattended": [rec("shell")],
        "ran attended": [rec("lookup", resumed=True, attended=True)],
        "is not <session>:<turn>:<call>": [rec("lookup", key="other")],
    }
    for i, (want, tools) in enumerate(cases.items()):
        world = tmp_path / f"w{i}"
        world.mkdir()
        (world / "tools-0.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tools))
        st = fsdurable.Store(tmp_path / f"st{i}")
        out, _ = oakills.check_final(st, str(world))
        assert any(want in v for v in out), (want, out)
    world = tmp_path / "wx"
    world.mkdir()
    st = fsdurable.Store(tmp_path / "stx")
    call = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"}
    st.create("s", metadata={"openai_agents": {"items": [call, call]}})
    out, _ = oakills.check_final(st, str(world))
    assert out == ["s: tool call c1 2 times in the conversation"]
