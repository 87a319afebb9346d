"""CLI commands on the store itself: ``init``, ``sessions``, ``show``, ``events``, ``cancel``,
``doctor`` and ``schema``. Only ``init`` creates a store."""

from __future__ import annotations

import argparse
from typing import Any

from . import Progress, Result, command, iso, non_negative, not_found, open_store, table

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


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


def _threads(st: Any, ids: list[str]) -> dict[str, str]:
    """The LangGraph thread id of each thread session (``lg-<hash>``) that can be read."""
    from .._errors import FsDurableError
    from .._lgstore import PREFIX, describe

    out = {}
    for sid in ids:
        if sid.startswith(PREFIX):
            try:
                out[sid] = describe(st.load(sid))["thread_id"]
            except (FsDurableError, OSError):
                continue  # listed without its name: `fsdurable doctor` reports the file
    return out


@command("sessions")
def _sessions(args: argparse.Namespace) -> Result:
    st = open_store(args)
    ids = st.sessions()
    threads = _threads(st, ids)
    text = "\n".join(f"{sid}  (LangGraph thread {threads[sid]!r})" if sid in threads else sid
                     for sid in ids)
    data: dict[str, Any] = {"sessions": ids}
    if threads:  # a LangGraph thread's session is named lg-<hash>: here is its thread id
        data["langgraph_threads"] = threads
    return 0, data, text or "(no sessions)"


def _sid_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id", help="the session's id (1-128 of A-Z a-z 0-9 _ -), or a "
                   "LangGraph thread id")


def _load_named(st: Any, name: str) -> Any:
    """A session by its id, or a LangGraph thread's session by its thread id."""
    from .._errors import InvalidSessionId, SessionNotFound
    from .._lgstore import thread_session_id

    try:
        return st.load(name)
    except (SessionNotFound, InvalidSessionId):
        alt = thread_session_id(name)
        if not st.exists(alt):
            raise
        return st.load(alt)


@command("show", args=_sid_args)
def _show(args: argparse.Namespace) -> Result:
    from .._codec import _conv, session_to_dict
    from .._errors import HistoryUnavailable
    from .._review import parked

    st = open_store(args)
    s = _load_named(st, args.session_id)
    d = session_to_dict(s)
    last: tuple[Any, ...] = ()
    try:  # the transcript is read from the session's segments (docs/storage.md)
        d["messages"] = [_conv().unstructure(m) for m in s.messages]
        last = tuple(s.messages[-20:])
    except HistoryUnavailable as e:  # the document still shows: its turn, its metadata
        d["messages"], d["history_error"] = None, e.reason
    if isinstance(d.get("turn"), dict):  # one vocabulary: turn_id, as everywhere else
        d["turn"] = {"turn_id": d["turn"].pop("id"), **d["turn"]}
    d = {"session_id": d.pop("id"), **d,
         "review_required": [c for c in parked(s) if c["answer"] is None]}
    state = "no turn in progress"
    if s.turn:
        state = (f"turn {s.turn.id} in progress: phase {s.turn.phase}, "
                 f"attempts {s.turn.resume_attempts}")
    count = "history unreadable" if "history_error" in d else f"{len(s.messages)} messages"
    lines = [f"session {s.id}  version {s.version}  source {s.source}  route {s.route_key}",
             state, count]
    if "langgraph" in s.metadata:
        from .._errors import UnreadableState
        from .._lgstore import Threads, describe

        try:  # the head as it stands: the thread's log holds the puts since the document
            d["langgraph"] = lg = describe(s, Threads(st).head(s))
            lines.insert(1, f"LangGraph thread {lg['thread_id']!r}, run {lg['run']}, "
                         f"{lg['records']} records")
        except UnreadableState:
            pass
    if d["review_required"]:
        lines.append(f"PARKED FOR REVIEW: {len(d['review_required'])} call(s) may or may not "
                     f"have run (fsdurable review {s.id})")
    if "history_error" in d:
        lines.append(f"history unreadable: {d['history_error']} (fsdurable doctor)")
    for m in last:
        text = m.content if len(m.content) <= 100 else m.content[:97] + "..."
        calls = "".join(f" [{c.name}]" for c in m.tool_calls)
        lines.append(f"  {m.role:>9}: {text}{calls}")
    adapter = _adapter(st, s)
    if adapter is not None:
        d["adapter"] = adapter
        lines[lines.index(count)] = _adapter_line(adapter)
        if adapter.get("last"):
            lines += [f"  {m['kind']:>9}: {m['text'][:100]}" for m in adapter["last"]]
    return 0, d, "\n".join(lines)


def _adapter(st: Any, s: Any) -> dict[str, Any] | None:
    """What an Agents SDK or Pydantic AI session's adapter says of it (each adapter's own
    ``describe``: this module parses no adapter format); None for any other session (a
    LangGraph thread's head is described above)."""
    from .._records import driver_of

    owner = driver_of(s.turn.driver if s.turn else "", s.source)
    try:
        if owner == "openai-agents":
            from ..openai_agents import describe as describe_oa

            return describe_oa(st, s)
        if owner == "pydantic-ai":
            from ..pydantic_ai import describe as describe_pa

            return describe_pa(st, s)
        if owner == "adk" or isinstance(s.metadata.get("adk"), dict):
            from ..adk import describe as describe_adk

            return describe_adk(s)
    except ImportError as e:  # the framework is not installed here: say so, show the rest
        return {"kind": f"{owner} session", "unread": f"{e.name} is not installed "
                f"(pip install 'fsdurable[{owner}]' to read it)"}
    return None


