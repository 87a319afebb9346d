"""The crash-state explorer (tests/torture/explorer.py) on the real commit protocol and on
deliberately broken variants of it: every state a power cut may leave is checked."""

from __future__ import annotations

import pytest

from tests.torture import explorer


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> explorer.Recording:
    import os

    os.environ.setdefault("FSDURABLE_NODE", "node-test")
    base = tmp_path_factory.mktemp("rec", numbered=True)
    return explorer.record_workload(str(base), scale=2)


def test_workload_covers_the_issue(recording: explorer.Recording) -> None:
    assert recording.commits >= 50
    assert recording.sessions >= 5
    assert {"create", "checkpoint", "attempt", "patch", "end_turn", "cancel", "delete",
            "repair", "sync_conflict", "segment_refused", "compaction", "archive_retention",
            "adapter_items", "inline_tail", "tail_flushed"} <= recording.kinds
    assert recording.inline_docs >= 20 and recording.flushes >= 5, (
        recording.inline_docs, recording.flushes)  # both paths of step 0, often
    ops = {op for op, _ in recording.ops}
    assert {"create", "write", "fsync", "rename", "unlink", "mkdir", "fsync_dir",
            "append"} <= ops


def test_every_crash_state_of_the_real_protocol_holds(recording: explorer.Recording) -> None:
    report = explorer.explore(recording)
    assert report.crash_points == len(recording.ops) + 1
    assert report.states > report.crash_points  # torn and reordered variants, not one per point
    assert report.violations == []


def test_model_enumerates_torn_and_reordered_states(tmp_path: object) -> None:
    from tests.torture.fsmodel import FsModel

    m = FsModel(str(tmp_path))
    base = str(tmp_path)
    m.record("create", (f"{base}/~a.json.x.tmp",))
    m.record("write", (f"{base}/~a.json.x.tmp", b"0123456789"))
    states = list(m.crash_states())
    contents = {s.files.get("~a.json.x.tmp") for s in states}
    assert None in contents  # the create itself may be lost
    assert {b"", b"01234", b"012345678", b"0123456789", b"01234\0\0\0\0\0"} <= contents
    m.record("fsync", (f"{base}/~a.json.x.tmp",))
    m.record("rename", (f"{base}/~a.json.x.tmp", f"{base}/a.json"))
    names = {tuple(sorted(s.files)) for s in m.crash_states()}
    assert names == {(), ("~a.json.x.tmp",), ("a.json",)}  # create / rename lost or not
    m.record("fsync_dir", (base,))
    assert [s.files for s in m.crash_states()] == [{"a.json": b"0123456789"}]


@pytest.mark.parametrize("name", explorer.MUTANTS)
def test_a_broken_protocol_is_caught(name: str) -> None:
    with explorer.mutant(name) as impl:
        report = explorer.run(commit_impl=impl, stop_at_first=True)
    assert report.violations, f"the explorer missed the broken variant {name}"


def test_the_test_side_copy_of_the_protocol_passes() -> None:
    """The mutants are reorderings of this copy: in the right order it must hold, so a caught
    mutant is caught for its reordering, not for a flaw of the copy."""
    with explorer.mutant("correct_copy") as impl:
        report = explorer.run(commit_impl=impl)
    assert report.violations == []


def test_the_figures_command_prints_the_table() -> None:
    """The command itself (its explorer part is the same code as the tests above)."""
    import subprocess

    from tests.conftest import PYTHON, REPO, subprocess_env

    out = subprocess.run([PYTHON, "-m", "tests.torture", "--quick", "--only", "hostile"],
                         env=subprocess_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split(" | ") == ["figure".ljust(len(lines[0].split(" | ")[0])), "value"]
    table = {k.strip(): v.strip() for k, v in (line.split(" | ") for line in lines[2:])}
    assert int(table["hostile inputs"]) >= 30
    assert table["violations"] == "0"
