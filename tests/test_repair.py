"""The one repair gate (issue 9: design step, items 2, 4, 6, 18, 19): reads never repair, a repair
acts only on the exact file it judged, never on another node's file or a newer format, writes the
replacement before the original goes, and each act is an event."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import attrs
import pytest

from fsdurable import Config, RecoveryPolicy, Store, UnreadableState, _fsio, recover
from fsdurable._codec import encode_marker, encode_session
from fsdurable._doctor import doctor, problems
from fsdurable._model import Marker

from .conftest import DATA, PYTHON, subprocess_env


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and link under the store except the event log: name -> (sha256, inode)."""
    out: dict[str, tuple[str, int]] = {}
    for d, dirs, files in os.walk(root):
        if os.path.relpath(d, root).split(os.sep)[0] == "events":
            continue
        for n in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            p = os.path.join(d, n)
            st = os.lstat(p)
            if os.path.islink(p):
                h = "link:" + os.readlink(p)
            else:
                with open(p, "rb") as f:
                    h = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, root)] = (h, st.st_ino)
    return out


class Never:
    def tool_effect(self, name: str) -> str | None:
        return None

    def resume_claimed(self, session: Any) -> Any:
        raise AssertionError("nothing may be resumed here")


class Loop:
    def __init__(self) -> None:
        self.resumed: list[str] = []

    def tool_effect(self, name: str) -> str | None:
        return None

    def resume_claimed(self, session: Any) -> Any:
        self.resumed.append(session.id)
        return None


def _bad_store(root: Path) -> Store:
    """A torn marker of a turn in progress, a garbage session, an old-format session, a
    symlinked session, an exhausted turn and an orphan marker."""
    st = Store(root)
    st.create("live")
    st.begin_turn("live", "go")
    Path(st.layout.marker("live")).write_bytes(b'{"format": "fsdurable.marker/1", "sess')
    Path(st.layout.session("junk")).write_bytes(b"\x00 not json")
    (Path(st.layout.sessions) / "legacy-chat_01.json").write_bytes(
        (DATA / "session_v1.json").read_bytes())
    os.symlink("/etc/hostname", st.layout.session("linked"))
    st.create("idle")
    s = st.create("orph")
    Path(st.layout.marker("orph")).write_bytes(encode_marker(Marker(
        session_id="orph", turn_id="t-gone", session_version=s.version, node_id=st.node_id,
        route_key="session:orph", source="api", started_at=st.clock() - 5,
        checkpoint_at=st.clock() - 5, resume_attempts=0)))
    old = st.create("old")
    old = st.begin_turn("old", "long ago")
    assert old.turn is not None
    st.commit(attrs.evolve(old, turn=attrs.evolve(old.turn, resume_attempts=3)), old.version)
    return st


def test_reads_and_dry_runs_change_nothing_on_disk(root: Path) -> None:
    """Item 18: load, interrupted, read_marker, sessions, `interrupted`, recover --dry-run.
    Failed on 4563120 (the listing quarantined the torn marker and rebuilt it)."""
    _bad_store(root)
    before = tree(root)
    st = Store(root)
    assert st.sessions() == sorted(["idle", "junk", "legacy-chat_01", "linked", "live", "old",
                                    "orph"])
    for sid in ("junk", "linked"):
        with pytest.raises(UnreadableState):
            st.load(sid)
    assert st.load("legacy-chat_01").version == 7  # migrated in memory only
    with pytest.raises(UnreadableState):
        st.read_marker("live")
    assert {m.session_id for m in st.interrupted()} == {"orph", "old"}
    report = recover(st, Never(), dry_run=True)
    for args in (["interrupted", "--json"], ["recover", "--dry-run", "--json"], ["doctor"],
                 ["show", "legacy-chat_01"], ["quarantine", "list"]):
        subprocess.run([PYTHON, "-m", "fsdurable", "--root", str(root), *args],
                       env=subprocess_env(), capture_output=True, check=False, timeout=60)
    assert tree(root) == before
    listed = subprocess.run([PYTHON, "-m", "fsdurable", "--root", str(root), "interrupted",
                             "--json"], env=subprocess_env(), capture_output=True, text=True,
                            check=True, timeout=60)
    assert json.loads(listed.stdout)["unreadable"] == [
        {"session_id": "live", "reason": "invalid_json"}]  # reported as bad, left in place
    # the dry run says what a real run would do, not "planned" for everything
    by = {o.session_id: o.outcome for o in report.outcomes}
    assert by["old"] == "would_abandon" and by["orph"] == "would_repair"
    assert by["live"] == "would_rebuild_marker"


