"""The ``fsdurable`` command line. In-process: ``main(argv=None) -> exit code``.

Exit codes: 0 ok, 1 problems found (or an operation refused), 2 usage error.
Every command takes ``--json`` and then prints exactly one JSON document on stdout.
Store root: ``--root``, else ``FSDURABLE_ROOT``, else the user data dir.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._errors import FsDurableError, InvalidSessionId

# A handler gets the parsed args and returns (exit code, data for --json, text for humans).
Result = tuple[int, Any, str]
Handler = Callable[[argparse.Namespace], Result]
_COMMANDS: dict[str, tuple[Handler, str, Callable[[argparse.ArgumentParser], None]]] = {}


def command(name: str, help: str, args: Callable[[argparse.ArgumentParser], None] | None = None
            ) -> Callable[[Handler], Handler]:
    """Register a subcommand (modules add theirs with this decorator)."""

    def register(fn: Handler) -> Handler:
        _COMMANDS[name] = (fn, help, args or (lambda p: None))
        return fn

    return register


def open_store(args: argparse.Namespace, *, create: bool = True) -> Any:
    from ._store import Store

    return Store(args.root, create=create)


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain text table (no dependency): columns padded to their widest cell."""
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------------- commands


@command("init", "create the store (or open an existing one) and print where it is")
def _init(args: argparse.Namespace) -> Result:
    st = open_store(args)
    data = {"root": st.root, "store_id": st.manifest.store_id, "format": st.manifest.format}
    return 0, data, f"store {st.manifest.store_id} at {st.root}"


@command("sessions", "list session ids (one listing; foreign files skipped)")
def _sessions(args: argparse.Namespace) -> Result:
    ids = open_store(args).sessions()
    return 0, {"sessions": ids}, "\n".join(ids) if ids else "(no sessions)"


def _show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id")


@command("show", "print one session", _show_args)
def _show(args: argparse.Namespace) -> Result:
    from ._codec import session_to_dict

    s = open_store(args).load(args.session_id)
    d = session_to_dict(s)
    lines = [f"session {s.id}  version {s.version}  source {s.source}  route {s.route_key}",
             f"in progress: {s.in_progress}" + (f" (turn {s.turn.id}, phase {s.turn.phase}, "
                                                f"attempts {s.turn.resume_attempts})"
                                                if s.turn else ""),
             f"{len(s.messages)} messages"]
    for m in s.messages[-20:]:
        text = m.content if len(m.content) <= 100 else m.content[:97] + "..."
        calls = "".join(f" [{c.name}]" for c in m.tool_calls)
        lines.append(f"  {m.role:>9}: {text}{calls}")
    return 0, d, "\n".join(lines)


@command("interrupted", "list the interrupted turns (markers) with their age")
def _interrupted(args: argparse.Namespace) -> Result:
    st = open_store(args)
    now = time.time()
    markers = st.interrupted()
    data = [{"session_id": m.session_id, "turn_id": m.turn_id, "node_id": m.node_id,
             "route_key": m.route_key, "source": m.source, "checkpoint_at": m.checkpoint_at,
             "age_seconds": round(now - m.checkpoint_at, 3),
             "resume_attempts": m.resume_attempts} for m in markers]
    rows = [[d["session_id"], _age(d["age_seconds"]), str(d["resume_attempts"]), d["node_id"]]
            for d in data]
    text = table(rows, ["session", "age", "attempts", "node"]) if rows else "(none)"
    return 0, {"interrupted": data}, text


def _events_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--session", dest="session_id", default=None, help="only this session")
    p.add_argument("--limit", type=int, default=50, help="the last N events (0: all)")


@command("events", "print the event log (every node's), oldest first", _events_args)
def _events(args: argparse.Namespace) -> Result:
    evs = open_store(args).events(args.session_id)
    if args.limit:
        evs = evs[-args.limit:]
    data = [e.to_dict() for e in evs]
    rows = [[time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at)), e.code,
             e.session_id or "", e.reason or ""] for e in evs]
    text = table(rows, ["at", "event", "session", "reason"]) if rows else "(no events)"
    return 0, {"events": data}, text


@command("cancel", "cancel a session's turn in progress: it never resumes", _show_args)
def _cancel(args: argparse.Namespace) -> Result:
    st = open_store(args)
    before = st.load(args.session_id)
    after = st.cancel(args.session_id)
    done = before.in_progress and not after.in_progress
    text = (f"cancelled turn {before.turn.id} of {after.id}" if done and before.turn
            else f"{after.id} has no turn in progress")
    return 0, {"session_id": after.id, "cancelled": done, "version": after.version}, text


def _doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repair", action="store_true", help="fix what can be fixed (each an event)")


@command("doctor", "scan the whole store and report every problem", _doctor_args)
def _doctor(args: argparse.Namespace) -> Result:
    from ._doctor import doctor, problems

    findings = doctor(open_store(args), repair=args.repair)
    left = problems(findings)
    rows = [[f.severity, f.code, f.session_id or "", "repaired" if f.repaired else
             (f.repair or ""), f.detail] for f in findings]
    text = table(rows, ["severity", "finding", "session", "repair", "detail"]) if rows else ""
    text += f"\n{len(findings)} findings, {len(left)} problems left" if rows else "store is healthy"
    return (1 if left else 0), {"findings": [f.to_dict() for f in findings],
                                "problems": len(left)}, text


# ---------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", default=argparse.SUPPRESS,
                        help="store directory (default: $FSDURABLE_ROOT, else the user data dir)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print one JSON document")
    p = argparse.ArgumentParser(prog="fsdurable", parents=[common],
                                description="Crash-durable agent turns on plain files.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text, add_args) in _COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, parents=[common], description=help_text)
        add_args(sp)
    return p


# Modules that add commands with @command, imported before parsing: recovery (`recover`, and the
# verdicts of `interrupted`, by re-registering it), the demo (`demo`), sync (`adopt`, `resolve`,
# `watch`). A module that is not there yet is skipped.
PLUGINS = ("._recovery_cli", ".demo", "._sync_cli")


def _load_plugins() -> None:
    import importlib

    for mod in PLUGINS:
        try:
            importlib.import_module(mod, __package__)
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}{mod}":
                raise


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (0 ok, 1 problems, 2 usage)."""
    _load_plugins()
    p = _parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else 2
    args.root = getattr(args, "root", None)
    args.json = getattr(args, "json", False)
    if not args.command:
        p.print_help(sys.stderr)
        return 2
    handler = _COMMANDS[args.command][0]
    try:
        try:
            code, data, text = handler(args)
        except InvalidSessionId as e:
            _error(args, e)
            return 2
        except FsDurableError as e:
            _error(args, e)
            return 1
        if args.json and data is not None:  # None: the command streamed its own (JSON Lines)
            print(json.dumps(data, indent=2, default=str, ensure_ascii=False))
        elif text:
            print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `fsdurable events | head`: the reader left, which is no error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush stays quiet
        return 0
    return code


def _error(args: argparse.Namespace, e: FsDurableError) -> None:
    if args.json:
        print(json.dumps(e.to_dict(), indent=2))
    print(f"fsdurable: {e}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
