"""``fsdurable timeline --html FILE``: the timeline as one self-contained page.

Inline SVG and CSS, no script, no font, no network: the file opens anywhere, offline, and can be
attached to a bug report. The same story as the terminal (``_timeline.build``): one row per
turn on the shared compressed axis, running stretches, crash gaps, checkpoints, each recovery
decision; hovering a mark shows its time, code, reason and detail (SVG ``<title>``). Below the
drawing, a table lists every decision in words.
"""

from __future__ import annotations

import html
import itertools
import json
import os
from typing import Any

from .. import _events as ev
from . import iso
from ._timeline import _span, axis, story_lines

__all__ = ["page", "write_html"]

LABEL_W, TRACK_W, STATUS_W, ROW_H, TOP = 240, 680, 180, 46, 64
WIDTH = LABEL_W + TRACK_W + STATUS_W + 20
COLOURS = {ev.RESUMING: "#d08a00", ev.RESUMED: "#2e9d5b", ev.RESUME_FAILED: "#c0392b",
           ev.ABANDONED: "#c0392b", ev.SKIPPED: "#d08a00", ev.REVIEW_REQUIRED: "#8e44ad",
           ev.ADOPTED: "#d08a00", ev.TOOL_REFUSED: "#d08a00", ev.REVIEW_ANSWERED: "#8e44ad",
           ev.REVIEW_RERUN: "#8e44ad", ev.CLOCK_STEP: "#d08a00", ev.TURN_PAUSED: "#d08a00",
           ev.TURN_COMPLETED: "#2e9d5b", ev.TURN_CANCELLED: "#c0392b",
           ev.TURN_FAILED: "#c0392b"}
LETTERS = {ev.RESUMING: "R", ev.RESUMED: "R", ev.RESUME_FAILED: "!", ev.ABANDONED: "A",
           ev.SKIPPED: "S", ev.REVIEW_REQUIRED: "?", ev.ADOPTED: "@", ev.TOOL_REFUSED: "#",
           ev.REVIEW_ANSWERED: "?", ev.REVIEW_RERUN: "R", ev.CLOCK_STEP: "~",
           ev.TURN_PAUSED: "‖", ev.TURN_COMPLETED: "✓", ev.TURN_CANCELLED: "✗",
           ev.TURN_FAILED: "!"}
STATUS_COLOURS = {"completed": "#2e9d5b", "abandoned": "#c0392b", "cancelled": "#c0392b",
                  "failed": "#c0392b", "interrupted": "#d08a00",
                  "review": "#8e44ad"}

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px 32px;
       color: #1f2328; background: #fafbfc; }
