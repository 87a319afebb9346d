"""LangGraph: ``FsDurableSaver`` against LangGraph's ``SqliteSaver`` and ``AsyncSqliteSaver``.

Command: ``python -m bench.langgraph`` (full) or ``--quick``. Writes ``langgraph.json``.
Needs ``langgraph`` and ``langgraph-checkpoint-sqlite`` (``pip install -e '.[test,bench]'``);
without them the part records that it was skipped.

Durability of each contender (what a put fsyncs):
  fsdurable          one frame (the record and the thread's head) appended to the thread's log,
                     one fdatasync; a run's first and last put also commit the session document
                     and write/remove its marker (docs/storage.md, "LangGraph threads").
                     Survives a power cut.
  sqlite_full        ``SqliteSaver`` as it comes: WAL, ``synchronous=FULL`` (Python's default):
                     the WAL is fsynced at every commit (1 fsync per put). Survives a power cut.
  sqlite_normal      ``SqliteSaver`` with ``synchronous=NORMAL``: WAL not fsynced per commit
                     (survives a process crash, NOT a power cut). Shown for reference only.
  async_sqlite_full  ``AsyncSqliteSaver`` (aiosqlite), WAL, ``synchronous=FULL``, ``await aput``.
  fsdurable_async    ``await saver.aput`` (the disk work in a worker thread, shielded).
  floor_append       (put only) the floor: one append of as many bytes as one fsdurable put
                     adds to its log, then one fdatasync, to a file that exists (stdlib only).

Figures, all contenders interleaved round by round in one run:
  put / get_tuple    one checkpoint (a 20-message ``messages`` blob, the other channel
                     unchanged) put onto a thread that already has 50; the latest read back.
                     Beside the time, the bytes one put writes (``wchar``: passed to write;
                     ``write_bytes``: sent to the storage layer, whole pages; ``/proc/self/io``,
                     over 50 puts per contender; raises where it cannot be measured).
                     ``python -m bench.lgput --base REV`` puts the saver of another revision
                     (the record-file layout before the log) beside these in one run.
  chat               a 100-turn chat through a real ``StateGraph`` (one node, a deterministic
                     fake chat model, the ``add_messages`` reducer: LangGraph stores the whole
                     message list at every step), ``invoke`` per turn: total time, bytes on
                     disk, and the cost of turns 91-100 over turns 1-10 (flat: ~1).
  discovery          interrupted runs among 10,000 threads (10 in flight): fsdurable's one
                     listing of ``markers/`` against what a SqliteSaver user must do — read every
                     thread's latest checkpoint and ask whether a node is still to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import time
from typing import Any

from ._floor import AppendFloor
from ._harness import cache_dir, environment, log, measure, ratio, script_main, write_result

FULL: dict[str, Any] = {
    "history": 50, "reps": 200, "budget": 8.0, "turns": 100, "threads": 10_000, "inflight": 10}
QUICK: dict[str, Any] = {
    "history": 10, "reps": 20, "budget": 1.0, "turns": 20, "threads": 500, "inflight": 10}


def _checkpoint(step: int, messages: list[str], *, pending: bool) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": messages, "topic": "bench"}
    cp["channel_versions"] = {"messages": step + 1, "topic": 1}
    cp["updated_channels"] = ["messages", "branch:to:agent"] if pending else ["messages"]
    return cp


class Putter:
    """Puts successive checkpoints onto one thread of a saver (sync or async)."""

    def __init__(self, saver: Any, thread: str, history: int, loop: Any = None) -> None:
        self.saver, self.thread, self.loop = saver, thread, loop
        self.messages = [f"message {i}: " + "lorem ipsum dolor sit amet " * 6 for i in range(20)]
        self.cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        self.step = 0
        for _ in range(history):
            self.put()

    def put(self) -> None:
        self.step += 1
        cp = _checkpoint(self.step, self.messages, pending=True)
        md: Any = {"source": "loop", "step": self.step, "parents": {}}
        nv = {"messages": self.step + 1} if self.step > 1 else {"messages": 2, "topic": 1}
        if self.loop is None:
            self.cfg = self.saver.put(self.cfg, cp, md, nv)
        else:
            self.cfg = self.loop.run_until_complete(self.saver.aput(self.cfg, cp, md, nv))

    def get(self) -> None:
        latest = {"configurable": {"thread_id": self.thread, "checkpoint_ns": ""}}
        if self.loop is None:
            tup = self.saver.get_tuple(latest)
        else:
            tup = self.loop.run_until_complete(self.saver.aget_tuple(latest))
        assert tup is not None and len(tup.checkpoint["channel_values"]["messages"]) == 20


def _sqlite(path: str, sync: str) -> Any:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    conn.execute(f"PRAGMA synchronous={sync}")
    return saver


def _async_sqlite(path: str, loop: Any) -> Any:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async def make() -> Any:
        conn = await aiosqlite.connect(path)
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        await conn.execute("PRAGMA synchronous=FULL")
        return saver

    return loop.run_until_complete(make())


def _du(path: str) -> int:
    total = 0
    for dirpath, _d, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):  # a temp file gone meanwhile
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def io_counters() -> dict[str, int]:
    """This process's ``wchar`` and ``write_bytes`` (Linux ``/proc/self/io``); raises if absent:
    a figure that cannot be measured fails the run."""
    with open("/proc/self/io", encoding="ascii") as f:
        d = dict(line.split(": ") for line in f.read().splitlines())
    return {"wchar": int(d["wchar"]), "write_bytes": int(d["write_bytes"])}


def bytes_per_put(putters: dict[str, Any], n: int) -> dict[str, dict[str, float]]:
    """Bytes one put writes, per contender (``n`` puts each, one contender at a time: bytes do
    not depend on what else runs). Raises if ``write_bytes`` stays 0 (tmpfs): not measurable."""
    out = {}
    for name, putter in putters.items():
        before = io_counters()
        for _ in range(n):
            putter.put()
        after = io_counters()
        out[name] = {k: (after[k] - before[k]) / n for k in before}
    if not any(v["write_bytes"] for v in out.values()):
        raise RuntimeError("write_bytes stayed 0 (tmpfs?): bytes written cannot be measured here")
    return out


def put_get(work: str, p: dict[str, Any]) -> dict[str, Any]:
    from fsdurable import Store
    from fsdurable.langgraph import FsDurableSaver

    loop = asyncio.new_event_loop()
    fs = FsDurableSaver(Store(os.path.join(work, "fs"), node_id="bench"))
    savers = {
        "fsdurable": Putter(fs, "t-sync", p["history"]),
        "fsdurable_async": Putter(fs, "t-async", p["history"], loop),
        "sqlite_full": Putter(_sqlite(os.path.join(work, "full.db"), "FULL"), "t", p["history"]),
        "sqlite_normal": Putter(_sqlite(os.path.join(work, "normal.db"), "NORMAL"), "t",
                                p["history"]),
        "async_sqlite_full": Putter(_async_sqlite(os.path.join(work, "async.db"), loop), "t",
                                    p["history"], loop),
    }
    floor = _append_floor(work, fs, savers["fsdurable"])
    puts = measure({**{k: v.put for k, v in savers.items()}, "floor_append": floor},
                   min_reps=10, max_reps=p["reps"], budget=p["budget"])
    gets = measure({k: v.get for k, v in savers.items()}, min_reps=10, max_reps=p["reps"],
                   budget=p["budget"])
    written = bytes_per_put(savers, 50 if p["reps"] > 20 else 10)
    loop.run_until_complete(savers["async_sqlite_full"].saver.conn.close())
    loop.close()
    log("  put: " + ", ".join(f"{k} {v['median'] * 1e3:.2f}ms" for k, v in puts.items()))
    log("  bytes per put (write_bytes): " + ", ".join(f"{k} {v['write_bytes']:,.0f}"
                                                      for k, v in written.items()))
    log("  get_tuple: " + ", ".join(f"{k} {v['median'] * 1e3:.3f}ms" for k, v in gets.items()))
    return {"put": puts, "get_tuple": gets, "bytes_per_put": written,
            "ratios": {"put_fsdurable_vs_sqlite_full": ratio(puts["fsdurable"],
                                                             puts["sqlite_full"]),
                       "put_fsdurable_async_vs_async_sqlite_full": ratio(
                           puts["fsdurable_async"], puts["async_sqlite_full"]),
                       "get_fsdurable_vs_sqlite_full": ratio(gets["fsdurable"],
                                                             gets["sqlite_full"]),
                       "put_floor_append_vs_sqlite_full": ratio(puts["floor_append"],
                                                                puts["sqlite_full"]),
                       "put_fsdurable_vs_floor_append": ratio(puts["fsdurable"],
                                                              puts["floor_append"])}}


def _append_floor(work: str, fs: Any, putter: Putter) -> AppendFloor:
    """The put's floor: one append of as many bytes as a put adds to fsdurable's log (measured
    on one put of ``putter``, a putter of the saver ``fs``), then one fdatasync, to a file that
    exists — what a put must do at least (the stdlib alone; as SQLite's WAL append)."""
    logs = os.path.join(fs.store.root, "langgraph")

    def size() -> int:
        return sum(e.stat().st_size for d in os.scandir(logs) for e in os.scandir(d.path)
                   if e.name.endswith(".lglog"))

    before = size()
    putter.put()
    return AppendFloor(os.path.join(work, "floor.log"), b"x" * (size() - before))


def _chat_graph(saver: Any) -> Any:
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph

    class Echo(FakeMessagesListChatModel):
        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                      **kw: Any) -> Any:
            self.responses = [AIMessage(f"reply {len(messages)}: " + "ok " * 40)]
            self.i = 0
            return super()._generate(messages, stop, run_manager, **kw)

    model = Echo(responses=[AIMessage("")])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    return g.compile(checkpointer=saver)


