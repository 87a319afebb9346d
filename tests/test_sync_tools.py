"""Real sync tools carry a store between two roots ("machines": each its own node id and its own
machine-local state dir): rsync, Unison and Syncthing, Debian's packages.

Tests never install anything: .ci/run installs the Debian packages. Where a tool is missing a
test skips saying why, except under ``CI=true``, where that is a failure (conftest.need_tools).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from fsdurable import Store
from fsdurable import _events as ev
from fsdurable._doctor import doctor
from fsdurable._errors import FsDurableError, SessionNotFound
from fsdurable._model import Message
from fsdurable._sync import conflict_copies, foreign_turns, ignore_file, resolve, versions

from .conftest import PYTHON, REPO, need_tools, skip_or_fail, subprocess_env
from .test_watch import recording

WAIT = 60.0  # a loaded CI box is slow; nothing here asserts a duration


def need(name: str) -> None:
    need_tools(name)


def machine(tmp_path: Path, name: str) -> dict[str, str]:
    """The environment of one 'machine': its node id and its own machine-local state dir."""
    state = tmp_path / f"state-{name}"
    state.mkdir(exist_ok=True)
    return subprocess_env(FSDURABLE_NODE=name, FSDURABLE_STATE_DIR=str(state))


def cli(env: dict[str, str], *args: str) -> tuple[int, Any]:
    p = subprocess.run([PYTHON, "-m", "fsdurable", *args, "--json"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else None


# ---------------------------------------------------------------------- rsync

CRASHING_TURN = """
import os, signal, sys
from fsdurable import AgentLoop, Reply, ScriptedModel, Store, tool
from fsdurable._tools import call

@tool(effect="none")
def note(ctx, text):
    with open(sys.argv[2], "a") as f:
        f.write(text + "\\n")
    return "noted"

def crash(transcript):  # the laptop dies inside the second model call
    os.kill(os.getpid(), signal.SIGKILL)

st = Store(sys.argv[1])
st.create("trip", source="desktop")
model = ScriptedModel([Reply("", (call("note", "c1", text="book the train"),)), crash])
AgentLoop(st, model, [note]).run("trip", "plan the trip", attended=True)
"""


def edge_host(store: Store) -> Any:
    """The edge box's host loop (``fsdurable adopt --host tests.test_sync_tools:edge_host``)."""
    from fsdurable import AgentLoop, ScriptedModel, tool

    @tool(effect="none")
    def note(ctx: Any, text: str) -> str:
        raise AssertionError("the edge model never asks for a note")

    return AgentLoop(store, ScriptedModel([], final="planned on the edge box"), [note])


