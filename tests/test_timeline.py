"""``fsdurable timeline``: golden terminal output from a fixed event log, colour only on a TTY
(never under NO_COLOR), width-aware, and the --html page drawn by a real headless Chromium."""

from __future__ import annotations

import datetime
import json
import os
import pty
import struct
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from fsdurable import Store
from fsdurable import _events as ev
from fsdurable._records import Event, Marker
from fsdurable.cli import main
from fsdurable.cli._timeline import build, render
from fsdurable.cli._timeline_html import page

from .conftest import PYTHON, REPO, need_tools, subprocess_env

GOLDEN = REPO / "tests" / "data" / "timeline"
T0 = 1_796_160_000.0  # 2026-12-01T21:20:00Z
UTC = datetime.timezone.utc


def _events() -> list[Event]:
    """Four turns: one resumed after a crash, one abandoned as stale five hours on, one parked
    for review, one crashed on every resume until the cap."""
    e = Event
    return [
        e(T0, ev.TURN_STARTED, "chat-1", "t1", "n1", detail={"attended": True}),
        e(T0 + 2.5, ev.RESUMING, "chat-1", "t1", "n1", detail={"attempt": 1, "cap": 3}),
        e(T0 + 2.6, ev.TOOL_REFUSED, "chat-1", "t1", "n1", "unattended_deny",
          {"tool": "delete_files"}),
        e(T0 + 3.0, ev.TURN_COMPLETED, "chat-1", "t1", "n1"),
        e(T0 + 3.0, ev.RESUMED, "chat-1", "t1", "n1", detail={"attempt": 1,
                                                               "status": "completed"}),
        e(T0 + 10, ev.TURN_STARTED, "old", "t2", "n1"),
        e(T0 + 10 + 18000, ev.ABANDONED, "old", "t2", "n1", "stale", {"age": 17990.0}),
        e(T0 + 20, ev.TURN_STARTED, "pay", "t3", "n1"),
        e(T0 + 21, ev.REVIEW_REQUIRED, "pay", "t3", "n1", "in_doubt",
          {"calls": [{"tool": "charge_card"}]}),
        e(T0 + 30, ev.TURN_STARTED, "loop", "t4", "n1"),
        e(T0 + 31, ev.RESUMING, "loop", "t4", "n1", detail={"attempt": 1, "cap": 2}),
        e(T0 + 32, ev.RESUMING, "loop", "t4", "n1", detail={"attempt": 2, "cap": 2}),
        e(T0 + 33, ev.ABANDONED, "loop", "t4", "n1", "exhausted", {"cap": 2}),
        e(T0 + 40, ev.SESSION_DELETED, "loop", None, "n1"),
    ]


def _story() -> dict[str, Any]:
    live = Marker(session_id="open", turn_id="t5", session_version=2, node_id="n1",
                  route_key="session:open", source="api", started_at=T0 + 50,
                  checkpoint_at=T0 + 55, resume_attempts=0)
    evs = [*_events(), Event(T0 + 50, ev.TURN_STARTED, "open", "t5", "n1")]
    return build(evs, now=T0 + 18100, markers={"open": live}, verdicts={"open": "resume"})


@pytest.mark.parametrize(("name", "width", "colour", "uni"),
                         [("plain-100", 100, False, True), ("plain-60", 60, False, True),
                          ("ascii-100", 100, False, False), ("colour-100", 100, True, True)])
def test_terminal_golden(name: str, width: int, colour: bool, uni: bool) -> None:
    text = render(_story(), width=width, colour=colour, unicode=uni, tz=UTC)
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("FSDURABLE_REGOLD"):
        golden.write_text(text + "\n", "utf-8")
    assert text + "\n" == golden.read_text("utf-8")
    visible = text if colour is False else _strip(text)
    assert all(len(line) <= width for line in visible.splitlines()), visible
    assert ("\x1b[" in text) is colour
    if not uni:
        assert visible.isascii()


