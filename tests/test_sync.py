"""Sync between machines: conflict-copy names, resolve (nothing lost), foreign turns and take-over,
and that nothing machine-local is ever written inside the store."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdurable import InvalidState, SessionNotFound, Store, TurnStateError, UnreadableState
from fsdurable import _events as ev
from fsdurable._codec import encode_marker, encode_session
from fsdurable._commit import plan_history
from fsdurable._model import Marker, Message, Session, Turn
from fsdurable._names import NameKind, classify
from fsdurable._sync import (
    conflict_copies,
    foreign_turns,
    resolve,
    take_over,
    tool_of,
    versions,
)

from .conftest import PYTHON, subprocess_env
from .test_store import biconditional_violations as _bicond


def biconditional_violations(store: Store) -> list[str]:
    """test_store's check, but conflict copies in markers/ are not markers."""
    return [v for v in _bicond(store) if classify(v.split(":")[0] + ".json")[0] is NameKind.OWN]

IDS = st.from_regex(r"[A-Za-z0-9_-]{1,40}", fullmatch=True).filter(
    lambda s: s.upper() not in {"CON", "PRN", "AUX", "NUL"} and not re.fullmatch(
        r"(?i)(com|lpt)\d", s))

# The names each tool really writes (Unison's was observed by running unison 2.52 here; the
# test_sync_tools module checks Syncthing's and Unison's against the real tools).
COPY_NAMES = [
    ("{id}.sync-conflict-20261129-101010-ABCDEFG.json", "syncthing"),
    ("{id}.sync-conflict-20261129-101010-ABCDEFG.sync-conflict-20261130-080000-HIJKLMN.json",
     "syncthing"),
    ("{id} (laptop's conflicted copy 2026-11-29).json", "dropbox/nextcloud"),
    ("{id} (Ann's conflicted copy 2026-11-29 (1)).json", "dropbox/nextcloud"),
    ("{id} (conflicted copy 2026-11-29 101010).json", "dropbox/nextcloud"),
    ("{id} (conflicted copy ann_b 2026-11-29 101010).json", "dropbox/nextcloud"),  # with a user
    ("{id} (conflict_on_2026-11-29).json", "unison"),
]


@given(sid=IDS, pattern=st.sampled_from(COPY_NAMES))
def test_every_tools_conflict_copy_is_classified_with_its_session(
        sid: str, pattern: tuple[str, str]) -> None:
    name = pattern[0].format(id=sid)
    assert classify(name) == (NameKind.CONFLICT, sid)
    assert tool_of(name) == pattern[1]


@given(sid=IDS)
def test_own_temp_and_foreign_names(sid: str) -> None:
    assert classify(f"{sid}.json") == (NameKind.OWN, sid)
    for temp in (f"~{sid}.json.k3j4_x.tmp", f".syncthing.{sid}.json.tmp",
                 f"~syncthing~{sid}.json.tmp", f".{sid}.json.Ab12Cd",  # rsync
                 f".{sid}.json.~1f3e", f".unison.{sid}.json.4a5b.unison.tmp"):
        assert classify(temp) == (NameKind.TEMP, None), temp
    # a copy of anything but a .json file is not a copy of a session
    assert classify(f"{sid} (conflicted copy 2026-11-29).txt")[0] is NameKind.FOREIGN
    assert classify(f"{sid}.sync-conflict-20261129-101010-ABCDEFG.txt")[0] is NameKind.FOREIGN


# ---------------------------------------------------------------------- helpers


def far_document(store: Store, s: Session) -> bytes:
    """Another node's document of ``s``; its new messages arrive too, as that node's segment."""
    chain, segment = plan_history(store._ctx, s.id, s)
    if segment is not None:
        with open(os.path.join(store.layout.history_dir(s.id), segment[0]), "wb") as f:
            f.write(segment[1])
    return encode_session(s, chain.ref if chain is not None else None)