h1 { font-size: 20px; margin: 0 0 4px; } .sub { color: #59636e; margin: 0 0 16px; }
svg { background: #fff; border: 1px solid #d0d7de; border-radius: 8px; }
svg text { font: 12px system-ui, sans-serif; fill: #1f2328; }
svg .mono { font-family: ui-monospace, "SF Mono", Menlo, monospace; font-size: 11px; }
svg .dim { fill: #59636e; } svg .mark { cursor: default; }
svg .mark:hover circle, svg .mark:hover rect, svg .mark:hover path { stroke: #000;
       stroke-width: 2; }
svg .row:hover .band { fill: #f3f6fa; }
.legend { margin: 10px 0 22px; color: #59636e; } .legend span { margin-right: 16px; }
.legend i { display: inline-block; width: 14px; height: 10px; margin-right: 5px;
            vertical-align: middle; border-radius: 2px; }
table { border-collapse: collapse; background: #fff; border: 1px solid #d0d7de; }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid #eaeef2;
         vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; } td.t { font-family: ui-monospace, monospace;
         font-size: 12px; white-space: nowrap; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _tip(at: float, text: str, reason: str | None, detail: dict[str, Any]) -> str:
    parts = [iso(at), text]
    if reason:
        parts.append(f"reason: {reason}")
    if detail:
        parts.append(json.dumps(detail, ensure_ascii=False, default=str, sort_keys=True))
    return f"<title>{_e(chr(10).join(parts))}</title>"


def _svg(story: dict[str, Any]) -> str:
    pos, ts = axis(story)
    turns = story["turns"]
    height = TOP + ROW_H * len(turns) + 16

    def x(at: float) -> float:
        return round(LABEL_W + 10 + pos(at) * (TRACK_W - 20), 1)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="timeline of turns" '
           'style="max-width:100%;height:auto">',
           '<defs><pattern id="gap" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fdecea"/>'
           '<line x1="0" y1="0" x2="0" y2="6" stroke="#e57368" stroke-width="2"/></pattern>'
           '</defs>',
           f'<text x="14" y="26" font-weight="600">turn</text>'
           f'<text x="{LABEL_W + TRACK_W + 8}" y="26" font-weight="600">outcome</text>',
           f'<line x1="{LABEL_W + 10}" y1="40" x2="{LABEL_W + TRACK_W - 10}" y2="40" '
           'stroke="#8c959f"/>']
    if ts:
        out.append(f'<text class="mono dim" x="{LABEL_W + 10}" y="26">{_e(iso(ts[0]))}</text>'
                   f'<text class="mono dim" x="{LABEL_W + TRACK_W - 10}" y="26" '
                   f'text-anchor="end">{_e(iso(ts[-1]))}</text>')
    for t in ts:
        out.append(f'<line x1="{x(t)}" y1="36" x2="{x(t)}" y2="44" stroke="#8c959f"/>')
    for a, b in itertools.pairwise(ts):
        if b - a >= 60 and x(b) - x(a) > 60:
            out.append(f'<text class="dim" x="{(x(a) + x(b)) / 2}" y="54" '
                       f'text-anchor="middle">{_e(_span(b - a))}</text>')
    for n, t in enumerate(turns):
        y = TOP + n * ROW_H
        mid = y + ROW_H / 2
        out.append(f'<g class="row" data-session="{_e(t["session_id"])}" '
                   f'data-turn="{_e(t["turn_id"])}" data-status="{_e(t["status"])}">')
        out.append(f'<rect class="band" x="1" y="{y}" width="{WIDTH - 2}" height="{ROW_H}" '
                   f'fill="{"#fff" if n % 2 else "#fbfcfd"}"/>')
        out.append(f'<text x="14" y="{mid - 3}">{_e(t["session_id"])}</text>'
                   f'<text class="mono dim" x="14" y="{mid + 12}">turn '
                   f'{_e(t["turn_id"][:12])}</text>')
        end = t["end"] if t["end"] is not None else max(
            [m["at"] for m in t["marks"]] + [g["to"] for g in t["gaps"]])
        x0, x1 = x(t["start"]), x(end)
        out.append(f'<rect x="{x0}" y="{mid - 5}" width="{max(x1 - x0, 2)}" height="10" '
                   f'rx="5" fill="#2e9d5b"><title>{_e("running")}</title></rect>')
        for g in t["gaps"]:
            gx0, gx1 = x(g["from"]), x(g["to"])
            out.append(f'<g class="mark gap"><rect x="{gx0}" y="{mid - 9}" '
                       f'width="{max(gx1 - gx0, 3)}" height="18" rx="3" fill="url(#gap)" '
                       f'stroke="#c0392b" stroke-dasharray="4 3"/>'
                       f'{_tip(g["from"], "crash gap: " + g["label"], None, {})}</g>')
        for m in t["marks"]:
            out.append(_mark(m, x(m["at"]), mid))
        status = t["status"] + (f": {t['reason']}" if t["reason"] else "")
        out.append(f'<text x="{LABEL_W + TRACK_W + 8}" y="{mid + 4}" font-weight="600" '
                   f'fill="{STATUS_COLOURS.get(t["status"], "#1f2328")}">{_e(status)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _mark(m: dict[str, Any], cx: float, cy: float) -> str:
    tip = _tip(m["at"], m["text"], m["reason"], m["detail"])
    kind = m["kind"]
    if kind == "checkpoint":
        shape = f'<circle cx="{cx}" cy="{cy}" r="4" fill="#fff" stroke="#1479b8" stroke-width="2"/>'
    elif kind == "start":
        shape = (f'<path d="M{cx - 5},{cy - 8} L{cx + 7},{cy} L{cx - 5},{cy + 8} Z" '
                 'fill="#1f2328"/>')
    elif kind in ("decision", "end"):
        colour = COLOURS.get(m["code"], "#59636e")
        letter = LETTERS.get(m["code"], "•")
        shape = (f'<circle cx="{cx}" cy="{cy}" r="9" fill="{colour}"/>'
                 f'<text x="{cx}" y="{cy + 4}" text-anchor="middle" font-weight="700" '
                 f'style="fill:#fff">{_e(letter)}</text>')
    else:
        shape = f'<circle cx="{cx}" cy="{cy}" r="3" fill="#8c959f"/>'
    return (f'<g class="mark {_e(kind)}" data-code="{_e(m["code"])}" '
            f'data-reason="{_e(m["reason"] or "")}">{shape}{tip}</g>')


def page(story: dict[str, Any], *, title: str) -> str:
    """The whole page: heading, drawing, legend, the decisions in words."""
    turns = story["turns"]
    rows = []
    for t in turns:
        start = next((m for m in t["marks"] if m["kind"] == "start"), None)
        told = [(start["at"], start["code"], start["text"])] if start else []
        for at, code, text in told + story_lines(t):
            gap = code == "gap"
            rows.append(f'<tr class="{"gap" if gap else "decision"}" data-code="{_e(code)}">'
                        f'<td>{_e(t["session_id"])}</td><td class="t">{_e(iso(at))}</td>'
                        f'<td>{"crash gap: " if gap else ""}{_e(text)}</td></tr>')
    legend = "".join(f'<span><i style="background:{c}"></i>{_e(w)}</span>' for c, w in (
        ("#2e9d5b", "running"), ("repeating-linear-gradient(45deg,#fdecea 0 3px,#e57368 3px "
                                 "5px)", "crash gap: no process ran the turn"),
        ("#1479b8", "checkpoint"), ("#d08a00", "R resume · S skipped"),
        ("#c0392b", "A abandoned · ✗ cancelled"), ("#8e44ad", "? parked for review"),
        ("#2e9d5b", "✓ completed")))
    summary = (f"{len(turns)} turn(s); now {iso(story['now'])}; hover a mark for its detail"
               if turns else "no turns in the event log")
    table = ("<table><thead><tr><th>session</th><th>at</th><th>what happened</th>"
             f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
             if rows else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>fsdurable timeline: {_e(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>fsdurable timeline</h1><p class=\"sub\">{_e(title)} — {_e(summary)}</p>"
            f"{_svg(story) if turns else ''}<div class=\"legend\">{legend}</div>{table}"
            "</body></html>\n")


def write_html(story: dict[str, Any], path: str, *, title: str) -> str:
    """Write the page to ``path`` (replaced atomically, never through a symlink); its path."""
    from .. import _fsio

    where = os.path.abspath(path)
    _fsio.write_atomic(where, page(story, title=title).encode("utf-8"), durable=False)
    return where
