"""The commit protocol's crash windows, with real processes killed at exact disk operations.

A child process runs store operations with an audit hook on ``os.rename``/``os.replace`` and
``os.remove``/``os.unlink``; at the chosen operation it calls ``os._exit`` (no cleanup, no flush of
anything Python holds). The parent then reopens the store like a restarted daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from fsdurable import Store
from fsdurable.cli import main

from .conftest import PYTHON, subprocess_env
from .test_store import biconditional_violations

CHILD = textwrap.dedent("""
    import os, sys, fsdurable
    root, nth = sys.argv[1], int(sys.argv[3])
    kind, target = sys.argv[2].split(":")
    st = fsdurable.Store(root)
    s = st.create("w")
    seen = 0

    def hook(event, args):
        global seen
        if event == "os." + kind and armed:
            path = args[1] if event == "os.rename" else args[0]
            if str(path).endswith(target):
                seen += 1
                if seen == nth:
                    os._exit(77)

    armed = False
    sys.addaudithook(hook)
    armed = True
    s = st.begin_turn("w", "hello")
    s = st.checkpoint(s, phase="model_reply")
    s = st.end_turn(s, "bye")
    s = st.begin_turn("w", "again")
    st.cancel("w")
    sys.exit(0)
""")


def run_child(root: Path, target: str, nth: int) -> int:
    r = subprocess.run([PYTHON, "-c", CHILD, str(root), target, str(nth)],
                       env=subprocess_env(), timeout=60, capture_output=True, text=True)
    assert r.returncode in (0, 77), r.stderr
    return r.returncode


def doctor_json(root: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["--root", str(root), "doctor", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_killed_between_marker_write_and_session_write(root: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # 1st rename onto sessions/w.json after arming = begin_turn's session write; the marker is
    # already renamed into place: the session on disk is still idle -> an orphan marker.
    assert run_child(root, "rename:sessions/w.json", 1) == 77
    store = Store(root)
    assert not store.load("w").in_progress
    assert os.path.exists(store.layout.marker("w"))
    code, report = doctor_json(root, capsys)
    assert code == 1  # the orphan marker, and the temp file of the session write that died
    assert sorted(f["code"] for f in report["findings"]) == ["orphan_marker", "temp_leftover"]
    code, report = doctor_json(root, capsys, "--repair")
    assert code == 0
    assert all(f["repaired"] for f in report["findings"] if f["severity"] == "problem")
    assert not os.path.exists(store.layout.marker("w"))
    assert "marker_repaired" in [e.code for e in Store(root).events("w")]
    code, report = doctor_json(root, capsys)
    assert code == 0 and [f["code"] for f in report["findings"]] == ["quarantined"]


def test_killed_between_session_write_and_marker_removal(root: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    # 1st removal of markers/w.json = end_turn's marker removal, after the session is idle.
    assert run_child(root, "remove:markers/w.json", 1) == 77
    store = Store(root)
    s = store.load("w")
    assert not s.in_progress and s.messages[-1].content == "bye"
    code, report = doctor_json(root, capsys, "--repair")
    assert [f["code"] for f in report["findings"]] == ["orphan_marker"]
    assert code == 0 and biconditional_violations(Store(root)) == []


@pytest.mark.parametrize("target", ["rename:sessions/w.json", "rename:markers/w.json",
                                    "remove:markers/w.json"])
@pytest.mark.parametrize("nth", [1, 2, 3, 4, 5])
def test_any_kill_point_leaves_no_in_progress_session_without_marker(
        root: Path, target: str, nth: int, capsys: pytest.CaptureFixture[str]) -> None:
    run_child(root, target, nth)
    store = Store(root)
    s = store.load("w")
    if s.in_progress:  # the one direction that must hold at every crash point
        m = store.read_marker("w")
        assert m is not None and s.turn is not None and m.turn_id == s.turn.id
    for d in (store.layout.sessions, store.layout.markers):
        for name in os.listdir(d):  # a temp file is never left under a final name
            assert name == "w.json" or (name.startswith("~") and name.endswith(".tmp")), name
    doctor_json(root, capsys, "--repair")
    assert biconditional_violations(Store(root)) == []
    code, report = doctor_json(root, capsys)
    assert code == 0
    assert [f["code"] for f in report["findings"] if f["severity"] == "problem"] == [], report