def write_copy(store: Store, s: Session, name: str, kind: str = "session") -> str:
    """What a sync tool does: put another machine's version beside ours under a copy name."""
    d = store.layout.sessions if kind == "session" else store.layout.markers
    path = os.path.join(d, name.format(id=s.id))
    data = far_document(store, s) if kind == "session" else encode_marker(Marker.of(s, "node-far"))
    with open(path, "wb") as f:
        f.write(data)
    return path


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def all_digests(store: Store) -> set[str]:
    """Every file's bytes, except the store's own markers: an index the commit function writes
    and removes itself (the session it indexes is what must never be lost)."""
    out = set()
    for d in (store.layout.sessions, store.layout.markers, store.layout.quarantine):
        for n in os.listdir(d):
            if d == store.layout.markers and classify(n)[0] is NameKind.OWN:
                continue
            out.add(digest(os.path.join(d, n)))
    return out


def two_sided(store: Store) -> tuple[Session, Session]:
    """Local: v3 idle with a reply; the far side: v4 in progress with another message, committed
    after the local one (the newest)."""
    s = store.create("s1")
    s = store.begin_turn("s1", "hello")
    local = store.end_turn(s, "local reply")
    far = attrs.evolve(s, version=4, messages=(*s.messages, Message("user", "from far")),
                       updated_at=local.updated_at + 1)
    return local, far


# ---------------------------------------------------------------------- listing and versions


def test_copies_are_listed_with_versions_never_as_sessions(store: Store) -> None:
    _local, far = two_sided(store)
    p = write_copy(store, far, COPY_NAMES[0][0])
    mp = write_copy(store, far, COPY_NAMES[2][0], kind="marker")
    assert store.sessions() == ["s1"]
    assert store.interrupted() == []  # the marker copy is not a marker
    vs = versions(store, "s1")
    assert [(v.local, v.version, v.in_progress) for v in vs] == [(True, 3, False),
                                                                  (False, 4, True)]
    assert vs[1].path == p and vs[1].tool == "syncthing"
    assert "version 4, in progress" in vs[1].describe()
    found = conflict_copies(store)
    assert sorted(v.path for v in found["s1"]) == sorted([p, mp])
    assert biconditional_violations(store) == []


# ---------------------------------------------------------------------- resolve


def test_resolve_newest_keeps_the_newest_commit_and_loses_nothing(store: Store) -> None:
    local, far = two_sided(store)
    before = all_digests(store)
    copy = write_copy(store, far, COPY_NAMES[3][0])
    before |= {digest(copy)}
    r = resolve(store, "s1")
    assert r.changed and r.keep == "newest" and r.kept == copy and r.kept_version == 4
    s = store.load("s1")
    # committed over the local version, and newer than every version seen (local and copies)
    assert s.version == max(local.version, far.version) + 1 == r.version
    assert s.messages == far.messages and s.in_progress
    # the kept turn is in progress: its marker was written (this node's) before the session
    m = store.read_marker("s1")
    assert m is not None and m.turn_id == far.turn.id and m.node_id == store.node_id
    assert biconditional_violations(store) == []
    # nothing lost: the old local bytes and the copy's bytes are both in quarantine
    assert before <= all_digests(store)
    assert not [n for n in os.listdir(store.layout.sessions) if n != "s1.json"]
    # the losers (the old local content); the kept copy is never listed among them
    assert len(r.quarantined) == 1 and r.kept_moved_to is not None
    assert not any(copy.endswith(os.path.basename(q).split("-", 3)[-1].split("-", 1)[-1])
                   for q in r.quarantined)
    e = [x for x in store.events("s1") if x.code == ev.CONFLICT_RESOLVED][-1]
    assert e.reason == "newest" and e.detail["kept"] == copy
    assert sorted(e.detail["quarantined"]) == sorted(r.quarantined)


def test_resolve_local_keeps_the_local_file_untouched(store: Store) -> None:
    local, far = two_sided(store)
    copy = write_copy(store, far, COPY_NAMES[0][0])
    mcopy = write_copy(store, far, COPY_NAMES[0][0], kind="marker")
    want = digest(store.layout.session("s1"))
    before = all_digests(store)
    r = resolve(store, "s1", keep="local")
    assert r.kept == store.layout.session("s1") and r.version == local.version
    assert digest(store.layout.session("s1")) == want
    assert not os.path.exists(copy) and not os.path.exists(mcopy)
    assert before <= all_digests(store)
    assert store.read_marker("s1") is None  # the far marker copy did not become a marker
    assert biconditional_violations(store) == []


