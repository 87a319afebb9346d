"""Adapters: the import time a user pays for each fsdurable framework adapter, next to the
framework's own store import, and next to the bare interpreter.

Command: ``python -m bench.adapters`` (full) or ``python -m bench.adapters --quick``.
Writes ``adapters.json``.

Each contender is a fresh ``python -c '<import>'`` process (wall time of the whole process),
timed interleaved round by round, so background load hits all of them alike:
  interpreter           ``pass``
  fsdurable             ``import fsdurable`` (imports no framework)
  openai_agents         ``from fsdurable.openai_agents import FileSession`` (needs no ``agents``)
  agents_sqlite         ``from agents import SQLiteSession`` (the SDK's own store)
  pydantic_ai           ``from fsdurable.pydantic_ai import FileConversationStore``
  pydantic_ai_memory    ``from pydantic_ai.conversation_store import InMemoryConversationStore``
  pydantic_ai_durable   ``from fsdurable.pydantic_ai import FsDurableAgent`` (durable runs)
  pydantic_ai_dbos      ``from pydantic_ai.durable_exec.dbos import DBOSDurability`` (the
                        framework's own durable runs, on DBOS)
  claude                ``from fsdurable.claude import FileSessionStore`` (no SDK import)
  claude_memory         ``from claude_agent_sdk import InMemorySessionStore``
  adk                   ``from fsdurable.adk import FileSessionService`` (durable runs are in the
                        same module: ``DurableRunner``)
  adk_memory            ``from google.adk.sessions import InMemorySessionService``
  adk_database          ``from google.adk.sessions import DatabaseSessionService`` (ADK's own
                        durable store, on SQLAlchemy)
A framework that is not installed is left out (and named in ``missing``).

Then the adapters' writes, side by side in one run (``add_items``; needs ``agents``, else the
run fails: it never reports a comparison it did not make): the Agents SDK's
``FileSession.add_items`` of one ~1 KB item to a session holding N = 10 and N = 1,000 items,
against the SDK's own ``SQLiteSession`` (a file database: WAL, ``synchronous`` FULL, one fsync
per commit) holding the same, interleaved round by round; before each call (untimed) the item
the last call added is popped, so every call meets N items. Beside the time, the bytes each
call sent to storage (``write_bytes`` of ``/proc/self/io``, whole pages) and passed to
``write`` (``wchar``), per call. Since the item log (docs/storage.md, "Item logs") each call
appends one frame to the session's log and fdatasyncs it, the document untouched; the pops
between calls leave dead bytes, and a log is rewritten (its live items copied whole) once they
pass ``Config.item_log_slack`` and the live bytes — rarely inside a timed call, so in the tail
of the times, not the median. ``fsdurable_growing`` is a session that only grows (nothing
popped). Five floors beside
them, stdlib only, the same bytes: ``floor_document`` is what the format must do at least (the
document with the item, written to a new temp file, fsynced, renamed, its directory fsynced: two
fsyncs), called directly; ``floor_document_hop`` the same write through ``SQLiteSession``'s
hop, ``loop.run_until_complete(asyncio.to_thread(...))`` (an ``async`` ``add_items`` runs its
disk work in a worker thread: the event loop wakes the thread and is woken back; fsdurable's
own hop, ``_aio.run_sync``, costs a little less), so
``floor_document_hop_vs_sqlite_N`` is the least any ``add_items`` writing that document by
rename can be against ``SQLiteSession``, and ``fsdurable_N_vs_floor_document_hop`` what
fsdurable adds to it; ``floor_protocol_hop`` the design's protocol done bare through the same hop
(``FloorProtocol`` of bench/commit.py, the same document: the commit lock's ``flock`` and
release, the young file's compare-and-swap read, the marker's ``lstat``, an exclusive temp of a
random name, the ``fstat`` after the rename; no Python logic), so that between it and
``fsdurable_N`` is the Python that drives those steps; ``floor_rename`` what format 5 did (the
segment, then the document, the same way: four fsyncs), and ``floor_append`` one append +
fdatasync of the item to a file that exists (what a database log such as SQLite's WAL does, and
the item log's floor: ``fsdurable_N_vs_floor_append`` is what fsdurable adds to it, the thread
hop included). The document floors stay as the cost of the format before the item log.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from typing import Any

from ._floor import AppendFloor, put
from ._harness import (
    REPO,
    cache_dir,
    environment,
    log,
    measure,
    ratio,
    run_child,
    script_main,
    write_result,
)
from .commit import FloorProtocol

CONTENDERS = {
    "interpreter": ("pass", None),
    "fsdurable": ("import fsdurable", None),
    "openai_agents": ("from fsdurable.openai_agents import FileSession", None),
    "agents_sqlite": ("from agents import SQLiteSession", "agents"),
    "pydantic_ai": ("from fsdurable.pydantic_ai import FileConversationStore", "pydantic_ai"),
    "pydantic_ai_memory": ("from pydantic_ai.conversation_store import "
                           "InMemoryConversationStore", "pydantic_ai"),
    "pydantic_ai_durable": ("from fsdurable.pydantic_ai import FsDurableAgent", "pydantic_ai"),
    "pydantic_ai_dbos": ("from pydantic_ai.durable_exec.dbos import DBOSDurability", "dbos"),
    "claude": ("from fsdurable.claude import FileSessionStore", None),
    "claude_memory": ("from claude_agent_sdk import InMemorySessionStore", "claude_agent_sdk"),
    "adk": ("from fsdurable.adk import FileSessionService", "google.adk"),
    "adk_memory": ("from google.adk.sessions import InMemorySessionService", "google.adk"),
    "adk_database": ("from google.adk.sessions import DatabaseSessionService", "google.adk"),
}
PAIRS = {"openai_agents": "agents_sqlite", "pydantic_ai": "pydantic_ai_memory",
         "pydantic_ai_durable": "pydantic_ai_dbos", "claude": "claude_memory",
         "adk": "adk_database"}
FULL: dict[str, Any] = {"min_reps": 10, "max_reps": 20, "budget": 20.0, "warmup": 1}
QUICK: dict[str, Any] = {"min_reps": 1, "max_reps": 1, "budget": 1.0, "warmup": 0}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing (google.adk)
        return False


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    p = QUICK if quick else FULL
    work = os.path.join(cache_dir(quick), "adapters")
    env = environment(work)
    child = dict(os.environ)
    child["PYTHONPATH"] = REPO + os.pathsep + child.get("PYTHONPATH", "")
    missing = sorted({m for _, m in CONTENDERS.values() if m and not _installed(m)})
    calls = {}
    for name, (code, module) in CONTENDERS.items():
        if module in missing:
            continue

        def call(code: str = code) -> None:
            if run_child([sys.executable, "-c", code], env=child, kill_after=120):
                raise RuntimeError(f"the import failed: {code}")

        calls[name] = call
    res = measure(calls, min_reps=p["min_reps"], max_reps=p["max_reps"], budget=p["budget"],
                  warmup=p["warmup"])
    base = res["interpreter"]["median"]
    over = {k: (v["median"] - base) * 1e3 for k, v in res.items()}
    ratios = {f"{a}_vs_{b}": res[a]["median"] / res[b]["median"]
              for a, b in PAIRS.items() if a in res and b in res}
    for k, v in res.items():
        log(f"  adapters {k}: {v['median'] * 1e3:.1f} ms (+{over[k]:.1f} ms over the "
            "interpreter)")
    body: dict[str, Any] = {
        "params": p, "results": res, "over_interpreter_ms": over, "ratios": ratios,
        "commands": {k: c for k, (c, _) in CONTENDERS.items()}, "missing": missing}
    body["add_items"] = add_items(quick, work)
    r = body["add_items"]["ratios"]
    body["targets"] = {
        f"add_items_{n}_vs_sqlite": {"value": r[f"fsdurable_{n}_vs_sqlite_{n}"],
                                     "target": "<= 1.5",
                                     "met": r[f"fsdurable_{n}_vs_sqlite_{n}"] <= 1.5}
        for n in body["add_items"]["sizes"]}
    write_result(out_dir, "adapters", env, body, quick=quick)
    return body


ITEM_BYTES = 1000


def _item(i: int) -> dict[str, Any]:
    return {"type": "message", "role": "user" if i % 2 == 0 else "assistant",
            "content": [{"type": "input_text", "text": f"{i} " + "w" * (ITEM_BYTES - 100)}]}


def io_counters() -> dict[str, int]:
    """This process's ``wchar`` and ``write_bytes`` (``/proc/self/io``: every thread's); raises
    if absent: a figure that cannot be measured fails the run."""
    with open("/proc/self/io", encoding="ascii") as f:
        d = dict(line.split(": ") for line in f.read().splitlines())
    return {"wchar": int(d["wchar"]), "write_bytes": int(d["write_bytes"])}


def _floors(base: str, item: bytes, root: str, sid: str, loop: Any) -> dict[str, Any]:
    """The five floors (module doc), with the sizes of fsdurable's own segment and document;
    ``loop``: the event loop both sessions' calls run on."""
    import asyncio

    seg_dir, doc_dir = os.path.join(base, "floor", "history"), os.path.join(base, "floor", "s")
    os.makedirs(seg_dir)
    os.makedirs(doc_dir)
    with open(os.path.join(root, "sessions", sid + ".json"), "rb") as f:
        doc = f.read()
    segment = b'{"format":"fsdurable.segment/1","session_id":"c","lane":"x","first":1,' + \
        b'"node_id":"n","prev":"' + b"0" * 40 + b'","prev_sha256":"' + b"0" * 64 + \
        b'","items":[' + item + b"]}\n"
    n = [0]

    def rename_floor() -> None:
        n[0] += 1
        put(seg_dir, f"{n[0]:012d}.json", segment)
        put(doc_dir, "c.json", doc)

    def document_floor() -> None:
        put(doc_dir, "d.json", doc + item)

    append_floor = AppendFloor(os.path.join(base, "floor", "log"), item + b"\n")

    def document_floor_hop() -> None:
        loop.run_until_complete(asyncio.to_thread(document_floor))

    proto_dir = os.path.join(base, "floor", "p")
    os.makedirs(proto_dir)
    proto = FloorProtocol(proto_dir, [doc + item])

    def protocol_floor_hop() -> None:
        loop.run_until_complete(asyncio.to_thread(proto.write, doc + item))

    return {"floor_document": document_floor, "floor_document_hop": document_floor_hop,
            "floor_protocol_hop": protocol_floor_hop, "floor_rename": rename_floor,
            "floor_append": append_floor}


