"""fsdurable.langgraph: durable graph runs with real LangGraph graphs, real processes, SIGKILL.

The graph (tests/lg_graph.py) is a StateGraph with a tool node and langchain_core's fake chat
model made deterministic; child processes run it against a real store in a temp dir.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from jsonschema import Draft202012Validator
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt

import fsdurable
from fsdurable._lgstore import parse_record, thread_session_id
from fsdurable.langgraph import FsDurableSaver, arecover, recover

from . import lg_graph
from .conftest import PYTHON, REPO, run_module, subprocess_env
from .conftest import io_log as recording

# what tests/lg_graph.py's children import: once, in their fork server
LG_WARM = ("langchain_core.language_models.fake_chat_models", "langgraph.graph",
           "langgraph.prebuilt", "fsdurable.langgraph")

SCHEMAS = REPO / "schemas"
SCHEMA = {k: Draft202012Validator(json.loads((SCHEMAS / f"{k}.schema.json").read_text()))
          for k in ("lgrecord", "lghead", "lglog", "lgframe")}


def child(*args: str, log: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_module("tests.lg_graph", list(args), subprocess_env(LG_LOG=str(log), **env),
                      LG_WARM, timeout=180)


def events(log: Path) -> list[str]:
    return log.read_text().splitlines()


def clean_transcript(tmp_path: Path) -> list[Any]:
    saver = FsDurableSaver(tmp_path / "reference")
    return lg_graph.summary(lg_graph.run(lg_graph.build(saver), "ref"))


def crash(root: Path, log: Path, thread: str = "t1", at: str = "5+10") -> None:
    out = child("run", str(root), thread, log=log, LG_CRASH_AT=at)
    assert out.returncode == -9, out.stderr  # SIGKILLed inside the tool call


def test_a_sigkilled_run_is_resumed_by_a_fresh_process(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "nodes.log"
    crash(root, log)
    # the run was in flight: its thread is an interrupted turn, found by one listing
    found = fsdurable.Store(root).interrupted()
    assert [m.session_id for m in found] == [thread_session_id("t1")]

    out = child("recover", str(root), log=log)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    [o] = res["report"]["outcomes"]
    assert (o["outcome"], o["status"], o["attempts"]) == ("resumed", "completed", 1)
    assert res["states"]["t1"] == clean_transcript(tmp_path)  # as if it never crashed
    lines = events(log)
    done = [x.split(" unattended")[0] for x in lines if "-done" in x]
    assert len(done) == len(set(done)), f"a completed node ran twice: {lines}"
    assert lines.count("tool-start 5+10") == 2  # the killed call, then its resume
    assert "agent-done 2 unattended=True" in lines  # the resumed run is unattended
    assert "agent-done 0 unattended=False" in lines
    store = fsdurable.Store(root)
    assert store.interrupted() == []
    codes = [e.code for e in store.events(thread_session_id("t1"))]
    assert codes[-3:] == ["interrupted_turn_resuming", "turn_completed", "interrupted_turn_resumed"]
    assert codes[0] == "turn_started"  # the live run began a turn of the langgraph driver


def test_a_run_that_keeps_crashing_is_abandoned_at_the_cap_and_stays_readable(
        tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "nodes.log"
    crash(root, log)
    (tmp_path / "nodes.log.crashed").unlink()
    for attempt in (1, 2, 3):  # each resume dies in the same tool: the count was committed first
        out = child("recover", str(root), log=log, LG_CRASH_AT="5+10")
        assert out.returncode == -9, out.stderr
        (tmp_path / "nodes.log.crashed").unlink()
        [m] = fsdurable.Store(root).interrupted()
        assert m.resume_attempts == attempt
    out = child("recover", str(root), log=log, LG_CRASH_AT="5+10")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    [o] = res["report"]["outcomes"]
    assert (o["outcome"], o["reason"]) == ("abandoned", "exhausted")
    assert fsdurable.Store(root).interrupted() == []
    # abandoned, not deleted: the transcript up to the crash is still there
    assert [m[0] for m in res["states"]["t1"]] == ["HumanMessage", "AIMessage", "ToolMessage",
                                                   "AIMessage"]


def test_a_completed_run_and_a_run_paused_at_interrupt_are_not_interrupted(
        root: Path) -> None:
    saver = FsDurableSaver(root)
    lg_graph.run(lg_graph.build(saver), "done")
    g = StateGraph(dict)

    def ask(state: dict[str, Any]) -> dict[str, Any]:
        return {"answer": interrupt("approve?")}

    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    graph = g.compile(checkpointer=saver)
    cfg: Any = {"configurable": {"thread_id": "human"}}
    graph.invoke({"answer": None}, cfg)
    assert graph.get_state(cfg).interrupts  # waiting for a human...
    assert saver.store.interrupted() == []  # ...is not an interrupted turn
    report = recover(graph, saver)
    assert report.outcomes == ()
    assert graph.invoke(Command(resume="yes"), cfg) == {"answer": "yes"}
    assert saver.store.interrupted() == []


def test_a_stale_run_is_abandoned_and_stays_readable(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "nodes.log"
    crash(root, log)
    now = [fsdurable.Store(root).clock()]
    saver = FsDurableSaver(fsdurable.Store(root, clock=lambda: now[0] + 5 * 3600))
    graph = lg_graph.build(saver)
    [o] = recover(graph, saver).outcomes
    assert (o.outcome, o.reason) == ("abandoned", "stale")
    assert not (log.read_text().count("agent-done 2"))  # nothing ran
    assert saver.store.interrupted() == []
    state = graph.get_state({"configurable": {"thread_id": "t1"}})
    assert len(state.values["messages"]) == 4 and state.next == ("tools",)


def test_arecover_resumes_on_the_callers_event_loop(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "nodes.log"
    crash(root, log)
    saver = FsDurableSaver(root)
    graph = lg_graph.build(saver)

    async def main() -> Any:
        beats = 0

        async def heartbeat() -> None:
            nonlocal beats
            while True:
                await asyncio.sleep(0.001)
                beats += 1

        hb = asyncio.create_task(heartbeat())
        report = await arecover(graph, saver)
        hb.cancel()
        state = await graph.aget_state({"configurable": {"thread_id": "t1"}})
        return report, state, beats

    report, state, beats = asyncio.run(main())
    [o] = report.outcomes
    assert (o.outcome, o.status) == ("resumed", "completed")
    assert lg_graph.summary(state.values) == clean_transcript(tmp_path)
    assert beats > 0  # the loop kept running while recovery worked


# ---------------------------------------------------------------------- storage



def cfg_of(tid: str) -> Any:
    return {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}  # generate_config: no ""


def _put(saver: FsDurableSaver, tid: str, parent: Any, i: int, value: Any) -> Any:
    cfg = cfg_of(tid)
    if parent is not None:
        cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    cp = generate_checkpoint(channel_values={"messages": value, "step": i},
                             channel_versions={"messages": i + 1, "step": i + 1})
    return saver.put(cfg, cp, generate_metadata(step=i), {"messages": i + 1, "step": i + 1})


def test_a_put_in_a_run_is_one_frame_appended_to_the_log_and_one_fsync(root: Path) -> None:
    """The first put begins the run (document, marker, log); every later one appends one
    frame to the thread's log and fdatasyncs it — nothing else is written, renamed or synced."""
    saver = FsDurableSaver(root, config=fsdurable.Config(checkpoint_debounce=3600.0))
    cfg = None
    sizes = []
    sid = thread_session_id("chat")
    log = str(root / "langgraph" / sid / "000000.lglog")
    for i in range(30):
        with recording() as ops:
            cfg = _put(saver, "chat", cfg, i, ["same size message"] * 3)
        if i == 0:
            assert any(op == "rename" and a[1].endswith(f"{sid}.json") for op, a in ops)
            continue
        assert [(op, a[0]) for op, a in ops] == [("append", log), ("fsync", log)], ops
        sizes.append(len(ops[0][1][1]))
    assert max(sizes) - min(sizes) < 64  # flat: a frame does not grow with history
    tup = saver.get_tuple(generate_config("chat"))
    assert tup is not None and tup.checkpoint["channel_values"]["step"] == 29
    assert len(list(saver.list(generate_config("chat")))) == 30
    fresh = FsDurableSaver(root)  # another process: the log's frames, not the document's head
    again = fresh.get_tuple(generate_config("chat"))
    assert again is not None and again.checkpoint == tup.checkpoint
    assert len(list(fresh.list(generate_config("chat")))) == 30