def test_a_real_recovery_repairs_through_the_gate(root: Path) -> None:
    _bad_store(root)
    st = Store(root)
    loop = Loop()
    report = recover(st, loop)
    by = {o.session_id: o for o in report.outcomes}
    assert by["live"].outcome == "resumed" and loop.resumed == ["live"]
    assert by["old"].outcome == "abandoned" and by["orph"].outcome == "repaired"
    codes = [e.code for e in st.events("live")]
    assert codes.count("file_quarantined") == 1 and "marker_repaired" in codes
    [q] = [n for n in os.listdir(st.layout.quarantine) if n.endswith("-live.json")]
    assert (Path(st.layout.quarantine) / q).read_bytes().startswith(b'{"format"')


def test_doctor_repair_migrates_and_quarantines_each_with_an_event(root: Path) -> None:
    _bad_store(root)
    st = Store(root)
    findings = doctor(st, repair=True)
    assert problems(findings) == [], problems(findings)
    raw = json.loads(Path(st.layout.session("legacy-chat_01")).read_bytes())
    assert raw["format"] != "fsdurable.session/1"
    codes = {e.code for e in st.events()}
    assert {"session_migrated", "session_quarantined", "marker_repaired"} <= codes
    assert doctor(st) == [f for f in doctor(st) if f.severity == "info"]


# ------------------------------------------------------------------ item 6