def _adapter_line(a: dict[str, Any]) -> str:
    if "unread" in a:
        return f"{a['kind']}: {a['unread']}"
    if a["kind"] == "adk session":
        return (f"ADK session of app {a['app_name']!r}, user {a['user_id']!r}: "
                f"{a['events']} events" + (f", invocation {a['run']}" if a.get("run") else ""))
    if a["kind"] == "openai-agents session":
        return f"Agents SDK session: {a['items']} items" + (
            f", run {a['run']}" if a.get("run") else "")
    return f"Pydantic AI conversation: {a['messages']} messages"


def _events_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--session", dest="session_id", default=None, metavar="SESSION_ID",
                   help="only this session's events")
    p.add_argument("--limit", type=non_negative, default=50, metavar="N",
                   help="the last N events (0: all; default 50)")
    p.add_argument("--since", type=since, default=None, metavar="WHEN",
                   help="only events at or after WHEN: an ISO 8601 time (without an offset: "
                        "local time) or an age such as 30s, 10m, 2h, 7d")
    p.add_argument("--code", action="append", default=None, metavar="CODE",
                   help="only events of this code (repeat it, or CODE,CODE; e.g. "
                        "interrupted_turn_abandoned)")
    p.add_argument("--follow", action="store_true",
                   help="then print each new event as it is written, until Ctrl-C (--json: "
                        "JSON Lines, one event per line)")


def since(text: str) -> float:
    """argparse type: a time (ISO 8601; local without an offset) or an age back from now."""
    import argparse
    import datetime
    import re
    import time

    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d)", text.strip())
    if m:
        unit = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}[m.group(2)]
        return time.time() - float(m.group(1)) * unit
    try:
        when = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time (2026-12-01T09:30:00+01:00) nor an age "
            "(30s, 10m, 2h, 7d)") from None
    return when.timestamp()  # a naive time is local, as a person typing it means


def _wanted(args: argparse.Namespace) -> Any:
    codes = {c.strip() for arg in args.code or () for c in arg.split(",") if c.strip()}
    return lambda e: ((args.since is None or e.at >= args.since)
                      and (not codes or e.code in codes))


@command("events", args=_events_args)
def _events(args: argparse.Namespace) -> Result:
    st = open_store(args)
    evs = st.events(args.session_id)
    if args.session_id is not None and not evs and not st.exists(args.session_id):
        raise not_found(st, args.session_id)  # as `show` says it
    wanted = _wanted(args)
    evs = [e for e in evs if wanted(e)]
    if args.limit:
        evs = evs[-args.limit:]
    if args.follow:
        return _follow(args, st, evs, wanted)
    data = [e.to_dict() for e in evs]
    rows = [[iso(e.at), e.code, e.session_id or "", e.reason or ""] for e in evs]
    text = table(rows, ["at", "event", "session", "reason"]) if rows else "(no events)"
    return 0, {"events": data}, text


def _follow(args: argparse.Namespace, st: Any, shown: list[Any], wanted: Any) -> Result:
    """Print ``shown``, then every new event as it lands (polled: the log is plain files, and
    a sync tool brings other nodes' lines the same way), until Ctrl-C."""
    import json
    import sys
    import time

    def say(e: Any) -> None:
        if args.json:
            print(json.dumps(e.to_dict(), default=str, ensure_ascii=False), flush=True)
        else:
            print(f"{iso(e.at)}  {e.code}  {e.session_id or ''}  {e.reason or ''}".rstrip(),
                  flush=True)

    seen = {_key(e) for e in shown}
    for e in shown:
        say(e)
    print(f"fsdurable: following the event log of {st.root} (Ctrl-C to stop)", file=sys.stderr,
          flush=True)
    while True:
        time.sleep(0.5)
        for e in st.events(args.session_id):
            if _key(e) not in seen and wanted(e) and e.code != "event_log_damaged":
                seen.add(_key(e))
                say(e)


def _key(e: Any) -> tuple[Any, ...]:
    return (e.at, e.code, e.session_id, e.turn_id, e.node_id, e.reason)


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
    with Progress(args, "doctor: " + ("scanning and repairing" if args.repair else "scanning")
                  + f" {st.root}") as shown:
        findings = doctor(st, repair=args.repair, progress=shown.update)
    left = problems(findings)
    rows = [[f.severity, f.code, f.session_id or "", "repaired" if f.repaired else
             (f.repair or ""), f.path, f.detail] for f in findings]
    text = (table(rows, ["severity", "finding", "session", "repair", "path", "detail"])
            if rows else "")
    text += f"\n{len(findings)} findings, {len(left)} problems left" if rows else "store is healthy"
    return (1 if left else 0), {"findings": [f.to_dict() for f in findings],
                                "problems": len(left)}, text


# the store's own formats, then the framework adapters' (fsdurable.langgraph, .openai_agents,
# .pydantic_ai, .claude)
KINDS = ("session", "segment", "marker", "event", "manifest", "lghead", "lgrecord", "lglog",
         "lgframe", "itemlog", "itemframe", "pydantic_ai_entry", "claude_batch")


def schema_text(kind: str) -> str:
    """A JSON Schema as installed: the wheel ships the top-level ``schemas/`` (their one source)
    as ``fsdurable/schemas/``; a source checkout has them beside the package."""
    from importlib.resources import files

    name = f"{kind}.schema.json"
    installed = files("fsdurable").joinpath("schemas", name)
    if installed.is_file():
        return installed.read_text("utf-8")
    return files("fsdurable").joinpath("..", "schemas", name).read_text("utf-8")


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
