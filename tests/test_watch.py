"""``store.watch()``: markers, sessions and conflict copies, judged by version, with the real
watchfiles backends (inotify and polling) and real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdurable import FsDurableError, Store
from fsdurable._names import NameKind, classify
from fsdurable._watch import Change

from .conftest import PYTHON, subprocess_env

WAIT = 20.0  # generous: a loaded CI machine is slow; nothing here asserts a duration


class Recorder:
    """Runs ``store.watch`` in a thread and keeps every Change."""

    def __init__(self, store: Store, **kw: object) -> None:
        self.store = store
        self.kw = kw
        self.changes: list[Change] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for c in self.store.watch(stop_event=self.stop, initial=True, **self.kw):
                self.changes.append(c)
        except BaseException as e:  # surfaced in the test thread
            self.error = e

    def wait_for(self, pred: Callable[[Change], bool], what: str = "") -> Change:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.error is not None:
                raise self.error
            for c in list(self.changes):
                if pred(c):
                    return c
            time.sleep(0.02)
        raise AssertionError(f"never saw {what}; saw:\n" +
                             "\n".join(c.describe() for c in self.changes))

    def sync(self, tag: str) -> int:
        """A barrier: commit a sentinel session and wait until it is seen. Returns the index of
        the sentinel's change (everything before it has been observed)."""
        self.store.create(f"zz-{tag}")
        c = self.wait_for(lambda c: c.session_id == f"zz-{tag}", f"sentinel {tag}")
        return self.changes.index(c)


@contextmanager
def recording(store: Store, **kw: object) -> Iterator[Recorder]:
    r = Recorder(store, **kw)
    r.thread.start()
    try:
        r.sync("ready")
        yield r
    finally:
        r.stop.set()
        r.thread.join(10)
        assert not r.thread.is_alive(), "watch did not stop on its stop_event"


def of(r: Recorder, sid: str, kind: str | None = None) -> list[Change]:
    return [c for c in r.changes if c.session_id == sid and (kind is None or c.kind == kind)]


@pytest.mark.parametrize("poll", [False, True], ids=["inotify", "poll"])
def test_a_turn_seen_live_markers_sessions_conflicts(store: Store, poll: bool) -> None:
    store.create("old")  # already there: reported once as "added" (initial=True)
    with recording(store, poll=poll, poll_interval=0.25) as r:
        assert [(c.kind, c.action, c.version) for c in of(r, "old")] == [("session", "added", 1)]
        store.create("a")
        s = store.begin_turn("a", "hi")
        m = r.wait_for(lambda c: c.kind == "marker" and c.session_id == "a", "marker added")
        assert m.action == "added" and m.turn_id == s.turn.id and m.node_id == store.node_id
        r.wait_for(lambda c: c.kind == "session" and c.session_id == "a" and c.version == 2,
                   "session a v2")
        s = store.checkpoint(s, phase="model_reply")
        c3 = r.wait_for(lambda c: c.kind == "session" and c.session_id == "a" and c.version == 3,
                        "session a v3")
        # a commit is a rename over the old file: the watcher says "added", we say "changed"
        assert c3.action == "changed" and c3.previous == 2 and c3.in_progress
        copy = os.path.join(store.layout.sessions, "a.sync-conflict-20261129-101010-ABCDEFG.json")
        shutil.copy(store.layout.session("a"), copy)
        cc = r.wait_for(lambda c: c.kind == "conflict", "conflict copy")
        assert (cc.action, cc.of, cc.session_id, cc.version) == ("added", "session", "a", 3)
        store.end_turn(s, "bye")
        r.wait_for(lambda c: c.kind == "marker" and c.action == "removed", "marker removed")
        r.wait_for(lambda c: c.kind == "session" and c.session_id == "a" and c.version == 4,
                   "session a v4")
        os.unlink(copy)
        r.wait_for(lambda c: c.kind == "conflict" and c.action == "removed", "copy removed")
        store.delete("old")
        r.wait_for(lambda c: c.session_id == "old" and c.action == "removed", "old removed")
    sess = [c.version for c in of(r, "a", "session")]
    assert sess == sorted(sess) and len(set(sess)) == len(sess)  # each version reported once


def test_same_version_replaced_is_not_a_change_and_temps_never_show(store: Store) -> None:
    store.create("a")
    with recording(store) as r:
        path = store.layout.session("a")
        # a sync tool re-delivers the same file: new inode, new mtime, same version
        tmp = os.path.join(store.layout.sessions, ".a.json.Xy12Zw")  # rsync's in-flight name
        shutil.copy(path, tmp)
        os.utime(tmp, (1, 1))
        os.replace(tmp, path)
        for d in (store.layout.sessions, store.layout.markers):
            for name in ("~a.json.k2j3.tmp", ".syncthing.a.json.tmp", "notes.txt",
                         ".a.json.~4f2a", "a (conflicted copy).txt"):
                Path(d, name).write_text("{}")
        for i in range(5):  # many commits: many of the store's own temp files come and go
            store.patch("a", lambda s, i=i: attrs.evolve(s, metadata={"i": i}))
        r.wait_for(lambda c: c.session_id == "a" and c.version == 6, "a v6")
        r.sync("after")
    seen = of(r, "a")
    assert (seen[0].action, seen[0].version) == ("added", 1)
    versions = [c.version for c in seen[1:]]
    assert 1 not in versions and versions == sorted(set(versions))  # the replace was not news
    for c in r.changes:
        assert classify(os.path.basename(c.path))[0] in (NameKind.OWN, NameKind.CONFLICT), c