def _frames(data: bytes) -> list[tuple[dict[str, Any], bytes]]:
    """The frames of a log's bytes after its header line, parsed as schemas/lglog.schema.json
    describes them (an independent reader of the documented format)."""
    import struct
    import zlib

    out, i = [], 0
    while i < len(data):
        magic, n, crc = struct.unpack_from(">4sII", data, i)
        assert magic == b"\x1eLGF"
        body = data[i + 12:i + 12 + n]
        assert len(body) == n and zlib.crc32(body) == crc
        nl = body.index(b"\n")
        out.append((json.loads(body[:nl]), body[nl + 1:]))
        i += 12 + n
    return out


def test_every_file_written_validates_and_payloads_are_the_serializers_bytes(
        root: Path) -> None:
    saver = FsDurableSaver(root)
    with recording() as ops:
        lg_graph.run(lg_graph.build(saver), "v")
        saver.copy_thread("v", "w")
        saver.prune(["w"])
        saver.delete_for_runs(["nope"])
    written = {a[0]: a[1] for op, a in ops if op == "write"}
    finals = [(written[a[0]], a[1]) for op, a in ops if op in ("rename", "link")]
    finals += [(written[a[0]], a[0]) for op, a in ops  # write_new: no temp file
               if op == "create" and not os.path.basename(a[0]).startswith("~")]
    appended = [(a[1], a[0]) for op, a in ops if op == "append" and "/langgraph/" in a[0]]
    for v in SCHEMA.values():
        Draft202012Validator.check_schema(v.schema)
        assert v.schema.get("additionalProperties", True) is True  # readers ignore unknown keys
    n_records = n_heads = n_logs = 0

    def frames(data: bytes, where: str) -> None:
        nonlocal n_records
        for hdr, rest in _frames(data):
            assert not list(SCHEMA["lgframe"].iter_errors(hdr)), (where, hdr)
            if "record" in hdr:
                rec = parse_record(rest, path=where)
                assert not list(SCHEMA["lgrecord"].iter_errors(rec.header))
                assert hdr["record"][:3] == [rec.header["kind"], rec.header["seq"], len(rest)]
                for meta, typed in zip(rec.header["parts"], rec.parts, strict=True):
                    if typed[0] != "empty":
                        value = saver.serde.loads_typed(typed)
                        assert saver.serde.dumps_typed(value)[0] == meta[1]
                n_records += 1
            else:
                assert rest == b""

    for data, final in finals:
        if "/langgraph/" in final:
            assert final.endswith(".lglog")
            nl = data.index(b"\n")
            assert not list(SCHEMA["lglog"].iter_errors(json.loads(data[:nl])))
            frames(data[nl + 1:], final)
            n_logs += 1
        elif "/sessions/lg-" in final:
            head = json.loads(data)["metadata"]["langgraph"]
            assert not list(SCHEMA["lghead"].iter_errors(head))
            n_heads += 1
    for data, final in appended:
        frames(data, final)
    assert n_records > 5 and n_heads > 5 and n_logs >= 3


