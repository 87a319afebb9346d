"""Progress on a terminal: ``doctor`` and ``recover`` draw how far they have got (stage, count of
total, percentage, a bar) on stderr when it is a terminal, erase it when done, and add nothing
with ``--json`` or without a terminal. The scans report through a callback (no CLI in the
library). The end-to-end tests run the real command with its stderr on a pseudo-terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest

from fsdurable import Store
from fsdurable._doctor import doctor
from fsdurable._recovery import recover
from fsdurable.cli._term import ERASE, progress_line

from .conftest import PYTHON, subprocess_env

SGR = re.compile(r"\x1b\[[0-9;]*m")  # a colour or style escape
# the child's scan, slowed per session by the test (never by the library) so that it runs
# long enough for several frames
SLOW_DOCTOR = """
import sys, time
import fsdurable._doctor as d
read = d._Scan.session
def slow(self, sid, path):
    time.sleep(0.01)
    return read(self, sid, path)
d._Scan.session = slow
from fsdurable.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_frame_shows_stage_count_percentage_and_bar_and_fits_the_width() -> None:
    line = progress_line("doctor: scanning /s", "sessions", 41200, 100000, 3.4, 0, 120)
    assert "sessions 41,200/100,000" in line and " 41%" in line and line.endswith(
        "3 s  (Ctrl-C stops)")
    bar = re.search(r"\[(#*)(\.*)\]", line)
    assert bar and len(bar.group(1)) == 12 and len(bar.group(1) + bar.group(2)) == 30
    for width in (100, 80, 60, 40, 25):  # narrower: hint, bar, then the path give way
        narrow = progress_line("doctor: scanning /a/long/store/path", "sessions", 5, 10, 1.0, 0,
                               width)
        assert len(narrow) < width and "sessions 5/10" in narrow, (width, narrow)
    assert line.isascii() and not SGR.search(line)  # any terminal; no colour (NO_COLOR)
    # nothing counted yet: a spinner that turns
    frames = {progress_line("recover: x", None, 0, 0, 0.4, t, 80) for t in range(4)}
    assert len(frames) == 4 and all("%" not in f for f in frames)
    assert "100%" in progress_line("recover: x", "turns", 7, 7, 1.0, 0, 80)


def _sessions(root: Path, n: int, in_progress: int) -> Store:
    st = Store(root)
    for i in range(n):
        st.create(f"s{i:03d}")
        if i < in_progress:
            st.begin_turn(f"s{i:03d}", "hi")
    return st


def test_doctor_reports_every_stage_through_its_callback(root: Path) -> None:
    st = _sessions(root, 12, 3)
    calls: list[tuple[str, int, int]] = []
    assert doctor(st, progress=lambda *a: calls.append(a)) == []
    stages = {}
    for stage, done, total in calls:
        stages.setdefault(stage, []).append((done, total))
    assert list(stages) == ["session files", "marker files", "sessions", "markers", "history"]
    want = {"session files": 12, "marker files": 3, "sessions": 12, "markers": 3, "history": 12}
    for stage, seen in stages.items():  # 1, 2, ... total, each once, in order
        assert seen == [(k, want[stage]) for k in range(1, want[stage] + 1)], stage
    assert doctor(st) == []  # no callback: the same scan, quietly


def test_recover_reports_each_interrupted_turn(root: Path) -> None:
    from fsdurable.cli._recovery import _NoLoop

    st = _sessions(root, 5, 4)
    calls: list[tuple[str, int, int]] = []
    report = recover(st, _NoLoop(), resume=False, progress=lambda *a: calls.append(a))
    assert len(report.outcomes) == 4
    assert calls == [("turns", k, 4) for k in range(1, 5)]


