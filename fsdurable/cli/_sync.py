"""CLI commands of sync: ``adopt``, ``resolve``, ``conflicts`` and ``watch``.

``watch`` streams: one line per change (``--json``: one JSON object per line, JSON Lines) until
Ctrl-C, ``--count`` changes or ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import threading
from typing import Any

from . import Result, command, iso, non_negative, not_found, open_store, table, usage


def _sid_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id", help="the session's id")


def _adopt_args(p: argparse.ArgumentParser) -> None:
    _sid_arg(p)
    p.add_argument("--host", metavar="MODULE:FACTORY", default=None,
                   help="build the host loop with FACTORY(store) and resume the turn now "
                        "(unattended); without it the turn is left for this node's recovery")


def _host(spec: str, store: Any) -> Any:
    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        usage(f"--host wants MODULE:FACTORY (e.g. myagent.host:build), got {spec!r}")
    try:
        factory = getattr(importlib.import_module(mod), attr)
    except ImportError as e:
        usage(f"--host: cannot import {mod!r} ({e}); the `fsdurable` script does not put the "
              "working directory on sys.path: set PYTHONPATH, or run `python -m fsdurable` "
              "from the directory that holds it")
    except AttributeError:
        usage(f"--host: module {mod!r} has no {attr!r} (MODULE:FACTORY, FACTORY(store) -> loop)")
    return factory(store)


@command("adopt", args=_adopt_args)
def _adopt(args: argparse.Namespace) -> Result:
    from .._sync import adopt

    st = open_store(args)
    before = st.read_marker(args.session_id)
    if before is None and not st.exists(args.session_id):
        raise not_found(st, args.session_id)
    loop = _host(args.host, st) if args.host else None
    out = adopt(st, args.session_id, loop)
    data = {"session_id": args.session_id, "from_node": before.node_id if before else None,
            "to_node": st.node_id, **out.to_dict()}
    text = f"adopted {args.session_id} from node {data['from_node']} (now {st.node_id}): " + (
        "left for this node's recovery (it resumes unattended)" if out.outcome == "left"
        else out.outcome + (f" ({out.reason})" if out.reason else ""))
    ok = out.outcome in ("left", "resumed")
    return (0 if ok else 1), data, text


def _resolve_args(p: argparse.ArgumentParser) -> None:
    _sid_arg(p)
    p.add_argument("--keep", default="newest", metavar="newest|local|PATH",
                   help="the version to keep: the highest version (default), the store's own "
                        "file, or the file at PATH; every other goes to quarantine/")


@command("resolve", args=_resolve_args)
def _resolve(args: argparse.Namespace) -> Result:
    from .._sync import MARKER, SESSION, resolve, versions

    st = open_store(args)
    shown = versions(st, args.session_id, SESSION) + versions(st, args.session_id, MARKER)
    r = resolve(st, args.session_id, keep=args.keep)
    if not r.changed:
        return 0, r.to_dict(), f"{args.session_id}: no conflict copies, nothing to do"
    def fate(v: Any) -> str:
        if v.path == r.kept:
            return "kept"
        if v.local:
            return "follows the session" if v.kind == MARKER else "replaced (copy quarantined)"
        return "quarantined"

    rows = [[fate(v), v.kind, v.path, v.describe()] for v in shown]
    text = table(rows, ["", "kind", "file", "version"])
    text += f"\n{args.session_id} is now at version {r.version}; moved to quarantine:\n  "
    text += "\n  ".join(r.quarantined)
    return 0, {**r.to_dict(), "versions": [v.to_dict() for v in shown]}, text


@command("conflicts")
def _conflicts(args: argparse.Namespace) -> Result:
    from .._sync import SESSION, conflict_copies, versions

    st = open_store(args)
    found = conflict_copies(st)
    data: list[dict[str, Any]] = []
    rows = []
    for sid, copies in sorted(found.items()):
        local = [v for v in versions(st, sid, SESSION) if v.local]
        data.append({"session_id": sid, "versions": [v.to_dict() for v in local + copies]})
        for v in local + copies:
            rows.append([sid, "local" if v.local else (v.tool or "?"), v.kind,
                         v.describe(), v.path])
    text = table(rows, ["session", "copy by", "kind", "version", "file"]) if rows else \
        "(no conflict copies)"
    return (1 if found else 0), {"conflicts": data}, text


def _watch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--poll", action="store_true",
                   help="poll instead of inotify/FSEvents (network filesystems)")
    p.add_argument("--initial", action="store_true",
                   help="first report what is already there (as 'added')")
    p.add_argument("--count", type=non_negative, default=0, metavar="N",
                   help="stop after N changes (0: never)")
    p.add_argument("--timeout", type=float, default=0.0, metavar="SECONDS",
                   help="stop after SECONDS (0: never)")


@command("watch", args=_watch_args)
def _watch(args: argparse.Namespace) -> Result:
    import signal

    st = open_store(args)
    stop = threading.Event()
    timer = threading.Timer(args.timeout, stop.set) if args.timeout > 0 else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    interrupted = []

    def on_sigint(signum: int, frame: Any) -> None:  # the watcher stops at its next check
        interrupted.append(signum)
        stop.set()

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: Ctrl-C is not ours to catch
        previous = None
    n = 0
    try:
        print(f"fsdurable: watching {st.root} for changes (Ctrl-C to stop)", file=sys.stderr,
              flush=True)
        for c in st.watch(poll=args.poll, initial=args.initial, stop_event=stop):
            if args.json:
                print(json.dumps(c.to_dict(), default=str), flush=True)
            else:
                print(iso(c.at), c.describe(), flush=True)
            n += 1
            if args.count and n >= args.count:
                break
    finally:
        if timer is not None:
            timer.cancel()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt  # one line and exit 130, as every command on Ctrl-C
    return 0, None, ""


def _ignore_args(p: argparse.ArgumentParser) -> None:
    from .._sync import IGNORE_FILES

    p.add_argument("name", choices=IGNORE_FILES, help="which tool's file")


@command("ignore-file", args=_ignore_args)
def _ignore_file(args: argparse.Namespace) -> Result:
    from .._sync import ignore_file

    path = ignore_file(args.name)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return 0, {"name": args.name, "path": path, "content": text}, text.rstrip("\n")


@command("node")
def _node(args: argparse.Namespace) -> Result:
    import os

    from .._layout import state_dir

    st = open_store(args)
    data = {"node_id": st.node_id, "from_env": bool(os.environ.get("FSDURABLE_NODE")),
            "state_dir": state_dir(st.root), "root": st.root,
            "foreign_turns": sorted({m.node_id for m in st.interrupted()} - {st.node_id})}
    text = (f"node {st.node_id}" + (" (from FSDURABLE_NODE)" if data["from_env"] else "")
            + f"\nmachine-local state (locks; never synced): {data['state_dir']}")
    if data["foreign_turns"]:
        text += f"\ninterrupted turns of other nodes here: {', '.join(data['foreign_turns'])}"
    return 0, data, text
