"""fsdurable on a REAL exFAT filesystem (tests/exfat.py mounts one through exfat-fuse on a loop
device): issue 12's exFAT section and issue 9 item 3 (case-insensitive names).

Failed on d21cff9: ``Store()``/``fsdurable init`` raised EPERM from ``os.link`` and left a
half-made store; ``load("chat")`` moved ``Chat``'s good file to quarantine; ``create("chat")``
did the same and wrote over it; ``Bob`` and ``bob`` had two commit locks; doctor reported five
permission problems it could not repair.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import attrs
import pytest

import fsdurable
from fsdurable import ConflictError, LockTimeout, SessionNotFound
from tests.conftest import PYTHON, REPO, subprocess_env

from . import exfat

exfat_mount = exfat.exfat_mount  # the fixtures, visible to this module's tests
exfat_dir = exfat.exfat_dir


def _open(d: Path) -> fsdurable.Store:
    """A store on exFAT whose manifest is written by hand, so the tests below do not depend on
    the init fix (and show their own bug on the code before it)."""
    root = d / "store"
    root.mkdir()
    (root / "fsdurable.json").write_text(json.dumps(
        {"format": "fsdurable/1", "store_id": "exfat-test", "created_at": 1.0}))
    return fsdurable.Store(root)


def test_the_mount_is_what_the_tests_claim(exfat_dir: Path) -> None:
    a = exfat_dir / "Probe.txt"
    a.write_text("x")
    assert (exfat_dir / "probe.TXT").read_text() == "x"  # case-insensitive
    with pytest.raises(PermissionError):
        os.link(a, exfat_dir / "hard")  # no hard links
    os.chmod(a, 0o600)
    assert os.stat(a).st_mode & 0o777 != 0o600  # modes are the mount's mask
    from fsdurable._fsio import holds_modes

    assert not holds_modes(str(a)) and holds_modes(str(REPO))


def test_init_works_without_hard_links(exfat_dir: Path, tmp_path: Path) -> None:
    root = exfat_dir / "store"
    env = subprocess_env(FSDURABLE_STATE_DIR=str(tmp_path / "state"))
    out = subprocess.run([PYTHON, "-m", "fsdurable", "init", "--root", str(root)], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(os.listdir(root)) == ["events", "fsdurable.json", "markers", "quarantine",
                                        "sessions"]
    manifest = json.loads((root / "fsdurable.json").read_bytes())
    assert manifest["format"] == "fsdurable/1"
    assert not [n for n in os.listdir(root) if n.endswith(".tmp")]  # nothing half-made
    again = fsdurable.Store(root)  # opens the same store
    assert again.manifest.store_id == manifest["store_id"]


def test_ids_differing_only_by_case_are_one_file(exfat_dir: Path) -> None:
    store = _open(exfat_dir)
    chat = store.create("Chat", metadata={"who": "first"})
    path = exfat_dir / "store" / "sessions" / "Chat.json"
    before = path.read_bytes()
    with pytest.raises(SessionNotFound) as info:
        store.load("chat")
    assert info.value.reason == "case_collision" and "Chat" in info.value.message
    with pytest.raises(ConflictError) as cinfo:
        store.create("chat")
    assert cinfo.value.reason == "case_collision"
    assert not store.exists("chat") and store.exists("Chat")
    with pytest.raises(SessionNotFound):
        store.begin_turn("chat", "hi")
    # nothing moved, nothing overwritten, no event claims a quarantine
    assert path.read_bytes() == before
    assert os.listdir(exfat_dir / "store" / "quarantine") == []
    assert os.listdir(exfat_dir / "store" / "sessions") == ["Chat.json"]
    assert store.load("Chat") == chat and store.sessions() == ["Chat"]
    assert not [e for e in store.events() if "quarantined" in e.code]


HOLD = """
import sys, time, fsdurable
store = fsdurable.Store(sys.argv[1])
with store.commit_lock(sys.argv[2]):
    open(sys.argv[3], "w").close()
    time.sleep(30)