def test_rsync_interrupted_turn_is_foreign_there_then_adopted_and_resumed(
        tmp_path: Path) -> None:
    need("rsync")
    a, b, notes = tmp_path / "laptop", tmp_path / "edge", tmp_path / "notes.txt"
    laptop, edge = machine(tmp_path, "laptop"), machine(tmp_path, "edge")
    p = subprocess.run([PYTHON, "-c", CRASHING_TURN, str(a), str(notes)], env=laptop,
                       timeout=120)
    assert p.returncode == -signal.SIGKILL
    temp = a / "sessions" / "~trip.json.k2j3h4.tmp"  # a write in flight when rsync ran
    temp.write_text("half")
    r = subprocess.run(["rsync", "-a", f"--filter=merge {ignore_file('rsync-filter')}",
                        f"{a}/", f"{b}/"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not (b / "sessions" / temp.name).exists()  # the shipped filter kept it home
    # on the edge box the turn is listed as foreign: never run by its recovery
    code, out = cli(edge, "interrupted", "--root", str(b))
    assert code == 0 and [(x["session_id"], x["verdict"], x["node_id"])
                          for x in out["interrupted"]] == [("trip", "foreign", "laptop")]
    code, out = cli(edge, "recover", "--root", str(b))
    assert [o["outcome"] for o in out["outcomes"]] == ["listed"]
    # adopted explicitly, and resumed (unattended) by the edge box's own loop
    code, out = cli(edge, "adopt", "trip", "--root", str(b), "--host",
                    "tests.test_sync_tools:edge_host")
    assert code == 0, out
    assert (out["from_node"], out["to_node"], out["outcome"]) == ("laptop", "edge", "resumed")
    st = Store(b, node_id="edge")
    s = st.load("trip")
    assert not s.in_progress and s.messages[-1].content == "planned on the edge box"
    assert notes.read_text() == "book the train\n"  # done once, on the laptop
    evs = [(e.code, e.node_id) for e in st.events("trip")]
    assert (ev.ADOPTED, "edge") in evs and (ev.RESUMED, "edge") in evs
    resuming = next(e for e in st.events("trip") if e.code == ev.RESUMING)
    assert resuming.detail["adopted"] is True
    assert st.interrupted() == []
    # the laptop's copy is untouched: rsync copies, it does not move
    assert [m.node_id for m in Store(a, node_id="laptop").interrupted()] == ["laptop"]


def kept_messages(st: Store) -> list[str]:
    """The messages of every session document kept in ``quarantine/`` (read from the store's
    history: a document names its segments)."""
    from fsdurable._codec import parse_session

    out = []
    for p in Path(st.layout.quarantine).iterdir():
        with contextlib.suppress(FsDurableError):
            s, _ = parse_session(p.read_bytes(), history_dir=st.layout.history_dir("s"))
            out += [m.content for m in s.messages]
    return out


# ---------------------------------------------------------------------- unison


def test_unison_conflicting_edits_detected_and_resolved_nothing_lost(
        tmp_path: Path) -> None:
    need("unison")
    a, b, udir = tmp_path / "laptop", tmp_path / "edge", tmp_path / "unison"
    udir.mkdir()
    with open(ignore_file("unison.prf"), encoding="utf-8") as f:
        shipped = f.read()
    (udir / "fsd.prf").write_text(f"root = {a}\nroot = {b}\n{shipped}\nbatch = true\n")
    env = {**os.environ, "UNISON": str(udir), "HOME": str(tmp_path)}

    def unison() -> None:
        r = subprocess.run(["unison", "fsd", "-silent"], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr

    def say(text: str) -> Any:
        return lambda s: attrs.evolve(s, messages=(*s.messages, Message("user", text)))

    sa = Store(a, node_id="laptop")
    sa.create("s")
    unison()
    sb = Store(b, node_id="edge")
    sb.patch("s", say("edge 1"))
    sb.patch("s", say("edge 2"))  # version 3 on the edge box
    sa.patch("s", say("laptop 1"))  # version 2 on the laptop ...
    later = time.time() + 60
    os.utime(sa.layout.session("s"), (later, later))  # ... but the newer file: unison keeps it
    unison()
    unison()  # the conflict copy travels too
    for st in (sa, sb):
        vs = versions(st, "s")
        assert [(v.local, v.version) for v in vs] == [(True, 2), (False, 3)]
        assert vs[1].tool == "unison" and "conflict" in os.path.basename(vs[1].path)
        assert list(conflict_copies(st)) == ["s"]
    found = [f for f in doctor(sb) if f.code == "conflict_copy"]
    assert len(found) == 1 and "version 3" in found[0].detail and "version 2" in found[0].detail
    # newest by COMMIT TIME: the laptop's edit (version 2) was committed after the edge's
    # (version 3) — the newest, although the lower version (issue 9 item 19)
    r = resolve(sb, "s")
    assert r.kept_version == 2 and r.version == 4  # above every version seen
    unison()
    for st in (sa, sb):
        s = st.load("s")
        assert [m.content for m in s.messages] == ["laptop 1"]
        assert list(conflict_copies(st)) == []
        # the losing edits are in quarantine/ on both sides (their messages in history/)
        assert "edge 2" in kept_messages(st)
    assert sa.patch("s", say("laptop 2")).version == 5  # and the laptop carries on
    assert [e.code for e in sb.events("s")].count(ev.CONFLICT_RESOLVED) == 1


# ---------------------------------------------------------------------- syncthing


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.define
class Syncthing:
    """Two Syncthing instances on 127.0.0.1 sharing one folder between two roots: no GUI, no
    discovery, no relays, no NAT traversal, no usage reporting, no upgrades."""

    base: Path
    roots: list[Path] = attrs.Factory(list)
    homes: list[Path] = attrs.Factory(list)
    ids: list[str] = attrs.Factory(list)
    ports: list[int] = attrs.Factory(list)
    procs: list[subprocess.Popen[bytes] | None] = attrs.Factory(list)

    def setup(self) -> None:
        for i in range(2):
            home, root = self.base / f"st-home{i}", self.base / f"root{i}"
            root.mkdir()
            shutil.copy(ignore_file("stignore"), root / ".stignore")
            out = subprocess.run(["syncthing", "generate", f"--home={home}",
                                  "--no-default-folder", "--skip-port-probing"],
                                 capture_output=True, text=True, timeout=60)
            m = re.search(r"Device ID: (\S+)", out.stdout + out.stderr)
            if m is None:
                skip_or_fail(f"syncthing generate failed: {out.stderr[-300:]}")
            self.homes.append(home)
            self.roots.append(root)
            self.ids.append(m.group(1))
            self.ports.append(_free_port())
            self.procs.append(None)
        for i in range(2):
            j = 1 - i
            (self.homes[i] / "config.xml").write_text(f"""<configuration version="36">
  <folder id="fsd" label="fsd" path="{self.roots[i]}" type="sendreceive" rescanIntervalS="3600"
          fsWatcherEnabled="true" fsWatcherDelayS="1">
    <device id="{self.ids[i]}"></device><device id="{self.ids[j]}"></device>
    <maxConflicts>10</maxConflicts>
  </folder>
  <device id="{self.ids[i]}" name="n{i}"><address>dynamic</address></device>
  <device id="{self.ids[j]}" name="n{j}"><address>tcp://127.0.0.1:{self.ports[j]}</address>
  </device>
  <gui enabled="false"><address>127.0.0.1:0</address></gui>
  <options>
    <listenAddress>tcp://127.0.0.1:{self.ports[i]}</listenAddress>
    <globalAnnounceEnabled>false</globalAnnounceEnabled>
    <localAnnounceEnabled>false</localAnnounceEnabled>
    <relaysEnabled>false</relaysEnabled>
    <natEnabled>false</natEnabled>
    <urAccepted>-1</urAccepted>
    <autoUpgradeIntervalH>0</autoUpgradeIntervalH>
    <crashReportingEnabled>false</crashReportingEnabled>
    <startBrowser>false</startBrowser>
    <reconnectionIntervalS>1</reconnectionIntervalS>
  </options>
</configuration>
""")

    def start(self, i: int) -> None:
        log = open(self.base / f"st-log{i}", "ab")  # noqa: SIM115 - owned by the process
        self.procs[i] = subprocess.Popen(
            ["syncthing", "serve", f"--home={self.homes[i]}", "--no-browser", "--no-restart",
             "--no-upgrade"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "STNOUPGRADE": "1", "STNORESTART": "1"})
        log.close()

    def stop(self, i: int) -> None:
        p = self.procs[i]
        if p is None:
            return
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)  # our own process group, started above
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(20)
        self.procs[i] = None

    def log(self) -> str:
        return "".join((self.base / f"st-log{i}").read_text(errors="replace")[-2000:]
                       for i in range(2) if (self.base / f"st-log{i}").exists())


def wait_until(pred: Any, what: str, st: Syncthing) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if pred():
            return
        dead = [p for p in st.procs if p is not None and p.poll() is not None]
        if dead:  # this syncthing cannot run here (another version's flags, a sandbox, ...)
            skip_or_fail(f"syncthing exited with {dead[0].returncode}: {st.log()[-600:]}")
        time.sleep(0.05)
    raise AssertionError(f"syncthing never delivered {what}\n{st.log()}")


@pytest.fixture
def syncthing(tmp_path: Path) -> Iterator[Syncthing]:
    need("syncthing")
    st = Syncthing(tmp_path)
    st.setup()
    try:
        st.start(0)
        st.start(1)
        yield st
    finally:
        st.stop(0)
        st.stop(1)


def test_syncthing_marker_written_on_one_root_is_seen_by_watch_on_the_other(
        syncthing: Syncthing) -> None:
    r0, r1 = syncthing.roots
    laptop = Store(r0, node_id="laptop")
    wait_until(lambda: (r1 / "fsdurable.json").exists() and (r1 / "markers").is_dir(),
               "the new store", syncthing)
    edge = Store(r1, node_id="edge", create=False)
    assert edge.manifest.store_id == laptop.manifest.store_id
    for d in ("sessions", "markers"):  # writes in flight on the laptop: never carried
        (r0 / d / "~far.json.q1w2e3.tmp").write_text("half")
    with recording(edge) as rec:
        laptop.create("far")
        s = laptop.begin_turn("far", "hello from the laptop")
        m = rec.wait_for(lambda c: c.kind == "marker" and c.session_id == "far",
                         "the laptop's marker on the edge box")
        assert m.action == "added" and m.node_id == "laptop" and m.turn_id == s.turn.id
        assert [x.session_id for x in foreign_turns(edge)] == ["far"]
        laptop.end_turn(s, "done")
        rec.wait_for(lambda c: c.kind == "marker" and c.session_id == "far"
                     and c.action == "removed", "the marker's removal")
        rec.wait_for(lambda c: c.kind == "session" and c.session_id == "far"
                     and c.version == 3, "the finished session")
    assert not (r1 / "sessions" / "~far.json.q1w2e3.tmp").exists()
    assert not (r1 / "markers" / "~far.json.q1w2e3.tmp").exists()
    for c in rec.changes:  # Syncthing's own .syncthing.*.tmp files never show
        assert ".tmp" not in c.path, c


def test_syncthing_conflict_copy_is_recognised_and_resolved(syncthing: Syncthing) -> None:
    r0, r1 = syncthing.roots
    laptop = Store(r0, node_id="laptop")
    laptop.create("s")
    wait_until(lambda: (r1 / "sessions" / "s.json").exists(), "the session", syncthing)
    syncthing.stop(1)  # the edge box goes offline; both sides edit
    edge = Store(r1, node_id="edge", create=False)

    def say(text: str) -> Any:
        return lambda s: attrs.evolve(s, messages=(*s.messages, Message("user", text)))

    edge.patch("s", say("edge 1"))
    edge.patch("s", say("edge 2"))  # version 3, the older file
    laptop.patch("s", say("laptop 1"))  # version 2, the newer file
    later = time.time() + 60
    os.utime(laptop.layout.session("s"), (later, later))
    syncthing.start(1)
    wait_until(lambda: any(".sync-conflict-" in n for n in os.listdir(r0 / "sessions"))
               and any(".sync-conflict-" in n for n in os.listdir(r1 / "sessions")),
               "a conflict copy on both sides", syncthing)
    names = [n for n in os.listdir(r1 / "sessions") if n != "s.json"]
    assert len(names) == 1 and re.fullmatch(r"s\.sync-conflict-\d{8}-\d{6}-[A-Z0-9]{7}\.json",
                                            names[0]), names  # the name Syncthing really writes
    vs = versions(edge, "s")
    assert sorted(v.version for v in vs) == [2, 3] and {v.tool for v in vs if not v.local} == {
        "syncthing"}
    r = resolve(edge, "s")
    assert r.kept_version == 2  # the latest commit (the laptop's), not the highest version
    wait_until(lambda: not any(".sync-conflict-" in n for n in os.listdir(r0 / "sessions")),
               "the resolution", syncthing)
    def contents() -> list[str] | None:  # while Syncthing applies the resolution, s.json
        try:  # may be absent for a moment (met once in CI at 147da61): not yet, not a failure
            return [m.content for m in laptop.load("s").messages]
        except SessionNotFound:
            return None

    wait_until(lambda: contents() == ["laptop 1"],
               "the resolved session", syncthing)
    assert "edge 2" in kept_messages(laptop)  # nothing lost, on the laptop too
