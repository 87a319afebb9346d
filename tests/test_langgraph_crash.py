"""fsdurable.langgraph under crashes: every state a power cut may leave while the saver puts,
writes, copies, prunes and deletes (tests/torture/lgcrash.py), broken variants of its protocol
caught, and a worker SIGKILLed before each of its disk operations in turn."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

from tests.torture import lgcrash


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> lgcrash.LgRecording:
    os.environ.setdefault("FSDURABLE_NODE", "node-test")
    return lgcrash.record(str(tmp_path_factory.mktemp("lgrec")))


def test_the_workload_covers_every_writing_method(recording: lgcrash.LgRecording) -> None:
    assert {"put", "put_writes", "delete_thread", "copy_thread", "prune",
            "delete_for_runs"} <= recording.kinds
    assert {op for op, _ in recording.ops} >= {"create", "write", "fsync", "rename", "unlink",
                                               "mkdir", "rmdir", "fsync_dir", "append"}
    # the thread of the record-file layout is migrated (its log created) and copied by a prune
    assert any(op == "unlink" and a[0].endswith(".ckpt") for op, a in recording.ops)
    assert any(op == "create" and a[0].endswith("000000.lglog") for op, a in recording.ops)


def test_every_crash_state_leaves_readable_acknowledged_threads(
        recording: lgcrash.LgRecording) -> None:
    report = lgcrash.explore(recording)
    assert report.crash_points == len(recording.ops) + 1
    assert report.states > report.crash_points
    assert report.violations == []


@pytest.mark.parametrize("name", sorted(lgcrash.LG_MUTANTS))
def test_a_broken_saver_protocol_is_caught(name: str) -> None:
    assert lgcrash.run_mutant(name).violations, f"the explorer missed {name}"


def test_a_worker_killed_at_its_disk_steps_leaves_acknowledged_threads(tmp_path: Path) -> None:
    res = lgcrash.kills(str(tmp_path), stride=3)
    assert res["kills"] >= 10
    assert res["violations"] == []
