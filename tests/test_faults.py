"""Faults: the disk refuses an operation. Each gives a typed error, the last committed state stays
readable and nothing half-written appears under a final name.

* ENOSPC / EIO / EACCES / EROFS at every step of every commit path: injected through ``_fsio``'s
  recorder (it raises ``OSError`` just before the operation).
* EACCES for real: the tests run as root, which ignores permission bits, so the child process
  runs with EVERY capability dropped (``setpriv --bounding-set=-all``): as the files' owner it then
  meets the mode bits like any user.
* a read-only store for real: a read-only bind mount (root); without root the recorder's EROFS
  scenarios above stand in.
* a lock held by a process that was SIGKILLed, and by one that hangs (SIGSTOP).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import attrs
import pytest

from fsdurable import StorageError, Store
from fsdurable._config import Config
from fsdurable._errors import LockTimeout
from tests.conftest import PYTHON, REPO, subprocess_env
from tests.torture import faults


@pytest.mark.parametrize("sc", faults.scenarios(), ids=lambda sc: sc.name)
def test_injected_fault(sc: faults.Scenario, root: Path) -> None:
    assert faults.run_scenario(sc, str(root)) == []


def test_an_event_log_that_cannot_be_written_never_fails_a_commit(root: Path) -> None:
    import errno

    st = Store(root)
    st.create("a")
    with faults.failing("append", errno.ENOSPC, where="events") as fired:
        s = st.begin_turn("a", "hi")  # its turn_started event hits ENOSPC
    assert fired and s.in_progress
    assert Store(root).load("a").in_progress


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "events" not in p.parts}


def _probe(root: Path, *prefix: str) -> dict[str, dict[str, object]]:
    out = subprocess.run([*prefix, PYTHON, "-m", "tests.torture.probe", str(root)],
                         env=subprocess_env(), capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return {r["op"]: r for r in map(json.loads, out.stdout.splitlines())}


def _no_caps() -> list[str]:
    if os.geteuid() != 0:
        return []  # an ordinary user meets the mode bits anyway
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make the mode bits bind")
    return [setpriv, "--inh-caps=-all", "--bounding-set=-all"]


WRITES = ("patch", "begin_turn", "checkpoint", "end_turn", "create", "delete")


def test_eacces_on_a_store_that_is_not_writable(root: Path) -> None:
    faults.seed(str(root))
    before = _snapshot(root)
    for dirpath, _, files in os.walk(root):
        os.chmod(dirpath, 0o500)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o400)
    try:
        res = _probe(root, *_no_caps())
    finally:
        for dirpath, _, _files in os.walk(root):
            os.chmod(dirpath, 0o700)
    # reading works: the last committed state, discovery, doctor
    assert res["load"]["ok"] and res["interrupted"]["value"] == "['b']"
    assert res["doctor"]["ok"] and res["doctor_repair"]["ok"]
    for op in WRITES:
        r = res[op]
        assert not r["ok"] and r["type"] == "StorageError" and r["reason"] == "EACCES", r
    assert res["recover"]["type"] in (None, "StorageError") or res["recover"]["ok"]
    assert _snapshot(root) == before  # nothing was touched
    assert faults.files_under_final_names_parse(str(root)) == []


def test_eacces_on_a_store_that_is_not_readable(root: Path) -> None:
    faults.seed(str(root))
    for dirpath, _, files in os.walk(root):
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0)
    try:
        res = _probe(root, *_no_caps())
    finally:
        for dirpath, _, files in os.walk(root):
            for f in files:
                os.chmod(os.path.join(dirpath, f), 0o600)
    assert res["open"] == {**res["open"], "ok": False, "typed": True, "type": "StorageError",
                           "reason": "EACCES"}
    assert Store(root).load("b").in_progress  # nothing was lost


@pytest.fixture
def ro_mount(tmp_path: Path) -> object:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root (the recorder's EROFS scenarios cover it)")
    src, dst = tmp_path / "store", tmp_path / "ro"
    faults.seed(str(src))
    dst.mkdir()
    r = subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"mount refused: {r.stderr!r}")
    try:
        r = subprocess.run(["mount", "-o", "remount,ro,bind", str(dst)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"remount ro refused: {r.stderr!r}")
        yield src, dst
    finally:
        subprocess.run(["umount", str(dst)], check=True)


def test_a_read_only_store(ro_mount: tuple[Path, Path]) -> None:
    src, dst = ro_mount
    before = _snapshot(src)
    res = _probe(dst)  # as root: the mount, not the mode bits, refuses
    assert res["open"]["ok"] and res["load"]["ok"] and res["interrupted"]["value"] == "['b']"
    assert res["doctor"]["ok"] and res["doctor_repair"]["ok"]
    for op in WRITES:
        r = res[op]
        assert not r["ok"] and r["type"] == "StorageError" and r["reason"] == "EROFS", r
    assert res["recover"]["ok"] or res["recover"]["type"] == "StorageError"
    assert _snapshot(src) == before


LOCKER = """
import sys, time
from fsdurable import Store
st = Store(sys.argv[1])
with st._commit_lock("a"), st.lock("session:a"):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_lock_held_by_a_killed_process_is_free(root: Path) -> None:
    st = Store(root, config=Config(commit_lock_timeout=0.3, route_lock_timeout=0.3))
    st.create("a")
    child = subprocess.Popen([PYTHON, "-c", LOCKER, str(root)], env=subprocess_env(),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        os.kill(child.pid, signal.SIGSTOP)  # hung, not dead: a typed timeout, not a hang
        with pytest.raises(LockTimeout) as e:
            st.patch("a", lambda s: attrs.evolve(s, metadata={"k": 1}))
        assert e.value.reason == "timeout" and e.value.session_id == "a"
        with pytest.raises(LockTimeout), st.lock("session:a"):
            pass
        assert Store(root).load("a").version == 1  # readable all along
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert child.stdout is not None
        child.stdout.close()
    s = st.begin_turn("a", "after the holder died")  # the kernel released its flocks
    with st.lock("session:a"):
        st.end_turn(s, "ok")
    assert Store(root).load("a").version == 3
    assert faults.files_under_final_names_parse(str(root)) == []


def test_storage_error_is_typed_and_carries_errno(root: Path) -> None:
    import errno

    st = Store(root)
    st.create("a")
    with faults.failing("fsync", errno.EIO, where="sessions"), pytest.raises(OSError) as e:
        st.patch("a", lambda s: attrs.evolve(s, metadata={"k": 1}))
    assert isinstance(e.value, StorageError) and e.value.errno == errno.EIO
    assert e.value.path and e.value.path.endswith("a.json")
    assert Store(root).load("a").version == 1