def test_a_file_replaced_after_judgement_is_never_moved(root: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 6: the reader rejects an oversized file before it returns a stat; a good commit
    replaces it before the repair acts. The good session must stay. Failed on 4563120 (doctor's
    quarantine passed no expect and moved the good file)."""
    st = Store(root, config=Config(max_file_bytes=4096))
    good = st.create("s")
    good_bytes = Path(st.layout.session("s")).read_bytes()
    Path(st.layout.session("s")).write_bytes(b"x" * 10_000)
    real = _fsio.read_bounded

    def racing(path: str, max_bytes: int) -> Any:
        try:
            return real(path, max_bytes)
        except UnreadableState:
            if path == st.layout.session("s"):
                tmp = path + ".new"
                Path(tmp).write_bytes(good_bytes)
                os.replace(tmp, path)  # another process commits a good file meanwhile
            raise

    monkeypatch.setattr(_fsio, "read_bounded", racing)
    doctor(st, repair=True)
    monkeypatch.setattr(_fsio, "read_bounded", real)
    assert Store(root).load("s").version == good.version
    assert os.listdir(st.layout.quarantine) == []


def test_quarantine_without_a_judged_stat_does_nothing(store: Store) -> None:
    from fsdurable import _repair

    store.create("s")
    assert _repair.quarantine(store, store.layout.session("s"), kind="session",
                              reason="symlink", session_id="s", expect=None) is None
    assert store.load("s").version == 1


# ------------------------------------------------------------------ item 4


_KILL_CHILD = textwrap.dedent("""
    import os, signal, sys
    from fsdurable import Store, _fsio
    from fsdurable._doctor import doctor
    root, when = sys.argv[1], sys.argv[2]
    st = Store(root)
    moved = []
    def rec(op, args):  # called BEFORE each operation: kill at the one after the move
        if when == "enospc" and op == "create" and "markers" in args[0]:
            raise OSError(28, "No space left on device")
        if when == "kill" and moved:
            os.kill(os.getpid(), signal.SIGKILL)
        if op in ("rename", "link") and "quarantine" in args[1]:
            moved.append(args)
    _fsio.set_recorder(rec)
    doctor(st, repair=True)
""")


@pytest.mark.parametrize("when", ["kill", "enospc"])
def test_marker_rebuild_never_loses_the_turn(root: Path, when: str) -> None:
    """Item 4: a SIGKILL as the bad marker reaches quarantine/, or ENOSPC on the rebuilt marker:
    the turn must stay discoverable. Failed on 4563120 (the marker was moved first: gone)."""
    st = Store(root)
    st.create("t")
    s = st.begin_turn("t", "go")
    Path(st.layout.marker("t")).write_bytes(b"\x00torn")
    p = subprocess.run([PYTHON, "-c", _KILL_CHILD, str(root), when], env=subprocess_env(),
                       capture_output=True, timeout=60, check=False)
    if when == "kill":
        assert p.returncode == -signal.SIGKILL, p.stderr
    assert os.path.exists(st.layout.marker("t"))  # the bad one, or its replacement
    after = Store(root)
    assert after.load("t").in_progress
    doctor(after, repair=True)
    [m] = after.interrupted()
    assert s.turn is not None and m.turn_id == s.turn.id


# ------------------------------------------------------------------ item 2


def _foreign_turn(root: Path) -> tuple[Store, Store]:
    b = Store(root, node_id="node-b")
    b.create("x")
    b.begin_turn("x", "b's work")
    return Store(root, node_id="node-a"), b


def test_a_newer_format_marker_of_another_node_is_never_taken(root: Path) -> None:
    """Item 2a/18: node A's recovery must not quarantine B's marker in a format it cannot read,
    rebuild it with A's id, nor resume B's turn. Failed on 4563120 (A resumed it)."""
    a, b = _foreign_turn(root)
    raw = json.loads(Path(b.layout.marker("x")).read_bytes())
    raw["format"] = "fsdurable.marker/99"
    Path(b.layout.marker("x")).write_bytes(json.dumps(raw).encode())
    before = tree(root)
    loop = Loop()
    report = recover(a, loop)
    doctor(a, repair=True)
    assert loop.resumed == [] and tree(root) == before
    [o] = report.outcomes
    assert o.outcome == "needs_newer"
    assert any(f.code == "needs_newer" for f in doctor(a))


def test_a_marker_ahead_of_its_session_waits_for_sync(root: Path) -> None:
    """Item 2b: B's marker arrived before B's session (its session_version is ahead of the
    session on disk): A's `doctor --repair` and recovery leave it. Failed on 4563120 (deleted as
    an orphan)."""
    a = Store(root, node_id="node-a")
    s = a.create("x")
    Path(a.layout.marker("x")).write_bytes(encode_marker(Marker(
        session_id="x", turn_id="tb", session_version=s.version + 1, node_id="node-b",
        route_key="session:x", source="api", started_at=a.clock(), checkpoint_at=a.clock(),
        resume_attempts=0)))
    before = tree(root)
    findings = doctor(a, repair=True)
    recover(a, Never(), RecoveryPolicy())
    assert tree(root) == before
    assert any(f.code == "waiting_for_sync" and not f.repaired for f in findings)


def test_an_own_orphan_marker_is_still_removed(root: Path) -> None:
    a = Store(root)
    s = a.create("x")
    Path(a.layout.marker("x")).write_bytes(encode_marker(Marker(
        session_id="x", turn_id="t", session_version=s.version, node_id=a.node_id,
        route_key="session:x", source="api", started_at=a.clock(), checkpoint_at=a.clock(),
        resume_attempts=0)))
    assert [f.repaired for f in doctor(a, repair=True) if f.code == "orphan_marker"] == [True]
    assert not os.path.exists(a.layout.marker("x"))
    assert "marker_repaired" in [e.code for e in a.events("x")]


def test_an_unreadable_session_with_a_foreign_marker_is_left(root: Path) -> None:
    a, b = _foreign_turn(root)
    Path(b.layout.session("x")).write_bytes(b'{"format": "fsdurable.session/2", "id"')
    before = tree(root)
    doctor(a, repair=True)
    recover(a, Never())
    assert tree(root) == before


# ------------------------------------------------------------------ newer formats are never written


def test_a_newer_format_session_is_reported_and_never_written(store: Store) -> None:
    s = store.create("n")
    raw = json.loads(encode_session(s))
    raw["format"] = "fsdurable.session/99"
    Path(store.layout.session("n")).write_bytes(json.dumps(raw).encode())
    before = tree(Path(store.root))
    with pytest.raises(UnreadableState) as e:
        store.begin_turn("n", "x")
    assert e.value.reason == "unknown_version"
    findings = doctor(store, repair=True)
    assert [f.code for f in findings if f.severity == "problem"] == ["needs_newer"]
    assert tree(Path(store.root)) == before


# ------------------------------------------------------------------ enospc on quarantine


def test_enospc_while_quarantining_leaves_the_file(store: Store,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    Path(store.layout.session("bad")).write_bytes(b"garbage")

    def full(op: str, args: tuple[Any, ...]) -> None:
        if op in ("rename", "create") and "quarantine" in str(args):
            raise OSError(errno.ENOSPC, "No space left on device")

    prev = _fsio.set_recorder(full)
    try:
        findings = doctor(store, repair=True)
    finally:
        _fsio.set_recorder(prev)
    assert Path(store.layout.session("bad")).read_bytes() == b"garbage"
    assert [f.repaired for f in findings if f.code == "unreadable_session"] == [False]


def test_a_torn_marker_of_another_node_keeps_its_owner(root: Path) -> None:
    """Item 2a: B's marker is torn; B's session (format 3) records B as the turn's owner. Node
    A's recovery and `doctor --repair` neither rebuild it with A's id nor resume B's turn; B's
    own recovery rebuilds it, still B's. Failed on 4563120 (A rebuilt it as its own and
    resumed it)."""
    a, b = _foreign_turn(root)
    Path(b.layout.marker("x")).write_bytes(b'{"format": "fsdurable.marker/1", "sess')
    before = tree(root)
    loop = Loop()
    [o] = recover(a, loop).outcomes
    findings = doctor(a, repair=True)
    assert loop.resumed == [] and o.outcome == "waiting_for_sync" and tree(root) == before
    assert any(f.code == "waiting_for_sync" for f in findings)
    mine = Loop()
    [o] = recover(Store(root, node_id="node-b"), mine).outcomes
    assert o.outcome == "resumed" and mine.resumed == ["x"]
    assert Store(root).load("x").turn is not None


# ------------------------------------------------------------------ item 19: resolve --keep newest


def test_resolve_newest_keeps_the_latest_commit_not_the_highest_version(store: Store) -> None:
    """Item 19: the local file is at version 5 (committed first); the far copy is at version 3,
    committed later on another node. `newest` keeps the later commit and never lists the kept
    copy among the losers. Failed on 4563120 (kept version 5; the kept copy was listed)."""
    from fsdurable._sync import resolve

    s = store.create("r")
    for _ in range(4):
        s = store.save(s)
    assert s.version == 5
    far = attrs.evolve(s, version=3, updated_at=s.updated_at + 60,
                       metadata={"from": "far, later"})
    copy = os.path.join(store.layout.sessions, "r.sync-conflict-20261130-101010-ABCDEFG.json")
    Path(copy).write_bytes(encode_session(far))
    res = resolve(store, "r", keep="newest")
    assert res.kept == copy and res.kept_version == 3
    assert store.load("r").metadata == {"from": "far, later"} and res.version == 6
    assert len(res.quarantined) == 1  # the old local content, copied aside
    assert all("sync-conflict" not in os.path.basename(q) for q in res.quarantined)


# ------------------------------------------------------------- quarantine: list, restore, purge


def _cli(root: Path, *args: str) -> tuple[int, Any]:
    p = subprocess.run([PYTHON, "-m", "fsdurable", "--root", str(root), *args, "--json"],
                       env=subprocess_env(), capture_output=True, text=True, timeout=60,
                       check=False)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else None


def test_quarantine_list_restore_and_purge(root: Path) -> None:
    st = Store(root)
    s = st.create("q", metadata={"keep": "me"})
    good = Path(st.layout.session("q")).read_bytes()
    Path(st.layout.session("q")).write_bytes(good[:-5])  # torn
    Path(st.layout.marker("z")).write_bytes(b"\x00junk")
    doctor(st, repair=True)
    code, out = _cli(root, "quarantine")
    assert code == 0
    items = {q["kind"]: q for q in out["quarantined"]}
    assert set(items) == {"session", "marker"}
    sq = items["session"]
    assert sq["session_id"] == "q" and sq["reason"] == "invalid_json" and sq["restorable"]
    assert sq["at"] is not None and items["marker"]["restorable"] is False
    # a restore of a file still broken fails, nothing moves
    code, err = _cli(root, "quarantine", "restore", sq["name"])
    assert code == 1 and err["reason"] == "invalid_json"
    # a human fixes it, then restores it: through the commit function, version moves on
    Path(sq["path"]).write_bytes(good)
    code, out = _cli(root, "quarantine", "restore", sq["name"])
    assert code == 0 and out["version"] == s.version + 1
    back = Store(root).load("q")
    assert back.metadata == {"keep": "me"} and back.version == s.version + 1
    assert [e.code for e in Store(root).events("q")][-1] == "quarantine_restored"
    # restoring over an existing session is refused
    Path(sq["path"]).write_bytes(good)
    code, err = _cli(root, "quarantine", "restore", sq["name"])
    assert code == 1 and err["reason"] == "exists"
    # nothing is deleted without --purge; --purge NAME deletes that one, with an event
    assert len(os.listdir(st.layout.quarantine)) == 2
    code, out = _cli(root, "quarantine", "--purge", items["marker"]["name"])
    assert code == 0 and len(out["purged"]) == 1
    assert len(os.listdir(st.layout.quarantine)) == 1
    assert "quarantine_purged" in [e.code for e in Store(root).events("z")]
    code, out = _cli(root, "quarantine", "--purge")
    assert code == 0 and os.listdir(st.layout.quarantine) == []


def test_doctor_table_shows_each_findings_path(root: Path) -> None:
    st = Store(root)
    Path(st.layout.session("bad")).write_bytes(b"nope")
    p = subprocess.run([PYTHON, "-m", "fsdurable", "--root", str(root), "doctor"],
                       env=subprocess_env(), capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 1 and st.layout.session("bad") in p.stdout


# ------------------------------------------------------------- item 13: doctor and the event log


def test_doctor_reports_events_that_would_vanish(root: Path, tmp_path: Path) -> None:
    """Item 13 (doctor's part): a day file over the cap, events/<node> as a symlink. Failed on
    4563120 (doctor said healthy). A day file over the cap is now read whole (streamed), its bad
    lines reported; a symlinked node directory is a problem that --repair moves aside."""
    st = Store(root, config=Config(max_file_bytes=4096))
    st.create("s")
    st.begin_turn("s", "an event")
    [day] = list(Path(st.layout.events).glob("*/*/*.jsonl"))
    with open(day, "ab") as f:
        f.write(b'{"x": 1}\n' * 1000)
    assert [e.code for e in st.events("s")][:1] == ["turn_started"]  # over the cap, still read
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, Path(st.layout.events) / "node-linked")
    findings = doctor(st)
    assert "events_symlink" in [f.code for f in problems(findings)]
    assert "events_damaged" in [f.code for f in findings]
    doctor(st, repair=True)
    assert not os.path.lexists(Path(st.layout.events) / "node-linked") and elsewhere.is_dir()


# ------------------------------------------------------------- a case-insensitive filesystem

from . import exfat  # noqa: E402

exfat_mount = exfat.exfat_mount  # the fixtures (a real exFAT mount; skipped where impossible)
exfat_dir = exfat.exfat_dir


def test_the_gate_never_takes_a_case_alias_for_a_bad_file(exfat_dir: Path) -> None:
    """On exFAT ``markers/chat.json`` opens ``Chat``'s marker and ``sessions/chat.json`` its
    session: files about another id. The gate reports nothing to do, moves nothing."""
    st = Store(exfat_dir / "store", create=True)
    st.create("Chat")
    st.begin_turn("Chat", "hi")
    before = tree(exfat_dir / "store")
    from fsdurable import _repair

    assert _repair.repair_session(st, "chat").action == "nothing"
    assert _repair.repair_marker(st, "chat").action == "nothing"
    assert problems(doctor(st, repair=True)) == []
    assert tree(exfat_dir / "store") == before
    # no hard links there: a bad marker is kept aside by a copy, then replaced by the commit
    Path(st.layout.marker("Chat")).write_bytes(b"\x00torn")
    assert _repair.repair_marker(st, "Chat").action == "rebuilt_marker"
    [kept] = os.listdir(st.layout.quarantine)
    assert (Path(st.layout.quarantine) / kept).read_bytes() == b"\x00torn"
    assert [m.session_id for m in st.interrupted()] == ["Chat"]


def test_a_quarantined_file_of_a_hyphenated_kind_lists_as_it_was_moved(store: Store) -> None:
    """``<stamp>-<random>-<kind>.<reason>-<original>``: a kind with a hyphen (a sync tool's
    conflict copy, ``conflict-session``; an item log, ``item-log``) was cut at its first
    hyphen, so a conflict copy listed as kind ``conflict`` with no reason and could not be
    restored although ``conflict-session`` is a restorable kind."""
    from fsdurable import _repair
    from fsdurable._quarantine import listing

    s = store.create("q")
    copy = store.layout.session("q").replace(".json", ".sync-conflict-20261206-x.json")
    log = f"{store.layout.root}/items-000000.log"
    for kind, reason, path in (("conflict-session", "sync_conflict", copy),
                               ("item-log", "unnamed_log", log)):
        with open(path, "wb") as f:
            f.write(encode_session(s) if kind != "item-log" else b"x")
        assert _repair.quarantine(store, path, kind=kind, reason=reason,
                                  expect=_fsio.lstat(path)) is not None
    got = {q.kind: q for q in listing(store)}
    assert set(got) == {"conflict-session", "item-log"}
    assert got["conflict-session"].reason == "sync_conflict"
    assert got["conflict-session"].restorable and got["conflict-session"].session_id == "q"
    assert got["item-log"].reason == "unnamed_log" and not got["item-log"].restorable
