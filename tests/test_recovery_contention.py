"""Several recoverers in one start (issue 9 item 8), with real processes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import fsdurable
from tests.conftest import PYTHON, subprocess_env

# A recoverer whose model provider is down: every resume fails after a short wait (so the
# processes' resumes overlap). The three start together on a file barrier.
CHILD = r'''
import json, os, sys, time
import fsdurable
from fsdurable import AgentLoop, recover

root, go, out = sys.argv[1:4]

def model(transcript, specs):
    time.sleep(1.0)  # longer than a loaded machine may delay one process's listing
    raise ConnectionError("provider down")

store = fsdurable.Store(root)
loop = AgentLoop(store, model)
while not os.path.exists(go):
    time.sleep(0.002)
rep = recover(store, loop)
with open(out, "w") as f:
    json.dump([[o.session_id, o.outcome, o.reason] for o in rep.outcomes], f)
'''

TURNS = ("a", "b", "c", "d")


def test_three_recoverers_spend_one_attempt_per_turn(tmp_path: Path, root: Path) -> None:
    store = fsdurable.Store(root)
    for sid in TURNS:
        store.create(sid)
        store.begin_turn(sid, "interrupted request")  # nobody runs them: a crash
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    go = tmp_path / "go"
    outs = [tmp_path / f"out{i}.json" for i in range(3)]
    procs = [subprocess.Popen([PYTHON, str(script), str(root), str(go), str(o)],
                              env=subprocess_env()) for o in outs]
    time.sleep(1.0)  # let all three import and reach the barrier
    go.touch()
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    reports = [json.loads(o.read_text()) for o in outs]
    for sid in TURNS:
        s = store.load(sid)
        assert s.in_progress and s.turn is not None, sid  # one failure: kept for the next start
        assert s.turn.resume_attempts == 1, (sid, reports)
        resuming = [e for e in store.events(sid) if e.code == "interrupted_turn_resuming"]
        assert len(resuming) == 1, (sid, reports)
        outcomes = sorted(o for rep in reports for (x, o, _) in rep if x == sid)
        assert outcomes == ["busy", "busy", "failed"], (sid, reports)
    assert all(m.resume_attempts == 1 for m in store.interrupted())
