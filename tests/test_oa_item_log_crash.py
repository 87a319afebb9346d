"""The Agents SDK adapter's item log under crashes: every state a power cut may leave while
``FileSession`` adds, pops, clears, rewrites its log, cuts a torn tail and migrates sessions of
the older layouts (tests/torture/oacrash.py), and broken variants of its protocol caught."""

from __future__ import annotations

import os

import pytest

from tests.torture import oacrash


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> oacrash.OaRecording:
    os.environ.setdefault("FSDURABLE_NODE", "node-test")
    return oacrash.record(str(tmp_path_factory.mktemp("oarec")))


def test_the_workload_covers_every_path_of_the_item_log(
        recording: oacrash.OaRecording) -> None:
    assert {"first_add", "add", "pop", "pop_across_frames", "clear", "add_after_clear",
            "torn_tail", "add_cuts_torn_tail", "create_inline", "migrate_inline",
            "create_lane", "migrate_lane"} <= recording.kinds
    # what the disk operations show: each session's log 0 durable before the document naming
    # it (a new session, and the two migrations), a rewrite (log n + 1, the document, log n
    # removed), a torn tail cut, frames of every kind, a pop cutting into an earlier frame
    assert {"log0_then_document:chat", "log0_then_document:inl", "log0_then_document:lane",
            "lane_segments", "rewrite", "torn_tail_cut", "add", "add_many", "pop", "clear",
            "pop_inside_frame"} <= oacrash.evidence(recording)
    assert {op for op, _ in recording.ops} >= {"create", "write", "fsync", "rename", "unlink",
                                               "mkdir", "fsync_dir", "append", "truncate"}
    assert recording.violations == []


def test_every_crash_state_leaves_readable_acknowledged_items(
        recording: oacrash.OaRecording) -> None:
    report = oacrash.explore(recording)
    assert report.crash_points == len(recording.ops) + 1
    assert report.states > report.crash_points
    assert report.started == report.states  # startup (doctor --repair) on every state
    assert report.violations == []


@pytest.mark.parametrize("name", sorted(oacrash.OA_MUTANTS))
def test_a_broken_item_log_protocol_is_caught(name: str) -> None:
    report = oacrash.run_mutant(name)
    # by a crash state, not only by what the workload saw itself
    assert report.from_states, f"the explorer missed {name}: {report.violations}"
