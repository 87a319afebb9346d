"""A symlink (or a file) in place of ``history/`` or ``history/<id>/`` is never followed
(docs/storage.md, "never through a symlink"): no commit writes a segment through it, no read
reads one, the repair gate never lists or removes through it, and doctor reports it
(``history_not_a_directory``). The same rule as a symlinked ``sessions/``."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import fsdurable
from fsdurable._config import Config
from fsdurable._doctor import doctor, problems
from fsdurable._errors import HistoryUnavailable, StorageError
from fsdurable._segcodec import encode_segment
from fsdurable._segments import repair_history

NODE = "node-test"
# which directory the symlink replaces: the session's history directory, or history/ itself
WHERE = ["history/c", "history"]


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # the files' mtimes are the real clock's

    def __call__(self) -> float:
        return self.now


def _store(root: Path, clock: Clock | None = None) -> fsdurable.Store:
    """Every commit writes its messages as a segment (no inline tail)."""
    return fsdurable.Store(root, node_id=NODE, clock=clock or Clock(),
                           config=Config(inline_tail_bytes=0))


def _chat(store: fsdurable.Store, sid: str, turns: int) -> fsdurable.Session:
    store.create(sid)
    s = store.load(sid)
    for i in range(turns):
        s = store.begin_turn(sid, f"question {i} " + "q" * 200)
        s = store.end_turn(s, f"answer {i} " + "a" * 200)
    return s


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (not through a symlink) and its bytes."""
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            p = Path(d) / f
            if not p.is_symlink():
                out[str(p.relative_to(path))] = p.read_bytes()
    return out


def _link_out(root: Path, where: str, outside: Path) -> Path:
    """Move ``root/where`` to ``outside`` and put a symlink to it in its place; returns the
    outside directory that holds session ``c``'s segments."""
    shutil.move(str(root / where), str(outside))
    os.symlink(outside, root / where)
    return outside / "c" if where == "history" else outside


def _chat_linked_out(root: Path, tmp_path: Path, where: str
                     ) -> tuple[fsdurable.Store, Path]:
    """A store whose session ``c`` has two turns, then ``root/where`` moved out and linked
    back (``_link_out``); returns the store and the directory the symlink points to."""
    store = _store(root)
    _chat(store, "c", 2)
    outside = tmp_path / "outside"
    _link_out(root, where, outside)
    return store, outside


def asyncio_run(coro: Any) -> Any:
    return asyncio.run(coro)


def _plant(store: fsdurable.Store, directory: Path) -> Path:
    """An unreferenced segment of this node (the leftover of a commit that died)."""
    name, _, data = encode_segment("c", 0, None, NODE, [fsdurable.Message("user", "planted")])
    path = directory / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("where", WHERE)
def test_a_commit_never_writes_a_segment_through_a_symlink(root: Path, tmp_path: Path,
                                                           where: str) -> None:
    store, outside = _chat_linked_out(root, tmp_path, where)
    before, doc = _tree(outside), (root / "sessions" / "c.json").read_bytes()
    with pytest.raises(StorageError) as info:
        store.begin_turn("c", "one more")
    assert info.value.reason == "not_a_directory"
    assert info.value.session_id == "c"
    assert _tree(outside) == before  # nothing written outside the store
    assert (root / "sessions" / "c.json").read_bytes() == doc  # nothing committed


@pytest.mark.parametrize("where", WHERE)
def test_a_read_never_reads_a_segment_through_a_symlink(root: Path, tmp_path: Path,
                                                        where: str) -> None:
    _, outside = _chat_linked_out(root, tmp_path, where)
    before, store_before = _tree(outside), _tree(root / "sessions")
    s = _store(root).load("c")  # the document reads: it names the history, holds none of it
    assert len(s.messages) == 4
    with pytest.raises(HistoryUnavailable) as info:
        tuple(s.messages)
    assert info.value.reason == "not_a_directory"
    with pytest.raises(HistoryUnavailable):
        _store(root).load("c").messages[-1]
    # a read moves nothing
    assert _tree(outside) == before and _tree(root / "sessions") == store_before
    assert os.path.islink(root / where)


@pytest.mark.parametrize("where", WHERE)
def test_the_repair_gate_never_removes_through_a_symlink(root: Path, tmp_path: Path,
                                                         where: str) -> None:
    clock = Clock()
    store = _store(root, clock)
    _chat(store, "c", 1)
    outside = tmp_path / "outside"
    planted = _plant(store, _link_out(root, where, outside))
    clock.now += 2 * Config().segment_grace
    before = _tree(outside)
    assert [a.reason for a in repair_history(store, "c")] == ["not_a_directory"]
    findings = doctor(store, repair=True)
    assert planted.exists() and _tree(outside) == before
    assert "segment_removed" not in [e.code for e in store.events("c")]
    assert not any(f.code == "orphan_segments" for f in findings)
    bad = [f for f in problems(findings) if f.code == "history_not_a_directory"]
    assert [f.path for f in bad] == [str(root / where)]
    assert os.path.islink(root / where)


def test_a_file_in_place_of_a_history_directory_is_refused(root: Path) -> None:
    store = _store(root)
    _chat(store, "c", 1)
    shutil.rmtree(root / "history" / "c")
    (root / "history" / "c").write_bytes(b"not a directory")
    with pytest.raises(HistoryUnavailable) as read:
        tuple(store.load("c").messages)
    assert read.value.reason == "not_a_directory"
    with pytest.raises(StorageError) as commit:
        store.begin_turn("c", "one more")
    assert commit.value.reason == "not_a_directory"
    findings = doctor(store, repair=True)
    assert "history_not_a_directory" in {f.code for f in problems(findings)}
    assert (root / "history" / "c").read_bytes() == b"not a directory"


def test_lanes_share_the_refusal(root: Path, tmp_path: Path) -> None:
    """A lane's segments (tests/lane_session.py drives a lane; the Agents SDK's item log has
    the same refusal: tests/test_item_log.py)."""
    from .lane_session import LaneSession as FileSession

    store = _store(root)
    fs = FileSession("c", store)
    asyncio_run(fs.add_items([{"type": "message", "role": "user", "content": "x" * 200}]))
    outside = tmp_path / "outside"
    _link_out(root, "history/c", outside)
    before = _tree(outside)
    with pytest.raises(HistoryUnavailable) as info:
        asyncio_run(FileSession("c", _store(root)).get_items())
    assert info.value.reason == "not_a_directory"
    with pytest.raises(StorageError) as commit:
        asyncio_run(fs.add_items([{"type": "message", "role": "user", "content": "y" * 200}]))
    assert commit.value.reason == "not_a_directory"
    assert _tree(outside) == before


def test_a_real_history_directory_still_works(root: Path) -> None:
    """The guard refuses only what is not a directory of the store."""
    store = _store(root)
    _chat(store, "c", 2)
    assert len(tuple(_store(root).load("c").messages)) == 4
    assert not [f for f in problems(doctor(store)) if f.code.startswith("history")]