def chat(work: str, p: dict[str, Any]) -> dict[str, Any]:
    """Each contender's chat, one turn each in round robin (interleaved)."""
    from fsdurable import Store
    from fsdurable.langgraph import FsDurableSaver

    loop = asyncio.new_event_loop()
    dirs = {k: os.path.join(work, "chat-" + k) for k in ("fsdurable", "sqlite_full",
                                                         "async_sqlite_full")}
    for d in dirs.values():
        os.makedirs(d)
    graphs = {
        "fsdurable": _chat_graph(FsDurableSaver(Store(os.path.join(dirs["fsdurable"], "s"),
                                                      node_id="bench"))),
        "sqlite_full": _chat_graph(_sqlite(os.path.join(dirs["sqlite_full"], "c.db"), "FULL")),
        "async_sqlite_full": _chat_graph(_async_sqlite(
            os.path.join(dirs["async_sqlite_full"], "c.db"), loop)),
    }
    aconn = graphs["async_sqlite_full"].checkpointer.conn
    turns: dict[str, list[float]] = {k: [] for k in graphs}
    cfg: Any = {"configurable": {"thread_id": "chat"}}
    for t in range(p["turns"]):
        msg = {"messages": [("user", f"turn {t}: " + "tell me more " * 10)]}
        for name, graph in graphs.items():
            t0 = time.perf_counter()
            if name.startswith("async"):
                loop.run_until_complete(graph.ainvoke(msg, cfg))
            else:
                graph.invoke(msg, cfg)
            turns[name].append(time.perf_counter() - t0)
    loop.run_until_complete(aconn.close())
    loop.close()
    k = max(1, len(turns["fsdurable"]) // 10)
    out: dict[str, dict[str, Any]] = {}
    for name, xs in turns.items():
        first, last = sorted(xs[:k])[k // 2], sorted(xs[-k:])[k // 2]
        out[name] = {"total_s": sum(xs), "bytes_on_disk": _du(dirs[name]),
                     "first_turns_median_s": first, "last_turns_median_s": last,
                     "last_vs_first": last / first}
    log("  chat: " + ", ".join(f"{k} {v['total_s']:.2f}s {v['bytes_on_disk'] >> 10}KB "
                               f"x{v['last_vs_first']:.2f}" for k, v in out.items()))
    return {"turns": p["turns"], "results": out,
            "ratios": {"total_fsdurable_vs_sqlite_full": out["fsdurable"]["total_s"]
                       / out["sqlite_full"]["total_s"],
                       "total_fsdurable_vs_async_sqlite_full": out["fsdurable"]["total_s"]
                       / out["async_sqlite_full"]["total_s"]}}


def _discovery_data(quick: bool, p: dict[str, Any]) -> tuple[str, str]:
    """A store and a SqliteSaver db with the same threads: each a finished two-checkpoint run,
    ``inflight`` of them stopped mid-run (cached between runs)."""
    from fsdurable import Config, Store
    from fsdurable.langgraph import FsDurableSaver

    base = os.path.join(cache_dir(quick), f"langgraph-{p['threads']}-{p['inflight']}")
    root, db = os.path.join(base, "store"), os.path.join(base, "sqlite.db")
    if os.path.exists(os.path.join(base, "done")):
        return root, db
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    fs = FsDurableSaver(Store(root, config=Config(fsync=False), node_id="bench"))
    sq = _sqlite(db, "OFF")
    for i in range(p["threads"]):
        for saver in (fs, sq):
            cfg: Any = {"configurable": {"thread_id": f"thread-{i}", "checkpoint_ns": ""}}
            cfg = saver.put(cfg, _checkpoint(0, ["hi"], pending=True),
                            {"source": "input", "step": -1, "parents": {}}, {"messages": 1})
            saver.put(cfg, _checkpoint(1, ["hi", "hello"], pending=i < p["inflight"]),
                      {"source": "loop", "step": 0, "parents": {}}, {"messages": 2})
    sq.conn.close()
    open(os.path.join(base, "done"), "w").close()
    return root, db


def discovery(quick: bool, p: dict[str, Any]) -> dict[str, Any]:
    from fsdurable import Store
    from fsdurable._lgstore import PREFIX
    from fsdurable.langgraph import _pending

    root, db = _discovery_data(quick, p)
    sq = _sqlite(db, "FULL")

    def fsdurable_listing() -> list[str]:
        return [m.session_id for m in Store(root, node_id="bench").interrupted()
                if m.session_id.startswith(PREFIX)]

    def sqlite_every_thread() -> list[str]:
        ids = [r[0] for r in sq.conn.execute("SELECT DISTINCT thread_id FROM checkpoints")]
        out = []
        for tid in ids:
            tup = sq.get_tuple({"configurable": {"thread_id": tid, "checkpoint_ns": ""}})
            if tup is not None and _pending(tup.checkpoint):
                out.append(tid)
        return out

    found = (len(fsdurable_listing()), len(sqlite_every_thread()))
    assert found == (p["inflight"], p["inflight"]), found
    res = measure({"fsdurable": fsdurable_listing, "sqlite_every_thread": sqlite_every_thread},
                  min_reps=3, max_reps=30, budget=p["budget"])
    sq.conn.close()
    r = ratio(res["sqlite_every_thread"], res["fsdurable"])
    log(f"  discovery among {p['threads']}: fsdurable {res['fsdurable']['median'] * 1e3:.2f}ms, "
        f"sqlite {res['sqlite_every_thread']['median'] * 1e3:.1f}ms ({r:.0f}x)")
    return {"threads": p["threads"], "inflight": p["inflight"], "results": res,
            "ratios": {"sqlite_every_thread_vs_fsdurable": r}}


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    p = QUICK if quick else FULL
    work = os.path.join(cache_dir(quick), "langgraph-work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = environment(work)
    try:
        import langgraph.checkpoint.sqlite
        import langgraph.graph  # noqa: F401
    except ImportError as e:
        body: dict[str, Any] = {"skipped": f"not installed: {e.name}", "targets": {}}
        write_result(out_dir, "langgraph", env, body, quick=quick)
        return body
    pg = put_get(work, p)
    ch = chat(work, p)
    disc = discovery(quick, p)
    put_r = pg["ratios"]["put_fsdurable_vs_sqlite_full"]
    flat = ch["results"]["fsdurable"]["last_vs_first"]
    disc_r = disc["ratios"]["sqlite_every_thread_vs_fsdurable"]
    targets = {
        # beside it, the floor: one append + fdatasync of the bytes a put adds to the log
        "put_vs_sqlite_full": {"value": put_r, "target": "<= 1.5", "met": put_r <= 1.5,
                               "floor_append_vs_sqlite_full":
                                   pg["ratios"]["put_floor_append_vs_sqlite_full"],
                               "fsdurable_vs_floor_append":
                                   pg["ratios"]["put_fsdurable_vs_floor_append"]},
        # beside it, each peer's own chat (interleaved turn by turn): LangGraph serialises the
        # whole conversation into every checkpoint, so every saver's turns grow with the chat
        "chat_last_vs_first_turns": {"value": flat, "target": "<= 1.5 (flat)",
                                     "met": flat <= 1.5,
                                     **{f"chat_{k}": v["last_vs_first"]
                                        for k, v in ch["results"].items() if k != "fsdurable"}},
        "discovery_vs_sqlite_every_thread": {"value": disc_r, "target": ">= 100",
                                             "met": disc_r >= 100},
    }
    body = {"params": p, "put_get": pg, "chat": ch, "discovery": disc, "targets": targets}
    write_result(out_dir, "langgraph", env, body, quick=quick, cleanup=work)
    return body


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())


def section(d: dict[str, Any]) -> str:
    """bench/README.md's LangGraph section (called by bench/report.py)."""
    from ._harness import fmt_time

    if "skipped" in d:
        return f"Skipped: {d['skipped']}."
    pg, ch, disc = d["put_get"], d["chat"], d["discovery"]
    fsyncs = {"fsdurable": "one frame appended to the thread's log (1)",
              "fsdurable_async": "the same, in a worker thread (1)",
              "sqlite_full": "WAL at each commit (1)", "sqlite_normal": "none per commit (0)",
              "async_sqlite_full": "WAL at each commit (1)",
              "floor_append": "the floor: one append of a put's bytes (1)"}
    rows = ["| contender | fsyncs per put | put median (p90) | get_tuple median (p90) "
            "| bytes per put: wchar / write_bytes |", "|---|---|---|---|---|"]
    for k, v in pg["put"].items():
        g = pg["get_tuple"].get(k)  # the floor puts only
        b = pg.get("bytes_per_put", {}).get(k)
        size = f"{b['wchar']:,.0f} / {b['write_bytes']:,.0f}" if b else ""
        got = f"{fmt_time(g['median'])} ({fmt_time(g['p90'])})" if g else ""
        rows.append(f"| {k} | {fsyncs.get(k, '')} | {fmt_time(v['median'])} "
                    f"({fmt_time(v['p90'])}) | {got} | {size} |")
    rows += ["", f"A {ch['turns']}-turn chat through a real `StateGraph` (`invoke` per turn, "
             "contenders interleaved turn by turn):", "",
             "| contender | total | bytes on disk | last 10 turns vs first 10 |",
             "|---|---|---|---|"]
    for k, v in ch["results"].items():
        rows.append(f"| {k} | {v['total_s']:.2f} s | {v['bytes_on_disk']:,} | "
                    f"{v['last_vs_first']:.2f}x |")
    r = disc["results"]
    rows += ["", f"Finding the {disc['inflight']} interrupted runs among {disc['threads']:,} "
             f"threads: fsdurable's listing of `markers/` {fmt_time(r['fsdurable']['median'])}; "
             "a SqliteSaver user reading every thread's latest checkpoint "
             f"{fmt_time(r['sqlite_every_thread']['median'])} "
             f"({disc['ratios']['sqlite_every_thread_vs_fsdurable']:,.0f}x).", ""]
    put_r = pg["ratios"]["put_fsdurable_vs_sqlite_full"]
    rows.append(f"The chat takes {ch['ratios']['total_fsdurable_vs_sqlite_full']:.1f}x "
                "SqliteSaver's time; each of its turns is two puts, two put_writes and the "
                "run's marker written and removed.")
    rows.append("")
    rows.append(
        f"`put` is {put_r:.2f}x SqliteSaver at equal durability (target <= 1.5x"
        f"{', met' if put_r <= 1.5 else ', **missed**'}). A put inside a graph run appends one "
        "frame (its record and the thread's head) to the thread's log and fdatasyncs it: one "
        "fsync, as SQLite in WAL mode appends to its WAL and fsyncs it once. A run's first and "
        "last put also commit the session document and write/remove the run's marker (that is "
        "what makes the run findable after a crash), which is why a chat turn costs more than "
        "two puts. No history is rewritten by a put; a chat's turns still grow, as its peers' "
        "do, because LangGraph serialises the whole conversation into every checkpoint."
        + (f" The floor, one append + fdatasync of the bytes a put adds to the log, took "
           f"{fmt_time(pg['put']['floor_append']['median'])}: "
           f"{pg['ratios']['put_floor_append_vs_sqlite_full']:.2f}x SqliteSaver's put; fsdurable "
           f"is {pg['ratios']['put_fsdurable_vs_floor_append']:.2f}x it, the Python around the "
           "one fdatasync." if "floor_append" in pg["put"] else ""))
    return "\n".join(rows)
