"""A forked child never keeps the agent's locks (issue 9 item 11): real fork, real SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import fsdurable
from fsdurable import AgentLoop, RecoveryPolicy, ScriptedModel, recover
from tests.conftest import PYTHON, subprocess_env

# The agent's tool starts a helper with multiprocessing's fork context (as many libraries do),
# then the agent hangs until it is killed. The helper outlives it.
CHILD = r'''
import multiprocessing, os, sys, time
import fsdurable
from fsdurable import AgentLoop, Reply, ScriptedModel, Tool
from fsdurable._tools import call

root, pidfile = sys.argv[1:3]

def helper():
    # written by the helper itself: its fork hooks have run by now (the parent's p.start()
    # returns before the child is scheduled, which on a loaded machine made this a race)
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pidfile + ".tmp", pidfile)
    time.sleep(120)

def spawn(ctx):
    p = multiprocessing.get_context("fork").Process(target=helper, daemon=False)
    p.start()
    time.sleep(120)  # the agent is killed here, mid-turn
    return "never"

store = fsdurable.Store(root)
loop = AgentLoop(store, ScriptedModel([Reply("", [call("spawn", "c1")])]), [Tool("spawn", spawn)])
loop.run("s", "go")
'''


def test_a_forked_helper_does_not_keep_the_route_lock(tmp_path: Path, root: Path) -> None:
    fsdurable.Store(root).create("s")
    script, pidfile = tmp_path / "child.py", tmp_path / "helper.pid"
    script.write_text(CHILD)
    agent = subprocess.Popen([PYTHON, str(script), str(root), str(pidfile)],
                             env=subprocess_env())
    helper = 0
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text()):
            assert agent.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        helper = int(pidfile.read_text())
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        os.kill(helper, 0)  # the forked helper is still alive
        store = fsdurable.Store(root)
        loop = AgentLoop(store, ScriptedModel([], final="recovered"))
        rep = recover(store, loop, RecoveryPolicy(lock_timeout=1.0))
        assert [(o.outcome, o.status) for o in rep.outcomes] == [("resumed", "completed")]
        assert store.load("s").messages[-1].content == "recovered"
    finally:
        if agent.poll() is None:
            agent.kill()
        if helper:
            with contextlib.suppress(ProcessLookupError):
                os.kill(helper, signal.SIGKILL)
