"""The compaction archive and its retention (docs/storage.md, "Compaction and its archive"):
the messages a summary replaced stay readable until ``Config.archive_retention`` releases the
oldest of them through the repair gate (``archive_pruned``; the document, format 7, says where
its chain is kept from) and this node's released segments go as unreferenced ones
(``segment_removed``); without a retention nothing goes; a lost archive is reported."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import attrs
import pytest

import fsdurable
from fsdurable._config import DAY, Config
from fsdurable._doctor import doctor
from fsdurable._segments import prune_archive, repair_history

OLD = time.time() - 3 * DAY


def _store(root: Path, retention: float | None = DAY, node: str = "node-test") -> fsdurable.Store:
    """Every message in a segment of its own (no inline tail): segment ``i`` holds message
    ``i``."""
    return fsdurable.Store(root, node_id=node,
                           config=Config(inline_tail_bytes=0, archive_retention=retention))


def _compacted(store: fsdurable.Store, turns: int = 5, keep: int = 2) -> tuple[object, ...]:
    """A chat of ``turns`` turns compacted to its last ``keep`` messages (summary set)."""
    store.create("c")
    for i in range(turns):
        s = store.begin_turn("c", f"question {i}")
        store.end_turn(s, f"answer {i}")
    kept = tuple(store.load("c").messages)[-keep:]
    store.patch("c", lambda cur: attrs.evolve(cur, summary="earlier", messages=kept))
    return kept


def _seg(root: Path, first: int) -> Path:
    return next((root / "history" / "c").glob(f"{first:012d}-*.json"))


def _age(root: Path, *firsts: int) -> None:
    for f in firsts:
        os.utime(_seg(root, f), (OLD, OLD))


def _doc(root: Path) -> dict[str, object]:
    d: dict[str, object] = json.loads((root / "sessions" / "c.json").read_bytes())
    return d


def test_retention_releases_the_oldest_archived_segments_through_the_gate(root: Path) -> None:
    store = _store(root)
    live = _compacted(store)
    assert store.load("c").messages.chain.ref.start == 8  # type: ignore[union-attr]
    _age(root, 0, 1, 2)  # written three days ago; 3 .. 9 today
    raw = (root / "sessions" / "c.json").read_bytes()
    found = {f.code: f for f in doctor(store)}
    assert "archive_expired" in found and "values 0..2" in found["archive_expired"].detail
    assert (root / "sessions" / "c.json").read_bytes() == raw  # a scan writes nothing
    assert len(store.archive("c")) == 8

    found = {f.code: f for f in doctor(store, repair=True)}
    assert found["archive_expired"].repaired and found["orphan_segments"].repaired
    d = _doc(root)
    assert d["format"] == "fsdurable.session/7"
    assert d["history"]["kept"] == 3 and d["history"]["start"] == 8  # type: ignore[index]
    codes = [e.code for e in store.events("c")]
    assert codes.count("archive_pruned") == 1 and codes.count("segment_removed") == 3
    pruned = next(e for e in store.events("c") if e.code == "archive_pruned")
    d = pruned.detail
    assert (d["kept_from"], d["kept"], d["segments"]) == (0, 3, 3)
    assert not list((root / "history" / "c").glob("00000000000[012]-*.json"))

    fresh = _store(root)
    assert [m.content for m in fresh.archive("c")] == [
        "answer 1", "question 2", "answer 2", "question 3", "answer 3"]
    assert tuple(fresh.load("c").messages) == live
    assert not {f.code for f in doctor(fresh)} & {"archive_expired", "orphan_segments",
                                                  "history_waiting", "history_unreadable"}
    s = fresh.begin_turn("c", "later")  # a commit keeps where the chain is kept from
    fresh.end_turn(s, "reply")
    assert _doc(root)["history"]["kept"] == 3  # type: ignore[index]
    assert len(fresh.archive("c")) == 5


def test_without_a_retention_the_archive_is_kept(root: Path) -> None:
    store = _store(root, retention=None)
    _compacted(store)
    _age(root, *range(10))
    before = sorted(p.name for p in (root / "history" / "c").iterdir())
    found = {f.code for f in doctor(store, repair=True)}
    assert "archive_expired" not in found and "orphan_segments" not in found
    assert sorted(p.name for p in (root / "history" / "c").iterdir()) == before
    assert "kept" not in _doc(root)["history"]  # type: ignore[operator]
    assert len(store.archive("c")) == 8
    assert "archive_pruned" not in [e.code for e in store.events("c")]


def test_retention_never_releases_live_messages_nor_under_a_running_turn(root: Path) -> None:
    store = _store(root)
    _compacted(store)
    _age(root, *range(10))  # every segment old, the live ones (8, 9) too
    store.begin_turn("c", "in flight")
    assert prune_archive(store, "c") is None  # a turn in progress: never a commit under it
    s = store.load("c")
    store.end_turn(s, "done")
    act = prune_archive(store, "c")
    assert act is not None and _doc(root)["history"]["kept"] == 8  # type: ignore[index]
    assert len(store.archive("c")) == 0
    assert [m.content for m in store.load("c").messages][:2] == ["question 4", "answer 4"]
    # a crash here (released, not removed yet) leaves unreferenced segments: the sweep's
    assert {a.action for a in repair_history(store, "c")} == {"removed_segment"}
    assert len(list((root / "history" / "c").iterdir())) == 4  # 8, 9 and the turn's two


def test_a_kept_past_the_summary_is_unreadable_and_removes_nothing(root: Path) -> None:
    store = _store(root)
    _compacted(store)
    _age(root, *range(10))
    d = _doc(root)
    d["history"]["kept"] = 9  # type: ignore[index]  # a hand edit: past start (8)
    (root / "sessions" / "c.json").write_bytes(json.dumps(d).encode())
    before = sorted(p.name for p in (root / "history" / "c").iterdir())
    store = _store(root)
    with pytest.raises(fsdurable.HistoryUnavailable) as info:
        store.archive("c")
    assert info.value.reason == "history_short"
    assert len(tuple(store.load("c").messages)) == 2  # the live messages still read
    found = {f.code for f in doctor(store, repair=True)}
    assert "history_unreadable" in found and "orphan_segments" not in found
    assert sorted(p.name for p in (root / "history" / "c").iterdir()) == before


def test_a_lost_archive_segment_is_reported(root: Path) -> None:
    """The archive is history too: doctor reads it, and one of its segments gone (not
    released by the retention) is said, not passed over."""
    store = _store(root, retention=None)
    _compacted(store)
    _seg(root, 2).unlink()
    with pytest.raises(fsdurable.HistoryUnavailable):
        store.archive("c")
    found = {f.code: f for f in doctor(store)}
    assert "history_waiting" in found and "000000000002-" in found["history_waiting"].path


def test_archive_retention_must_be_positive() -> None:
    with pytest.raises(ValueError, match="archive_retention"):
        Config(archive_retention=0)