def add_items(quick: bool, work: str) -> dict[str, Any]:
    """``FileSession.add_items`` vs ``SQLiteSession.add_items`` at N items (module doc)."""
    import asyncio

    from agents import SQLiteSession

    import fsdurable
    from fsdurable.openai_agents import FileSession

    sizes = (10, 1000)
    p: dict[str, Any] = {"min_reps": 3, "max_reps": 5, "budget": 1.0, "warmup": 1} if quick else \
        {"min_reps": 30, "max_reps": 200, "budget": 4.0, "warmup": 3}
    base = os.path.join(work, "add_items")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    loop = asyncio.new_event_loop()
    store = fsdurable.Store(os.path.join(base, "store"))
    sessions: dict[str, Any] = {}
    for n in sizes:
        sessions[f"fsdurable_{n}"] = FileSession(f"chat{n}", store)
        sessions[f"sqlite_{n}"] = SQLiteSession(f"chat{n}", os.path.join(base, f"sq{n}.db"))
        for name in (f"fsdurable_{n}", f"sqlite_{n}"):
            for lo in range(0, n, 100):  # a history built as a chat builds it: in batches
                loop.run_until_complete(sessions[name].add_items(
                    [_item(i) for i in range(lo, min(n, lo + 100))]))
    sessions["fsdurable_growing"] = FileSession("growing", store)  # never popped (module doc)
    loop.run_until_complete(sessions["fsdurable_growing"].add_items(
        [_item(i) for i in range(sizes[-1])]))
    one = [_item(10**6)]
    state: dict[str, Any] = {"last": None, "at": io_counters(), "added": set()}

    def account() -> None:
        now, last = io_counters(), state["last"]
        if last is not None:
            for k in ("wchar", "write_bytes"):
                io[last][k] += now[k] - state["at"][k]
            io[last]["calls"] += 1

    def setup(name: str) -> None:  # untimed: the last call's bytes, then back to N items
        account()
        if name in state["added"] and name in sessions and name != "fsdurable_growing":
            loop.run_until_complete(sessions[name].pop_item())
        state["added"].add(name)
        state["at"], state["last"] = io_counters(), name

    calls = {k: (lambda s=s: loop.run_until_complete(s.add_items(one)))
             for k, s in sessions.items()}
    calls.update(_floors(base, json.dumps(one[0]).encode(), store.root, f"chat{sizes[-1]}",
                         loop))
    io: dict[str, dict[str, int]] = {k: {"wchar": 0, "write_bytes": 0, "calls": 0}
                                     for k in calls}
    res = measure(calls, setup=setup, **p)
    account()
    state["last"] = None
    for s in sessions.values():
        if isinstance(s, SQLiteSession):
            s.close()
    loop.close()
    per_call = {k: {"wchar": v["wchar"] / v["calls"], "write_bytes": v["write_bytes"] / v["calls"]}
                for k, v in io.items() if v["calls"]}
    if not any(v["write_bytes"] for v in per_call.values()):
        raise RuntimeError("write_bytes stayed 0 (tmpfs?): bytes written cannot be measured here")
    ratios = {f"fsdurable_{n}_vs_sqlite_{n}": ratio(res[f"fsdurable_{n}"], res[f"sqlite_{n}"])
              for n in sizes}
    ratios[f"fsdurable_{sizes[-1]}_vs_{sizes[0]}"] = ratio(res[f"fsdurable_{sizes[-1]}"],
                                                          res[f"fsdurable_{sizes[0]}"])
    ratios["fsdurable_growing_vs_sqlite_" + str(sizes[-1])] = ratio(
        res["fsdurable_growing"], res[f"sqlite_{sizes[-1]}"])
    for who in ("floor_document", "floor_document_hop", "floor_protocol_hop", "floor_rename",
                "floor_append"):
        ratios[f"fsdurable_{sizes[-1]}_vs_{who}"] = ratio(res[f"fsdurable_{sizes[-1]}"], res[who])
        ratios[f"{who}_vs_sqlite_{sizes[-1]}"] = ratio(res[who], res[f"sqlite_{sizes[-1]}"])
    ratios[f"fsdurable_{sizes[0]}_vs_floor_document_hop"] = ratio(res[f"fsdurable_{sizes[0]}"],
                                                                 res["floor_document_hop"])
    ratios[f"floor_document_hop_vs_sqlite_{sizes[0]}"] = ratio(res["floor_document_hop"],
                                                             res[f"sqlite_{sizes[0]}"])
    for k, v in res.items():
        b = per_call.get(k)
        log(f"  add_items {k}: {v['median'] * 1e3:.2f} ms" + (
            f", {b['write_bytes']:.0f} bytes to storage, {b['wchar']:.0f} written per call"
            if b else ""))
    for k, x in ratios.items():
        log(f"  add_items {k}: {x:.2f}x")
    return {"params": p, "sizes": list(sizes), "item_bytes": len(json.dumps(one[0])),
            "results": res, "bytes_per_call": per_call, "ratios": ratios}


