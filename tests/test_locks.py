"""The lock module itself: flock on POSIX and portalocker (forced here, the Windows path) take
the same lock; threads, Store objects and processes exclude each other through the open lock
files it keeps; a forked child never shares or keeps them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from fsdurable import LockTimeout, Store, _locks

from .conftest import PYTHON, subprocess_env

pytestmark = pytest.mark.skipif(os.name != "posix", reason="flock and fork are POSIX")


@pytest.fixture(params=["flock", "portalocker"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test runs with fcntl.flock called directly and again through portalocker (what
    Windows uses), so the path no POSIX run takes by itself does not rot."""
    if request.param == "portalocker":
        import portalocker

        calls: list[object] = []
        real = portalocker.lock

        def spy(fh: object, flags: object) -> None:
            calls.append(fh)
            real(fh, flags)  # type: ignore[arg-type]

        monkeypatch.setattr(_locks, "_FLOCK", False)
        monkeypatch.setattr(portalocker, "lock", spy)
        yield request.param
        assert calls, "portalocker was never called"
    else:
        yield request.param


def holder(root: Path, flag: Path, key: str = "s", seconds: float = 1.0) -> subprocess.Popen[bytes]:
    """Another process (flock, the default) holding ``key``'s commit lock for ``seconds``."""
    code = textwrap.dedent(f"""
        import time, fsdurable
        st = fsdurable.Store({str(root)!r})
        with st.commit_lock({key!r}):
            open({str(flag)!r}, "w").close()
            time.sleep({seconds})
    """)
    child = subprocess.Popen([PYTHON, "-c", code], env=subprocess_env())
    deadline = time.monotonic() + 30
    while not flag.exists():
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    return child


def test_another_process_excludes_and_the_timeout_says_which_lock(
        backend: str, root: Path, tmp_path: Path) -> None:
    store = Store(root)
    store.create("s")
    child = holder(root, tmp_path / "held")
    try:
        with pytest.raises(LockTimeout) as info, store.commit_lock("s", timeout=0.1):
            pass
        err = info.value
        assert (err.reason, err.session_id) == ("timeout", "s")
        assert err.path is not None and err.path.endswith(".lock")
        assert err.__cause__ is not None  # the last refused try
        t0 = time.monotonic()
        with store.commit_lock("s", timeout=30):  # taken once the other process lets go
            assert time.monotonic() - t0 < 30
    finally:
        child.wait(30)


def test_threads_and_two_store_objects_exclude_each_other(backend: str, root: Path) -> None:
    a, b = Store(root), Store(root)
    a.create("s")
    inside = threading.Event()
    leave = threading.Event()

    def hold() -> None:
        with a.commit_lock("s"):
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert inside.wait(30)
        for st in (a, b):  # one open file for all of them: the threads' lock excludes
            with pytest.raises(LockTimeout) as info, st.commit_lock("s", timeout=0.1):
                pass
            assert info.value.reason == "timeout" and info.value.session_id == "s"
        with pytest.raises(LockTimeout), a.commit_lock("s", timeout=0):  # one try, no wait
            pass
    finally:
        leave.set()
        t.join(30)
    with b.commit_lock("s", timeout=1), a.lock("session:s", timeout=1):
        pass


