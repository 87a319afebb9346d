"""Lanes (docs/storage.md, "Lanes"): the Agents SDK's session items in write-once segments the
document names — what ``add_items`` writes (the new items and the small document, whatever came
before), what ``get_items(limit)`` reads, a pop cut in the document without a rewrite, a lane
segment waiting for sync or corrupt, unreferenced lane segments through the repair gate, the
migration of an older session's inline items with its event, the run path's trim, and every
file it writes against its schema."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

import fsdurable
from fsdurable._config import Config
from fsdurable._doctor import doctor
from fsdurable._errors import HistoryUnavailable
from fsdurable._history import History
from fsdurable._segments import repair_history

from .conftest import io_log
from .lane_session import KEY, items, record, trimmed, with_record
from .lane_session import LaneSession as FileSession
from .test_schemas import assert_valid, kind_of, recording


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # the files' mtimes are the real clock's

    def __call__(self) -> float:
        return self.now


def _store(root: Path, clock: Clock | None = None, inline: int = 0) -> fsdurable.Store:
    """A store whose lanes go to segments at every commit (``inline``: the inline tail's bound,
    0 by default here: these tests are of the segments; the inline tail's are below and in
    test_inline_tail.py)."""
    return fsdurable.Store(root, node_id="node-test", clock=clock or Clock(),
                           config=Config(inline_tail_bytes=inline))


def item(i: int, size: int = 200) -> dict[str, Any]:
    return {"type": "message", "role": "user", "n": i, "content": "x" * size}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def lane_files(root: Path, sid: str) -> list[Path]:
    d = root / "history" / sid
    return sorted(p for p in d.iterdir() if p.name.startswith(KEY + "-")) if d.exists() else []



def written(ops: list[tuple[str, tuple[Any, ...]]]) -> int:
    return sum(len(a[1]) for op, a in ops if op in ("write", "append"))


def fsyncs(ops: list[tuple[str, tuple[Any, ...]]]) -> int:
    return sum(1 for op, _ in ops if op in ("fsync", "fsync_dir"))


def files(ops: list[tuple[str, tuple[Any, ...]]]) -> list[str]:
    """The files a commit put in place (renamed to their names)."""
    return [a[1] for op, a in ops if op in ("rename", "link")]


def test_add_items_writes_the_new_items_and_the_document_whatever_came_before(
        root: Path) -> None:
    """Before lanes the whole list was re-encoded and rewritten: at 1,000 items one more item
    wrote ~200 KB. Format 5 wrote a segment and the document (two files, four fsyncs); format
    6 writes the document alone, the item in its inline tail, until the tail passes the bound
    (one file, two fsyncs), the same at 10 items as at 1,000; then one segment with the tail."""
    store = fsdurable.Store(root, node_id="node-test", clock=Clock())  # the default bound
    bound = Config().inline_tail_bytes
    one = len(json.dumps(item(0), separators=(",", ":")))
    cost = {}
    for sid, n in (("small", 10), ("big", 1000)):
        fs = FileSession(sid, store)
        for lo in range(0, n, 100):
            run(fs.add_items([item(i) for i in range(lo, min(n, lo + 100))]))
        path = root / "sessions" / f"{sid}.json"
        small, flushes = [], 0
        for k in range(2 * (bound // one) + 2):
            tail = json.loads(path.read_bytes())["lanes"][KEY].get("inline", [])
            size = len(json.dumps([*tail, item(n + k)], separators=(",", ":")))
            with io_log() as ops:
                run(fs.add_items([item(n + k)]))
            doc = json.loads(path.read_bytes())["lanes"][KEY]
            if size <= bound:  # one file (the document), two fsyncs (it and sessions/)
                assert files(ops) == [str(path)] and fsyncs(ops) == 2, (k, ops)
                assert doc["inline"][-1]["n"] == n + k and len(doc["inline"]) == len(tail) + 1
                small.append(written(ops))
            else:  # past the bound: the tail and the item as one segment, then the document
                made = sum(1 for op, _ in ops if op == "mkdir")  # the session's first one
                assert fsyncs(ops) == 4 + made and len(files(ops)) == 2, (k, ops)
                assert "history" in files(ops)[0] and files(ops)[1] == str(path)
                assert "inline" not in doc and written(ops) < bound + 2 * one + 2000
                flushes += 1
            assert doc["count"] == n + k + 1
        assert flushes == 2, flushes  # the bound passed twice in these calls, not more
        cost[sid] = min(small)  # a call after a flush: the document and one item inline
        assert max(small) < bound + 2000, small  # the document never grows past the bound
        assert [x["n"] for x in run(fs.get_items())] == list(range(n + k + 1))
    assert cost["big"] < one + 2000, cost  # the document and its inline tail
    assert abs(cost["big"] - cost["small"]) < 64, cost  # only the numbers differ


def test_get_items_reads_only_the_segments_it_needs(root: Path) -> None:
    store = _store(root)
    fs = FileSession("c", store)
    for lo in range(0, 50, 10):
        run(fs.add_items([item(i) for i in range(lo, lo + 10)]))
    segs = lane_files(root, "c")
    assert len(segs) == 5
    for p in segs[:-1]:  # only the newest segment stays on disk
        p.rename(root / p.name)
    got = run(fs.get_items(limit=3))
    assert [x["n"] for x in got] == [47, 48, 49]
    with pytest.raises(HistoryUnavailable) as info:
        run(fs.get_items(limit=11))  # it needs the segment before: not there
    assert info.value.reason == "waiting_for_sync"
    assert run(fs.get_items(limit=0)) == []
    got[0]["n"] = "changed by the caller"
    assert run(fs.get_items(limit=3))[0]["n"] == 47  # a caller's change is its own


def test_pop_item_cuts_the_lane_in_the_document_and_rewrites_nothing(root: Path) -> None:
    store = _store(root)
    fs = FileSession("c", store)
    run(fs.add_items([item(0), item(1)]))
    run(fs.add_items([item(2)]))
    before = {p.name: p.read_bytes() for p in lane_files(root, "c")}
    with io_log() as ops:
        assert run(fs.pop_item())["n"] == 2  # the whole newest segment: its prev is the head
    assert not [a for op, a in ops if op == "write" and "history" in a[0]]
    with io_log() as ops:
        assert run(fs.pop_item())["n"] == 1  # a cut inside the first segment
    assert not [a for op, a in ops if op == "write" and "history" in a[0]]
    assert {p.name: p.read_bytes() for p in lane_files(root, "c")} == before  # write-once
    doc = json.loads((root / "sessions" / "c.json").read_bytes())
    first = sorted(before)[0]
    assert doc["lanes"][KEY]["count"] == 1 and doc["lanes"][KEY]["head"] == first
    run(fs.add_items([item(7)]))  # after the cut: a segment whose first is the cut
    assert [x["n"] for x in run(FileSession("c", _store(root)).get_items())] == [0, 7]
    assert run(fs.pop_item())["n"] == 7
    assert run(fs.pop_item())["n"] == 0
    assert run(fs.pop_item()) is None
    assert KEY not in json.loads((root / "sessions" / "c.json").read_bytes()).get("lanes", {})
    run(fs.add_items([item(9)]))
    run(fs.clear_session())
    assert run(fs.get_items()) == []


def test_a_chain_whose_count_does_not_fall_inside_its_head_is_corrupt(root: Path) -> None:
    """The cut must fall inside the segment it names: a count past the head's end, or before
    its first value, is never read as another list."""
    store = _store(root)
    fs = FileSession("c", store)
    run(fs.add_items([item(0)]))
    run(fs.add_items([item(1), item(2)]))
    path = root / "sessions" / "c.json"
    good = json.loads(path.read_bytes())
    for count in (4, 1):
        doc = json.loads(json.dumps(good))
        doc["lanes"][KEY]["count"] = count
        path.write_bytes(json.dumps(doc).encode())
        with pytest.raises(HistoryUnavailable) as info:
            run(FileSession("c", _store(root)).get_items())
        assert info.value.reason == "history_corrupt"


def test_a_lane_segment_not_on_disk_yet_is_waiting_for_sync_never_corrupt(root: Path) -> None:
    store = _store(root)
    fs = FileSession("c", store)
    run(fs.add_items([item(0)]))
    run(fs.add_items([item(1)]))
    for p in lane_files(root, "c"):  # a sync tool delivered the document only
        p.rename(root / p.name)
    fresh = _store(root)
    assert len(items(fresh.load("c"))) == 2  # the count is the document's
    with pytest.raises(HistoryUnavailable) as info:
        run(FileSession("c", fresh).get_items())
    assert info.value.reason == "waiting_for_sync"
    findings = doctor(fresh, repair=True)
    assert "history_waiting" in {f.code for f in findings}
    assert "history_unreadable" not in {f.code for f in findings}
    assert (root / "sessions" / "c.json").exists()
    assert not list((root / "quarantine").iterdir())
    for p in root.glob(KEY + "-*.json"):  # the segments arrive
        p.rename(root / "history" / "c" / p.name)
    assert [x["n"] for x in run(FileSession("c", _store(root)).get_items())] == [0, 1]


def test_a_lane_segment_that_does_not_match_its_digest_is_corrupt(root: Path) -> None:
    store = _store(root)
    run(FileSession("c", store).add_items([item(0)]))
    [seg] = lane_files(root, "c")
    seg.write_bytes(seg.read_bytes().replace(b'"n":0', b'"n":5'))
    with pytest.raises(HistoryUnavailable) as info:
        run(FileSession("c", _store(root)).get_items())
    assert info.value.reason == "history_corrupt"
    assert "history_unreadable" in {f.code for f in doctor(_store(root))}


def test_unreferenced_lane_segments_go_only_through_the_repair_gate(root: Path) -> None:
    clock = Clock()
    store = _store(root, clock)
    fs = FileSession("c", store)
    run(fs.add_items([item(0)]))
    run(fs.add_items([item(1)]))
    run(fs.pop_item())  # the cut segment stays referenced
    run(fs.clear_session())
    run(fs.add_items([item(2)]))
    [kept] = [p for p in lane_files(root, "c") if p.name.startswith(f"{KEY}-000000000000")
              and b'"n":2' in p.read_bytes()]
    assert len(lane_files(root, "c")) == 3
    assert repair_history(store, "c", dry_run=True) == []  # too young: a commit may name it
    clock.now += 2 * Config().segment_grace
    assert len(lane_files(root, "c")) == 3  # a read, a dry run: nothing moves
    findings = doctor(store, repair=True)
    assert any(f.code == "orphan_segments" and f.repaired for f in findings)
    assert lane_files(root, "c") == [kept]
    assert [e.code for e in store.events("c")].count("segment_removed") == 2
    assert [x["n"] for x in run(FileSession("c", _store(root)).get_items())] == [2]


def test_an_older_session_s_inline_items_migrate_through_the_repair_gate(root: Path) -> None:
    store = _store(root)
    old = [item(0), item(1)]
    # what an older fsdurable wrote: the items inline in the metadata
    store.create("a", source="openai-agents", metadata={KEY: {"items": old, "run": {"x": 1}}})
    store.create("b", source="openai-agents", metadata={KEY: {"items": old}})
    assert list(items(_store(root).load("a"))) == old  # reads as before
    assert "old_format" in {f.code for f in doctor(_store(root)) if f.session_id == "a"}
    # the adapter's first write: the gate migrates (an event), then the item is appended
    run(FileSession("a", _store(root)).add_items([item(2)]))
    doc = json.loads((root / "sessions" / "a.json").read_bytes())
    assert doc["metadata"][KEY] == {"run": {"x": 1}} and doc["lanes"][KEY]["count"] == 3
    assert [x["n"] for x in run(FileSession("a", _store(root)).get_items())] == [0, 1, 2]
    assert [e.code for e in store.events("a")].count("session_migrated") == 1
    # doctor --repair migrates the other
    doctor(_store(root), repair=True)
    doc = json.loads((root / "sessions" / "b.json").read_bytes())
    assert doc["metadata"][KEY] == {} and doc["lanes"][KEY]["count"] == 2
    assert [e.code for e in store.events("b")].count("session_migrated") == 1
    assert [x["n"] for x in run(FileSession("b", _store(root)).get_items())] == [0, 1]


def test_a_resumed_run_trims_the_items_by_a_cut_without_rewriting(root: Path) -> None:
    """The run path (``_oarun``/recovery): what a dead run added after its last checkpoint
    (``items_at``) goes, by the document alone."""
    store = _store(root)
    fs = FileSession("c", store)
    for i in range(4):
        run(fs.add_items([item(i)]))
    s = store.load("c")
    s = store.commit(with_record(s, items_at=2), s.version)
    assert record(s)["items_at"] == 2
    with io_log() as ops:
        s = store.commit(trimmed(store.load("c")), s.version)
    assert not [a for op, a in ops if op == "write" and "history" in a[0]]
    assert isinstance(items(s), History) and len(items(s)) == 2
    assert [x["n"] for x in run(FileSession("c", _store(root)).get_items())] == [0, 1]


def test_every_file_the_lanes_write_validates(root: Path) -> None:
    store = _store(root)
    with recording() as writes:
        fs = FileSession("c", store)
        run(fs.add_items([item(0), {"nested": [1, 2.5, None, True, {"k": "v"}]}]))
        run(fs.add_items(["a string item", 3]))
        run(fs.pop_item())
        run(fs.add_items([item(4)]))
        store.create("old", metadata={KEY: {"items": [item(0)]}})
        run(FileSession("old", store).add_items([item(1)]))
    kinds = []
    for path, data in writes:
        kind = kind_of(root, path)
        if kind is not None:
            assert_valid(kind, data, where=path)
            kinds.append(kind)
    assert kinds.count("segment") == 5 and "session" in kinds  # c: 3; old: 1 + 1
    for p in (root / "history").glob("*/*.json"):
        assert_valid("segment", p.read_bytes(), where=str(p))
    for p in (root / "sessions").glob("*.json"):
        assert_valid("session", p.read_bytes(), where=str(p))


def test_format_5_for_lanes_a_format_4_document_is_migrated_by_the_gate(tmp_path: Path) -> None:
    """Lanes came with format 5: a fsdurable that knows no lanes meets a format-5 document as a
    newer one (never writes it, so never drops its lanes). A format-4 document is read as it is
    and migrated through the repair gate (``session_migrated``), never by a silent rewrite."""
    from fsdurable import _repair
    from fsdurable._codec import parse_session
    from fsdurable._recordcodec import upgrade

    st = fsdurable.Store(tmp_path / "s")
    st.create("c1")
    st.patch("c1", lambda s: s)
    path = tmp_path / "s" / "sessions" / "c1.json"
    assert json.loads(path.read_bytes())["format"] == "fsdurable.session/7"
    old = path.read_bytes().replace(b"fsdurable.session/7", b"fsdurable.session/4")
    path.write_bytes(old)
    s, migrated = parse_session(old, path=str(path))
    assert migrated and s.id == "c1"
    assert st.load("c1").version == s.version  # a read moves and writes nothing
    assert path.read_bytes() == old
    act = _repair.migrate_session(st, "c1")
    assert act.acted
    assert json.loads(path.read_bytes())["format"] == "fsdurable.session/7"
    assert [e.code for e in st.events("c1")][-1] == "session_migrated"
    with pytest.raises(fsdurable.UnreadableState) as e:  # what a format-4 fsdurable would say
        import fsdurable._recordcodec as rc

        saved = dict(rc.CURRENT)
        rc.CURRENT["session"] = 4
        try:
            upgrade(json.loads(path.read_bytes()), "session")
        finally:
            rc.CURRENT.update(saved)
    assert e.value.reason == "unknown_version"


def test_a_commit_leaves_the_session_it_was_given_as_it_was(tmp_path: Path) -> None:
    """The commit returns its own copy naming the stored history; the caller's session (its
    lanes and messages as given) is never changed, nor is one it committed before."""
    import attrs

    from fsdurable._model import Message

    st = fsdurable.Store(tmp_path / "s")
    s0 = st.create("c", lanes={"x": (1, 2)})
    lanes0, msgs0 = s0.lanes, s0.messages
    given = attrs.evolve(s0, lanes={"x": (*s0.lanes["x"], 3)},
                         messages=(Message("user", "hi"),))
    lanes1, msgs1 = given.lanes, given.messages
    s1 = st.commit(given, s0.version)
    assert given.lanes is lanes1 and given.lanes == {"x": (1, 2, 3)}
    assert given.messages is msgs1 and given.messages == (Message("user", "hi"),)
    assert s0.lanes is lanes0 and s0.messages is msgs0
    assert isinstance(s1.lanes["x"], History) and isinstance(s1.messages, History)
    assert list(s1.lanes["x"]) == [1, 2, 3] and list(s1.messages) == [Message("user", "hi")]
    assert st.load("c") == s1
