"""Bad files in a store: reported by every read (never moved by one), quarantined with an event
by the repair gate, never a crash, nothing else touched."""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs
import pytest

import fsdurable
from fsdurable import Config, Store, UnreadableState, _repair, recover
from fsdurable._doctor import doctor

GOOD_MARKER = {
    "format": "fsdurable.marker/1", "session_id": "m", "turn_id": "t", "session_version": 2,
    "node_id": "node-test", "route_key": "session:m", "source": "api", "started_at": 1.0,
    "checkpoint_at": 1.0, "resume_attempts": 0,
}


def _session_bytes(store: Store) -> bytes:
    store.create("good")
    with open(store.layout.session("good"), "rb") as f:
        return f.read()


BAD_SESSIONS = {
    "garbage": lambda good: b"\x00\x01garbage",
    "truncated": lambda good: good[: len(good) // 2],
    "empty": lambda good: b"",
    "wrong_type": lambda good: good.replace(b'"version":1', b'"version":"1"'),
    "bool_for_int": lambda good: good.replace(b'"version":1', b'"version":true'),
    "unknown_format": lambda good: good.replace(b"fsdurable.session/7", b"fsdurable.session/9"),
    "wrong_kind": lambda good: good.replace(b"fsdurable.session/7", b"fsdurable.marker/1"),
    "no_format": lambda good: good.replace(b'"format":"fsdurable.session/7",', b""),
    "array": lambda good: b"[1, 2, 3]",
    "bom": lambda good: b"\xef\xbb\xbf" + good,
    "invalid_utf8": lambda good: good.replace(b'"api"', b'"\xff\xfe"'),
    "turn_without_in_progress": lambda good: good.replace(b'"in_progress":false',
                                                          b'"in_progress":true'),
}


@pytest.mark.parametrize("case", sorted(BAD_SESSIONS))
def test_bad_session_is_quarantined(store: Store, case: str) -> None:
    good = _session_bytes(store)
    bad = BAD_SESSIONS[case](good)
    assert bad != good
    path = store.layout.session("bad")
    with open(path, "wb") as f:
        f.write(bad)
    assert store.sessions() == ["bad", "good"]  # a listing never opens files
    with pytest.raises(UnreadableState) as e:
        store.load("bad")
    assert e.value.session_id == "bad" and e.value.reason
    assert store.sessions() == ["bad", "good"]  # a read never moves it
    act = _repair.repair_session(store, "bad")
    if case == "unknown_format":  # a newer fsdurable's file: left, reported
        assert act.action == "needs_newer" and store.sessions() == ["bad", "good"]
        return
    assert act.action == "quarantined"
    assert store.sessions() == ["good"]
    [q] = os.listdir(store.layout.quarantine)
    with open(os.path.join(store.layout.quarantine, q), "rb") as f:
        assert f.read() == bad  # kept byte for byte
    [event] = [x for x in store.events("bad") if x.code == "session_quarantined"]
    assert event.detail["moved_to"].endswith(q)
    assert store.load("good").version == 1  # nothing else touched


def test_oversized_session_is_not_read(root: Path) -> None:
    store = Store(root, config=Config(max_file_bytes=4096))
    store.create("big", metadata={"blob": "x" * 1000})
    with open(store.layout.session("huge"), "wb") as f:
        f.write(b'{"format": "fsdurable.session/2", "pad": "' + b"x" * 10000 + b'"}')
    with pytest.raises(UnreadableState) as e:
        store.load("huge")
    assert e.value.reason == "oversized"
    with pytest.raises(fsdurable.InvalidState):
        store.save(attrs.evolve(store.load("big"), metadata={"blob": {1, 2}}))  # not JSON
    assert store.load("big").version == 1


BAD_MARKERS = {
    "garbage": b"garbage",
    "truncated": json.dumps(GOOD_MARKER).encode()[:40],
    "wrong_type": json.dumps({**GOOD_MARKER, "resume_attempts": "0"}).encode(),
    "bool_for_int": json.dumps({**GOOD_MARKER, "resume_attempts": True}).encode(),
    "unknown_version": json.dumps({**GOOD_MARKER, "format": "fsdurable.marker/7"}).encode(),
    "missing_field": json.dumps({k: v for k, v in GOOD_MARKER.items()
                                 if k != "turn_id"}).encode(),
    "names_another_session": json.dumps({**GOOD_MARKER, "session_id": "other"}).encode(),
    "duplicate_keys": b'{"format": "fsdurable.marker/1", "format": "fsdurable.marker/1"}',
    "nan": json.dumps(GOOD_MARKER).replace('"checkpoint_at": 1.0',
                                           '"checkpoint_at": NaN').encode(),
    "huge_number": json.dumps(GOOD_MARKER).replace('"checkpoint_at": 1.0',
                                                   '"checkpoint_at": 1e400').encode(),
    "negative": json.dumps({**GOOD_MARKER, "resume_attempts": -1}).encode(),
}


@pytest.mark.parametrize("case", sorted(BAD_MARKERS))
def test_bad_marker_is_quarantined_and_discovery_goes_on(store: Store, case: str) -> None:
    store.create("ok")
    store.begin_turn("ok", "go")
    with open(store.layout.marker("m"), "wb") as f:
        f.write(BAD_MARKERS[case])
    found = store.interrupted()  # never raises, never moves anything
    assert [m.session_id for m in found] == ["ok"]
    assert sorted(os.listdir(store.layout.markers)) == ["m.json", "ok.json"]
    [o] = [o for o in recover(store, _NoLoop(), resume=False).outcomes if o.session_id == "m"]
    if case == "unknown_version":  # a newer fsdurable's marker: left in place, reported
        assert o.outcome == "needs_newer"
        assert sorted(os.listdir(store.layout.markers)) == ["m.json", "ok.json"]
        return
    assert o.outcome == "quarantined"  # no session says whose it is: kept aside, not deleted
    assert os.listdir(store.layout.markers) == ["ok.json"]
    [ev] = [e for e in store.events("m") if e.code == "file_quarantined"]
    assert ev.detail["cause"] and ev.detail["moved_to"]


class _NoLoop:
    def tool_effect(self, name: str) -> str | None:
        return None

    def resume_claimed(self, session: object) -> object:
        raise AssertionError("resume=False never resumes")


def test_good_marker_parses(store: Store) -> None:
    with open(store.layout.marker("m"), "w") as f:
        json.dump({**GOOD_MARKER, "future_field": [1, 2]}, f)  # unknown keys are ignored
    [m] = store.interrupted()
    assert m.session_id == "m" and m.turn_id == "t"


def test_symlinked_marker_is_not_followed(store: Store, tmp_path: Path) -> None:
    outside = tmp_path / "m.json"
    outside.write_text(json.dumps(GOOD_MARKER))
    os.symlink(outside, store.layout.marker("m"))
    assert store.interrupted() == []
    assert outside.read_text() == json.dumps(GOOD_MARKER)  # the target is untouched
    assert os.path.islink(store.layout.marker("m"))  # a read never moves it
    doctor(store, repair=True)
    assert not os.path.lexists(store.layout.marker("m"))
    assert outside.read_text() == json.dumps(GOOD_MARKER)


def test_a_directory_where_a_file_should_be(store: Store) -> None:
    os.mkdir(store.layout.marker("dir"))
    os.mkdir(store.layout.session("dir2"))
    assert store.interrupted() == []
    with pytest.raises(UnreadableState):
        store.load("dir2")


def test_an_unreadable_manifest_is_left_by_open_and_replaced_by_the_repair_gate(
        root: Path) -> None:
    """Opening a store never repairs (on 02a7dbc it moved fsdurable.json into quarantine/ from
    Store.__init__, outside the repair gate); doctor reports it, and doctor --repair (or
    recover) keeps the old bytes in quarantine/ before a new manifest is renamed over it."""
    Store(root)
    with open(root / "fsdurable.json", "w") as f:
        f.write("{not json")
    store = Store(root)
    assert store.manifest_problem == "invalid_json" and store.manifest.store_id == ""
    assert (root / "fsdurable.json").read_text() == "{not json"
    assert os.listdir(store.layout.quarantine) == []
    [f] = [f for f in doctor(store) if f.code == "manifest_unreadable"]
    assert not f.repaired and (root / "fsdurable.json").read_text() == "{not json"
    store.create("a")  # the store works meanwhile
    [f] = [f for f in doctor(store, repair=True) if f.code == "manifest_unreadable"]
    assert f.repaired and store.manifest_problem is None and store.manifest.store_id
    assert Store(root).manifest == store.manifest
    [kept] = [n for n in os.listdir(store.layout.quarantine) if "-manifest." in n]
    assert (Path(store.layout.quarantine) / kept).read_text() == "{not json"
    [e] = [e for e in store.events() if e.code == "file_quarantined"]
    assert e.detail["kind"] == "manifest" and e.detail["moved_to"].endswith(kept)
    assert [f for f in doctor(store) if f.code == "manifest_unreadable"] == []


def test_recover_replaces_an_unreadable_manifest(root: Path) -> None:
    from fsdurable import AgentLoop, ScriptedModel

    Store(root)
    (root / "fsdurable.json").write_bytes(b"\x00" * 40)
    store = Store(root)
    assert store.manifest_problem is not None
    recover(store, AgentLoop(store, ScriptedModel([]), []))
    assert store.manifest_problem is None and Store(root).manifest_problem is None


def test_a_directory_at_the_manifest_is_moved_aside_and_replaced(root: Path) -> None:
    """No bytes to keep: the directory itself goes into quarantine/, then the new manifest
    (on 75f1263 the keep-aside could neither link nor copy it: every repair failed)."""
    Store(root)
    os.unlink(root / "fsdurable.json")
    os.mkdir(root / "fsdurable.json")
    (root / "fsdurable.json" / "note").write_text("mine")
    store = Store(root)
    assert store.manifest_problem is not None
    [f] = [f for f in doctor(store, repair=True) if f.code == "manifest_unreadable"]
    assert f.repaired and Store(root).manifest == store.manifest
    [kept] = [n for n in os.listdir(store.layout.quarantine) if "-manifest." in n]
    assert (Path(store.layout.quarantine) / kept / "note").read_text() == "mine"


def test_a_manifest_the_disk_refuses_never_makes_recover_raise(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fsdurable import AgentLoop, ScriptedModel, _fsio
    from fsdurable._errors import StorageError

    Store(root)
    (root / "fsdurable.json").write_text("{")
    store = Store(root)
    store.create("a")
    store.begin_turn("a", "go")
    real_read = _fsio.read_bounded

    def refusing(path: str, max_bytes: int) -> object:
        if path == store.layout.manifest:
            raise StorageError("EIO", path=path, reason="io")
        return real_read(path, max_bytes)

    monkeypatch.setattr(_fsio, "read_bounded", refusing)
    assert _repair.repair_manifest(store).action == "failed"
    rep = recover(store, AgentLoop(store, ScriptedModel([]), []), resume=False)
    assert [o.outcome for o in rep.outcomes] == ["left"]
    assert store.manifest_problem is not None  # the next start tries again


def test_a_newer_store_format_is_refused(root: Path) -> None:
    Store(root)
    with open(root / "fsdurable.json", "w") as f:
        json.dump({"format": "fsdurable/2", "store_id": "x", "created_at": 1.0}, f)
    with pytest.raises(UnreadableState) as e:
        Store(root)
    assert e.value.reason == "unknown_version"


def test_symlinked_store_directory_is_refused(root: Path, tmp_path: Path) -> None:
    Store(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rmdir(root / "markers")
    os.symlink(elsewhere, root / "markers")
    with pytest.raises(UnreadableState) as e:
        Store(root)
    assert e.value.reason == "not_a_directory"


def test_unreadable_marker_of_a_turn_in_progress_is_rebuilt(store: Store) -> None:
    s = store.create("live")
    s = store.begin_turn("live", "go")
    with open(store.layout.marker("live"), "wb") as f:
        f.write(b"\x00garbage")
    assert store.interrupted() == []  # a listing only reports it
    [o] = recover(store, _NoLoop(), resume=False).outcomes  # the gate rebuilds it first
    assert o.outcome == "left"
    [m] = store.interrupted()  # kept aside, then rebuilt from the session: still discoverable
    assert m.session_id == "live" and s.turn is not None and m.turn_id == s.turn.id
    codes = [e.code for e in store.events("live")]
    assert "file_quarantined" in codes and "marker_repaired" in codes
    assert "interrupted_turn_abandoned" not in codes
    assert store.load("live").in_progress


def test_doctor_rebuilds_an_unreadable_marker_of_a_turn_in_progress(store: Store) -> None:
    from fsdurable import doctor

    store.create("live")
    store.begin_turn("live", "go")
    with open(store.layout.marker("live"), "wb") as f:
        f.write(b"{}")
    os.chmod(store.layout.marker("live"), 0o600)
    [f] = [x for x in doctor(store) if x.severity == "problem"]
    assert f.code == "unreadable_marker" and not f.repaired
    assert [x.code for x in doctor(store, repair=True) if x.severity == "problem"] == [
        "unreadable_marker"]
    assert [x.code for x in doctor(store) if x.severity == "problem"] == []
    assert [m.session_id for m in store.interrupted()] == ["live"]


def test_a_socket_where_a_file_should_be_never_crashes(store: Store, tmp_path: Path) -> None:
    import socket

    store.create("ok")
    for path in (store.layout.marker("sock"), store.layout.session("sock2")):
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    assert store.interrupted() == []
    with pytest.raises(UnreadableState):
        store.load("sock2")
    from fsdurable import doctor

    doctor(store)
    doctor(store, repair=True)
    assert store.sessions() == ["ok"]


def test_a_session_too_large_to_read_back_is_never_written(root: Path) -> None:
    store = Store(root, config=Config(max_file_bytes=4096))
    s = store.create("grow")
    with pytest.raises(fsdurable.InvalidState) as e:
        store.save(attrs.evolve(s, metadata={"blob": "x" * 5000}))
    assert e.value.reason == "too_large"
    assert store.load("grow") == s


def test_a_bad_events_directory_never_breaks_a_commit(store: Store) -> None:
    import shutil

    shutil.rmtree(store.layout.events)
    with open(store.layout.events, "w") as f:  # a file where the event log's directory goes
        f.write("x")
    store.create("e")
    s = store.begin_turn("e", "go")  # the event cannot be written; the commit stands
    assert s.in_progress and [m.session_id for m in store.interrupted()] == ["e"]