def test_counts_stay_exact_under_threads_of_two_stores(backend: str, root: Path) -> None:
    a, b = Store(root), Store(root)
    a.create("n", metadata={"n": 0})

    def bump(st: Store) -> None:
        for _ in range(15):
            st.patch("n", lambda s: attrs.evolve(s, metadata={"n": s.metadata["n"] + 1}))

    threads = [threading.Thread(target=bump, args=(st,)) for st in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert a.load("n").metadata["n"] == 60


def test_a_lock_file_stays_open_between_holds_and_the_cache_is_bounded(
        backend: str, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    with store.commit_lock("k0"):
        pass
    path = store._lockdir().path("commit", "k0")
    first = _locks._FILES[path].fh
    with store.commit_lock("k0"):
        assert _locks._FILES[path].fh is first  # not opened again
    monkeypatch.setattr(_locks, "KEEP", 4)
    with store.commit_lock("held"):
        for i in range(10):
            with store.commit_lock(f"k{i}"):
                pass
        assert len(_locks._FILES) <= 4
        held = store._lockdir().path("commit", "held")
        assert held in _locks._FILES  # in use: never closed
    assert first.closed  # the least recently used went first


FORK_CHILD = r"""
import os, sys, fsdurable
from fsdurable import LockTimeout, _locks

st = fsdurable.Store(sys.argv[1])
with st.commit_lock("s"):  # the lock file is now open in this process (cached, idle)
    pass
with st.commit_lock("held"):
    pass
ready_r, ready_w = os.pipe()
st_cm = st.commit_lock("held")
st_cm.__enter__()  # held across the fork
pid = os.fork()
if pid == 0:
    os.read(ready_r, 1)  # the parent holds "s" now
    ok = not _locks._FILES  # the child starts with no lock file of its parent's
    try:  # its own open file: the parent's lock excludes it (a shared one would not)
        with st.commit_lock("s", timeout=0.2):
            ok = False
    except LockTimeout:
        pass
    try:  # held by the parent across the fork (the lock module, not the store's re-entry)
        with st._lockdir().hold("commit", "held", timeout=0.2):
            ok = False
    except LockTimeout:
        pass
    os._exit(0 if ok else 1)
with st.commit_lock("s"):
    os.write(ready_w, b"x")
    _, status = os.waitpid(pid, 0)
st_cm.__exit__(None, None, None)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_shares_no_open_lock_file(root: Path, tmp_path: Path) -> None:
    """The lock files kept open between holds are closed in a forked child: holding its own
    open file, the child is excluded by its parent's lock, never let in as the same holder."""
    Store(root).create("s")
    script = tmp_path / "fork.py"
    script.write_text(FORK_CHILD)
    out = subprocess.run([PYTHON, str(script), str(root)], env=subprocess_env(), timeout=60)
    assert out.returncode == 0


FORK_INSIDE = r"""
import os, sys, fsdurable
from fsdurable import LockTimeout

st = fsdurable.Store(sys.argv[1])
with st.commit_lock("s"):  # a fork inside the parent's commit lock (a tool's helper process)
    pid = os.fork()
    if pid == 0:
        try:  # the store's "held by this thread" record came along: it must not let it in
            with st.commit_lock("s", timeout=0.2):
                os._exit(1)
        except LockTimeout:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_inside_a_commit_lock_does_not_hold_it(root: Path, tmp_path: Path
                                                              ) -> None:
    """The store's commit lock is re-entrant within a thread (a per-thread record of the ids
    held); a forked child inherits that record but not the lock (its lock files are closed at
    the fork), so the record is its parent's, never its own: the child waits like any other
    process. It was let in at once, and could commit beside its parent."""
    Store(root).create("s")
    script = tmp_path / "fork_inside.py"
    script.write_text(FORK_INSIDE)
    out = subprocess.run([PYTHON, str(script), str(root)], env=subprocess_env(), timeout=60)
    assert out.returncode == 0


def test_a_forked_child_keeps_no_lock_of_its_parent(root: Path, tmp_path: Path) -> None:
    """The parent SIGKILLed while it holds a commit lock, a forked child still alive: the lock is
    free (the child closed its copies of the open lock files, held and cached)."""
    Store(root).create("s")
    flag = tmp_path / "child-up"
    code = textwrap.dedent(f"""
        import os, time, fsdurable
        st = fsdurable.Store({str(root)!r})
        with st.commit_lock("t"):  # cached, idle at the fork
            pass
        with st.commit_lock("s"):
            pid = os.fork()
            if pid == 0:
                with open({str(flag)!r} + ".pid", "w") as f:
                    f.write(str(os.getpid()))
                os.replace({str(flag)!r} + ".pid", {str(flag)!r})
                time.sleep(60)
                os._exit(0)
            time.sleep(60)
    """)
    parent = subprocess.Popen([PYTHON, "-c", code], env=subprocess_env())
    child = 0
    try:
        deadline = time.monotonic() + 30
        while not (flag.exists() and flag.read_text()):
            assert parent.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        child = int(flag.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        os.kill(child, 0)  # the forked child is still alive
        st = Store(root)
        for key in ("s", "t"):
            with st.commit_lock(key, timeout=5):
                pass
    finally:
        if parent.poll() is None:
            parent.kill()
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def test_the_commit_path_never_imports_portalocker_on_posix(root: Path) -> None:
    """``import portalocker`` cost a fresh process's first commit ~20 ms (bench/README.md): on
    POSIX the lock is fcntl.flock's, called directly."""
    code = textwrap.dedent(f"""
        import sys, fsdurable
        st = fsdurable.Store({str(root)!r})
        st.create("s")
        s = st.begin_turn("s", "hi")
        s = st.checkpoint(s)
        with st.lock("route"):
            st.end_turn(s, "bye")
        assert "portalocker" not in sys.modules, "portalocker imported"
    """)
    subprocess.run([PYTHON, "-c", code], env=subprocess_env(), timeout=60, check=True)


def _another_thread_commits(st: Store, sid: str) -> list[object]:
    """Take ``sid``'s commit lock from another thread (0.5 s): ``["locked"]``, or the error."""
    got: list[object] = []

    def other() -> None:
        try:
            with st.commit_lock(sid, timeout=0.5):
                got.append("locked")
        except LockTimeout as e:
            got.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join(30)
    return got


def test_ctrl_c_as_a_commit_hold_is_recorded_gives_the_lock_back(root: Path) -> None:
    """A KeyboardInterrupt raised the moment the commit lock is taken, as the hold is recorded
    (a signal handler runs at the next C call: the record's ``set.add``), is a commit that never
    began: the lock is given back and the thread's record forgets it. The lock stayed taken by
    the interrupted hold, so the session's next commit from any thread of the process waited its
    whole timeout, and this thread's record said "held": its next commit skipped the lock."""
    st = Store(root)
    st.create("s")

    class Trap(set[str]):
        def add(self, key: str) -> None:
            super().add(key)
            raise KeyboardInterrupt  # what SIGINT's handler raises after the call returns

    st._held.ids = Trap()
    st._held.pid = os.getpid()
    with pytest.raises(KeyboardInterrupt), st.commit_lock("s"):
        raise AssertionError("entered")
    assert "s" not in st._held.ids
    assert _another_thread_commits(st, "s") == ["locked"]


def test_ctrl_c_as_a_commit_hold_is_given_back_still_gives_the_lock_back(root: Path) -> None:
    """The same instant at the other end: a KeyboardInterrupt as the record forgets the hold
    (its ``set.discard``) still releases the lock. It was lost with the hold: the session's next
    commit from another thread of the process waited its whole timeout."""
    st = Store(root)
    st.create("s")

    class Trap(set[str]):
        def discard(self, key: str) -> None:
            super().discard(key)
            raise KeyboardInterrupt

    st._held.ids = Trap()
    st._held.pid = os.getpid()
    with pytest.raises(KeyboardInterrupt), st.commit_lock("s"):
        pass
    assert _another_thread_commits(st, "s") == ["locked"]


def test_ctrl_c_as_the_flock_is_taken_leaves_no_flock(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt the moment ``flock`` returns (a handler runs after the C call) is an
    acquire that failed: the file lock is given back. It stayed on the cached lock file, so
    every other process waited for that lock until this one exited."""
    import fcntl

    locks = _locks.Locks(str(tmp_path / "locks"))
    path = locks.path("route", "r")
    real = _locks._try_lock

    def taken_then_interrupted(fh: object) -> BaseException | None:
        assert real(fh) is None
        raise KeyboardInterrupt

    monkeypatch.setattr(_locks, "_try_lock", taken_then_interrupted)
    with pytest.raises(KeyboardInterrupt), locks.hold("route", "r", timeout=1):
        raise AssertionError("entered")
    monkeypatch.setattr(_locks, "_try_lock", real)
    fd = os.open(path, os.O_RDWR)  # another open file: as another process sees the lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while it is held
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    with locks.hold("route", "r", timeout=1):  # and this process takes it again
        pass