def section(d: dict[str, Any]) -> str:
    """bench/README.md's table (``bench.report``)."""
    from .report import table

    r, over = d["results"], d["over_interpreter_ms"]
    rows = [[f"`{d['commands'][k]}`", f"{r[k]['median'] * 1e3:.0f} ms", f"+{over[k]:.0f} ms"]
            for k in r]
    out = ("A fresh `python -c` process per import, interleaved; the interpreter alone is the "
           "first row.\n\n" + table(["import", "process (median)", "over the interpreter"],
                                      rows))
    a = d.get("add_items")
    if a:
        rows = []
        labels = [(f"{who}_{n}", f"{label} at {n:,} items") for n in a["sizes"]
                  for who, label in (("fsdurable", "`FileSession`"),
                                     ("sqlite", "`SQLiteSession`"))]
        labels += [(k, label) for k, label in (
            ("fsdurable_growing", "`FileSession` growing (nothing popped)"),
            ("floor_document", "floor: the document by rename (2 fsyncs)"),
            ("floor_document_hop", "floor: the document by rename, through the thread hop "
                                   "`SQLiteSession` makes (`asyncio.to_thread`)"),
            ("floor_protocol_hop", "floor: the protocol done bare (lock, compare-and-swap, "
                                   "marker check, the document by rename), through the hop"),
            ("floor_rename", "floor: segment + document by rename (4 fsyncs)"),
            ("floor_append", "floor: one append + fdatasync")) if k in a["results"]]
        for k, label in labels:
            b = a["bytes_per_call"].get(k, {"write_bytes": 0.0, "wchar": 0.0})
            rows.append([label, f"{a['results'][k]['median'] * 1e3:.2f} ms",
                         f"{b['write_bytes'] / 1024:.1f} KiB", f"{b['wchar'] / 1024:.1f} KiB"])
        out += (f"\n\n`add_items` of one {a['item_bytes']}-byte item, interleaved, each call "
                "meeting the same N items:\n\n" + table(
                    ["session", "add_items (median)", "to storage per call (write_bytes)",
                     "written per call (wchar)"], rows))
    return out


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
