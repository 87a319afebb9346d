"""Windows and macOS code paths that can be exercised here: no ``os.fchmod`` (Windows before
3.13), modes the OS cannot hold, and the bounded retry of a replace/unlink that another process
(a sync client, an antivirus scanner) blocks for a moment with a sharing violation."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from fsdurable import StorageError, Store
from fsdurable._doctor import doctor
from fsdurable._fsio import _read, _write


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_no_fchmod_does_not_crash_doctor_repair(root: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(root)
    st.create("a")
    path = st.layout.session("a")
    os.chmod(path, 0o644)
    monkeypatch.delattr(os, "fchmod")  # as on Windows before Python 3.13
    [f] = [f for f in doctor(st, repair=True) if f.code == "permissions"]
    assert f.repaired and _mode(path) == 0o600


def test_modes_the_os_cannot_hold_are_not_problems(root: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(root)
    st.create("a")
    os.chmod(st.layout.session("a"), 0o644)
    assert [f.code for f in doctor(st)] == ["permissions"]
    monkeypatch.setattr(_read, "MODES_HELD", False)  # Windows: ACLs, a read-only bit
    assert doctor(st) == []


class Sharing:
    """``os.replace``/``os.unlink`` that fail with a sharing violation ``n`` times first."""

    def __init__(self, real: Any, n: int) -> None:
        self.real, self.left, self.calls = real, n, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise PermissionError(errno.EACCES, "The process cannot access the file because it "
                                  "is being used by another process", args[0])
        return self.real(*args)


@pytest.fixture
def windows_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_write, "_SHARING_RETRY", True)
    monkeypatch.setattr(_write, "_SHARING_WAITS", (0.001,) * 5)


@pytest.mark.usefixtures("windows_retry")
def test_a_short_sharing_violation_is_ridden_out(root: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(root)
    st.create("a")
    rep = Sharing(os.replace, 3)
    monkeypatch.setattr(os, "replace", rep)
    st.begin_turn("a", "hi")  # session and marker written by replace
    assert rep.calls >= 4
    unl = Sharing(os.unlink, 2)
    monkeypatch.setattr(os, "unlink", unl)
    st.cancel("a")  # the marker is unlinked
    assert unl.calls == 3 and st.interrupted() == []
    monkeypatch.undo()
    assert not Store(root).load("a").in_progress


@pytest.mark.usefixtures("windows_retry")
def test_a_lasting_sharing_violation_is_a_typed_error(root: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(root)
    st.create("a")
    rep = Sharing(os.replace, 100)
    monkeypatch.setattr(os, "replace", rep)
    with pytest.raises(StorageError):
        st.begin_turn("a", "hi")
    assert rep.calls == 6  # bounded: the waits, then the error stands
    monkeypatch.undo()
    assert not Store(root).load("a").in_progress  # the old content stands


def test_posix_never_retries_a_refusal(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_write, "_SHARING_RETRY", False)
    st = Store(root)
    st.create("a")
    rep = Sharing(os.replace, 1)
    monkeypatch.setattr(os, "replace", rep)
    with pytest.raises(StorageError):
        st.begin_turn("a", "hi")
    assert rep.calls == 1
