"""Re-routing during a live turn (issue 9 item 1): the lock that guards a turn is the one it
started under, until it ends, whatever the session's route field says later."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import attrs

import fsdurable
from fsdurable import AgentLoop, RecoveryPolicy, ScriptedModel, recover
from tests.conftest import PYTHON, subprocess_env

LIVE = r'''
import os, sys, time
import fsdurable
from fsdurable import AgentLoop, Reply, ScriptedModel, Tool
from fsdurable._tools import call

root, world, gate = sys.argv[1:4]

def wait_for(name):
    while not os.path.exists(gate + name):
        time.sleep(0.005)

def look(ctx):
    with open(world, "a") as f:
        f.write("look\n")
    wait_for("1")
    return "looked"

def charge(ctx):
    with open(world, "a") as f:
        f.write("charge\n")
    wait_for("2")
    return "charged"

store = fsdurable.Store(root)
model = ScriptedModel([Reply("", [call("look", "l1")]), Reply("", [call("charge", "c1")])],
                      final="live done")
loop = AgentLoop(store, model, [Tool("look", look), Tool("charge", charge, effect="external")])
r = loop.run("s", "pay the bill", attended=True)
print(r.status, flush=True)
'''


def _wait_lines(path: Path, n: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while not (path.exists() and len(path.read_text().splitlines()) >= n):
        assert proc.poll() is None, "the live turn ended early"
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_a_live_turn_rerouted_midway_is_never_resumed(tmp_path: Path, root: Path) -> None:
    store = fsdurable.Store(root)
    store.create("s", route_key="chan:old")
    script, world, gate = tmp_path / "live.py", tmp_path / "world", str(tmp_path / "go")
    script.write_text(LIVE)
    live = subprocess.Popen([PYTHON, str(script), str(root), str(world), gate],
                            env=subprocess_env(), stdout=subprocess.PIPE, text=True)
    try:
        _wait_lines(world, 1, live)  # the live turn holds chan:old and runs `look`
        store.patch("s", lambda s: attrs.evolve(s, route_key="chan:new"))  # another writer
        Path(gate + "1").touch()
        _wait_lines(world, 2, live)  # `charge` runs: its intent commit rewrote the marker
        loop = AgentLoop(store, ScriptedModel([], final="recovered"))
        rep = recover(store, loop, RecoveryPolicy(lock_timeout=0.5))
        assert [o.outcome for o in rep.outcomes] == ["busy"]  # never resumed while it lives
        Path(gate + "2").touch()
        out, _ = live.communicate(timeout=30)
        assert live.returncode == 0 and out.strip() == "completed"
    finally:
        if live.poll() is None:
            live.kill()
    assert world.read_text().splitlines() == ["look", "charge"]  # each effect once
    s = store.load("s")
    assert not s.in_progress and s.route_key == "chan:new" and s.messages[-1].content == "live done"
    assert "interrupted_turn_resuming" not in [e.code for e in store.events("s")]


def test_a_route_change_between_the_check_and_begin_turn_keeps_the_held_route(root: Path) -> None:
    """The check-then-begin gap of ``run``: the route is patched after the loop checked it under
    the lock and before ``begin_turn`` committed. The turn's route must be the lock the run
    holds, not the new field (else recovery could take the free new route mid-turn)."""
    store = fsdurable.Store(root)
    other = fsdurable.Store(root)  # another writer
    store.create("s", route_key="chan:old")
    real = store.begin_turn

    def racing(session_id: str, content: str | None = None, **kw: object) -> fsdurable.Session:
        other.patch(session_id, lambda s: attrs.evolve(s, route_key="chan:new"))
        return real(session_id, content, **kw)  # type: ignore[arg-type]

    store.begin_turn = racing  # type: ignore[method-assign]
    seen: list[str] = []

    def probe(ctx: object) -> str:
        s = other.load("s")
        assert s.turn is not None
        seen.append(s.turn.route_key)
        try:
            with other.lock(s.turn.route_key, timeout=0):
                seen.append("free")
        except fsdurable.LockTimeout:
            seen.append("held")
        return "ok"

    from fsdurable import Reply, Tool
    from fsdurable._tools import call

    loop = AgentLoop(store, ScriptedModel([Reply("", [call("probe", "p1")])]),
                     [Tool("probe", probe)])
    assert loop.run("s", "go").status == "completed"
    assert seen == ["chan:old", "held"]
