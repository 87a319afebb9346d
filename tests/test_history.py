"""A session's history in write-once segments (docs/storage.md): what a commit writes, what a
load reads, a history waiting for sync or corrupt, compaction and its archive, unreferenced
segments through the repair gate, and the migration from format 3."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

import fsdurable
from fsdurable import _fsio, _repair
from fsdurable._config import Config
from fsdurable._doctor import doctor
from fsdurable._errors import HistoryUnavailable
from fsdurable._history import History
from fsdurable._model import Message
from fsdurable._segments import repair_history


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # the files' mtimes are the real clock's

    def __call__(self) -> float:
        return self.now


def _store(root: Path, clock: Clock | None = None, node: str = "node-test",
           inline: int = 0) -> fsdurable.Store:
    """A store whose messages go to segments at every commit (``inline``: the inline tail's
    bound, 0 by default here: these tests are of the segments; test_inline_tail.py has the
    inline tail's)."""
    return fsdurable.Store(root, node_id=node, clock=clock or Clock(),
                           config=Config(inline_tail_bytes=inline))


def _chat(store: fsdurable.Store, sid: str, turns: int, size: int = 200) -> fsdurable.Session:
    store.create(sid)
    s = store.load(sid)
    for i in range(turns):
        s = store.begin_turn(sid, f"question {i} " + "q" * size)
        s = store.end_turn(s, f"answer {i} " + "a" * size)
    return s


def _segments(root: Path, sid: str) -> list[Path]:
    d = root / "history" / sid
    return sorted(d.iterdir()) if d.exists() else []


class Writes:
    """The bytes written to each file by the operations recorded."""

    def __init__(self) -> None:
        self.files: dict[str, int] = {}
        self.ops: list[str] = []

    def __call__(self, op: str, args: tuple[Any, ...]) -> None:
        self.ops.append(op)
        if op in ("write", "append"):
            self.files[args[0]] = self.files.get(args[0], 0) + len(args[1])


def _record(fn: Any) -> Writes:
    w = Writes()
    prev = _fsio.set_recorder(w)
    try:
        fn()
    finally:
        _fsio.set_recorder(prev)
    return w


def test_a_commit_writes_the_new_messages_and_the_small_document(root: Path) -> None:
    store = _store(root)
    s = _chat(store, "c", 200)
    doc = (root / "sessions" / "c.json").read_bytes()
    assert len(doc) < 700 and b"answer" not in doc  # the transcript is not in the document
    assert len(_segments(root, "c")) == 400
    s = store.begin_turn("c", "one more question")
    # a checkpoint that adds no message writes the document only
    w = _record(lambda: store.checkpoint(s, phase="model_reply"))
    assert [os.path.dirname(p) for p in w.files] == [str(root / "sessions")]
    assert sum(w.files.values()) < 900
    # a turn's end writes one segment holding only the new message, before the document
    w = _record(lambda: store.end_turn(store.load("c"), "the reply " + "r" * 100))
    [seg] = [p for p in w.files if "history" in p]
    assert w.files[seg] < 450  # the message and its header: not the 400 before it
    assert sum(w.files.values()) < 1500
    assert len(store.load("c").messages) == 402


def test_load_patch_and_begin_turn_read_no_history(root: Path) -> None:
    store = _store(root)
    _chat(store, "c", 3)
    for p in _segments(root, "c"):  # a sync tool delivered the document only
        p.rename(root / p.name)
    fresh = _store(root)
    s = fresh.load("c")
    assert len(s.messages) == 6  # from the document
    s = fresh.patch("c", lambda cur: attrs.evolve(cur, metadata={"k": 1}))
    s = fresh.begin_turn("c", "hello")
    s = fresh.checkpoint(s, phase="x")
    assert fresh.interrupted()[0].session_id == "c"
    with pytest.raises(HistoryUnavailable) as info:
        tuple(s.messages)
    assert info.value.reason == "waiting_for_sync"
    assert isinstance(info.value, LookupError)
    # the newest message is in the segment this process wrote: read without the rest
    assert s.messages[-1].content == "hello"
    # never corrupt: doctor reports it and --repair moves nothing
    findings = doctor(fresh, repair=True)
    assert "history_waiting" in {f.code for f in findings}
    assert (root / "sessions" / "c.json").exists()
    assert not list((root / "quarantine").iterdir())
    for p in root.glob("*.json"):  # the segments arrive
        if p.name != "fsdurable.json":
            p.rename(root / "history" / "c" / p.name)
    msgs = tuple(_store(root).load("c").messages)
    assert [m.content for m in msgs][-1] == "hello" and len(msgs) == 7


def test_a_segment_that_does_not_match_its_digest_is_corrupt_never_short(root: Path) -> None:
    store = _store(root)
    _chat(store, "c", 2)
    first = _segments(root, "c")[0]
    d = json.loads(first.read_bytes())
    d["messages"][0]["content"] = "tampered"
    first.write_bytes(json.dumps(d).encode())
    s = _store(root).load("c")
    assert s.messages[-1].content.startswith("answer 1")  # the newest segments still read
    with pytest.raises(HistoryUnavailable) as info:
        list(s.messages)
    assert info.value.reason == "history_corrupt"
    store = _store(root)
    assert "history_unreadable" in {f.code for f in doctor(store)}
    assert store.events("c")[-1].code != "history_unreadable"  # a scan writes nothing
    assert "history_unreadable" in {f.code for f in doctor(store, repair=True)}
    assert store.events("c")[-1].code == "history_unreadable"
    assert first.exists() and (root / "sessions" / "c.json").exists()  # left for a human


def _short(root: Path) -> Path:
    """Session ``c`` of one turn (2 messages) whose document says a summary replaced 5: a
    range that is not there. Its path."""
    _chat(_store(root), "c", 1)
    path = root / "sessions" / "c.json"
    d = json.loads(path.read_bytes())
    d["history"]["start"] = 5
    path.write_bytes(json.dumps(d).encode())
    return path


def test_a_summary_naming_more_than_the_history_holds_is_unreadable(root: Path) -> None:
    path = _short(root)
    s = _store(root).load("c")  # the document reads
    with pytest.raises(HistoryUnavailable) as info:
        tuple(s.messages)
    assert info.value.reason == "history_short"
    # never silently short: not as an empty history either (its length, truth, last message)
    for read in (len, bool, lambda m: m[-1], lambda m: m[0:1], reversed):
        with pytest.raises(HistoryUnavailable) as info:
            list(read(s.messages)) if read is reversed else read(s.messages)  # type: ignore[operator]
        assert info.value.reason == "history_short"
    assert "unreadable: history_short" in repr(s.messages)
    # shown, not counted, wherever a count was printed: `show` and a sync copy's description
    from fsdurable._sync import read_version
    from fsdurable.cli import main

    v = read_version(_store(root), str(path), "c")
    assert v.error is None and v.messages is None and "history unreadable" in v.describe()
    assert main(["--root", str(root), "show", "c"]) == 0


def test_messages_are_not_appended_to_a_history_that_is_short(root: Path) -> None:
    """A message committed on top of a summary that names a range that is not there would be
    invisible (the history's length stays that of nothing): the commit refuses it, writing
    nothing; a commit that adds no message (a checkpoint, a patch of the metadata) still works,
    as for a history waiting for sync."""
    path = _short(root)
    store = _store(root)
    files = sorted(p.name for p in root.rglob("*") if p.is_file())
    raw = path.read_bytes()
    with pytest.raises(HistoryUnavailable) as info:
        store.begin_turn("c", "hello")
    assert info.value.reason == "history_short"
    s = store.load("c")
    with pytest.raises(HistoryUnavailable):
        store.save(attrs.evolve(s, messages=s.messages + (Message("user", "x"),)))  # noqa: RUF005
    assert path.read_bytes() == raw
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == files
    s = store.patch("c", lambda cur: attrs.evolve(cur, metadata={"k": 1}))
    assert s.metadata == {"k": 1}
    assert json.loads(path.read_bytes())["history"]["start"] == 5


def test_history_unavailable_is_public() -> None:
    """README and docs/storage.md tell a user to catch it: it is importable from the package."""
    assert fsdurable.HistoryUnavailable is HistoryUnavailable
    assert "HistoryUnavailable" in fsdurable.__all__
    assert issubclass(HistoryUnavailable, (fsdurable.FsDurableError, LookupError))


def test_a_head_whose_name_is_not_its_digest_is_corrupt(root: Path) -> None:
    store = _store(root)
    _chat(store, "c", 1)
    path = root / "sessions" / "c.json"
    d = json.loads(path.read_bytes())
    d["history"]["sha256"] = "0" * 64
    path.write_bytes(json.dumps(d).encode())
    with pytest.raises(HistoryUnavailable) as info:
        tuple(_store(root).load("c").messages)
    assert info.value.reason == "history_corrupt"


def test_history_behaves_as_the_tuple_it_replaces(root: Path) -> None:
    store = _store(root)
    _chat(store, "c", 3)
    s = _store(root).load("c")
    msgs = s.messages
    assert isinstance(msgs, History)
    want = tuple(msgs)
    assert len(want) == 6 and msgs == want and want == msgs and msgs[1:3] == want[1:3]
    assert list(reversed(msgs)) == list(reversed(want)) and msgs[-2] == want[-2]
    assert (msgs + (Message("user", "x"),))[-1].content == "x"  # noqa: RUF005 (its __add__)
    assert () + msgs == want and hash(msgs) == hash(want)  # noqa: RUF005 (its __radd__)
    with pytest.raises(IndexError):
        msgs[6]


def test_compaction_keeps_the_replaced_messages_as_an_archive(root: Path) -> None:
    store = _store(root)
    _chat(store, "c", 5)
    before = len(_segments(root, "c"))
    kept = tuple(store.load("c").messages)[-2:]
    s = store.patch("c", lambda cur: attrs.evolve(cur, summary="five questions",
                                                  messages=kept))
    assert len(_segments(root, "c")) == before  # nothing rewritten
    assert tuple(_store(root).load("c").messages) == kept == tuple(s.messages)
    archive = _store(root).archive("c")
    assert len(archive) == 8 and archive[0].content.startswith("question 0")
    d = json.loads((root / "sessions" / "c.json").read_bytes())
    assert d["history"]["start"] == 8 and d["history"]["count"] == 10
    # a rewrite that is neither an extension nor a suffix is appended whole
    s = store.patch("c", lambda cur: attrs.evolve(cur, messages=(Message("user", "new"),)))
    assert [m.content for m in _store(root).load("c").messages] == ["new"]
    assert len(_store(root).archive("c")) == 10


def test_unreferenced_segments_go_only_through_the_repair_gate(root: Path) -> None:
    clock = Clock()
    store = _store(root, clock)
    _chat(store, "c", 1)
    good = set(_segments(root, "c"))
    # a commit that died after its segment: the segment is invisible
    ours = root / "history" / "c" / "000000000002-00000000000000aa.json"
    ours.write_bytes(b'{"format":"fsdurable.segment/1","session_id":"c","first":2,'
                     b'"node_id":"node-test","prev":null,"prev_sha256":null,"messages":[]}\n')
    theirs = root / "history" / "c" / "000000000002-00000000000000bb.json"
    theirs.write_bytes(b'{"format":"fsdurable.segment/1","session_id":"c","first":2,'
                       b'"node_id":"node-far","prev":null,"prev_sha256":null,"messages":[]}\n')
    assert len(store.load("c").messages) == 2
    assert repair_history(store, "c", dry_run=True) == []  # too young: a commit may name it
    clock.now += 2 * Config().segment_grace
    acts = {a.action: a for a in repair_history(store, "c", dry_run=True)}
    assert set(acts) == {"would_remove_segment", "waiting_for_sync"}
    assert ours.exists()  # a dry run changes nothing
    findings = doctor(store, repair=True)
    assert any(f.code == "orphan_segments" and f.repaired for f in findings)
    assert not ours.exists() and theirs.exists()  # another node's: it may be in sync flight
    assert good <= set(_segments(root, "c"))
    assert len(tuple(_store(root).load("c").messages)) == 2
    assert [e.code for e in store.events("c")].count("segment_removed") == 1


def test_deleting_a_session_leaves_its_segments_to_the_repair_gate(root: Path) -> None:
    clock = Clock()
    store = _store(root, clock)
    _chat(store, "c", 1)
    store.delete("c")
    assert _segments(root, "c")
    clock.now += 2 * Config().segment_grace
    doctor(store, repair=True)
    assert not (root / "history" / "c").exists()


def test_format_3_migrates_through_the_repair_gate_with_an_event(root: Path) -> None:
    store = _store(root)
    doc = {"format": "fsdurable.session/3", "id": "old", "version": 4, "commit_id": "ab",
           "route_key": "session:old", "in_progress": False, "turn": None,
           "messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello"}],
           "summary": None, "metadata": {}}
    path = root / "sessions" / "old.json"
    path.write_bytes(json.dumps(doc).encode())
    s = store.load("old")  # read as before, in memory
    assert [m.content for m in s.messages] == ["hi", "hello"]
    assert _repair.repair_session(store, "old", dry_run=True).action == "would_migrate"
    assert path.read_bytes() == json.dumps(doc).encode()
    assert _repair.repair_session(store, "old").action == "migrated"
    raw = json.loads(path.read_bytes())
    assert raw["format"] == "fsdurable.session/7" and "messages" not in raw
    [seg] = _segments(root, "old")
    assert raw["history"]["head"] == seg.name
    assert [m.content for m in _store(root).load("old").messages] == ["hi", "hello"]
    assert [e.code for e in store.events("old")] == ["session_migrated"]


def test_segments_a_quarantined_copy_names_are_kept(root: Path) -> None:
    clock = Clock()
    store = _store(root, clock)
    _chat(store, "c", 1)
    _repair.copy_aside(store, store.layout.session("c"), "session", "losing_side")
    store.delete("c")
    clock.now += 2 * Config().segment_grace
    doctor(store, repair=True)
    assert len(_segments(root, "c")) == 2  # the quarantined document still reads them