def test_a_killed_writer_process_leaves_a_marker_the_watcher_saw(store: Store) -> None:
    store.create("k")
    code = textwrap.dedent(f"""
        import os, signal, fsdurable
        st = fsdurable.Store({store.root!r})
        s = st.begin_turn("k", "work")
        s = st.checkpoint(s, phase="tool_batch")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    with recording(store) as r:
        p = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), timeout=60)
        assert p.returncode == -signal.SIGKILL
        m = r.wait_for(lambda c: c.kind == "marker" and c.session_id == "k", "marker of k")
        r.wait_for(lambda c: c.kind == "session" and c.session_id == "k" and c.version == 3,
                   "k v3")
        r.sync("after")
    assert m.action == "added" and m.node_id == store.node_id
    assert not [c for c in of(r, "k", "marker") if c.action == "removed"]
    assert [x.session_id for x in store.interrupted()] == ["k"]


def test_a_torn_file_is_reported_unreadable_and_watch_changes_nothing(store: Store) -> None:
    store.create("t")
    with recording(store) as r:
        with open(store.layout.session("t"), "r+b") as f:
            f.truncate(10)  # a tool writing in place, caught half-way
        u = r.wait_for(lambda c: c.session_id == "t" and c.action == "unreadable", "unreadable")
        assert u.previous == 1 and u.error
    # watching only reads: the torn file is still there, not quarantined
    assert os.path.getsize(store.layout.session("t")) == 10
    assert os.listdir(store.layout.quarantine) == []


def test_importing_and_opening_a_store_never_loads_watchfiles(root: Path) -> None:
    code = (f"import sys, fsdurable; st = fsdurable.Store({str(root)!r}); st.interrupted(); "
            "bad = [m for m in ('watchfiles', 'fsdurable._watch', 'fsdurable._sync') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([PYTHON, "-c", code], env=subprocess_env(), check=True, timeout=60)


OPS = st.lists(st.tuples(st.sampled_from(["create", "begin", "checkpoint", "end", "cancel",
                                          "delete", "copy", "uncopy", "touch"]),
                         st.sampled_from(["a", "b", "c"])), min_size=1, max_size=25)


def _apply(store: Store, op: str, sid: str) -> None:
    path = store.layout.session(sid)
    copy = os.path.join(store.layout.sessions, f"{sid} (conflicted copy 2026-11-29 101010).json")
    try:
        if op == "create":
            store.create(sid)
        elif op == "begin":
            store.begin_turn(sid, "go")
        elif op == "checkpoint":
            store.checkpoint(store.load(sid), phase="p")
        elif op == "end":
            store.end_turn(store.load(sid), "ok")
        elif op == "cancel":
            store.cancel(sid)
        elif op == "delete":
            store.delete(sid)
        elif op == "copy" and os.path.exists(path):
            shutil.copy(path, copy)
        elif op == "uncopy" and os.path.exists(copy):
            os.unlink(copy)
        elif op == "touch" and os.path.exists(path):  # a tool re-delivers the same bytes
            shutil.copy(path, path + ".Ab12Cd")
            os.replace(path + ".Ab12Cd", path)
    except (FsDurableError, LookupError):
        pass  # the op does not apply in this state (no turn, no session, ...)


def _disk(store: Store) -> dict[str, int]:
    out = {}
    for d in (store.layout.sessions, store.layout.markers):
        for name in os.listdir(d):
            if classify(name)[0] in (NameKind.OWN, NameKind.CONFLICT):
                with open(os.path.join(d, name), "rb") as f:
                    data = json.loads(f.read())
                out[os.path.join(d, name)] = data.get("version", data.get("session_version"))
    return out


@settings(max_examples=6, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=OPS, poll=st.booleans())
def test_replaying_the_changes_gives_what_is_on_disk(tmp_path_factory: pytest.TempPathFactory,
                                                      ops: list[tuple[str, str]],
                                                      poll: bool) -> None:
    """Whatever happens and however the events coalesce, the last reported version of each file
    is the version on disk, and every file gone was reported removed."""
    store = Store(tmp_path_factory.mktemp("w") / "store")
    with recording(store, poll=poll, poll_interval=0.2) as r:
        for op, sid in ops:
            _apply(store, op, sid)
        r.sync("end")
    view: dict[str, int | None] = {}
    for c in r.changes:
        if c.action == "removed":
            view.pop(c.path, None)
        elif c.action in ("added", "changed"):
            view[c.path] = c.version
    disk = _disk(store)
    assert view == disk