def _on_a_tty(argv: list[str], code: str | None = None, columns: int = 100,
              ) -> tuple[int, str, bytes]:
    """Run ``fsdurable ARGV`` (or ``python -c CODE ARGV``) with stderr on a pseudo-terminal of
    ``columns`` columns and stdout on a pipe: (exit code, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    cmd = [PYTHON, "-c", code, *argv] if code else [PYTHON, "-m", "fsdurable", *argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            env=subprocess_env(NO_COLOR="1"), text=True)
    os.close(slave)
    got = bytearray()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has gone
                break
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None:
            break
    out = proc.communicate(timeout=60)[0]
    os.close(master)
    return proc.returncode, out, bytes(got)


def _piped(argv: list[str], code: str | None = None) -> tuple[int, str, str]:
    cmd = [PYTHON, "-c", code, *argv] if code else [PYTHON, "-m", "fsdurable", *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=120,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def test_doctor_on_a_terminal_draws_its_progress_and_erases_it(root: Path) -> None:
    _sessions(root, 120, 2)
    argv = ["doctor", "--root", str(root)]
    code, out, tty = _on_a_tty(argv, SLOW_DOCTOR, columns=220)  # room for pytest's long path
    assert code == 0 and out.strip() == "store is healthy"
    text = tty.decode("ascii")  # plain ASCII, whatever the terminal's encoding
    assert not SGR.search(text)  # no colour at all (so NO_COLOR has nothing to remove)
    frames = [f for f in text.split(ERASE) if f]
    assert text.endswith(ERASE) and frames, text  # erased when done
    counted = [re.search(r"sessions (\d+)/120 +(\d+)% \[(#*)\.*\]", f) for f in frames]
    seen = [(int(m.group(1)), int(m.group(2)), len(m.group(3))) for m in counted if m]
    assert len(seen) >= 2, frames  # the count moves: at least two frames of the session stage
    assert [s[0] for s in seen] == sorted(s[0] for s in seen)
    for done, pct, filled in seen:  # the bar is 30 wide at 220 columns
        assert pct == 100 * done // 120 and filled == 30 * done // 120 and 0 < done <= 120
    assert seen[-1][2] >= seen[0][2]  # the bar grows
    assert all(len(f) < 220 for f in frames)  # each frame fits the terminal: no wrapped lines
    assert "doctor: scanning" in frames[0]
    # the same command without a terminal prints the same stdout and nothing on stderr
    assert _piped(argv, SLOW_DOCTOR) == (0, out, "")


def test_with_json_a_terminal_gets_nothing_and_stdout_is_the_document(root: Path) -> None:
    import json

    _sessions(root, 60, 1)
    argv = ["doctor", "--root", str(root), "--json"]
    code, out, tty = _on_a_tty(argv, SLOW_DOCTOR)
    assert code == 0 and tty == b""
    assert json.loads(out) == {"findings": [], "problems": 0}
    assert _piped(argv, SLOW_DOCTOR) == (0, out, "")


def _ageless(out: str) -> object:
    """recover's output without the turns' ages (they grow between two runs)."""
    import json

    if out.startswith("{"):
        doc = json.loads(out)
        for o in doc["outcomes"]:
            o.pop("age_seconds")
        return doc
    return re.sub(r"  \d+(\.\d)?[smh] ", "  AGE ", out)


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_recover_on_a_terminal_adds_nothing_to_stdout(root: Path, json_flag: list[str]) -> None:
    """recover without a host loop leaves the turns as they are (``left``), so it can run again:
    with stderr on a terminal and piped, its stdout is the same; a quick recover ends before
    the first frame, so the terminal gets the erase alone (nothing at all with --json)."""
    _sessions(root, 3, 2)
    argv = ["recover", "--root", str(root), *json_flag]
    code, out, tty = _on_a_tty(argv)
    assert code == 0 and tty == (b"" if json_flag else ERASE.encode())
    assert "s000" in out and "s001" in out and "s002" not in out
    piped = _piped(argv)
    assert piped[0] == 0 and piped[2] == "" and _ageless(piped[1]) == _ageless(out)
