"""CLI commands on the store itself: ``init``, ``sessions``, ``show``, ``events``, ``cancel``,
``doctor`` and ``schema``. Only ``init`` creates a store."""

from __future__ import annotations

import argparse

from . import Result, command, iso, non_negative, not_found, open_store, table


@command("init")
def _init(args: argparse.Namespace) -> Result:
    import os

    from .._layout import default_root

    root = args.root if args.root is not None else default_root()
    existed = os.path.exists(os.path.join(os.path.realpath(root), "fsdurable.json"))
    st = open_store(args, create=True)
    data = {"root": st.root, "store_id": st.manifest.store_id, "format": st.manifest.format,
            "created": not existed, "manifest_problem": st.manifest_problem}
    what = "store" if not existed else "store already exists:"
    text = f"{what} {st.manifest.store_id or '(id unreadable)'} at {st.root}"
    if st.manifest_problem is not None:
        text += (f"\nfsdurable.json cannot be read ({st.manifest_problem}): `fsdurable doctor "
                 "--repair` keeps it in quarantine/ and writes a new one")
    return 0, data, text


@command("sessions")
def _sessions(args: argparse.Namespace) -> Result:
    ids = open_store(args).sessions()
    return 0, {"sessions": ids}, "\n".join(ids) if ids else "(no sessions)"


def _sid_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id", help="the session's id (1-128 of A-Z a-z 0-9 _ -)")


@command("show", args=_sid_args)
def _show(args: argparse.Namespace) -> Result:
    from .._codec import session_to_dict
    from .._review import parked

    s = open_store(args).load(args.session_id)
    d = session_to_dict(s)
    if isinstance(d.get("turn"), dict):  # one vocabulary: turn_id, as everywhere else
        d["turn"] = {"turn_id": d["turn"].pop("id"), **d["turn"]}
    d = {"session_id": d.pop("id"), **d,
         "review_required": [c for c in parked(s) if c["answer"] is None]}
    state = "no turn in progress"
    if s.turn:
        state = (f"turn {s.turn.id} in progress: phase {s.turn.phase}, "
                 f"attempts {s.turn.resume_attempts}")
    lines = [f"session {s.id}  version {s.version}  source {s.source}  route {s.route_key}",
             state, f"{len(s.messages)} messages"]
    if d["review_required"]:
        lines.append(f"PARKED FOR REVIEW: {len(d['review_required'])} call(s) may or may not "
                     f"have run (fsdurable review {s.id})")
    for m in s.messages[-20:]:
        text = m.content if len(m.content) <= 100 else m.content[:97] + "..."
        calls = "".join(f" [{c.name}]" for c in m.tool_calls)
        lines.append(f"  {m.role:>9}: {text}{calls}")
    return 0, d, "\n".join(lines)


def _events_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--session", dest="session_id", default=None, metavar="SESSION_ID",
                   help="only this session's events")
    p.add_argument("--limit", type=non_negative, default=50, metavar="N",
                   help="the last N events (0: all; default 50)")


@command("events", args=_events_args)
def _events(args: argparse.Namespace) -> Result:
    st = open_store(args)
    evs = st.events(args.session_id)
    if args.session_id is not None and not evs and not st.exists(args.session_id):
        raise not_found(st, args.session_id)  # as `show` says it
    if args.limit:
        evs = evs[-args.limit:]
    data = [e.to_dict() for e in evs]
    rows = [[iso(e.at), e.code,
             e.session_id or "", e.reason or ""] for e in evs]
    text = table(rows, ["at", "event", "session", "reason"]) if rows else "(no events)"
    return 0, {"events": data}, text


@command("cancel", args=_sid_args)
def _cancel(args: argparse.Namespace) -> Result:
    from .._review import parked

    st = open_store(args)
    before = st.load(args.session_id)
    after = st.cancel(args.session_id)
    done = before.in_progress and not after.in_progress
    turn = before.turn.id if before.turn else None
    review = [c for c in parked(after) if done and c.get("turn_id") == turn]
    text = (f"cancelled turn {before.turn.id} of {after.id}" if done and before.turn
            else f"{after.id} has no turn in progress")
    if review:
        text += (f"; {len(review)} call(s) may have run and are kept for review "
                 f"(fsdurable review {after.id})")
    return 0, {"session_id": after.id, "cancelled": done, "version": after.version,
               "review_required": review}, text


def _doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repair", action="store_true", help="fix what can be fixed (each an event)")


@command("doctor", args=_doctor_args)
def _doctor(args: argparse.Namespace) -> Result:
    from .._doctor import doctor, problems

    st = open_store(args)
    findings = doctor(st, repair=args.repair)
    left = problems(findings)
    rows = [[f.severity, f.code, f.session_id or "", "repaired" if f.repaired else
             (f.repair or ""), f.path, f.detail] for f in findings]
    text = (table(rows, ["severity", "finding", "session", "repair", "path", "detail"])
            if rows else "")
    text += f"\n{len(findings)} findings, {len(left)} problems left" if rows else "store is healthy"
    return (1 if left else 0), {"findings": [f.to_dict() for f in findings],
                                "problems": len(left)}, text


# the store's own formats, then the framework adapters' (fsdurable.langgraph, .pydantic_ai, .claude)
KINDS = ("session", "marker", "event", "manifest", "lghead", "lgrecord", "pydantic_ai_entry",
         "claude_batch")


def schema_text(kind: str) -> str:
    """A shipped JSON Schema (``fsdurable/schemas/<kind>.schema.json``, in the wheel)."""
    from importlib.resources import files

    return files("fsdurable").joinpath("schemas", f"{kind}.schema.json").read_text("utf-8")


def _schema_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", nargs="?", choices=KINDS, metavar="KIND",
                   help=f"one of {', '.join(KINDS)} (without it: list them)")


@command("schema", args=_schema_args)
def _schema(args: argparse.Namespace) -> Result:
    import json

    if args.kind is None:
        return 0, {"schemas": list(KINDS)}, "\n".join(KINDS)
    text = schema_text(args.kind)
    return 0, json.loads(text), text.rstrip("\n")
