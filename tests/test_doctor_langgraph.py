"""``doctor`` judges the LangGraph threads' files (``langgraph/<thread dir>/``) against their
documents (``fsdurable._doctorlg``): a healthy thread has no finding; a torn tail, a log
shorter than its document, a file its document does not name, a directory without a document,
a temp leftover and a symlink each get one; ``--repair`` moves only what no document names into
quarantine/, byte for byte, and never touches the thread's current log. Before, doctor did not
look into ``langgraph/`` at all."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

import fsdurable
from fsdurable._lgstore import thread_session_id
from fsdurable.langgraph import FsDurableSaver
from tests.test_langgraph_log import log_of, put, snapshot

SID = thread_session_id("t")


def thread(root: Path, *, pruned: bool = False) -> Any:
    saver = FsDurableSaver(root)
    c = None
    for i in range(3):
        c = put(saver, i, c)
    if pruned:
        saver.prune(["t"])  # the survivors copied into log 1, log 0 removed
    saver.close()
    return snapshot(FsDurableSaver(root))


def lg(findings: list[fsdurable.Finding]) -> list[fsdurable.Finding]:
    """The findings about files in ``langgraph/`` (not about quarantine/, say)."""
    return [f for f in findings if f"{os.sep}langgraph{os.sep}" in f.path
            and f"{os.sep}quarantine{os.sep}" not in f.path]


def test_a_healthy_thread_has_no_finding(tmp_path: Path) -> None:
    for pruned in (False, True):
        root = tmp_path / f"s{pruned}"
        thread(root, pruned=pruned)
        assert lg(fsdurable.doctor(fsdurable.Store(root))) == []


def test_a_torn_tail_is_information_and_left_to_the_next_put(tmp_path: Path) -> None:
    root = tmp_path / "s"
    before = thread(root)
    log = log_of(root)
    log.write_bytes(log.read_bytes() + b"\x1eLGF\x00\x00\x10\x00garbage")
    data = log.read_bytes()
    [f] = lg(fsdurable.doctor(fsdurable.Store(root), repair=True))
    assert (f.code, f.severity, f.session_id) == ("langgraph_torn_tail", "info", SID)
    assert "15 byte(s)" in f.detail and f.repair is None
    assert log.read_bytes() == data and snapshot(FsDurableSaver(root)) == before


def test_a_log_shorter_than_its_document_is_a_problem_left_as_it_is(tmp_path: Path) -> None:
    root = tmp_path / "s"
    thread(root, pruned=True)  # the document now counts the whole of log 1
    log = log_of(root, 1)
    log.write_bytes(log.read_bytes()[:-10])
    data = log.read_bytes()
    found = lg(fsdurable.doctor(fsdurable.Store(root), repair=True))
    assert [(f.code, f.severity, f.repaired) for f in found] == [
        ("langgraph_log_short", "problem", False)]
    assert "sync tool" in found[0].detail
    assert log.read_bytes() == data
    from fsdurable._doctor import problems

    assert problems(found) == found


def test_a_file_its_document_does_not_name_goes_to_quarantine(tmp_path: Path) -> None:
    """A deletion's old log whose removal a crash cut short (log 0 beside log 1)."""
    root = tmp_path / "s"
    thread(root)
    old = log_of(root).read_bytes()
    saver = FsDurableSaver(root)
    saver.prune(["t"])
    saver.close()
    before = snapshot(FsDurableSaver(root))
    log_of(root).write_bytes(old)
    os.chmod(log_of(root), 0o600)
    store = fsdurable.Store(root)
    [f] = lg(fsdurable.doctor(store))
    assert (f.code, f.path, f.repaired) == ("langgraph_stale_file", str(log_of(root)), False)
    [f] = lg(fsdurable.doctor(store, repair=True))
    assert f.repaired and not log_of(root).exists() and log_of(root, 1).exists()
    [kept] = [q for q in os.listdir(root / "quarantine") if q.endswith("000000.lglog")]
    assert (root / "quarantine" / kept).read_bytes() == old
    assert any(e.code == "file_quarantined" for e in store.events(SID))
    assert snapshot(FsDurableSaver(root)) == before
    assert lg(fsdurable.doctor(store)) == []


def test_a_directory_without_its_document_goes_to_quarantine(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    thread(a)
    theirs = log_of(a).read_bytes()
    (b / "langgraph").mkdir(parents=True)
    shutil.copytree(log_of(a).parent, log_of(b).parent)  # the log came first, by a sync tool
    store = fsdurable.Store(b)
    [f] = lg(fsdurable.doctor(store))
    assert (f.code, f.severity, f.session_id) == ("langgraph_no_session", "info", SID)
    [f] = lg(fsdurable.doctor(store, repair=True))
    assert f.repaired and not log_of(b).parent.exists()
    [kept] = [q for q in os.listdir(b / "quarantine") if q.endswith(log_of(b).name)]
    assert (b / "quarantine" / kept).read_bytes() == theirs


def test_a_temp_leftover_and_a_symlink_in_a_thread_directory(tmp_path: Path) -> None:
    root = tmp_path / "s"
    before = thread(root)
    d = log_of(root).parent
    (d / "~000001.lglog.AbC123.tmp").write_bytes(b"half a copy")
    outside = tmp_path / "outside"
    outside.write_bytes(b"not ours")
    (d / "000007.lglog").symlink_to(outside)
    store = fsdurable.Store(root)
    found = {f.code: f for f in lg(fsdurable.doctor(store))}
    assert set(found) == {"temp_leftover", "symlink"}
    fsdurable.doctor(store, repair=True)
    assert sorted(os.listdir(d)) == [log_of(root).name]
    assert outside.read_bytes() == b"not ours"  # the link moved, never followed
    assert snapshot(FsDurableSaver(root)) == before
    assert lg(fsdurable.doctor(store)) == []
