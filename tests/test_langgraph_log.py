"""The LangGraph saver's per-thread log (docs/storage.md, "LangGraph threads"): a torn tail
ignored and cut, a log shorter than its document refused, and threads of the older record-file
layout (lghead/1) read in place, migrated by their first write and copied into a log by a
deletion."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

from fsdurable import UnreadableState
from fsdurable._lgstore import thread_session_id
from fsdurable.langgraph import FsDurableSaver
from tests.torture.lgcrash import to_record_files

CFG: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def put(saver: FsDurableSaver, step: int, parent: Any = None) -> Any:
    cfg: Any = {"configurable": dict(CFG["configurable"])}
    if parent is not None:
        cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    cp = generate_checkpoint(channel_values={"log": [f"m{i}" for i in range(step + 1)],
                                             "step": step},
                             channel_versions={"log": step + 1, "step": step + 1})
    return saver.put(cfg, cp, {"source": "loop", "step": step, "parents": {}},
                     {"log": step + 1, "step": step + 1})


def snapshot(saver: FsDurableSaver) -> list[tuple[str, Any, int]]:
    return [(t.checkpoint["id"], t.checkpoint["channel_values"], len(t.pending_writes or []))
            for t in saver.list(CFG)]


def log_of(root: Path, n: int = 0) -> Path:
    return root / "langgraph" / thread_session_id("t") / f"{n:06d}.lglog"


def test_a_torn_tail_is_ignored_by_readers_and_cut_by_the_next_put(tmp_path: Path) -> None:
    root = tmp_path / "s"
    saver = FsDurableSaver(root)
    c = None
    for i in range(3):
        c = put(saver, i, c)
    before = snapshot(saver)
    saver.close()  # the run's route lock: each saver below is another process's
    log = log_of(root)
    good = log.read_bytes()
    for tail in (b"\x1eLGF\x00\x00\x10\x00garbage", b"\x00" * 700, good[-300:]):
        log.write_bytes(good + tail)
        fresh = FsDurableSaver(root)
        assert snapshot(fresh) == before  # the tail is no frame: ignored
        nxt = put(fresh, 3, c)
        fresh.close()
        assert log.stat().st_size > len(good)
        assert not log.read_bytes()[len(good):].startswith(tail[:20])  # cut, then appended
        again = FsDurableSaver(root)
        got = again.get_tuple(CFG)
        assert got is not None and got.checkpoint["id"] == nxt["configurable"]["checkpoint_id"]
        assert len(snapshot(again)) == len(before) + 1
        log.write_bytes(good)


def test_a_log_shorter_than_its_document_is_unreadable_never_older(tmp_path: Path) -> None:
    root = tmp_path / "s"
    saver = FsDurableSaver(root)
    c = None
    for i in range(3):
        c = put(saver, i, c)
    saver.prune(["t"])  # commits the document: it counts the whole of log 1
    saver.close()
    log = log_of(root, 1)
    data = log.read_bytes()
    log.write_bytes(data[:-10])
    with pytest.raises(UnreadableState) as e:
        FsDurableSaver(root).get_tuple(CFG)
    assert e.value.reason == "log_short"


def test_a_thread_of_the_record_file_layout_is_read_migrated_and_copied(tmp_path: Path) -> None:
    root = tmp_path / "s"
    saver = FsDurableSaver(root)
    c = None
    for i in range(4):
        c = put(saver, i, c)
    saver.put_writes(c, [("log", "w")], "task")
    before = snapshot(saver)
    saver.close()
    to_record_files(str(root), "t")
    d = root / "langgraph" / thread_session_id("t")
    assert len(list(d.glob("*.ckpt"))) == 4 and not list(d.glob("*.lglog"))

    old = FsDurableSaver(root)
    assert snapshot(old) == before  # read in place
    c = put(old, 4, c)  # the first write: a log 0, and the document says lghead/2
    old.close()
    sid = thread_session_id("t")
    head = old.store.load(sid).metadata["langgraph"]
    assert head["format"] == "fsdurable.lghead/2" and head["legacy"] == 5
    assert log_of(root).exists() and len(list(d.glob("*.ckpt"))) == 4
    after = snapshot(FsDurableSaver(root))
    assert after[1:] == before and after[0][0] == c["configurable"]["checkpoint_id"]

    fresh = FsDurableSaver(root)
    fresh.prune(["t"])  # a deletion copies what stays into a log and removes the files
    assert sorted(os.listdir(d)) == ["000001.lglog"]
    kept = snapshot(FsDurableSaver(root))
    assert kept == [after[0]]
    assert kept[0][1] == {"log": [f"m{i}" for i in range(5)], "step": 4}


def test_a_torn_log_header_of_a_new_thread_is_replaced(tmp_path: Path) -> None:
    """A crash between creating a log and making its header durable leaves a file with part
    of a header: nothing was ever appended to it, so the next put replaces it."""
    root = tmp_path / "s"
    saver = FsDurableSaver(root)
    saver.threads.ensure("t")  # the document, no log yet
    log = log_of(root)
    log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    log.write_bytes(b'{"format": "fsdurable.lg')
    fresh = FsDurableSaver(root)
    assert fresh.get_tuple(CFG) is None
    c = put(fresh, 0)
    fresh.close()
    got = FsDurableSaver(root).get_tuple(CFG)
    assert got is not None and got.checkpoint["id"] == c["configurable"]["checkpoint_id"]


def test_a_threads_files_without_their_document_are_kept_in_quarantine(tmp_path: Path) -> None:
    """A thread's log that arrived (by a sync tool) before its session document, or that a
    crashed first put left: the next first put of the thread on this node never deletes it
    (it did: ``_clear_dir`` unlinked every file); the repair gate moves it into quarantine/
    with an event, byte for byte."""
    import shutil

    import fsdurable

    a, b = tmp_path / "a", tmp_path / "b"
    other = FsDurableSaver(fsdurable.Store(a, node_id="laptop"))
    put(other, 0)
    other.close()
    theirs = log_of(a).read_bytes()
    (b / "langgraph").mkdir(parents=True)
    shutil.copytree(log_of(a).parent, log_of(b).parent)  # the log came first; no document yet
    mine = FsDurableSaver(fsdurable.Store(b, node_id="desktop"))
    put(mine, 0)
    mine.close()
    store = fsdurable.Store(b)
    kept = [q for q in os.listdir(b / "quarantine") if q.endswith(log_of(b).name)]
    assert len(kept) == 1, os.listdir(b / "quarantine")
    assert (b / "quarantine" / kept[0]).read_bytes() == theirs
    [ev] = [e for e in store.events(thread_session_id("t")) if e.code == "file_quarantined"]
    assert ev.detail["kind"] == "langgraph" and ev.detail["cause"] == "no_session"
    assert snapshot(FsDurableSaver(store))[0][1]["step"] == 0  # this node's thread is readable


def test_a_cut_forgets_exactly_the_records_after_the_last_head() -> None:
    """``LogView.cut`` drops only the newest entries (records of a write whose head frame a
    crash tore off), keeping every number up to the head in order for the next write."""
    from fsdurable._lglog import LogView, encode_frames, encode_record

    def rec(seq: int) -> tuple[str, int, bytes]:
        return ("ckpt", seq, encode_record({"kind": "ckpt", "seq": seq, "ns": "",
                                            "id": f"c{seq}"}, [(["checkpoint"], ("json", b"{}"))]))

    first = encode_frames([rec(1), rec(2)], {"seq": 2})
    torn = encode_frames([rec(3), rec(4), rec(5)], {"seq": 5})
    frame5 = len(encode_frames([rec(5)], {"seq": 5}))
    view = LogView(key=(0, 0), base=0, gen="g")
    data = first + torn[:-frame5 // 2]  # records 3 and 4 whole, the frame with the head cut
    view.feed(data, 0, 1 << 20)
    assert list(view.locs) == [1, 2, 3, 4] and view.head_seq == 2 and view.torn
    view.cut()
    assert list(view.locs) == [1, 2] and view.end == len(first) and view.seq == 2
    again = encode_frames([rec(3)], {"seq": 3})
    view.feed(again, view.end, 1 << 20)
    assert list(view.locs) == [1, 2, 3] and view.head == {"seq": 3}
    assert view.end == view.head_end == len(first) + len(again)


def test_what_a_writer_keeps_of_its_own_frames_is_what_a_reader_parses(tmp_path: Path) -> None:
    """A put takes its frames into the log's view and its records into the cache as encoded,
    never reading them back: both must equal what a fresh reader parses from the file."""
    from fsdurable._lglog import parse_record, scan

    saver = FsDurableSaver(tmp_path / "s")
    c = None
    for i in range(3):
        c = put(saver, i, c)
    assert c is not None
    saver.put_writes(c, [("log", "w"), ("step", 7)], "task-1", "p")  # to the latest
    child: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": "sub",
                                   "checkpoint_id": "x"}}
    cp = generate_checkpoint(channel_values={"log": ["c"]}, channel_versions={"log": 1})
    saver.put_writes({"configurable": {"thread_id": "t", "checkpoint_ns": "",
                                       "checkpoint_id": "9999"}}, [("log", 1)], "early", "")
    saver.put(child, cp, {"source": "loop", "step": 0, "parents": {}}, {"log": 1})
    saver.copy_thread("t", "u")
    for tid in ("t", "u"):
        th = saver.threads
        sid = th.sid(tid)
        s = th.session(sid)
        assert s is not None
        kept = th._logs[sid][1]
        fresh = scan(th.log_path(sid, th.head(s)["log"]["n"]), None, th._max)
        assert fresh is not None
        for field in ("end", "seq", "head", "head_end", "head_seq", "locs", "torn", "base"):
            assert getattr(kept, field) == getattr(fresh, field), field
        assert set(kept.head or {}) >= {"ns", "seq", "gen"}
        for (rsid, _gen, seq), rec in list(th._records.items()):
            if rsid == sid:
                kind = fresh.locs[seq][0]
                assert rec == parse_record(th.raw(s, seq, kind)), (tid, seq)
