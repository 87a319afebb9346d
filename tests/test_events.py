"""The event log at its edges (issue 9 items 12, 13; issue 13's per-session query and retention).

- an appender starts on a fresh line after a torn one (crash mid-append, zero-filled tail);
- a day file over ``max_file_bytes`` is still read (streamed; only an over-long LINE is skipped,
  and reported);
- ``events/<node>`` as a symlink is never followed, the emit lands beside it and the reader
  reports the symlink: nothing vanishes silently;
- ``events(session_id)`` reads only that session's files, whatever the rest of the store logged;
- retention removes this node's old day files (``prune_events``, ``doctor --repair``), each
  prune an event, and never another node's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from fsdurable import Config, Store, _fsio, doctor

DAY = 86400.0
T0 = 1_800_000_000.0  # 2027-01-15


def _files_of(root: Path, needle: bytes) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(root / "events"):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                if needle in f.read():
                    out.append(p)
    return out


@pytest.mark.parametrize("tail", [b'{"format":"fsdurable.event/1","at":1.0,"co', b"\0" * 300],
                         ids=["crash_mid_append", "zero_filled_tail"])
def test_the_event_after_a_torn_line_is_kept(store: Store, root: Path, tail: bytes) -> None:
    store.emit("first", session_id="s")
    [path] = _files_of(root, b'"first"')
    with open(path, "ab") as f:  # what a crash mid-append (or a power cut) leaves
        f.write(tail)
    store.emit("second", session_id="s")
    evs = store.events("s")
    assert [e.code for e in evs] == ["first", "second", "event_log_damaged"]
    assert evs[-1].reason == "bad_lines" and evs[-1].detail["unreadable_lines"] == 1  # reported
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    assert lines[-2].startswith(b'{"format"') and b'"second"' in lines[-2]


def test_a_day_file_over_the_cap_is_still_read(root: Path) -> None:
    store = Store(root, config=Config(max_file_bytes=4096))
    for i in range(100):  # ~20 KB in one day file: five times the cap
        store.emit("tick", session_id="s", i=i)
    got = [e for e in store.events("s") if e.code == "tick"]
    assert [e.detail["i"] for e in got] == list(range(100))
    assert not [e for e in store.events("s") if e.code == "event_log_damaged"]


def test_an_over_long_line_is_skipped_and_reported(root: Path) -> None:
    store = Store(root, config=Config(max_file_bytes=4096))
    store.emit("before", session_id="s")
    store.emit("huge", session_id="s", blob="x" * 10_000)  # one line over the per-line cap
    store.emit("after", session_id="s")
    evs = store.events("s")
    assert [e.code for e in evs] == ["before", "after", "event_log_damaged"]
    assert evs[-1].reason == "bad_lines" and evs[-1].detail["overlong_lines"] == 1


def test_a_symlinked_node_directory_is_never_followed_and_nothing_vanishes(
        root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store = Store(root)
    os.symlink(outside, root / "events" / "node-test")
    store.emit("decision", session_id="s", reason="why")
    assert list(outside.iterdir()) == []  # nothing written through the link
    fresh = Store(root)  # another process reads it
    evs = fresh.events("s")
    assert [e.code for e in evs] == ["decision", "event_log_damaged"]
    assert evs[-1].reason == "symlink" and evs[-1].detail["path"].endswith("node-test")
    assert fresh.log.unwritten == 0


def test_an_event_the_disk_refuses_is_kept_and_written_with_the_next(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    import errno

    def refuse(op: str, args: tuple[Any, ...]) -> None:
        if op == "append":
            raise OSError(errno.ENOSPC, "No space left on device")

    old = _fsio.set_recorder(refuse)
    try:
        assert store.emit("lost_if_dropped", session_id="s") is None  # Store.emit never raises
    finally:
        _fsio.set_recorder(old)
    assert store.log.unwritten == 1
    assert any("lost_if_dropped" in r.getMessage() for r in caplog.records)
    store.emit("next", session_id="s")
    assert [e.code for e in store.events("s")] == ["lost_if_dropped", "next"]
    assert store.log.unwritten == 0


def test_a_session_query_reads_only_that_sessions_files(store: Store,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for sid in ("a", "b", "c"):
        for i in range(5):
            store.emit("tick", session_id=sid, i=i)
    store.emit("store_level")
    opened: list[str] = []
    real = _fsio.iter_lines

    def spy(path: str, *args: Any, **kw: Any) -> Any:
        opened.append(path)
        return real(path, *args, **kw)

    monkeypatch.setattr(_fsio, "iter_lines", spy)
    assert [e.detail["i"] for e in store.events("a")] == list(range(5))
    assert opened and all(os.sep + "a" + os.sep in p for p in opened), opened
    opened.clear()
    assert len(store.events()) == 16  # the whole log still reads everything
    assert len(opened) == 4


def test_a_flat_layout_log_is_read_and_moved_aside_on_first_append(root: Path) -> None:
    store = Store(root)
    old = root / "events" / "node-test"
    old.mkdir(parents=True)
    other = root / "events" / "node-other"
    other.mkdir()
    line = (b'{"format":"fsdurable.event/1","at":%d.0,"code":"%s","session_id":"s","turn_id":null,'
            b'"node_id":"%s","reason":null,"detail":{}}\n')
    then = int(time.time()) - 1000
    (old / "2026-01-01.jsonl").write_bytes(line % (then + 1, b"mine_before", b"node-test"))
    (other / "2026-01-01.jsonl").write_bytes(line % (then, b"theirs_before", b"node-other"))
    assert [e.code for e in store.events("s")] == ["theirs_before", "mine_before"]
    store.emit("now", session_id="s")
    assert (old / "@legacy" / "2026-01-01.jsonl").exists()
    assert (other / "2026-01-01.jsonl").exists()  # another node's files are never moved
    assert [e.code for e in store.events("s")] == ["theirs_before", "mine_before", "now"]


def test_retention_prunes_this_nodes_old_days_with_an_event(root: Path) -> None:
    now = [T0 - 100 * DAY]
    store = Store(root, clock=lambda: now[0])
    other = Store(root, clock=lambda: now[0], node_id="node-other")
    store.emit("ancient", session_id="s")
    other.emit("ancient_elsewhere", session_id="s")
    now[0] = T0 - 1 * DAY
    store.emit("recent", session_id="s")
    now[0] = T0
    done = store.prune_events()
    assert done["files"] == 1 and done["sessions"] == 1
    codes = [e.code for e in store.events("s")]
    assert codes == ["ancient_elsewhere", "recent"]  # another node's log is never pruned
    [pruned] = [e for e in store.events() if e.code == "events_pruned"]
    assert pruned.detail["files"] == 1 and pruned.detail["retention"] == 90 * DAY
    assert (root / "events" / "node-test" / "@layout2").is_dir()  # the layout flag stays
    assert store.prune_events()["files"] == 0  # nothing left to prune: no second event
    assert len([e for e in store.events() if e.code == "events_pruned"]) == 1


def test_doctor_repair_applies_the_retention(root: Path) -> None:
    now = [T0 - 40 * DAY]
    store = Store(root, clock=lambda: now[0],
                  config=Config(event_retention=30 * DAY))
    store.emit("old", session_id="s")
    now[0] = T0
    assert [f.code for f in doctor(store) if f.code == "events_pruned"] == []  # a scan only
    assert [e.code for e in store.events("s")] == ["old"]
    findings = doctor(store, repair=True)
    assert [f.repaired for f in findings if f.code == "events_pruned"] == [True]
    assert store.events("s") == []
    assert not (root / "events" / "node-test" / "s").exists()  # the emptied directory went too


def test_retention_must_be_positive() -> None:
    with pytest.raises(ValueError, match="event_retention"):
        Config(event_retention=0)


def _ops(store: Store, fn: Any) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []

    def rec(op: str, args: tuple[Any, ...]) -> None:
        if op in ("append", "fsync") and "events" in str(args[0]):
            got.append((op, os.path.basename(os.path.dirname(str(args[0])))))

    old = _fsio.set_recorder(rec)
    try:
        fn()
    finally:
        _fsio.set_recorder(old)
    return got


def test_a_turns_lines_are_notes_fsynced_by_the_next_decision(store: Store) -> None:
    # issue 18: turn_started and turn_completed restate commits durable in the session; fsynced
    # each turn, the day file's page went to storage once a turn (one fsync more, too)
    sid = store.create("s").id
    store.end_turn(store.begin_turn(sid, "hi"), "there")  # the day file exists from here
    box: dict[str, Any] = {}
    begun = _ops(store, lambda: box.setdefault("s", store.begin_turn(sid, "again")))
    assert begun == [("append", "s")]  # written (a dead process loses nothing), not fsynced
    ended = _ops(store, lambda: store.end_turn(box["s"], "ok"))
    assert ended == [("append", "s")]
    assert [e.code for e in store.events(sid)][-2:] == ["turn_started", "turn_completed"]
    assert set(store.log._unsynced) == {_files_of_session(store, sid)}
    # a decision fsyncs what the notes left: one fsync for the stretch of turns
    s = store.begin_turn(sid, "third")
    assert _ops(store, lambda: store.cancel(sid)) == [("append", "s"), ("fsync", "s")]
    assert store.log._unsynced == {}
    assert s.turn is not None


def _files_of_session(store: Store, sid: str) -> str:
    [path] = [os.path.join(d, n) for d, _, names in os.walk(store.layout.events)
              for n in names if os.path.basename(d) == sid]
    return path


def test_a_note_that_waited_long_enough_is_fsynced_by_the_next_note(root: Path) -> None:
    # the bound on what a power cut can take: once the oldest unsynced line has waited
    # Config.event_note_fsync_after, the next note fsyncs the file (this line with it)
    now = [T0]
    store = Store(root, node_id="n1", clock=lambda: now[0],
                  config=Config(event_note_fsync_after=30.0))
    sid = store.create("s").id
    store.end_turn(store.begin_turn(sid, "hi"), "there")
    store.log._sync_unsynced(all_=True)
    box: dict[str, Any] = {}
    now[0] += 10
    assert _ops(store, lambda: box.setdefault("s", store.begin_turn(sid, "a"))) == [
        ("append", "s")]
    now[0] += 29  # 29 s after the oldest unsynced line: not yet
    assert _ops(store, lambda: store.end_turn(box["s"], "b")) == [("append", "s")]
    now[0] += 1  # 30 s
    assert _ops(store, lambda: box.update(s=store.begin_turn(sid, "c"))) == [
        ("append", "s"), ("fsync", "s")]
    assert store.log._unsynced == {}
    now[0] -= 3600  # a clock set back never holds a line back longer
    assert _ops(store, lambda: store.end_turn(box["s"], "d")) == [("append", "s")]
    assert _ops(store, lambda: box.update(s=store.begin_turn(sid, "e"))) == [
        ("append", "s")]
    now[0] -= 1
    assert _ops(store, lambda: store.end_turn(box["s"], "f")) == [
        ("append", "s"), ("fsync", "s")]


def test_event_note_fsync_after_zero_fsyncs_every_line(root: Path) -> None:
    store = Store(root, node_id="n1", config=Config(event_note_fsync_after=0))
    sid = store.create("s").id
    store.end_turn(store.begin_turn(sid, "hi"), "there")
    box: dict[str, Any] = {}
    assert _ops(store, lambda: box.setdefault("s", store.begin_turn(sid, "a"))) == [
        ("append", "s"), ("fsync", "s")]
    assert _ops(store, lambda: store.end_turn(box["s"], "b")) == [
        ("append", "s"), ("fsync", "s")]
    with pytest.raises(ValueError, match="event_note_fsync_after"):
        Config(event_note_fsync_after=-1)
    with pytest.raises(ValueError, match="event_note_fsync_after"):
        Config(event_note_fsync_after=float("nan"))


def test_a_noted_line_in_another_file_is_fsynced_by_the_next_durable_event(
        store: Store) -> None:
    a, b = store.create("a").id, store.create("b").id
    store.emit("first", session_id=a)
    store.emit("first", session_id=b)
    assert _ops(store, lambda: store.log.note("noted", session_id=a)) == [("append", "a")]
    # another session's event: its own append and fsync, then the noted file's fsync
    assert _ops(store, lambda: store.emit("other", session_id=b)) == [
        ("append", "b"), ("fsync", "b"), ("fsync", "a")]
    assert _ops(store, lambda: store.emit("again", session_id=b)) == [
        ("append", "b"), ("fsync", "b")]
    assert [e.code for e in store.events(a)] == ["first", "noted"]


def test_a_noted_event_that_creates_its_file_is_durable_at_once(store: Store) -> None:
    # a new day file: its directory entry must last too, so nothing is left for later
    assert _ops(store, lambda: store.log.note("noted", session_id="n")) == [
        ("append", "n"), ("fsync", "n")]
    assert store.log._unsynced == {}
