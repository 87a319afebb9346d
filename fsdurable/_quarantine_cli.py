"""CLI of ``quarantine/``: ``fsdurable quarantine [list]``, ``quarantine restore NAME``,
``quarantine --purge [NAME ...]`` (the one command that deletes anything fsdurable kept aside)."""

from __future__ import annotations

import argparse

from ._errors import InvalidState
from .cli import Result, command, open_store, table


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=("list", "restore"), default="list",
                   help="list (default): what is there, why, when; restore NAME: put a fixed "
                        "session back through the commit function")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="file name(s) in quarantine/ (as `list` shows them)")
    p.add_argument("--purge", action="store_true",
                   help="DELETE the named files (all of them if none is named), each an event")


@command("quarantine", "list what sits in quarantine/ (what, why, when), restore a fixed "
         "session, or --purge", _args)
def _quarantine(args: argparse.Namespace) -> Result:
    from ._quarantine import listing, purge, restore

    st = open_store(args)
    if args.purge:
        if args.action != "list":
            raise InvalidState("--purge cannot be combined with restore", reason="usage")
        gone = purge(st, list(args.names) or None)
        return 0, {"purged": gone}, (f"deleted {len(gone)} file(s):\n  " + "\n  ".join(gone)
                                     if gone else "quarantine/ is empty")
    if args.action == "restore":
        if len(args.names) != 1:
            raise InvalidState("restore takes one NAME", reason="usage")
        s = restore(st, args.names[0])
        return 0, {"session_id": s.id, "version": s.version, "restored": args.names[0]}, (
            f"restored {s.id} (now version {s.version}) from quarantine/{args.names[0]}")
    items = listing(st)
    rows = [[q.name, q.kind, q.reason or "?", q.session_id or "", str(q.size)] for q in items]
    text = table(rows, ["name", "was", "why", "session", "bytes"]) if rows else "(empty)"
    return 0, {"quarantined": [q.to_dict() for q in items]}, text