def test_resolve_path_keeps_the_named_version_even_an_older_one(store: Store,
                                                                 tmp_path: Path) -> None:
    local, far = two_sided(store)
    older = attrs.evolve(local, version=2, messages=local.messages[:1])
    copy = write_copy(store, older, COPY_NAMES[5][0])
    newer = write_copy(store, far, COPY_NAMES[0][0])
    r = resolve(store, "s1", keep=copy)
    assert r.kept == copy and store.load("s1").messages == older.messages
    assert not os.path.exists(newer) and not os.path.exists(copy)
    assert biconditional_violations(store) == []
    # a file outside the store can be kept; it is read, never moved
    outside = tmp_path / "restored.json"
    outside.write_bytes(far_document(store, far))
    r = resolve(store, "s1", keep=str(outside))
    assert outside.exists() and store.load("s1").messages == far.messages


def test_resolve_refuses_a_marker_path_and_a_missing_local(store: Store) -> None:
    _local, far = two_sided(store)
    mcopy = write_copy(store, far, COPY_NAMES[0][0], kind="marker")
    with pytest.raises(InvalidState):
        resolve(store, "s1", keep=mcopy)
    os.unlink(store.layout.session("s1"))
    write_copy(store, far, COPY_NAMES[0][0])
    with pytest.raises(SessionNotFound):
        resolve(store, "s1", keep="local")
    r = resolve(store, "s1")  # newest: the copy becomes the session, above its own version
    assert r.version == far.version + 1 and store.load("s1").messages == far.messages


def test_an_unreadable_copy_is_a_loser_never_deleted(store: Store) -> None:
    two_sided(store)
    bad = os.path.join(store.layout.sessions, "s1 (conflicted copy 2026-11-29 101010).json")
    with open(bad, "wb") as f:
        f.write(b'{"format": "fsdurable.session/2", "id": "s1", "ver')  # torn by a tool
    v = next(x for x in versions(store, "s1") if not x.local)
    assert v.error is not None and "unreadable" in v.describe()
    with pytest.raises(UnreadableState):  # it cannot be kept
        resolve(store, "s1", keep=bad)
    r = resolve(store, "s1")
    assert len(r.quarantined) == 1
    with open(r.quarantined[0], "rb") as f:
        assert f.read().endswith(b'"ver')


def test_nothing_to_resolve_changes_nothing(store: Store) -> None:
    store.create("s1")
    r = resolve(store, "s1")
    assert not r.changed and r.quarantined == ()
    assert not [e for e in store.events("s1") if e.code == ev.CONFLICT_RESOLVED]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sides=st.lists(st.tuples(st.integers(1, 9), st.booleans()), min_size=1, max_size=4),
       local_in_progress=st.booleans())
def test_resolve_property_newest_wins_nothing_lost(tmp_path_factory: pytest.TempPathFactory,
                                                   sides: list[tuple[int, bool]],
                                                   local_in_progress: bool) -> None:
    store = Store(tmp_path_factory.mktemp("p") / "store")
    s = store.create("p")
    if local_in_progress:
        s = store.begin_turn("p", "x")
    for i, (v, busy) in enumerate(sides):
        turn = Turn(id=f"far{i}", started_at=1.0, checkpoint_at=2.0) if busy else None
        c = attrs.evolve(s, version=v, metadata={"side": i}, in_progress=busy, turn=turn,
                         updated_at=s.updated_at + i + 1)
        write_copy(store, c, f"{{id}}.sync-conflict-2026112{i}-101010-ABCDEFG.json")
    before = all_digests(store)
    local = store.load("p")
    cands = [(local.version, local.updated_at, True, local.messages, local.metadata)]
    for vv in versions(store, "p")[1:]:
        assert vv.session is not None
        cands.append((vv.version, vv.updated_at, False, vv.session.messages,
                      vv.session.metadata))
    best = max(cands, key=lambda c: (c[1], c[0], c[2]))  # the latest commit, then the version
    resolve(store, "p")
    now = store.load("p")
    assert (now.messages, now.metadata) == (best[3], best[4])
    assert before <= all_digests(store)  # every version's bytes are still somewhere
    assert [n for n in os.listdir(store.layout.sessions)] == ["p.json"]
    assert biconditional_violations(store) == []


