"""CLI of ``quarantine/``: ``fsdurable quarantine [list]``, ``quarantine restore NAME``,
``quarantine --purge [NAME ...]`` (the one command that deletes anything fsdurable kept aside)."""

from __future__ import annotations

import argparse

from . import Result, command, open_store, table, usage


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("words", nargs="*", metavar="list | restore NAME | NAME",
                   help="list (default): what is there, why, when; restore NAME: put a fixed "
                        "session back through the commit function (with the item logs it "
                        "names), or an item log its session names; with --purge: the NAMEs "
                        "(file names in quarantine/, as `list` shows them)")
    p.add_argument("--purge", action="store_true",
                   help="DELETE the named files (all of them if none is named), each an event")


@command("quarantine", "list what sits in quarantine/ (what, why, when), restore a fixed "
         "session, or --purge", _args)
def _quarantine(args: argparse.Namespace) -> Result:
    from .._quarantine import listing, parse_name, purge, restore

    words = list(args.words)
    action = words.pop(0) if words and words[0] in ("list", "restore") else "list"
    st = open_store(args)
    if args.purge:
        if action != "list":
            usage("--purge cannot be combined with restore")
        gone = purge(st, words or None)
        return 0, {"purged": gone}, (f"deleted {len(gone)} file(s):\n  " + "\n  ".join(gone)
                                     if gone else "quarantine/ is empty")
    if action == "restore":
        if len(words) != 1:
            usage("restore takes one NAME (fsdurable quarantine lists them)")
        kind = parse_name(st, words[0]).kind if "/" not in words[0] else ""
        s = restore(st, words[0])  # a bad name: its typed error, from restore
        if kind == "item-log":
            return 0, {"session_id": s.id, "version": s.version, "restored": words[0]}, (
                f"restored an item log of {s.id} from quarantine/{words[0]}")
        return 0, {"session_id": s.id, "version": s.version, "restored": words[0]}, (
            f"restored {s.id} (now version {s.version}) from quarantine/{words[0]}")
    if words:
        usage(f"unexpected {' '.join(words)!r}: names go with restore or --purge")
    items = listing(st)
    rows = [[q.name, q.kind, q.reason or "?", q.session_id or "", str(q.size)] for q in items]
    text = table(rows, ["name", "was", "why", "session", "bytes"]) if rows else "(empty)"
    return 0, {"quarantined": [q.to_dict() for q in items]}, text
