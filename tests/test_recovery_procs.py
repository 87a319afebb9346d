"""Recovery with real processes: SIGKILL inside the model call, two processes on one route."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import fsdurable
from tests.conftest import PYTHON, subprocess_env

# One child program, two roles. Each appends what it does to a shared log (O_APPEND + fsync), so
# the parent can read the real order of events across processes.
CHILD = r'''
import os, sys, time
import fsdurable
from fsdurable import AgentLoop, Reply, ScriptedModel, Tool, recover
from fsdurable._tools import call

role, root, log, go = sys.argv[1:5]

def note(line):
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, (line + "\n").encode())
    os.fsync(fd)
    os.close(fd)

def slow(ctx):
    note(f"{role} tool start")
    while not os.path.exists(go):
        time.sleep(0.005)
    note(f"{role} tool end")
    return "slow done"

def model(transcript, specs):
    note(f"{role} model")
    n = ScriptedModel.step_index(transcript)
    return Reply("working", [call("slow", "s1")]) if n == 0 else Reply(f"{role} finished")

store = fsdurable.Store(root)
loop = AgentLoop(store, model, [Tool("slow", slow)])
if role == "live":
    note("live start")
    r = loop.run("s", "live request", attended=True)
    note(f"live {r.status}")
else:
    def select(m):
        note("recovery claiming")
        return True
    rep = recover(store, loop, select=select)
    note("recovery " + ",".join(o.outcome for o in rep.outcomes))
'''


def _spawn(tmp: Path, role: str, root: Path) -> subprocess.Popen[bytes]:
    script = tmp / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen([PYTHON, str(script), role, str(root), str(tmp / "log"),
                             str(tmp / "go")], env=subprocess_env())


def _wait_for(tmp: Path, line: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (tmp / "log").exists() and line in (tmp / "log").read_text().splitlines():
            return
        assert proc.poll() is None, f"child exited {proc.returncode} before {line!r}"
        time.sleep(0.005)
    raise AssertionError(f"never saw {line!r}")


def _log(tmp: Path) -> list[str]:
    return (tmp / "log").read_text().splitlines()


def test_recovery_never_waits_for_a_live_turn_it_is_busy(tmp_path: Path, root: Path) -> None:
    """A turn whose route lock is held is ``busy`` at once (tried, never waited for: with
    several recoverers, waiting would let each claim the turn in turn). The live turn goes on."""
    fsdurable.Store(root).create("s")
    live = _spawn(tmp_path, "live", root)
    _wait_for(tmp_path, "live tool start", live)  # the live turn holds the route lock now
    rec = _spawn(tmp_path, "recovery", root)  # it sees the live turn's marker
    assert rec.wait(30) == 0
    (tmp_path / "go").touch()
    assert live.wait(30) == 0
    assert _log(tmp_path) == ["live start", "live model", "live tool start", "recovery claiming",
                              "recovery busy", "live tool end", "live model", "live completed"]
    store = fsdurable.Store(root)
    s = store.load("s")
    assert not s.in_progress and s.messages[-1].content == "live finished"
    events = store.events("s")
    codes = [e.code for e in events]
    assert "interrupted_turn_resuming" not in codes and "turn_cancelled" not in codes
    assert [(e.code, e.reason) for e in events if e.code.startswith("interrupted")] == [
        ("interrupted_turn_skipped", "route_busy")]


def test_a_live_turn_waits_for_a_running_recovery(tmp_path: Path, root: Path) -> None:
    store = fsdurable.Store(root)
    store.create("s")
    store.begin_turn("s", "interrupted request")  # in progress, and nobody runs it: a crash
    rec = _spawn(tmp_path, "recovery", root)
    _wait_for(tmp_path, "recovery tool start", rec)
    live = _spawn(tmp_path, "live", root)
    _wait_for(tmp_path, "live start", live)
    time.sleep(0.2)
    (tmp_path / "go").touch()
    assert rec.wait(30) == 0 and live.wait(30) == 0
    log = _log(tmp_path)
    # nothing of the live turn happens between the recovery's first and last step
    assert log.index("recovery resumed") < log.index("live model")
    assert log[:6] == ["recovery claiming", "recovery model", "recovery tool start",
                       "live start", "recovery tool end", "recovery model"]
    s = fsdurable.Store(root).load("s")
    contents = [(m.role, m.content) for m in s.messages]
    assert contents == [("user", "interrupted request"), ("assistant", "working"),
                        ("tool", "slow done"), ("assistant", "recovery finished"),
                        ("user", "live request"), ("assistant", "working"),
                        ("tool", "slow done"), ("assistant", "live finished")]


def _demo_child(root: Path, world: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "fsdurable.demo", *args, "--root", str(root),
                           "--world", str(world), "--session", "boot"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60,
                          check=False)


def test_the_attempt_count_survives_a_crash_inside_the_model_call(tmp_path: Path,
                                                                  root: Path) -> None:
    world = tmp_path / "world"
    p = _demo_child(root, world, "turn", "--scenario", "boot_loop")
    assert p.returncode == -signal.SIGKILL, p.stderr
    store = fsdurable.Store(root)
    m = store.read_marker("boot")
    assert m is not None and m.resume_attempts == 0
    for attempt in (1, 2, 3):
        p = _demo_child(root, world, "recover")
        assert p.returncode == -signal.SIGKILL, p.stderr  # died inside the model call
        m = store.read_marker("boot")
        assert m is not None and m.resume_attempts == attempt
        s = store.load("boot")
        assert s.turn is not None and s.turn.resume_attempts == attempt
    p = _demo_child(root, world, "recover")
    assert p.returncode == 0, p.stderr
    assert '"outcome": "abandoned"' in p.stdout and '"reason": "exhausted"' in p.stdout
    assert store.read_marker("boot") is None and not store.load("boot").in_progress
    resuming = [e.detail["attempt"] for e in store.events("boot")
                if e.code == "interrupted_turn_resuming"]
    assert resuming == [1, 2, 3]
    assert os.environ.get("FSDURABLE_DEMO_KILL") is None