@pytest.mark.parametrize("tid", ["../../etc/passwd", "a/b\\c", "", "CON", "t\u00e9\u4e2d\x00",
                                 "x" * 5000, "Same", "same"])
def test_any_thread_id_stays_inside_its_directory(root: Path, tid: str) -> None:
    saver = FsDurableSaver(root)
    _put(saver, tid, None, 0, "hello")
    sid = thread_session_id(tid)
    assert sid.startswith("lg-") and len(sid) == 35 and sid == sid.lower()
    assert sorted(os.listdir(root / "langgraph")) == [sid]
    tup = saver.get_tuple(cfg_of(tid))
    assert tup is not None and tup.config["configurable"]["thread_id"] == tid
    assert [t.config["configurable"]["thread_id"] for t in saver.list(None)] == [tid]


def test_puts_from_many_threads_are_all_kept(root: Path) -> None:
    saver = FsDurableSaver(root)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            cfg = None
            for i in range(10):
                cfg = _put(saver, f"t{k % 2}", None, i, k)
                saver.put_writes(cfg, [("ch", k)], f"task{k}-{i}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    fresh = FsDurableSaver(root)
    for tid in ("t0", "t1"):
        got = list(fresh.list(generate_config(tid)))
        assert len(got) == 30
        assert all(len(t.pending_writes or []) == 1 for t in got)


def test_import_fsdurable_and_discovery_import_no_langgraph(tmp_path: Path) -> None:
    root = tmp_path / "store"
    FsDurableSaver(root)
    code = ("import sys, fsdurable; fsdurable.Store(sys.argv[1]).interrupted(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('langgraph', 'langchain_core')))")
    out = subprocess.run([PYTHON, "-c", code, str(root)], env=subprocess_env(), text=True,
                         capture_output=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def _cp(ckid: str | None = None, *, pending: bool) -> Any:
    cp = generate_checkpoint(checkpoint_id=ckid)
    cp["updated_channels"] = ["branch:to:next"] if pending else ["x"]
    return cp


def test_writes_saved_before_their_checkpoint_join_it_and_an_early_interrupt_pauses(
        root: Path) -> None:
    """durability="async" saves in the background: a task's writes may reach the saver before
    the checkpoint they belong to (seen with a real graph paused at interrupt())."""
    saver = FsDurableSaver(root)
    first = saver.put(cfg_of("t"), _cp(pending=True), generate_metadata(), {})
    nxt = _cp(pending=True)
    early = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": nxt["id"]}}
    saver.put_writes(early, [("x", 1), ("__interrupt__", {"ask": "?"})], "task")
    parent = {**cfg_of("t")}
    parent["configurable"] = {**parent["configurable"],
                              "checkpoint_id": first["configurable"]["checkpoint_id"]}
    saver.put(parent, nxt, generate_metadata(step=1), {})
    tup = saver.get_tuple(cfg_of("t"))
    assert tup is not None and tup.checkpoint["id"] == nxt["id"]
    assert sorted(w[1] for w in tup.pending_writes or []) == ["__interrupt__", "x"]
    assert saver.store.interrupted() == []  # paused for a human, not interrupted


def test_a_late_write_to_an_older_checkpoint_never_reopens_the_run(root: Path) -> None:
    saver = FsDurableSaver(root)
    first = saver.put(cfg_of("t"), _cp(pending=True), generate_metadata(), {})
    parent = {"configurable": {**first["configurable"]}}
    saver.put(parent, _cp(pending=False), generate_metadata(step=1), {})  # the run ended
    assert saver.store.interrupted() == []
    saver.put_writes(first, [("__resume__", "late")], "task")
    assert saver.store.interrupted() == []
    tup = saver.get_tuple(first)
    assert tup is not None and [w[1] for w in tup.pending_writes or []] == ["__resume__"]


def test_a_run_stopped_at_a_bound_breakpoint_is_paused_and_in_flight_once_resumed(
        root: Path) -> None:
    from typing import TypedDict

    class S(TypedDict):
        n: int

    saver = FsDurableSaver(root)
    seen: list[bool] = []

    def c(state: S) -> S:
        seen.append(bool(saver.store.interrupted()))  # the resumed run is in flight again
        return {"n": state["n"] - 1}

    g = StateGraph(S)
    g.add_node("a", lambda s: {"n": s["n"] + 1})
    g.add_node("b", lambda s: {"n": s["n"] * 10})
    g.add_node("c", c)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    graph = saver.bind(g.compile(checkpointer=saver, interrupt_before=["b"]))
    cfg: Any = {"configurable": {"thread_id": "bp"}}
    assert graph.invoke({"n": 1}, cfg, durability="sync") == {"n": 2}
    assert graph.get_state(cfg).next == ("b",)
    assert saver.store.interrupted() == []  # waiting for a human at the breakpoint
    assert recover(graph, saver).outcomes == ()
    assert graph.invoke(None, cfg, durability="sync") == {"n": 19}
    assert seen == [True] and saver.store.interrupted() == []
