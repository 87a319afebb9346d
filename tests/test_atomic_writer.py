"""``write_atomic`` under both of its drivers: this module's own on POSIX, atomicwrites'
``AtomicWriter`` (its ``replace_atomic``/``move_atomic`` rename) elsewhere — forced here too, so
the path no POSIX run takes by itself does not rot."""

from __future__ import annotations

import errno
import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fsdurable import StorageError, Store, _fsio
from fsdurable._fsio import _atomic

from .conftest import PYTHON, subprocess_env

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the POSIX driver and os.link")


@pytest.fixture(params=["steps", "atomicwrites"])
def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Each test runs with this module's driver and again with atomicwrites' (spied: its
    ``AtomicWriter`` must run every write, and a write that lands, through its rename). Yields
    what atomicwrites did (empty for this module's driver)."""
    calls: list[str] = []
    if request.param == "atomicwrites":
        import atomicwrites

        def spy(name: str, real: Any) -> Any:
            def call(*args: Any, **kw: Any) -> Any:
                calls.append(name)
                return real(*args, **kw)
            return call

        monkeypatch.setattr(_atomic, "_ATOMICWRITES", True)
        for name in ("replace_atomic", "move_atomic"):
            monkeypatch.setattr(atomicwrites, name, spy(name, getattr(atomicwrites, name)))
        monkeypatch.setattr(atomicwrites.AtomicWriter, "_open",
                            spy("open", atomicwrites.AtomicWriter._open))
        yield calls
        assert "open" in calls, "atomicwrites never drove a write"
    else:
        monkeypatch.setattr(_atomic, "_ATOMICWRITES", False)
        yield calls
        assert calls == []


def renamed_by_atomicwrites(request: pytest.FixtureRequest, calls: list[str]) -> bool:
    """False only when atomicwrites drove the writes and none of them went through its rename."""
    if "atomicwrites" not in request.node.callspec.id:
        return True
    return "replace_atomic" in calls or "move_atomic" in calls


def temps(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if n.endswith(".tmp")]


def test_replace_returns_the_new_files_stat(
    tmp_path: Path, driver: list[str], request: pytest.FixtureRequest
) -> None:
    p = tmp_path / "doc.json"
    p.write_bytes(b"old")
    st = _fsio.write_atomic(str(p), b"new content")
    assert p.read_bytes() == b"new content"
    now = os.stat(p)
    assert (st.st_ino, st.st_size, st.st_mtime_ns) == (now.st_ino, now.st_size, now.st_mtime_ns)
    assert now.st_mode & 0o777 == 0o600
    assert temps(tmp_path) == []
    assert renamed_by_atomicwrites(request, driver)


def test_create_never_replaces(
    tmp_path: Path, driver: list[str], request: pytest.FixtureRequest
) -> None:
    p = tmp_path / "seg.json"
    _fsio.write_atomic(str(p), b"first", overwrite=False)
    with pytest.raises(FileExistsError):
        _fsio.write_atomic(str(p), b"second", overwrite=False)
    assert p.read_bytes() == b"first"
    assert temps(tmp_path) == []
    assert renamed_by_atomicwrites(request, driver)


def test_create_without_hard_links_claims_then_renames(
    tmp_path: Path, driver: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """exFAT through FUSE refuses link() with EPERM (atomicwrites' move_atomic is link() on
    POSIX): the name is claimed with O_EXCL instead."""
    def no_link(src: str, dst: str) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    p = tmp_path / "seg.json"
    _fsio.write_atomic(str(p), b"first", overwrite=False)
    assert p.read_bytes() == b"first"
    with pytest.raises(FileExistsError):
        _fsio.write_atomic(str(p), b"second", overwrite=False)
    assert p.read_bytes() == b"first"
    assert temps(tmp_path) == []


@pytest.mark.parametrize("step", ["write", "fsync", "rename"])
def test_a_failed_step_leaves_the_old_content_and_no_temp(
    tmp_path: Path, driver: list[str], step: str
) -> None:
    p = tmp_path / "doc.json"
    p.write_bytes(b"old")

    def fail(op: str, args: tuple[Any, ...]) -> None:
        if op == step:
            raise OSError(errno.ENOSPC, "No space left on device")

    prev = _fsio.set_recorder(fail)
    try:
        with pytest.raises(StorageError):
            _fsio.write_atomic(str(p), b"new")
    finally:
        _fsio.set_recorder(prev)
    assert p.read_bytes() == b"old"
    assert temps(tmp_path) == []


def test_a_store_commits_through_either_driver(
    tmp_path: Path, driver: list[str], request: pytest.FixtureRequest
) -> None:
    store = Store(str(tmp_path / "store"))
    store.create("s")
    s = store.begin_turn("s", "hello " * 2000)  # past the inline tail: a segment is created
    s = store.checkpoint(s, phase="model_reply")
    store.end_turn(s, "bye " * 2000)
    got = Store(str(tmp_path / "store")).load("s")
    assert [m.content for m in got.messages] == ["hello " * 2000, "bye " * 2000]
    assert not got.in_progress
    assert renamed_by_atomicwrites(request, driver)


def test_the_commit_path_never_imports_atomicwrites_on_posix(tmp_path: Path) -> None:
    """``import atomicwrites`` (tempfile, shutil, random, bz2, lzma) cost a fresh process's
    first commit 3.3 ms in a clean venv (bench/commit.py): on POSIX the steps are driven here."""
    code = textwrap.dedent(f"""
        import sys, fsdurable
        st = fsdurable.Store({str(tmp_path / "store")!r})
        st.create("s")
        s = st.begin_turn("s", "hi " * 3000)
        s = st.checkpoint(s)
        st.end_turn(s, "bye " * 3000)
        assert "atomicwrites" not in sys.modules, "atomicwrites imported"
    """)
    subprocess.run([PYTHON, "-c", code], env=subprocess_env(), timeout=60, check=True)
