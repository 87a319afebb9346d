"""CLI command ``timeline [SESSION]``: recovery as a story over time, from the event log.

One row per turn, time left to right: where it started, its checkpoints, where it ran, the gap
where no process ran it (it crashed or was stopped), each recovery decision with its reason, and
how it ended. The model (``build``) is plain data (``--json`` prints it); ``render`` draws it for
a terminal (width-aware, colour only on a TTY and never under ``NO_COLOR``); ``--html FILE``
writes a self-contained page (``_timeline_html``).

Time is drawn on one compressed axis shared by every row: each interval between two moments gets
a width that grows with the logarithm of its length, so a five-hour-old checkpoint and a resume a
second later both stay visible (the axis says how long a long stretch really was).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from .. import _events as ev
from . import Result, command, iso, non_negative, not_found, open_store

__all__ = ["axis", "build", "colour_wanted", "describe", "render", "story_lines", "story_of"]

# a pass of recovery picked the turn up: before it, no process ran the turn (the crash gap)
PICKED_UP = frozenset({ev.RESUMING, ev.ABANDONED, ev.SKIPPED, ev.REVIEW_REQUIRED, ev.ADOPTED})
DECISIONS = PICKED_UP | {ev.RESUMED, ev.RESUME_FAILED, ev.TOOL_REFUSED, ev.REVIEW_ANSWERED,
                         ev.REVIEW_RERUN, ev.CLOCK_STEP, ev.TURN_PAUSED}
ENDS = {ev.TURN_COMPLETED: "completed", ev.TURN_CANCELLED: "cancelled",
        ev.TURN_FAILED: "failed", ev.ABANDONED: "abandoned"}

# glyph per mark: (unicode, ascii, colour)
GLYPHS: dict[str, tuple[str, str, str]] = {
    "start": ("▶", ">", "1"), "checkpoint": ("•", "o", "36"), "run": ("━", "=", "32"),
    "gap": ("╌", ".", "31"), ev.RESUMING: ("R", "R", "1;33"), ev.RESUMED: ("R", "R", "1;32"),
    ev.RESUME_FAILED: ("!", "!", "1;31"), ev.ABANDONED: ("A", "A", "1;31"),
    ev.SKIPPED: ("S", "S", "1;33"), ev.REVIEW_REQUIRED: ("?", "?", "1;35"),
    ev.ADOPTED: ("@", "@", "1;33"), ev.TOOL_REFUSED: ("#", "#", "1;33"),
    ev.REVIEW_ANSWERED: ("?", "?", "35"), ev.REVIEW_RERUN: ("R", "R", "35"),
    ev.CLOCK_STEP: ("~", "~", "33"), ev.TURN_PAUSED: ("‖", "|", "33"),
    ev.TURN_COMPLETED: ("✓", "+", "1;32"), ev.TURN_CANCELLED: ("✗", "x", "1;31"),
    ev.TURN_FAILED: ("!", "!", "1;31"),
}
LEGEND = [("start", "start"), ("checkpoint", "checkpoint"), ("run", "running"),
          ("gap", "crash gap (no process ran the turn)"), (ev.RESUMING, "resume"),
          (ev.ABANDONED, "abandoned"), (ev.SKIPPED, "skipped"),
          (ev.REVIEW_REQUIRED, "parked for review"), (ev.TURN_COMPLETED, "completed"),
          (ev.TURN_CANCELLED, "cancelled")]


def describe(code: str, reason: str | None, d: dict[str, Any]) -> str:
    """One event in words, with its reason (what a row's decision lines say)."""
    why = f" ({reason})" if reason else ""
    if code == ev.RESUMING:
        return (f"resuming: attempt {d.get('attempt', '?')} of {d.get('cap', '?')}"
                + (", adopted" if d.get("adopted") else ""))
    if code == ev.RESUMED:
        return f"resumed: {d.get('status') or 'done'} (attempt {d.get('attempt', '?')})"
    if code == ev.RESUME_FAILED:
        return f"resume failed: {d.get('error', '?')}"
    if code == ev.ABANDONED:
        age = d.get("age")
        old = f", checkpoint {_span(float(age))} old" if isinstance(age, (int, float)) else ""
        return f"abandoned{why}{old}"
    if code == ev.REVIEW_REQUIRED:
        calls = d.get("calls") or d.get("tools")
        n = f", {len(calls)} call(s)" if isinstance(calls, list) else ""
        return f"parked for review{why}{n}: a call may or may not have run"
    if code == ev.SKIPPED:
        return f"skipped{why}: found, kept, not run"
    if code == ev.TOOL_REFUSED:
        return f"tool {d.get('tool', '?')} refused{why}"
    if code == ev.ADOPTED:
        return f"adopted from node {d.get('from_node', '?')}{why}"
    if code == ev.TURN_STARTED:
        return "started" + (" (attended)" if d.get("attended") else "")
    return code.replace("_", " ") + why


def _span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s" if seconds >= 0.1 else f"{seconds * 1000:.0f} ms"


# ---------------------------------------------------------------------- the model


def build(events: list[Any], *, now: float, markers: dict[str, Any] | None = None,
          verdicts: dict[str, str] | None = None, turns_now: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    """The story: one dict per turn (oldest first) with its marks, gaps, status and reason.

    ``markers``/``verdicts``: the interrupted turns as they are now (a turn with a marker and no
    end is open: its gap runs to ``now``); ``turns_now``: a session's current turn (its ledger's
    intent and outcome times are checkpoints)."""
    markers, verdicts, turns_now = markers or {}, verdicts or {}, turns_now or {}
    turns: dict[tuple[str, str], list[Any]] = {}
    other = 0
    for e in sorted(events, key=lambda e: e.at):
        if e.session_id and e.turn_id:
            turns.setdefault((e.session_id, e.turn_id), []).append(e)
        else:
            other += 1
    for sid, m in markers.items():
        turns.setdefault((sid, m.turn_id), [])
    out = [_turn(sid, tid, evs, now, markers.get(sid), verdicts.get(sid), turns_now.get(sid))
           for (sid, tid), evs in turns.items()]
    out.sort(key=lambda t: (t["start"], t["session_id"]))
    return {"now": now, "turns": out, "other_events": other}


def _turn(sid: str, tid: str, evs: list[Any], now: float, marker: Any, verdict: str | None,
          current: Any) -> dict[str, Any]:
    marks: list[dict[str, Any]] = []
    gaps: list[dict[str, Any]] = []
    live = marker is not None and marker.turn_id == tid
    checkpoints: list[float] = []
    begun = [marker.started_at] if live else []
    if live:
        checkpoints.append(marker.checkpoint_at)
    if current is not None and current.id == tid:
        begun.append(current.started_at)
        checkpoints.append(current.checkpoint_at)
        for entry in current.ledger:
            checkpoints += [t for t in (entry.intent_at, entry.outcome_at) if t is not None]
    if begun:  # a checkpoint at the start itself is the start
        checkpoints = [c for c in checkpoints if c > min(begun) + 1e-3]
    last: float | None = None  # the last sign of the turn's own process
    status, reason, end = ("open", None, None)
    for e in evs:
        detail = dict(e.detail)
        age = detail.get("age")
        if e.code == ev.ABANDONED and isinstance(age, (int, float)):
            checkpoints.append(e.at - float(age))  # the checkpoint the verdict judged
        if e.code in PICKED_UP and last is not None:
            since = max([last, *[c for c in checkpoints if last <= c <= e.at]])
            if e.at > since:
                gaps.append({"from": since, "to": e.at, "open": False,
                             "label": f"no process ran the turn for {_span(e.at - since)}"})
        kind = ("start" if e.code == ev.TURN_STARTED else "decision" if e.code in DECISIONS
                else "end" if e.code in ENDS else "event")
        marks.append({"at": e.at, "kind": kind, "code": e.code, "reason": e.reason,
                      "text": describe(e.code, e.reason, detail), "node_id": e.node_id,
                      "detail": detail})
        last = e.at
        if e.code in ENDS:
            status, reason, end = ENDS[e.code], e.reason, e.at
        elif e.code == ev.REVIEW_REQUIRED and status == "open":
            status, reason = "review", e.reason
        elif e.code == ev.TURN_PAUSED and status == "open":
            status = "paused"
    for c in sorted(set(checkpoints)):
        marks.append({"at": c, "kind": "checkpoint", "code": "checkpoint", "reason": None,
                      "text": "checkpoint (committed)", "node_id": None, "detail": {}})
    marks.sort(key=lambda m: m["at"])
    started = [m["at"] for m in marks if m["kind"] == "start"]
    # the turn_started event is the start drawn; the marker's own start time (a few ms before
    # it) only stands in when the log has no such event
    start = started[0] if started else min([m["at"] for m in marks] + begun) if marks or begun \
        else now
    if live and end is None:
        status, reason = "interrupted", verdict
    if live and end is None and now > max([m["at"] for m in marks] + [start]):
        since = max([m["at"] for m in marks] + [start])
        gaps.append({"from": since, "to": now, "open": True,
                     "label": f"no end yet ({_span(now - since)}): interrupted or still "
                              f"running; verdict {verdict or '?'}"})
    return {"session_id": sid, "turn_id": tid, "start": start, "end": end, "status": status,
            "reason": reason, "marks": marks, "gaps": gaps}


def axis(story: dict[str, Any]) -> tuple[Callable[[float], float], list[float]]:
    """Position in [0, 1] of a time on the compressed axis, and the moments it is built on."""
    ts = sorted({m["at"] for t in story["turns"] for m in t["marks"]}
                | {g[k] for t in story["turns"] for g in t["gaps"] for k in ("from", "to")})
    if len(ts) < 2:
        return (lambda t: 0.0), ts
    cum = [0.0]
    for a, b in itertools.pairwise(ts):
        cum.append(cum[-1] + 0.4 + math.log1p((b - a) / 0.05))
    total = cum[-1]

    def pos(t: float) -> float:
        i = min(max(bisect.bisect_right(ts, t) - 1, 0), len(ts) - 2)
        a, b = ts[i], ts[i + 1]
        frac = min(max((t - a) / (b - a), 0.0), 1.0)
        return float((cum[i] + frac * (cum[i + 1] - cum[i])) / total)

    return pos, ts


# ---------------------------------------------------------------------- the terminal


def colour_wanted(stream: Any) -> bool:
    """Colour only on a terminal, and never under NO_COLOR (https://no-color.org)."""
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def render(story: dict[str, Any], *, width: int, colour: bool = False, unicode: bool = True,
           tz: Any = None) -> str:
    """The story for a terminal ``width`` columns wide: one row per turn, then its decisions."""
    turns = story["turns"]
    if not turns:
        return "(no turns in the event log)"
    pos, ts = axis(story)

    def paint(text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text

    def glyph(name: str) -> tuple[str, str]:
        u, a, c = GLYPHS.get(name, ("*", "*", ""))
        return (u if unicode else a), c

    label_w = max(12, min(24, width // 5))
    status_w = max(10, min(24, width // 5))
    track_w = max(10, width - label_w - status_w - 2)
    indent = label_w + 3 if width >= 90 else 4  # the story lines: under the track when it fits
    first_at, last_at = (ts[0], ts[-1]) if ts else (story["now"], story["now"])
    lines = [f"{'turn':<{label_w}} {_ends(iso(first_at, tz), iso(last_at, tz), track_w)}",
             f"{'':<{label_w}} {_ticks(pos, ts, track_w, unicode)}"]
    for t in turns:
        cells: list[tuple[str, str]] = [(" ", "")] * track_w

        def col(at: float) -> int:
            return min(track_w - 1, round(pos(at) * (track_w - 1)))

        first = col(t["start"])
        last = col(t["end"] if t["end"] is not None else max(
            [m["at"] for m in t["marks"]] + [g["to"] for g in t["gaps"]]))
        for i in range(first, last + 1):
            cells[i] = glyph("run")
        for g in t["gaps"]:
            for i in range(col(g["from"]), col(g["to"]) + 1):
                cells[i] = glyph("gap")
        rank = {"checkpoint": 0, "event": 1, "start": 2, "end": 3, "decision": 4}
        for m in sorted(t["marks"], key=lambda m: rank[m["kind"]]):
            if m["kind"] != "event":
                cells[col(m["at"])] = glyph("checkpoint" if m["kind"] == "checkpoint" else
                                            "start" if m["kind"] == "start" else m["code"])
        label = _middle(t["session_id"], label_w)
        status = t["status"] + (f": {t['reason']}" if t["reason"] else "")
        track = "".join(paint("".join(ch for ch, _ in run), c)  # one code per same-colour run
                        for c, run in itertools.groupby(cells, key=lambda cell: cell[1]))
        lines.append(f"{label:<{label_w}} {track} {paint(_fit(status, status_w), _tone(t))}")
        for at, name, text in story_lines(t):
            ch, c = glyph(name)
            mark = ch * 3 if name == "gap" else ch
            head = f"{'':<{indent}}{iso(at, tz)}  "
            room = width - len(head) - len(mark) - 1
            lines.append(f"{head}{paint(mark, c)} {_fit(text, max(room, 10))}")
    lines.append("")
    row: list[str] = []
    used = 0
    for k, text in LEGEND:  # wrapped to the width
        ch, c = glyph(k)
        if row and used + len(text) + 4 > width:
            lines.append("  ".join(row))
            row, used = [], 0
        row.append(f"{paint(ch, c)} {text}")
        used += len(text) + 4
    lines.append("  ".join(row))
    if story["other_events"]:
        lines.append(f"{story['other_events']} event(s) about no turn: fsdurable events")
    text = "\n".join(line.rstrip() for line in lines)
    return text if unicode else text.replace("…", "~")


def story_lines(t: dict[str, Any]) -> list[tuple[float, str, str]]:
    """A turn's story in words, oldest first: (time, glyph name, text) for each decision, end
    and gap (a gap is told at its start, before the decision that ended it)."""
    told = [(g["to"], 0, g["from"], "gap", g["label"]) for g in t["gaps"]]
    told += [(m["at"], 1, m["at"], m["code"], m["text"]) for m in t["marks"]
             if m["kind"] in ("decision", "end")]
    return [(at, name, text) for _, _, at, name, text in sorted(told, key=lambda x: x[:2])]


def _middle(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` (a session id's distinct part is often its end)."""
    if len(text) <= width:
        return text
    keep = width - 1
    return text[:keep // 2] + "…" + text[len(text) - (keep - keep // 2):]


def _tone(t: dict[str, Any]) -> str:
    return {"completed": "32", "abandoned": "31", "cancelled": "31", "failed": "31",
            "interrupted": "33", "review": "35"}.get(t["status"], "")


def _fit(text: str, width: int, raw_extra: int = 0) -> str:
    """``text`` cut to ``width`` visible characters (``raw_extra``: invisible colour codes)."""
    if len(text) - raw_extra <= width:
        return text
    return text[:max(1, width + raw_extra - 1)] + "…"


def _ends(left: str, right: str, width: int) -> str:
    if len(left) + len(right) + 1 > width:
        return _fit(left, width)
    return left + " " * (width - len(left) - len(right)) + right


def _ticks(pos: Callable[[float], float], ts: list[float], width: int, unicode: bool) -> str:
    """The axis: a tick per moment, and how long each long stretch really was."""
    line = ["─" if unicode else "-"] * width
    for t in ts:
        line[min(width - 1, round(pos(t) * (width - 1)))] = "┬" if unicode else "+"
    for a, b in itertools.pairwise(ts):
        if b - a >= 60:
            text = f" {_span(b - a)} "
            i, j = (round(pos(x) * (width - 1)) for x in (a, b))
            if j - i - 1 >= len(text):
                mid = i + 1 + (j - i - 1 - len(text)) // 2
                line[mid:mid + len(text)] = list(text)
    return "".join(line)


# ---------------------------------------------------------------------- the command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id", nargs="?", default=None,
                   help="one session's turns (without it: the whole store's)")
    p.add_argument("--html", metavar="FILE", default=None,
                   help="also write a self-contained page (inline SVG, no network) to FILE")
    p.add_argument("--last", type=non_negative, default=20, metavar="N",
                   help="the last N turns (0: all; default 20)")


def story_of(st: Any, session_id: str | None) -> dict[str, Any]:
    """The store's (or one session's) story, from its event log and its interrupted turns."""
    from .._gates import RecoveryPolicy, verdict

    events = st.events(session_id)
    markers, _bad = st.scan_markers()
    if session_id is not None:
        markers = [m for m in markers if m.session_id == session_id]
        if not events and not markers and not st.exists(session_id):
            raise not_found(st, session_id)
    now = st.clock()
    pol = RecoveryPolicy.from_config(st.config)
    current = {}
    if session_id is not None and st.exists(session_id):
        s = st.load(session_id)
        if s.turn is not None:
            current[session_id] = s.turn
    return build(events, now=now, markers={m.session_id: m for m in markers},
                 verdicts={m.session_id: verdict(m, node_id=st.node_id, now=now, policy=pol)
                           for m in markers}, turns_now=current)


@command("timeline", args=_args)
def _timeline(args: argparse.Namespace) -> Result:
    import shutil

    st = open_store(args)
    story = story_of(st, args.session_id)
    if args.last:
        story["turns"] = story["turns"][-args.last:]
    text = render(story, width=shutil.get_terminal_size((100, 24)).columns,
                  colour=colour_wanted(sys.stdout), unicode=_can_draw(sys.stdout))
    if args.html is not None:
        from ._timeline_html import write_html

        where = write_html(story, args.html, title=args.session_id or st.root)
        story["html"] = where
        text += f"\nwrote {where}"
    return 0, story, text


def _can_draw(stream: Any) -> bool:
    try:
        "━╌▶•✓✗".encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True
