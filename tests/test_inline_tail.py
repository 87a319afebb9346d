"""The inline tail (docs/storage.md, "The inline tail", format ``fsdurable.session/6``): a
chain's newest values kept in the document up to a bound — what a commit writes below the bound
(the document alone: one file, two fsyncs) and when it passes it (one segment holding the tail
and the new values, chained after the head), the history read back identical before and after,
cuts (pop, trim, compaction) within and below the tail, a session with no segment at all
(read, synced as one file, judged by the repair gate), waiting for sync below the tail, hostile
tails, and a format-5 store read as it is and migrated by the repair gate with its event."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

import fsdurable
from fsdurable import _repair
from fsdurable._codec import parse_session
from fsdurable._config import Config
from fsdurable._doctor import doctor
from fsdurable._errors import HistoryUnavailable
from fsdurable._history import History
from fsdurable._model import Message, extended
from fsdurable._recordcodec import upgrade
from fsdurable._segments import repair_history

from .lane_session import KEY
from .lane_session import LaneSession as FileSession
from .test_lanes import files, fsyncs, io_log, written
from .test_schemas import assert_valid


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _store(root: Path, *, bound: int = 1024, values: int = 256, node: str = "node-test",
           clock: Clock | None = None) -> fsdurable.Store:
    return fsdurable.Store(root, node_id=node, clock=clock or Clock(),
                           config=Config(inline_tail_bytes=bound, inline_tail_values=values))


def _msg(i: int, size: int = 100) -> Message:
    return Message("user" if i % 2 == 0 else "assistant", f"{i}:" + "m" * size)


def _encoded(m: Message) -> int:
    from fsdurable._codec import _conv

    return len(json.dumps(_conv().unstructure(m), separators=(",", ":")))


def _add(store: fsdurable.Store, sid: str, *msgs: Message) -> fsdurable.Session:
    return store.patch(sid, lambda s: attrs.evolve(s, messages=extended(s.messages, *msgs)))


def _doc(root: Path, sid: str) -> dict[str, Any]:
    d: dict[str, Any] = json.loads((root / "sessions" / f"{sid}.json").read_bytes())
    return d


def _segments(root: Path, sid: str) -> list[Path]:
    d = root / "history" / sid
    return sorted(d.iterdir()) if d.exists() else []


def test_a_small_commit_writes_the_document_alone(root: Path) -> None:
    store = _store(root, bound=16 * 1024)
    store.create("c")
    for i in range(5):
        with io_log() as ops:
            _add(store, "c", _msg(i))
        path = str(root / "sessions" / "c.json")
        assert files(ops) == [path] and fsyncs(ops) == 2, ops  # one file, two fsyncs
        assert not [a for op, a in ops if "history" in str(a[0])]
        assert written(ops) < 1000 + (i + 1) * 150
    assert not (root / "history").exists() or not _segments(root, "c")
    doc = _doc(root, "c")["history"]
    assert doc["head"] is None and doc["sha256"] is None and doc["count"] == 5
    assert [m["content"] for m in doc["inline"]] == [_msg(i).content for i in range(5)]
    assert tuple(_store(root).load("c").messages) == tuple(_msg(i) for i in range(5))


def test_the_tail_is_flushed_exactly_when_the_bound_passes(root: Path) -> None:
    bound = 600
    store = _store(root, bound=bound)
    store.create("c")
    sent: list[Message] = []
    inline: list[Message] = []
    flushes = 0
    for i in range(40):
        m = _msg(i, size=40 + 7 * (i % 5))
        size = sum(_encoded(x) for x in [*inline, m]) + len(inline) + 2
        before = {p.name for p in _segments(root, "c")}
        with io_log() as ops:
            _add(store, "c", m)
        sent.append(m)
        new = sorted({p.name for p in _segments(root, "c")} - before)
        doc = _doc(root, "c")["history"]
        if size <= bound:
            inline.append(m)
            assert new == [] and fsyncs(ops) == 2, (i, size)
            assert len(doc["inline"]) == len(inline)
        else:  # one segment: the tail and the new message, after the chain's head
            assert len(new) == 1 and doc["head"] == new[0] and "inline" not in doc, (i, size)
            seg = json.loads((root / "history" / "c" / new[0]).read_bytes())
            assert [x["content"] for x in seg["messages"]] == [x.content for x in [*inline, m]]
            assert seg["first"] == i + 1 - len(inline) - 1
            assert (seg["prev"] is None) == (flushes == 0)
            inline, flushes = [], flushes + 1
        assert doc["count"] == i + 1
        # read back by another store: the same history, whichever form it is in
        assert tuple(_store(root).load("c").messages) == tuple(sent)
        assert_valid("session", (root / "sessions" / "c.json").read_bytes())
    assert flushes >= 5
    for p in _segments(root, "c"):
        assert_valid("segment", p.read_bytes())
    # the chain: each segment names and proves the one before it
    s = _store(root).load("c")
    assert isinstance(s.messages, History) and s.messages.chain is not None
    names = s.messages.chain.segment_names()
    assert len(names) == flushes and names == sorted(names, reverse=True)


def test_the_bound_in_values(root: Path) -> None:
    store = _store(root, bound=1 << 20, values=3)
    store.create("c")
    for i in range(3):
        _add(store, "c", Message("user", str(i)))
    assert _segments(root, "c") == [] and len(_doc(root, "c")["history"]["inline"]) == 3
    _add(store, "c", Message("user", "3"))
    [seg] = _segments(root, "c")
    assert len(json.loads(seg.read_bytes())["messages"]) == 4
    assert [m.content for m in _store(root).load("c").messages] == ["0", "1", "2", "3"]


def test_a_big_message_goes_to_a_segment_at_once(root: Path) -> None:
    store = _store(root, bound=1000)
    store.create("c")
    _add(store, "c", _msg(0, size=10))
    _add(store, "c", _msg(1, size=5000))  # over the bound alone: with the tail, one segment
    [seg] = _segments(root, "c")
    assert [m["content"][:2] for m in json.loads(seg.read_bytes())["messages"]] == ["0:", "1:"]
    assert "inline" not in _doc(root, "c")["history"]


def test_reading_the_tail_reads_no_segment(root: Path) -> None:
    store = _store(root, bound=500)
    store.create("c")
    for i in range(8):
        _add(store, "c", _msg(i))
    doc = _doc(root, "c")["history"]
    assert doc["head"] is not None and doc["inline"]
    moved = root / "moved"
    shutil.move(str(root / "history" / "c"), moved)  # a sync tool has not delivered them yet
    s = _store(root).load("c")
    assert s.messages[-1] == _msg(7)  # inline: nothing to read
    with pytest.raises(HistoryUnavailable) as info:
        tuple(s.messages)
    assert info.value.reason == "waiting_for_sync"
    s = _add(_store(root), "c", _msg(8))  # a commit still works, the tail grows
    shutil.move(str(moved), root / "history" / "c")
    assert tuple(_store(root).load("c").messages) == tuple(_msg(i) for i in range(9))


def test_a_corrupt_inline_message_is_the_history_s_finding_not_the_document_s(
        root: Path) -> None:
    store = _store(root)
    store.create("c")
    _add(store, "c", _msg(0))
    path = root / "sessions" / "c.json"
    d = json.loads(path.read_bytes())
    d["history"]["inline"][0]["role"] = 7
    path.write_bytes(json.dumps(d).encode())
    s = _store(root).load("c")  # the document reads: load structures no message
    assert len(s.messages) == 1
    store2 = _store(root)
    store2.patch("c", lambda cur: attrs.evolve(cur, metadata={"x": 1}))  # nor does a patch
    with pytest.raises(HistoryUnavailable) as info:
        tuple(store2.load("c").messages)
    assert info.value.reason == "history_corrupt"
    assert any(f.code == "history_unreadable" for f in doctor(store2))
    assert path.exists()


def test_lane_pops_and_trims_cut_the_tail_then_the_chain(root: Path) -> None:
    store = _store(root, bound=200)
    fs = FileSession("c", store)

    def run(coro: Any) -> Any:
        return asyncio.run(coro)

    run(fs.add_items([{"n": i, "pad": "p" * 60} for i in range(3)]))  # past 200: a segment
    [first] = _segments(root, "c")
    run(fs.add_items([{"n": 3}]))
    run(fs.add_items([{"n": 4}]))  # inline: 3, 4
    lane = _doc(root, "c")["lanes"][KEY]
    assert lane["head"] == first.name and [x["n"] for x in lane["inline"]] == [3, 4]
    with io_log() as ops:
        assert run(fs.pop_item())["n"] == 4  # within the tail: the document alone
    assert files(ops) == [str(root / "sessions" / "c.json")]
    assert run(fs.pop_item())["n"] == 3
    assert "inline" not in _doc(root, "c")["lanes"][KEY]
    assert run(fs.pop_item())["n"] == 2  # below the tail: the head cut at 2
    lane = _doc(root, "c")["lanes"][KEY]
    assert lane["count"] == 2 and lane["head"] == first.name
    run(fs.add_items([{"n": 7}]))  # inline after a cut head
    lane = _doc(root, "c")["lanes"][KEY]
    assert lane["count"] == 3 and [x["n"] for x in lane["inline"]] == [7]
    assert [x["n"] for x in run(FileSession("c", _store(root)).get_items())] == [0, 1, 7]
    run(fs.add_items([{"n": 8, "pad": "p" * 200}]))  # flushed: first = the cut, prev = head
    new = [p for p in _segments(root, "c") if p != first]
    [seg] = new
    d = json.loads(seg.read_bytes())
    assert d["first"] == 2 and d["prev"] == first.name and [x["n"] for x in d["items"]] == [7, 8]
    assert [x["n"] for x in run(FileSession("c", _store(root)).get_items())] == [0, 1, 7, 8]
    assert [x["n"] for x in run(FileSession("c", _store(root)).get_items(limit=1))] == [8]
    assert_valid("segment", seg.read_bytes())
    assert_valid("session", (root / "sessions" / "c.json").read_bytes())


def test_a_compaction_within_the_tail_writes_no_segment(root: Path) -> None:
    store = _store(root)
    store.create("c")
    for i in range(4):
        _add(store, "c", _msg(i))
    s = store.patch("c", lambda cur: attrs.evolve(cur, summary="earlier",
                                                  messages=tuple(cur.messages)[-1:]))
    assert _segments(root, "c") == []
    doc = _doc(root, "c")["history"]
    assert doc["start"] == 3 and doc["count"] == 4 and len(doc["inline"]) == 4
    assert tuple(s.messages) == (_msg(3),)
    assert tuple(_store(root).load("c").messages) == (_msg(3),)
    assert _store(root).archive("c") == tuple(_msg(i) for i in range(3))


def test_a_session_without_segments_syncs_and_repairs_as_one_file(tmp_path: Path) -> None:
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    clock = Clock()
    a = _store(a_root, node="node-a", clock=clock)
    b = _store(b_root, node="node-b", clock=clock)
    a.create("c")
    s = a.begin_turn("c", "hello")
    a.end_turn(s, "hi")
    assert not (a_root / "history").exists() or _segments(a_root, "c") == []
    shutil.copy(a_root / "sessions" / "c.json", b_root / "sessions" / "c.json")  # the sync
    assert [m.content for m in b.load("c").messages] == ["hello", "hi"]
    s = b.begin_turn("c", "more")
    b.end_turn(s, "sure")
    shutil.copy(b_root / "sessions" / "c.json", a_root / "sessions" / "c.json")
    a2 = _store(a_root, node="node-a", clock=clock)
    assert [m.content for m in a2.load("c").messages] == ["hello", "hi", "more", "sure"]
    clock.now += 2 * Config().segment_grace
    assert repair_history(a2, "c") == []
    findings = doctor(a2, repair=True)
    assert not [f for f in findings if f.code.startswith("history") or "segment" in f.code]
    assert [m.content for m in a2.load("c").messages] == ["hello", "hi", "more", "sure"]


def test_hostile_tails_are_refused_or_reported(root: Path) -> None:
    store = _store(root)
    store.create("c")
    _add(store, "c", _msg(0))
    path = root / "sessions" / "c.json"
    good = json.loads(path.read_bytes())
    for bad in ({"inline": {"role": "user"}}, {"inline": [{"role": "user"}] * 2},
                {"sha256": "0" * 64}, {"inline": "x"}):
        d = json.loads(json.dumps(good))
        d["history"].update(bad)
        with pytest.raises(fsdurable.UnreadableState) as info:
            parse_session(json.dumps(d).encode(), path=str(path))
        assert info.value.reason == "wrong_value", bad
    d = json.loads(json.dumps(good))  # a null head, fewer values than count: a short chain
    d["history"]["count"] = 3
    s, _ = parse_session(json.dumps(d).encode(), path=str(path))
    with pytest.raises(HistoryUnavailable) as hinfo:
        tuple(s.messages)
    assert hinfo.value.reason == "history_short"


def test_a_format_5_store_is_read_as_it_is_and_migrated_with_its_event(root: Path) -> None:
    """A format-5 document (a chain in segments, no inline tail: exactly what format 5 wrote,
    its tag aside) reads as it is (``migrated``, nothing written); the repair gate rewrites it
    in format 6 (``session_migrated``); the next commit keeps its new messages inline after
    the format-5 chain's head. A fsdurable of format 5 meets the result as a newer format."""
    old = _store(root, bound=0)  # every message in a segment, as format 5 stored them
    old.create("c")
    for i in range(3):
        _add(old, "c", _msg(i))
    path = root / "sessions" / "c.json"
    v5 = path.read_bytes().replace(b"fsdurable.session/7", b"fsdurable.session/5")
    path.write_bytes(v5)
    s, migrated = parse_session(v5, path=str(path))
    assert migrated and tuple(s.messages) == tuple(_msg(i) for i in range(3))
    store = _store(root)
    assert store.load("c").version == s.version and path.read_bytes() == v5  # a read writes nothing
    act = _repair.migrate_session(store, "c")
    assert act.acted
    assert _doc(root, "c")["format"] == "fsdurable.session/7"
    assert [e.code for e in store.events("c")][-1] == "session_migrated"
    assert tuple(store.load("c").messages) == tuple(_msg(i) for i in range(3))
    segs = _segments(root, "c")
    _add(store, "c", _msg(3))  # inline after the format-5 chain's head
    assert _segments(root, "c") == segs
    doc = _doc(root, "c")["history"]
    assert doc["head"] in {p.name for p in segs}
    assert len(doc["inline"]) == 1
    assert tuple(_store(root).load("c").messages) == tuple(_msg(i) for i in range(4))
    assert not _repair.migrate_session(store, "c").acted  # current: nothing to do
    import fsdurable._recordcodec as rc

    saved = dict(rc.CURRENT)
    rc.CURRENT["session"] = 5
    try:
        with pytest.raises(fsdurable.UnreadableState) as info:  # what format 5 would say
            upgrade(json.loads(path.read_bytes()), "session")
    finally:
        rc.CURRENT.update(saved)
    assert info.value.reason == "unknown_version"