# ---------------------------------------------------------------------- foreign turns


def test_foreign_turn_is_listed_and_taken_over_with_an_event(root: Path) -> None:
    a = Store(root, node_id="laptop")
    a.create("t")
    s = a.begin_turn("t", "do it")
    b = Store(root, node_id="edge")
    assert [m.session_id for m in foreign_turns(b)] == ["t"] and foreign_turns(a) == []
    with pytest.raises(TurnStateError) as e:
        take_over(a, "t")
    assert e.value.reason == "not_foreign"
    m = take_over(b, "t")
    assert m.node_id == "edge" and m.turn_id == s.turn.id
    # the take-over never freshens the turn: same checkpoint, same attempt count
    assert m.checkpoint_at == s.turn.checkpoint_at and m.resume_attempts == 0
    assert foreign_turns(b) == [] and [x.session_id for x in foreign_turns(a)] == ["t"]
    e2 = [x for x in b.events("t") if x.code == ev.ADOPTED][-1]
    assert e2.detail == {"from_node": "laptop", "to_node": "edge"} and e2.node_id == "edge"
    with pytest.raises(TurnStateError):
        take_over(b, "missing-turn")


def test_take_over_refuses_a_turn_that_moved_on(root: Path) -> None:
    a = Store(root, node_id="laptop")
    a.create("t")
    s = a.begin_turn("t", "do it")
    # the session finished on the far side but the marker removal has not arrived yet
    data = encode_marker(Marker.of(s, "laptop"))
    a.end_turn(s, "done")
    with open(a.layout.marker("t"), "wb") as f:
        f.write(data)
    with pytest.raises(TurnStateError) as e:
        take_over(Store(root, node_id="edge"), "t")
    assert e.value.reason == "superseded"


# ---------------------------------------------------------------------- machine-local state

ALLOWED = re.compile(r"fsdurable\.json|sessions/[A-Za-z0-9_-]+\.json|markers/[A-Za-z0-9_-]+\.json"
                     r"|events/[A-Za-z0-9_-]+/(?:[A-Za-z0-9_-]+|@store)/\d{4}-\d\d-\d\d\.jsonl"
                     r"|history/[A-Za-z0-9_-]+/\d{12}-[0-9a-f]{16}\.json|quarantine/.+")


