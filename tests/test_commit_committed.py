"""Issue 9 item 17: a commit that committed never raises as if it had not.

EIO is injected at the exact ``_fsio`` operation (the recorder raises before it runs). After the
session's rename and directory fsync the commit is made: a marker the disk refuses to remove is
an orphan (the harmless reverse gap) and the commit returns. If the session's own directory fsync
fails after its rename, the new state is in place but not proven durable: DurabilityUnknown (a
StorageError) carries exactly the session now on disk. (Failed on 996123e: a plain StorageError,
and the caller's retry got a ConflictError.)"""

from __future__ import annotations

import errno
from pathlib import Path

import attrs
import pytest

import fsdurable
from fsdurable import DurabilityUnknown, StorageError
from tests.torture.faults import failing


@pytest.mark.parametrize("op", ["unlink", "fsync_dir"])
def test_end_turn_returns_when_only_the_marker_removal_fails(root: Path, op: str) -> None:
    store = fsdurable.Store(root)
    store.create("a")
    s = store.begin_turn("a", "hi")
    with failing(op, errno.EIO, where="markers") as fired:
        done = store.end_turn(s, "bye")  # committed: no raise
    assert fired
    assert not done.in_progress and done.version == s.version + 1
    assert fsdurable.Store(root).load("a") == done
    # the caller goes on from what it got: no ConflictError, no retry needed
    assert store.save(attrs.evolve(done, metadata={"next": 1})).version == done.version + 1
    fsdurable.Store(root).interrupted()  # the orphan marker (if left) is no turn
    assert [m.session_id for m in fsdurable.Store(root).interrupted()] == []


@pytest.mark.parametrize("action", ["patch", "end_turn", "begin_turn", "create"])
def test_a_session_dir_fsync_failure_says_exactly_what_was_committed(root: Path,
                                                                     action: str) -> None:
    store = fsdurable.Store(root)
    store.create("a")
    s = store.begin_turn("a", "hi") if action == "end_turn" else store.load("a")
    calls = {
        "patch": lambda: store.patch("a", lambda cur: attrs.evolve(cur, metadata={"k": 1})),
        "end_turn": lambda: store.end_turn(s, "bye"),
        "begin_turn": lambda: store.begin_turn("a", "hello"),
        "create": lambda: store.create("b"),
    }
    with failing("fsync_dir", errno.EIO, where="sessions"), \
            pytest.raises(DurabilityUnknown) as info:
        calls[action]()
    e = info.value
    assert isinstance(e, StorageError) and e.errno == errno.EIO
    sid = "b" if action == "create" else "a"
    on_disk = fsdurable.Store(root).load(sid)
    assert e.session == on_disk and e.session_id == sid
    assert f"committed at version {on_disk.version}" in str(e)
    # continuing from err.session works; retrying the same change would be the lost-update trap
    assert store.save(attrs.evolve(e.session, metadata={"after": 1})).version == \
        on_disk.version + 1


def test_a_marker_dir_fsync_failure_before_the_session_is_not_a_commit(root: Path) -> None:
    store = fsdurable.Store(root)
    before = store.create("a")
    with failing("fsync_dir", errno.EIO, where="markers"), pytest.raises(StorageError) as info:
        store.begin_turn("a", "hi")
    assert not isinstance(info.value, DurabilityUnknown)  # the session was never written
    assert fsdurable.Store(root).load("a") == before
    assert not store.load("a").in_progress
    assert store.begin_turn("a", "again").in_progress  # the store works on


def test_end_turn_returns_when_the_disk_refuses_to_say_whether_the_marker_is_there(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker's lstat after the session's write is part of the marker removal: an EIO there
    (a disk failing, or shut down, between the two) leaves an orphan at worst and the commit
    returns. (Failed on 448b0a2: the raw OSError escaped end_turn after the commit was made.)"""
    from fsdurable import _fsio

    store = fsdurable.Store(root)
    store.create("a")
    s = store.begin_turn("a", "hi")
    real = _fsio.lstat

    def refusing(path: str) -> object:
        if "markers" in str(path):
            raise OSError(errno.EIO, "Input/output error", path)
        return real(path)

    monkeypatch.setattr(_fsio, "lstat", refusing)
    done = store.end_turn(s, "bye")  # committed: no raise
    monkeypatch.setattr(_fsio, "lstat", real)
    assert not done.in_progress and done.version == s.version + 1
    assert fsdurable.Store(root).load("a") == done
    assert store.save(attrs.evolve(done, metadata={"next": 1})).version == done.version + 1
