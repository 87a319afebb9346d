"""The store's contract: the marker <=> in-progress biconditional on every path, compare-and-swap,
locks across processes, permissions, symlinks, ids, foreign files."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import fsdurable
from fsdurable import ConflictError, InvalidSessionId, SessionNotFound, Store, TurnStateError

from .conftest import PYTHON, skip_or_fail, subprocess_env


def biconditional_violations(store: Store) -> list[str]:
    """Every way 'on-disk in_progress <=> marker exists' is false right now."""
    bad = []
    markers = {n[:-5] for n in os.listdir(store.layout.markers) if n.endswith(".json")}
    for sid in store.sessions():
        s = store.load(sid)
        if s.in_progress != (sid in markers):
            bad.append(f"{sid}: in_progress={s.in_progress} marker={sid in markers}")
        if s.in_progress:
            m = store.read_marker(sid)
            assert m is not None and s.turn is not None
            if m.turn_id != s.turn.id:
                bad.append(f"{sid}: marker for turn {m.turn_id}, session on {s.turn.id}")
    for sid in markers - set(store.sessions()):
        bad.append(f"{sid}: marker without session")
    return bad


def test_every_path_keeps_the_biconditional(store: Store) -> None:
    s = store.create("a", source="desktop")
    assert s.version == 1 and not s.in_progress
    assert biconditional_violations(store) == []
    s = store.begin_turn("a", "hello")
    assert s.in_progress and os.path.exists(store.layout.marker("a"))
    assert biconditional_violations(store) == []
    s = store.checkpoint(s, phase="model_reply")
    assert biconditional_violations(store) == []
    s = store.save(attrs.evolve(s, metadata={"k": 1}))
    assert biconditional_violations(store) == []
    s = store.patch("a", lambda cur: attrs.evolve(cur, summary="short"))
    assert biconditional_violations(store) == []
    s = store.end_turn(s, "done")
    assert not os.path.exists(store.layout.marker("a"))
    assert biconditional_violations(store) == []
    store.begin_turn("a", "again")
    s = store.patch("a", lambda cur: attrs.evolve(cur, in_progress=False, turn=None))
    assert not os.path.exists(store.layout.marker("a"))  # a patch that ends the turn drops it
    store.begin_turn("a", "third")
    store.cancel("a")
    assert biconditional_violations(store) == []
    store.begin_turn("a", "fourth")
    store.delete("a")
    assert store.sessions() == [] and os.listdir(store.layout.markers) == []
    codes = [e.code for e in store.events("a")]
    assert codes.count("turn_started") == 4
    assert "turn_completed" in codes and "turn_cancelled" in codes and "session_deleted" in codes


def test_full_save_entering_in_progress_writes_the_marker(store: Store) -> None:
    s = store.create("b")
    t = fsdurable.Turn(id="t1", started_at=1.0, checkpoint_at=2.0)
    s = store.save(attrs.evolve(s, in_progress=True, turn=t))
    m = store.read_marker("b")
    assert m is not None and m.turn_id == "t1" and m.session_version == s.version
    assert [x.session_id for x in store.interrupted()] == ["b"]


def test_begin_turn_twice_is_refused(store: Store) -> None:
    store.create("c")
    store.begin_turn("c", "x")
    with pytest.raises(TurnStateError) as e:
        store.begin_turn("c", "y")
    assert isinstance(e.value, RuntimeError) and e.value.session_id == "c"


def test_cancel_without_turn_is_a_noop(store: Store) -> None:
    s = store.create("d")
    assert store.cancel("d") == s
    assert [e.code for e in store.events("d")] == []


def test_conflict_two_writers_one_base(store: Store) -> None:
    s = store.create("e")
    first = store.save(attrs.evolve(s, metadata={"who": "first"}))
    with pytest.raises(ConflictError) as err:
        store.save(attrs.evolve(s, metadata={"who": "second"}))
    assert err.value.expected == 1 and err.value.actual == 2
    assert store.load("e") == first  # no lost update: the first write stands


def test_conflict_detected_when_a_sync_tool_replaces_the_file(store: Store, root: Path) -> None:
    s = store.create("f")
    other = Store(root)  # another process, as far as caches go
    newer = other.save(attrs.evolve(other.load("f"), metadata={"from": "other machine"}))
    with pytest.raises(ConflictError):
        store.save(attrs.evolve(s, metadata={"from": "here"}))
    assert store.load("f") == newer


def test_two_processes_one_base_exactly_one_wins(root: Path) -> None:
    Store(root).create("g")
    code = textwrap.dedent(f"""
        import sys, time, attrs, fsdurable
        st = fsdurable.Store({str(root)!r})
        s = st.load("g")
        while not __import__("os").path.exists({str(root / "go")!r}):
            time.sleep(0.001)
        try:
            st.save(attrs.evolve(s, metadata={{"who": sys.argv[1]}}))
            print("won")
        except fsdurable.ConflictError:
            print("conflict")
    """)
    procs = [subprocess.Popen([PYTHON, "-c", code, str(i)], stdout=subprocess.PIPE, text=True,
                              env=subprocess_env()) for i in range(2)]
    time.sleep(1.0)
    (root / "go").touch()
    outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outs == ["conflict", "won"]
    s = Store(root).load("g")
    assert s.version == 2 and s.metadata["who"] in ("0", "1")


def test_patch_serialises_read_modify_write_across_threads(store: Store) -> None:
    store.create("h", metadata={"n": 0})

    def bump() -> None:
        for _ in range(20):
            store.patch("h", lambda s: attrs.evolve(s, metadata={"n": s.metadata["n"] + 1}))

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = store.load("h")
    assert s.metadata["n"] == 80 and s.version == 81


def test_route_lock_excludes_another_process(root: Path, tmp_path: Path) -> None:
    store = Store(root)
    log = tmp_path / "log"
    code = textwrap.dedent(f"""
        import time, fsdurable
        st = fsdurable.Store({str(root)!r})
        with st.lock("session:x"):
            open({str(log)!r}, "a").write("child-in\\n")
            time.sleep(1.0)
            open({str(log)!r}, "a").write("child-out\\n")
    """)
    child = subprocess.Popen([PYTHON, "-c", code], env=subprocess_env())
    deadline = time.time() + 30
    while not (log.exists() and "child-in" in log.read_text()):
        assert time.time() < deadline
        time.sleep(0.01)
    with pytest.raises(fsdurable.LockTimeout), store.lock("session:x", timeout=0.1):
        pass
    with store.lock("session:x", timeout=30), open(log, "a") as f:
        f.write("parent-in\n")
    child.wait(timeout=30)
    assert log.read_text().split() == ["child-in", "child-out", "parent-in"]
    with store.lock("session:other", timeout=0.1):  # other routes are independent
        pass


def test_lock_of_a_killed_process_is_released(root: Path, tmp_path: Path) -> None:
    store = Store(root)
    flag = tmp_path / "held"
    code = textwrap.dedent(f"""
        import os, signal, fsdurable
        st = fsdurable.Store({str(root)!r})
        with st.lock("session:dead"):
            open({str(flag)!r}, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([PYTHON, "-c", code], env=subprocess_env(), timeout=60)
    assert flag.exists()
    with store.lock("session:dead", timeout=5):
        pass


def test_lock_files_live_outside_the_store(store: Store) -> None:
    with store.lock("session:z"):
        pass
    store.create("z")
    for dirpath, _, files in os.walk(store.root):
        assert not any(f.endswith(".lock") for f in files), dirpath



def test_a_store_opened_through_a_symlink_shares_one_lock_directory(tmp_path: Path) -> None:
    """The lock directory is keyed by the store directory's identity: the store opened by its
    real path, through a symlink, and ``state_dir`` of the link all name one directory."""
    from fsdurable._layout import state_dir

    direct = Store(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    via = Store(tmp_path / "link")
    locks = direct._lockdir().directory
    assert via._lockdir().directory == locks
    assert locks == os.path.join(state_dir(str(tmp_path / "link")), "locks")
@pytest.mark.parametrize("bad", [
    "", "a/b", "a\\b", ".", "..", "a.b", "a\x00b", "x" * 129, "CON", "nul", "Com1", "LPT9",
    "../../etc/passwd", "é", "a b", 7,
])
def test_invalid_ids_refused_before_touching_disk(store: Store, bad: object) -> None:
    before = sorted(os.walk(store.root))
    for call in (lambda: store.create(bad), lambda: store.load(bad), lambda: store.patch(
            bad, lambda s: s), lambda: store.delete(bad), lambda: store.cancel(bad),
                 lambda: store.begin_turn(bad, "x")):
        with pytest.raises(InvalidSessionId) as e:
            call()  # type: ignore[no-untyped-call]
        assert isinstance(e.value, ValueError)
    assert sorted(os.walk(store.root)) == before


def test_permissions(store: Store) -> None:
    old = os.umask(0o022)
    try:
        store.create("p")
        store.begin_turn("p", "x")
    finally:
        os.umask(old)
    for d in store.layout.directories():
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    for f in (store.layout.session("p"), store.layout.marker("p"), store.layout.manifest):
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f
    for dirpath, _, files in os.walk(store.layout.events):
        for name in files:
            assert stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode) == 0o600


def test_symlink_planted_at_session_path_is_not_followed(store: Store, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    os.symlink(outside, store.layout.session("s"))
    with pytest.raises(fsdurable.UnreadableState):
        store.load("s")  # never read through the link, never moved by a read
    with pytest.raises(fsdurable.UnreadableState):
        store.create("s")  # never written over a file it cannot read
    assert outside.read_text() == "precious" and os.path.islink(store.layout.session("s"))
    from fsdurable import _repair

    assert _repair.repair_session(store, "s").action == "quarantined"  # the repair gate
    s = store.create("s")  # the link is gone (in quarantine), a real file takes its place
    assert not os.path.islink(store.layout.session("s")) and s.version == 1
    assert outside.read_text() == "precious"
    q = os.listdir(store.layout.quarantine)
    assert any("-session.symlink-" in n and n.endswith("-s.json") for n in q)


def test_write_over_a_symlink_replaces_the_link_not_the_target(store: Store,
                                                               tmp_path: Path) -> None:
    s = store.create("t")
    outside = tmp_path / "outside.json"
    outside.write_text("precious")
    assert not os.path.lexists(store.layout.marker("t"))  # idle: no marker
    os.symlink(outside, store.layout.marker("t"))
    store.begin_turn("t", "go")  # the marker write renames over the link
    assert outside.read_text() == "precious"
    assert not os.path.islink(store.layout.marker("t"))
    assert store.read_marker("t") is not None and s.version == 1


def test_foreign_files_are_skipped_by_listings(store: Store) -> None:
    store.create("real")
    store.begin_turn("real", "x")
    names = ["real.sync-conflict-20261129-101010-ABCDEFG.json",
             "real (host's conflicted copy 2026-11-29).json", "~real.json.abc123.tmp",
             ".syncthing.real.json.tmp", "notes.txt", "a.b.json", "CON.json", ".DS_Store"]
    for d in (store.layout.sessions, store.layout.markers):
        for n in names:
            with open(os.path.join(d, n), "w") as f:
                f.write("{}")
    assert store.sessions() == ["real"]
    assert [m.session_id for m in store.interrupted()] == ["real"]
    for d in (store.layout.sessions, store.layout.markers):
        assert set(names) <= set(os.listdir(d))  # skipped, never touched


def test_missing_session(store: Store) -> None:
    with pytest.raises(SessionNotFound) as e:
        store.load("nope")
    assert isinstance(e.value, LookupError) and e.value.session_id == "nope"


def test_store_reopens_and_keeps_its_identity(root: Path) -> None:
    a = Store(root)
    b = Store(root)
    assert a.manifest == b.manifest
    with pytest.raises(SessionNotFound):
        Store(root.parent / "absent", create=False)


def test_subscriber_sees_events_in_process(store: Store) -> None:
    seen: list[str] = []
    unsubscribe = store.subscribe(lambda e: seen.append(e.code))
    store.create("u")
    store.begin_turn("u", "x")
    store.cancel("u")
    unsubscribe()
    store.begin_turn("u", "y")
    assert seen == ["turn_started", "turn_cancelled"]


class StoreMachine(RuleBasedStateMachine):
    """Random sequences of every public write path: the biconditional holds after each step."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.tmp = tempfile.mkdtemp()
        self.store = Store(os.path.join(self.tmp, "s"))
        self.latest: dict[str, fsdurable.Session] = {}

    ids = st.sampled_from(["s1", "s2", "s3"])

    @rule(sid=ids)
    def create(self, sid: str) -> None:
        try:
            self.latest[sid] = self.store.create(sid)
        except ConflictError:
            assert sid in self.latest

    @rule(sid=ids)
    def begin(self, sid: str) -> None:
        if sid in self.latest:
            try:
                self.latest[sid] = self.store.begin_turn(sid, "go")
            except TurnStateError:
                assert self.latest[sid].in_progress

    @rule(sid=ids, phase=st.sampled_from(["model_reply", "tools_done"]))
    def checkpoint(self, sid: str, phase: str) -> None:
        s = self.latest.get(sid)
        if s is not None and s.in_progress:
            self.latest[sid] = self.store.checkpoint(s, phase=phase)

    @rule(sid=ids)
    def end(self, sid: str) -> None:
        s = self.latest.get(sid)
        if s is not None and s.in_progress:
            self.latest[sid] = self.store.end_turn(s, "ok")

    @rule(sid=ids)
    def cancel(self, sid: str) -> None:
        if sid in self.latest:
            self.latest[sid] = self.store.cancel(sid)

    @rule(sid=ids, n=st.integers(0, 5))
    def patch(self, sid: str, n: int) -> None:
        if sid in self.latest:
            self.latest[sid] = self.store.patch(
                sid, lambda s: attrs.evolve(s, metadata={"n": n}))

    @rule(sid=ids)
    def save_stale(self, sid: str) -> None:
        s = self.latest.get(sid)
        if s is not None and s.version > 1:
            with pytest.raises(ConflictError):
                self.store.save(attrs.evolve(s, version=s.version - 1))

    @rule(sid=ids)
    def delete(self, sid: str) -> None:
        if sid in self.latest:
            self.store.delete(sid)
            del self.latest[sid]

    @invariant()
    def biconditional(self) -> None:
        assert biconditional_violations(self.store) == []
        for sid, s in self.latest.items():
            assert self.store.load(sid) == s

    def teardown(self) -> None:
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)


StoreMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_store_state_machine = StoreMachine.TestCase


def test_a_commit_from_another_node_never_moves_the_turn(root: Path) -> None:
    a = Store(root, node_id="nodeA")
    a.create("x")
    a.begin_turn("x", "go")
    b = Store(root, node_id="nodeB")
    b.patch("x", lambda s: attrs.evolve(s, metadata={"renamed": True}))
    m = a.read_marker("x")
    assert m is not None and m.node_id == "nodeA"  # still A's turn: B edited, did not adopt
    s = b.load("x")
    b.commit(s, s.version, owner="nodeB")  # the explicit change of owner (adopt, claim)
    m = a.read_marker("x")
    assert m is not None and m.node_id == "nodeB"
    b.cancel("x")
    b.begin_turn("x", "new turn")  # a new turn belongs to the node that starts it
    m = a.read_marker("x")
    assert m is not None and m.node_id == "nodeB"


def test_one_store_through_two_paths_shares_its_locks(root: Path, tmp_path: Path) -> None:
    Store(root)
    alias = tmp_path / "alias"
    if os.geteuid() == 0 and shutil.which("mount"):
        alias.mkdir()
        if subprocess.run(["mount", "--bind", str(root), str(alias)]).returncode != 0:
            alias.rmdir()
    if not alias.exists():
        skip_or_fail("cannot bind-mount here (needs root and mount --bind)")
    try:
        a, b = Store(root), Store(alias)
        assert a.root != b.root
        with a.lock("session:x"), pytest.raises(fsdurable.LockTimeout), \
                b.lock("session:x", timeout=0.1):
            pass
    finally:
        subprocess.run(["umount", str(alias)], check=False)


def test_a_checkpoint_does_not_reread_the_marker_it_wrote(store: Store) -> None:
    """The commit path recognises its own marker by stat (taken after the rename): a checkpoint
    within Config.marker_refresh neither rewrites nor re-reads it."""
    import sys

    s = store.create("hot")
    s = store.begin_turn("hot", "go")
    opened: list[str] = []
    armed = [True]

    def hook(event: str, args: tuple[object, ...]) -> None:
        if armed[0] and event == "open" and isinstance(args[0], str):
            opened.append(args[0])

    sys.addaudithook(hook)
    try:
        for _ in range(3):
            s = store.checkpoint(s, phase="model_reply")
    finally:
        armed[0] = False
    assert not [p for p in opened if p.endswith(os.path.join("markers", "hot.json"))], opened