def test_nothing_machine_local_is_written_inside_the_store(root: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    monkeypatch.delenv("FSDURABLE_NODE")  # the node id file is created, where?
    state = tmp_path / "state"
    monkeypatch.setenv("FSDURABLE_STATE_DIR", str(state))
    store = Store(root)
    _local, far = two_sided(store)
    write_copy(store, far, COPY_NAMES[0][0])
    resolve(store, "s1")
    b = Store(root, node_id="other")
    take_over(b, "s1")
    with store.lock("some-route"):
        pass
    inside = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert all(ALLOWED.fullmatch(p) for p in inside), inside
    assert (state / "node_id").exists()  # the node's identity lives in the state dir
    assert not (state / "node_id").resolve().is_relative_to(root.resolve())
    locks = [p for p in state.rglob("*") if "lock" in p.name or "lock" in str(p.parent)]
    assert locks  # the locks were taken there, not in the store


# ---------------------------------------------------------------------- adopt (take over + resume)


def _far_turn(root: Path) -> Session:
    """A desktop turn interrupted on the laptop: the human who was there is not here."""
    a = Store(root, node_id="laptop")
    a.create("t", source="desktop")
    return a.begin_turn("t", "tidy up")


def _edge_loop(store: Store, seen: list[bool]) -> object:
    from fsdurable._loop import AgentLoop
    from fsdurable._tools import Reply, ScriptedModel, call, tool

    @tool(effect="none")
    def probe(ctx: object) -> str:
        seen.append(ctx.attended)  # type: ignore[attr-defined]
        return "ok"

    @tool(name="rm", effect="external")
    def rm(ctx: object) -> str:
        raise AssertionError("a deny-listed tool ran in an unattended turn")

    model = ScriptedModel([Reply("", (call("probe", "c1"), call("rm", "c2")))], final="tidied")
    return AgentLoop(store, model, [probe, rm])


def test_adopt_resumes_a_foreign_turn_unattended(root: Path) -> None:
    from fsdurable._sync import adopt

    turn = _far_turn(root)
    b = Store(root, node_id="edge")
    seen: list[bool] = []
    out = adopt(b, "t", _edge_loop(b, seen))
    assert out.outcome == "resumed"
    s = b.load("t")
    assert not s.in_progress and s.messages[-1].content == "tidied"
    assert seen == [False]  # attendance decided at execution time, never from source="desktop"
    codes = [e.code for e in b.events("t")]
    assert codes.index(ev.ADOPTED) < codes.index(ev.RESUMING) < codes.index(ev.RESUMED)
    assert ev.TOOL_REFUSED in codes  # the unattended deny-list applied
    resuming = next(e for e in b.events("t") if e.code == ev.RESUMING)
    assert resuming.turn_id == turn.turn.id and resuming.detail["adopted"] is True
    assert b.interrupted() == [] and biconditional_violations(b) == []


def test_adopt_without_a_loop_leaves_the_turn_to_this_nodes_recovery(root: Path) -> None:
    from fsdurable._recovery import recover
    from fsdurable._sync import adopt

    _far_turn(root)
    b = Store(root, node_id="edge")
    out = adopt(b, "t")
    assert out.outcome == "left"
    m = b.read_marker("t")
    assert m is not None and m.node_id == "edge" and m.resume_attempts == 0
    # the laptop, were it to start now, would only list it
    laptop = Store(root, node_id="laptop")
    assert [o.verdict for o in recover(laptop, _edge_loop(laptop, []),
                                       dry_run=True).outcomes] == ["foreign"]
    seen: list[bool] = []
    report = recover(b, _edge_loop(b, seen))  # the edge host's next start: it is ours now
    assert [o.outcome for o in report.outcomes] == ["resumed"] and seen == [False]


def test_adopting_an_expired_turn_abandons_it(root: Path) -> None:
    import time

    from fsdurable._sync import adopt

    _far_turn(root)
    later = Store(root, node_id="edge", clock=lambda: time.time() + 5 * 3600)
    out = adopt(later, "t", _edge_loop(later, []))
    assert (out.outcome, out.reason) == ("abandoned", "stale")
    assert later.interrupted() == [] and not later.load("t").in_progress


def test_a_state_dir_inside_the_store_is_refused(root: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSDURABLE_STATE_DIR", str(root / "local"))
    store = Store(root)
    with pytest.raises(InvalidState) as e:
        store.create("a")  # the first commit takes a lock: it would live inside ROOT
    assert e.value.reason == "state_dir_in_store"
    assert not (root / "local").exists() and store.sessions() == []


# ---------------------------------------------------------------------- CLI


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    from fsdurable.cli import main

    capsys.readouterr()
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def test_cli_conflicts_doctor_resolve(store: Store, root: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    _local, far = two_sided(store)
    copy = write_copy(store, far, COPY_NAMES[0][0])
    r = str(root)
    code, out = _cli(capsys, "conflicts", "--root", r)
    [c] = out["conflicts"]
    assert code == 1 and c["session_id"] == "s1" and [v["version"] for v in c["versions"]] == [3, 4]
    code, out = _cli(capsys, "doctor", "--root", r)
    detail = next(f["detail"] for f in out["findings"] if f["code"] == "conflict_copy")
    assert "version 4, in progress" in detail and "version 3, idle" in detail
    assert "keeps the copy, version 4" in detail
    code, out = _cli(capsys, "resolve", "s1", "--root", r, "--keep", "local")
    assert code == 0 and out["kept"] == store.layout.session("s1") and out["changed"]
    assert not os.path.exists(copy) and len(out["quarantined"]) == 1
    code, out = _cli(capsys, "resolve", "s1", "--root", r)
    assert code == 0 and out["changed"] is False
    code, out = _cli(capsys, "conflicts", "--root", r)
    assert code == 0 and out == {"conflicts": []}
    code, out = _cli(capsys, "resolve", "s1", "--root", r, "--keep", str(root / "nope.json"))
    assert code == 1 and out["error"] == "SessionNotFound"


def test_cli_adopt_and_ignore_file(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _far_turn(root)  # on node "laptop"; this process is node "node-test"
    code, out = _cli(capsys, "adopt", "t", "--root", str(root))
    assert code == 0 and (out["from_node"], out["to_node"], out["outcome"]) == (
        "laptop", "node-test", "left")
    code, out = _cli(capsys, "adopt", "t", "--root", str(root))
    assert code == 1 and out["reason"] == "not_foreign"
    code, out = _cli(capsys, "node", "--root", str(root))
    assert code == 0 and out["node_id"] == "node-test" and out["from_env"]
    assert not Path(out["state_dir"]).resolve().is_relative_to(root.resolve())
    code, out = _cli(capsys, "ignore-file", "stignore")
    assert code == 0 and "(?d)~*.tmp" in out["content"].splitlines()
    assert os.path.isfile(out["path"])


def test_cli_watch_streams_json_lines(root: Path) -> None:
    st = Store(root)
    with subprocess.Popen([PYTHON, "-m", "fsdurable", "watch", "--root", str(root), "--json",
                           "--count", "2", "--timeout", "60"], env=subprocess_env(),
                          stdout=subprocess.PIPE, text=True) as p:
        deadline = time.monotonic() + 60
        n = 0
        while p.poll() is None and time.monotonic() < deadline:
            st.create(f"w{n}")  # until the watcher has seen two
            n += 1
            time.sleep(0.3)
        out, _ = p.communicate(timeout=30)
    assert p.returncode == 0
    changes = [json.loads(x) for x in out.splitlines()]
    assert len(changes) == 2
    assert all(c["kind"] == "session" and c["action"] == "added" for c in changes)


def test_resolve_waits_for_a_turn_holding_the_route(root: Path) -> None:
    import threading

    from fsdurable import Config, LockTimeout

    store = Store(root, config=Config(route_lock_timeout=0.3))
    _local, far = two_sided(store)
    copy = write_copy(store, far, COPY_NAMES[0][0])
    before = digest(store.layout.session("s1"))
    held, release = threading.Event(), threading.Event()

    def live_turn() -> None:  # another process's live turn, in a thread here
        with Store(root).lock("session:s1"):
            held.set()
            release.wait(30)

    t = threading.Thread(target=live_turn)
    t.start()
    try:
        assert held.wait(30)
        with pytest.raises(LockTimeout):
            resolve(store, "s1")
        assert digest(store.layout.session("s1")) == before and os.path.exists(copy)
    finally:
        release.set()
        t.join(30)
    assert resolve(store, "s1").kept == copy


@pytest.mark.parametrize("xdg", [None, "", "  ", "/srv/state"])
def test_the_state_base_is_platformdirs_without_importing_it(
        monkeypatch: pytest.MonkeyPatch, xdg: str | None) -> None:
    """On Linux the machine-local state base is computed without platformdirs (its import was
    5-10 ms of every CLI command that needs the node id); it must be exactly platformdirs'
    answer, or a user's node id and locks would move on upgrade."""
    import platformdirs

    from fsdurable import _layout

    state, data = ("XDG_STATE_HOME", "~/.local/state"), ("XDG_DATA_HOME", "~/.local/share")
    if not sys.platform.startswith("linux"):
        assert _layout._xdg(*state) is None and _layout._xdg(*data) is None
        return
    monkeypatch.delenv("FSDURABLE_STATE_DIR")
    for var in ("XDG_STATE_HOME", "XDG_DATA_HOME"):
        if xdg is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, xdg)
    assert _layout._xdg(*state) == platformdirs.user_state_dir("fsdurable", appauthor=False)
    assert _layout._xdg(*data) == platformdirs.user_data_dir("fsdurable", appauthor=False)
    assert _layout._state_base() == _layout._platform_state()
    assert _layout.default_root() == os.path.join(
        platformdirs.user_data_dir("fsdurable", appauthor=False), "store")
    monkeypatch.setenv("ANDROID_DATA", "/data")
    monkeypatch.setenv("ANDROID_ROOT", "/system")
    assert _layout._xdg(*state) is None  # platformdirs decides there