def _strip(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_the_story_has_each_turn_gap_and_decision() -> None:
    story = _story()
    rows = {t["session_id"]: t for t in story["turns"]}
    assert list(rows) == ["chat-1", "old", "pay", "loop", "open"]  # by start time
    assert rows["chat-1"]["status"] == "completed"
    assert [(g["from"], g["to"]) for g in rows["chat-1"]["gaps"]] == [(T0, T0 + 2.5)]
    old = rows["old"]
    assert (old["status"], old["reason"]) == ("abandoned", "stale")
    # the checkpoint the verdict judged (at - age) starts the gap: 5 h with no process
    assert [m["at"] for m in old["marks"] if m["kind"] == "checkpoint"] == [T0 + 20]
    assert [(g["from"], g["to"]) for g in old["gaps"]] == [(T0 + 20, T0 + 18010)]
    assert (rows["pay"]["status"], rows["pay"]["reason"]) == ("review", "in_doubt")
    assert len(rows["loop"]["gaps"]) == 3  # the crash before each pick-up
    assert rows["loop"]["reason"] == "exhausted"
    op = rows["open"]
    assert op["status"] == "interrupted" and op["reason"] == "resume"
    assert op["gaps"][-1] == {"from": T0 + 55, "to": T0 + 18100, "open": True,
                              "label": op["gaps"][-1]["label"]}
    assert story["other_events"] == 1  # session_deleted is about no turn


def _store_with_story(root: Path) -> Store:
    clock = [time.time() - 18100]  # the past: the command's clock is the real one
    st = Store(root, clock=lambda: clock[0])
    st.create("chat-1")
    s = st.begin_turn("chat-1", "hi")
    assert s.turn is not None
    clock[0] += 5
    st.emit(ev.RESUMING, session_id="chat-1", turn_id=s.turn.id, attempt=1, cap=3)
    st.end_turn(st.load("chat-1"), "done")
    st.create("old")
    s2 = st.begin_turn("old", "hello")
    assert s2.turn is not None
    clock[0] += 18000
    st.abandon_turn("old", s2.turn.id, reason="stale", age=18000.0)
    st.create("live")
    st.begin_turn("live", "working")
    return st


def test_the_command_text_json_and_errors(root: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    _store_with_story(root)
    capsys.readouterr()
    assert main(["timeline", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # not a terminal: no colour
    for sid in ("chat-1", "old", "live"):
        assert sid in out
    assert "abandoned (stale), checkpoint 5.0 h old" in out and "resuming: attempt 1 of 3" in out
    assert main(["timeline", "old", "--root", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["session_id"] for t in doc["turns"]] == ["old"]
    assert main(["timeline", "nope", "--root", str(root)]) == 1
    assert main(["timeline", "--last", "1", "--root", str(root), "--json"]) == 0
    assert [t["session_id"] for t in json.loads(capsys.readouterr().out)["turns"]] == ["live"]


@pytest.mark.parametrize(("no_color", "want"), [(None, True), ("1", False)])
def test_colour_only_on_a_tty_and_never_under_no_color(no_color: str | None, want: bool,
                                                       root: Path) -> None:
    _store_with_story(root)
    env = subprocess_env(COLUMNS="90")
    env.pop("NO_COLOR", None)
    if no_color is not None:
        env["NO_COLOR"] = no_color
    primary, secondary = pty.openpty()
    p = subprocess.Popen([PYTHON, "-m", "fsdurable", "timeline", "--root", str(root)],
                         env=env, cwd=REPO, stdout=secondary, stderr=secondary)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(primary)
    assert p.wait(timeout=60) == 0
    text = b"".join(chunks).decode("utf-8")
    assert ("\x1b[" in text) is want
    assert all(len(line) <= 90 for line in _strip(text).splitlines())


# ---------------------------------------------------------------------- the browser


def _png_colours(data: bytes) -> set[bytes]:
    """The distinct colours of a PNG (8-bit RGB or RGBA, non-interlaced), decoded with zlib."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert header is not None
    w, h, depth, ctype, _, _, interlace = header
    assert depth == 8 and ctype in (2, 6) and interlace == 0, header
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    colours: set[bytes] = set()
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev, strict=True))
        elif f == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                p_ = a + b - c
                pa, pb, pc = abs(p_ - a), abs(p_ - b), abs(p_ - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 255
        colours.update(bytes(line[i:i + 3]) for i in range(0, stride, bpp * 4))
        prev = line
    return colours


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True, timeout=120, env={**os.environ, "HOME": str(tmp_path)})


def test_the_page_in_a_real_browser(root: Path, tmp_path: Path) -> None:
    """Chromium draws the page: a screenshot that is not blank and holds the colours of the
    running stretch, the crash gap and the decisions; the drawn DOM has every turn and decision."""
    need_tools("chromium")
    _store_with_story(root)
    html_file = tmp_path / "timeline.html"
    assert main(["timeline", "--root", str(root), "--html", str(html_file)]) == 0
    text = html_file.read_text("utf-8")
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in text and "<script" not in text  # self-contained, nothing fetched
    png = tmp_path / "shot.png"
    r = _chromium(tmp_path, f"--screenshot={png}", "--window-size=1200,800", html_file.as_uri())
    assert r.returncode == 0 and png.exists(), r.stderr[-2000:]
    colours = _png_colours(png.read_bytes())
    assert len(colours) > 50, len(colours)  # not a blank page
    for hex_ in ("2e9d5b", "c0392b", "d08a00"):  # running/completed, abandoned, resuming
        assert bytes.fromhex(hex_) in colours, hex_
    dom = _chromium(tmp_path, "--dump-dom", html_file.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    drawn = dom.stdout.decode("utf-8")
    for sid in ("chat-1", "old", "live"):
        assert f'data-session="{sid}"' in drawn
    assert drawn.count('class="mark decision"') >= 2  # resuming, abandoned
    assert 'data-code="interrupted_turn_abandoned" data-reason="stale"' in drawn
    assert "crash gap" in drawn and "<title>" in drawn  # hover detail


def test_the_page_escapes_what_it_shows() -> None:
    story = build([Event(T0, ev.TURN_STARTED, "x", "t", "n", detail={"note": "<b>&"}),
                   Event(T0 + 1, ev.ABANDONED, "x", "t", "n", "<script>")], now=T0 + 2)
    text = page(story, title="<i>")
    assert "<script>" not in text and "&lt;script&gt;" in text and "<b>&" not in text


def test_golden_files_are_checked_in() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.txt")) == [
        "ascii-100.txt", "colour-100.txt", "plain-100.txt", "plain-60.txt"]


def test_the_start_drawn_is_the_turn_started_event() -> None:
    """The marker is written a few ms before turn_started is logged: the row began at the
    marker's time and drew a running stretch before its own start glyph."""
    live = Marker(session_id="s", turn_id="t", session_version=2, node_id="n1",
                  route_key="session:s", source="api", started_at=T0 - 0.005,
                  checkpoint_at=T0 - 0.005)
    story = build([Event(T0, ev.TURN_STARTED, "s", "t", "n1")], now=T0 + 60,
                  markers={"s": live}, verdicts={"s": "resume"})
    [t] = story["turns"]
    assert t["start"] == T0
    row = render(story, width=80, tz=UTC).splitlines()[2]
    assert row.split()[1].startswith("▶"), row
