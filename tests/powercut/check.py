"""What must hold after a power cut, judged in a fresh process from the remounted disk.

``check(root, ack_files)`` reads the ack logs of every workload run on this filesystem (outside
the mount, fsynced line by line) and the store as the journal replay left it, before anything
repairs it, and returns the violations and the figures:

* every file parses: the store opens; every ``*.json`` under the store (temp files aside) is
  JSON; every session loads; every marker parses; the event log reads;
* each session is at its last acknowledged commit or later, and at the same commit (commit id)
  when the version is the same; a session whose delete was acknowledged never comes back;
* a session in progress has a marker of the same turn;
* every acknowledged LangGraph checkpoint is readable with every acknowledged write, and each
  thread's latest checkpoint is the last acknowledged one or a later one;
* every acknowledged Agents SDK item, Pydantic AI message and Claude entry is there;
* ``Store.interrupted()``, ``fsdurable recover --dry-run --json`` and ``fsdurable doctor
  --json`` never crash (a JSON document, exit 0 or 1), and doctor finds no unreadable file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import traceback
from collections import Counter
from typing import Any

import fsdurable
from tests.torture.kills import _read_jsonl

__all__ = ["check", "read_acks"]

# doctor findings that mean a file does not parse (a violation after a cut, not a repair job)
UNREADABLE = ("unreadable_session", "unreadable_marker", "manifest_unreadable",
              "events_unreadable")


def read_acks(path: str) -> list[dict[str, Any]]:
    """The lines of an ack log (the last one may be torn by the kill: skipped)."""
    return _read_jsonl(path)


class _Check:
    def __init__(self, root: str) -> None:
        self.root = root
        self.bad: list[str] = []
        self.stats: Counter[str] = Counter()
        self.quarantined: list[str] = []

    def guard(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as e:
            self.bad.append(f"{what} raised {type(e).__name__}: {e}\n"
                            f"{traceback.format_exc(limit=4)}")
            return None

    def files_parse(self) -> None:
        for d, _dirs, names in os.walk(self.root):
            if os.path.relpath(d, self.root).split(os.sep)[0] == "quarantine":
                self.stats["quarantined_files"] += len(names)
                continue
            for name in names:
                if not name.endswith(".json") or name.startswith("~"):
                    continue
                path = os.path.join(d, name)
                self.stats["json_files"] += 1
                try:
                    with open(path, "rb") as f:
                        json.loads(f.read())
                except ValueError as e:
                    size = os.path.getsize(path)
                    self.bad.append(f"{os.path.relpath(path, self.root)} ({size} bytes) does "
                                    f"not parse: {e}")

    def cli(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "fsdurable", "--root", self.root, "--json", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        what = "fsdurable " + " ".join(args)
        try:
            doc = json.loads(out.stdout)
        except ValueError:
            self.bad.append(f"{what}: exit {out.returncode}, not one JSON document: "
                            f"{out.stdout[-300:]!r} {out.stderr[-500:]!r}")
            return
        if out.returncode not in (0, 1):
            self.bad.append(f"{what}: exit {out.returncode}: {out.stderr[-500:]}")
        if args[0] == "doctor":
            for f in doc.get("findings", []):
                self.stats[f"doctor_{f['code']}"] += 1
                if f["code"] == "quarantined":  # what an earlier doctor --repair moved aside
                    self.quarantined.append(f["detail"])
                if f["code"] in UNREADABLE:
                    self.bad.append(f"doctor: {f['code']} {f['path']}: {f['detail']}")


def _sessions(c: _Check, store: fsdurable.Store, acks: list[dict[str, Any]]) -> None:
    last: dict[str, dict[str, Any]] = {}
    deleting, deleted = set(), set()
    for a in acks:
        if a["k"] == "s":
            prev = last.get(a["sid"])
            if prev is None or a["v"] >= prev["v"]:
                last[a["sid"]] = a
            c.stats["acked_commits"] += 1
            c.stats[f"acked_{a['op']}"] += 1
        elif a["k"] == "deleting":
            deleting.add(a["sid"])
        elif a["k"] == "deleted":
            deleted.add(a["sid"])
            c.stats["acked_deletes"] += 1
    for sid in sorted(deleted):
        if store.exists(sid):
            c.bad.append(f"session {sid}: its delete was acknowledged and it came back")
    for sid, a in sorted(last.items()):
        if sid in deleted:
            continue
        if not store.exists(sid):
            if sid in deleting:
                c.stats["deletes_in_flight_landed"] += 1
            else:
                c.bad.append(f"session {sid}: acknowledged v{a['v']} ({a['op']}) is gone")
            continue
        s = c.guard(f"load({sid})", lambda sid=sid: store.load(sid))
        if s is None:
            continue
        if s.version < a["v"]:
            c.bad.append(f"session {sid}: acknowledged v{a['v']} ({a['op']}), disk has "
                         f"v{s.version}")
        elif s.version == a["v"] and s.commit_id != a["c"]:
            c.bad.append(f"session {sid}: v{a['v']} is commit {s.commit_id} on disk, "
                         f"acknowledged {a['c']} ({a['op']})")
        else:
            c.stats["sessions_at_ack" if s.version == a["v"] else "sessions_later"] += 1
    # in progress => a marker of the same turn, for every session on disk
    markers, bad = store.scan_markers()
    c.bad += [f"marker {sid} is bad: {why}" for sid, why in bad]
    by_sid = {m.session_id: m for m in markers}
    for sid in store.sessions():
        s = c.guard(f"load({sid})", lambda sid=sid: store.load(sid))
        if s is None:
            continue
        c.stats["sessions_on_disk"] += 1
        if s.in_progress:
            c.stats["in_progress"] += 1
            m = by_sid.get(sid)
            if m is None:
                c.bad.append(f"session {sid} v{s.version} in progress (turn {s.turn.id}) "
                             "without a marker")
            elif m.turn_id != s.turn.id:
                c.bad.append(f"session {sid} on turn {s.turn.id}, its marker on {m.turn_id}")
    c.stats["orphan_markers"] += sum(
        1 for sid in by_sid if not (store.exists(sid) and store.load(sid).in_progress))


def _langgraph(c: _Check, store: fsdurable.Store, acks: list[dict[str, Any]]) -> None:
    from fsdurable.langgraph import FsDurableSaver

    saver = FsDurableSaver(store)
    latest: dict[str, str] = {}
    for a in acks:
        if a["k"] not in ("lg_put", "lg_writes"):
            continue
        tid, ckid = a["thread"], a["ckid"]
        cfg = {"configurable": {"thread_id": tid, "checkpoint_ns": "", "checkpoint_id": ckid}}
        tup = c.guard(f"get_tuple({tid}, {ckid})", lambda cfg=cfg: saver.get_tuple(cfg))
        if tup is None:
            c.bad.append(f"langgraph {tid}: acknowledged checkpoint {ckid} is not readable")
            continue
        if a["k"] == "lg_put":
            c.stats["acked_lg_puts"] += 1
            latest[tid] = max(latest.get(tid, ""), ckid)
        else:
            c.stats["acked_lg_writes"] += 1
            if not any(w[0] == a["task"] for w in tup.pending_writes or ()):
                c.bad.append(f"langgraph {tid}: acknowledged writes of {a['task']} on {ckid} "
                             "are missing")
    for tid, ckid in latest.items():
        cfg = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
        tup = c.guard(f"get_tuple({tid})", lambda cfg=cfg: saver.get_tuple(cfg))
        got = tup.config["configurable"]["checkpoint_id"] if tup is not None else ""
        if got < ckid:
            c.bad.append(f"langgraph {tid}: latest is {got or 'nothing'}, acknowledged {ckid}")


def _adapters(c: _Check, store: fsdurable.Store, acks: list[dict[str, Any]]) -> None:
    from fsdurable import openai_agents as oa
    from fsdurable.claude import FileSessionStore
    from fsdurable.pydantic_ai import FileConversationStore

    items: dict[str, set[str]] = {}
    convs: dict[str, int] = {}
    lines: dict[str, tuple[dict[str, str], set[str]]] = {}
    for a in acks:
        if a["k"] == "oa":
            items.setdefault(a["sid"], set()).add(a["item"])
        elif a["k"] == "pa":
            convs[a["cid"]] = max(convs.get(a["cid"], 0), a["n"])
        elif a["k"] == "claude":
            lines.setdefault(a["key"]["session_id"], (a["key"], set()))[1].add(a["uuid"])
    for sid, want in items.items():
        got = c.guard(f"get_items({sid})",
                      lambda sid=sid: asyncio.run(oa.FileSession(sid, store).get_items()))
        have = {i.get("content") for i in got or ()}
        c.stats["acked_oa_items"] += len(want)
        if want - have:
            c.bad.append(f"agents session {sid}: acknowledged items missing: "
                         f"{sorted(want - have)[:5]}")
    conversations = FileConversationStore(store)
    for cid, n in convs.items():
        conv = c.guard(f"conversation {cid}",
                       lambda cid=cid: asyncio.run(conversations.load(cid)))
        c.stats["acked_pa_saves"] += 1
        have = len(conv.messages) if conv is not None else 0
        if have < n:
            c.bad.append(f"pydantic-ai conversation {cid}: {have} messages, acknowledged {n}")
    transcripts = FileSessionStore(store)
    for sid, (key, uuids) in lines.items():
        got = c.guard(f"transcript {sid}", lambda key=key: asyncio.run(transcripts.load(key)))
        have = {e.get("uuid") for e in got or ()}
        c.stats["acked_claude_entries"] += len(uuids)
        if uuids - have:
            c.bad.append(f"claude transcript {sid}: acknowledged entries missing: "
                         f"{sorted(uuids - have)[:5]}")


def check(root: str, ack_files: list[str]) -> dict[str, Any]:
    """The verdict on the store at ``root`` (see the module docstring)."""
    c = _Check(root)
    acks = [a for f in ack_files for a in read_acks(f)]
    if not any(a["k"] == "store" for a in acks):  # no workload has opened it yet
        try:
            fsdurable.Store(root, create=False)
        except fsdurable.SessionNotFound:  # cut while the first one created it: no promise
            c.stats["store_not_created_yet"] += 1
            return {"violations": [], "stats": dict(c.stats), "quarantined": []}
    c.files_parse()
    store = c.guard("Store(root)", lambda: fsdurable.Store(root, create=False))
    if store is not None:
        c.guard("interrupted()", store.interrupted)
        c.guard("events()", store.events)
        c.guard("sessions", lambda: _sessions(c, store, acks))
        c.guard("langgraph", lambda: _langgraph(c, store, acks))
        c.guard("adapters", lambda: _adapters(c, store, acks))
    c.cli("recover", "--dry-run")
    c.cli("doctor")
    return {"violations": c.bad, "stats": dict(c.stats), "quarantined": c.quarantined}