"""


def test_one_commit_lock_for_ids_differing_only_by_case(exfat_dir: Path, tmp_path: Path) -> None:
    store = _open(exfat_dir)
    root = exfat_dir / "store"
    store.create("Bob")
    ready = tmp_path / "ready"
    child = subprocess.Popen([PYTHON, "-c", HOLD, str(root), "Bob", str(ready)],
                             env=subprocess_env(), cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(LockTimeout), store.commit_lock("bob", timeout=0.3):
            pass
    finally:
        child.kill()
        child.wait()
    with store.commit_lock("bob", timeout=5):  # released with its holder
        pass


def test_doctor_reports_no_permission_the_filesystem_cannot_hold(exfat_dir: Path) -> None:
    store = _open(exfat_dir)
    store.create("a")
    store.begin_turn(store.create("b").id, "hi")
    findings = fsdurable.doctor(store)
    assert [f.code for f in findings if f.code == "permissions"] == []
    from fsdurable._doctor import problems

    assert problems(findings) == []


REPLACE = """
import sys, attrs, fsdurable
store = fsdurable.Store(sys.argv[1])
store.patch("c", lambda s: attrs.evolve(s, metadata={"by": "b"}))
"""


def test_a_replace_within_one_coarse_timestamp_is_a_conflict(exfat_dir: Path) -> None:
    store = _open(exfat_dir)
    mine = store.patch(store.create("c").id, lambda s: attrs.evolve(s, metadata={"by": "a"}))
    out = subprocess.run([PYTHON, "-c", REPLACE, str(exfat_dir / "store")],
                         env=subprocess_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    with pytest.raises(ConflictError):
        store.save(attrs.evolve(mine, metadata={"by": "a", "again": True}))
    assert store.load("c").metadata == {"by": "b"}


def test_store_recovery_and_kill_torture_on_exfat(exfat_dir: Path, tmp_path: Path) -> None:
    """Three agent processes SIGKILLed at random on the exFAT store, restarted, then recovery
    and doctor --repair; every invariant of tests/torture/kills.py holds."""
    env = subprocess_env(FSDURABLE_STATE_DIR=str(tmp_path / "state"))
    out = subprocess.run([PYTHON, "-m", "tests.torture.kills", "--kills", "30", "--seed", "5",
                          "--dir", str(exfat_dir)], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=900)
    res = json.loads(out.stdout)
    assert res["violations"] == [], res["violations"]
    assert out.returncode == 0 and res["kills"] == 30
    stats = res["stats"]
    assert stats["event_turn_completed"] > 0 and stats["acknowledged_commits"] > 0
    # killed turns were found and recovered on exFAT (resumed, parked or abandoned)
    assert stats.get("event_interrupted_turn_resuming", 0) + sum(
        v for k, v in stats.items() if k.startswith("final_recovery_")) > 0, stats


# ---------------------------------------------------------------- the no-hard-link path anywhere


def _no_links(*a: object, **k: object) -> None:
    raise PermissionError(1, "Operation not permitted")  # what exfat-fuse says


def test_create_if_absent_without_hard_links(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from fsdurable import _fsio

    monkeypatch.setattr(os, "link", _no_links)
    target = tmp_path / "m.json"
    _fsio.write_atomic(str(target), b"first")
    target.unlink()
    _fsio.write_atomic(str(target), b"one", overwrite=False)
    with pytest.raises(FileExistsError):
        _fsio.write_atomic(str(target), b"two", overwrite=False)
    assert target.read_bytes() == b"one"
    assert os.listdir(tmp_path) == ["m.json"]  # no temp file left
    assert os.stat(target).st_mode & 0o777 == 0o600


def test_an_empty_node_id_left_by_a_crash_is_replaced(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from fsdurable._layout import node_id

    monkeypatch.delenv("FSDURABLE_NODE")
    monkeypatch.setenv("FSDURABLE_STATE_DIR", str(tmp_path))
    (tmp_path / "node_id").write_bytes(b"")  # a claim whose rename never came
    got = node_id()
    assert got.startswith("n") and (tmp_path / "node_id").read_text().strip() == got
    assert node_id() == got



def test_an_item_log_is_restored_where_there_are_no_hard_links(exfat_dir: Path) -> None:
    """``quarantine restore`` puts an item log back by a hard link and an unlink (never over a
    file that arrived meanwhile); exFAT refuses links (EPERM), so there it is a rename."""
    import asyncio

    from fsdurable import _quarantine
    from fsdurable.openai_agents import FileSession

    store = _open(exfat_dir)
    root = Path(store.root)
    old, new = {"role": "user", "content": "old"}, {"role": "user", "content": "new"}
    asyncio.run(FileSession("s1", store).add_items([old]))
    doc = root / "sessions" / "s1.json"
    old_doc = doc.read_bytes()
    doc.write_bytes(b"{not json")  # corrupt: the next write starts the session over
    asyncio.run(FileSession("s1", fsdurable.Store(root)).add_items([new]))
    doc.write_bytes(old_doc)  # the old document put back by hand
    [q] = [q for q in _quarantine.listing(store) if q.kind == "item-log"]
    _quarantine.restore(fsdurable.Store(root), q.name)
    assert asyncio.run(FileSession("s1", fsdurable.Store(root)).get_items()) == [old]
    kinds = sorted((q.kind, q.reason) for q in _quarantine.listing(store))
    assert ("item-log", "displaced") in kinds and ("item-log", "unnamed_log") not in kinds
