"""Fault injection: the disk refuses an operation in the middle of a commit.

Each scenario builds a store, injects one failure at an exact ``_fsio`` operation (the recorder
raises ``OSError`` before the operation happens), runs one store call and checks:

* the call raises a typed ``StorageError`` carrying the errno (events that cannot be written never
  fail a commit: they are checked separately);
* the last committed state stays readable by a fresh store (the old version, or — when the
  failure came after the rename — the new one, whole);
* nothing half-written is under a final name, and no temp file is left behind;
* "session in progress => marker" still holds, and the store keeps working afterwards.

Real-world variants live in tests/test_faults.py: a read-only bind mount, a store owned by
another uid (EACCES without the recorder) and a lock held by a killed process.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from fsdurable import _fsio
from fsdurable._codec import parse_marker, parse_session
from fsdurable._errors import DurabilityUnknown, StorageError
from fsdurable._model import Session
from fsdurable._names import NameKind, classify
from fsdurable._store import Store


@contextmanager
def failing(op: str, err: int, *, where: str = "", skip: int = 0) -> Iterator[list[int]]:
    """Make the ``skip+1``-th ``op`` whose first path contains ``where`` raise ``OSError(err)``.
    Yields a list that holds 1 once the fault fired."""
    fired: list[int] = []
    seen = [0]

    def recorder(name: str, args: tuple[Any, ...]) -> None:
        if fired or name != op or not (args and where in str(args[0]).split(os.sep)):
            return
        if seen[0] < skip:
            seen[0] += 1
            return
        fired.append(1)
        raise OSError(err, os.strerror(err), str(args[0]))

    prev = _fsio.set_recorder(recorder)
    try:
        yield fired
    finally:
        _fsio.set_recorder(prev)


def files_under_final_names_parse(root: str) -> list[str]:
    """Violations: an own-named file that does not parse, or a temp file left behind."""
    out = []
    for sub, parse in (("sessions", parse_session), ("markers", parse_marker)):
        d = os.path.join(root, sub)
        for name in os.listdir(d):
            kind, _ = classify(name)
            path = os.path.join(d, name)
            if kind is NameKind.TEMP:
                out.append(f"temp file left: {sub}/{name}")
            elif kind is NameKind.OWN:
                with open(path, "rb") as f:
                    try:
                        parse(f.read(), path=path)  # type: ignore[operator]
                    except Exception as e:
                        out.append(f"half-written {sub}/{name}: {e}")
    return out


def biconditional(root: str) -> list[str]:
    out = []
    for name in os.listdir(os.path.join(root, "sessions")):
        kind, sid = classify(name)
        if kind is not NameKind.OWN:
            continue
        with open(os.path.join(root, "sessions", name), "rb") as f:
            s, _ = parse_session(f.read())
        if s.in_progress and not os.path.exists(os.path.join(root, "markers", name)):
            out.append(f"session {sid} in progress without a marker")
    return out


# ---------------------------------------------------------------------- scenarios

Action = Callable[[Store], Any]


def _begin(st: Store) -> Any:
    return st.begin_turn("a", "hi")


def _checkpoint(st: Store) -> Any:
    return st.checkpoint(st.load("b"), phase="model_reply")


def _end(st: Store) -> Any:
    return st.end_turn(st.load("b"), "bye")


def _patch(st: Store) -> Any:
    return st.patch("a", lambda s: attrs.evolve(s, metadata={"k": 1}))


def _create(st: Store) -> Any:
    return st.create("new")


def _delete(st: Store) -> Any:
    return st.delete("a")


def _cancel(st: Store) -> Any:
    return st.cancel("b")


ACTIONS: dict[str, Action] = {"create": _create, "patch": _patch, "begin_turn": _begin,
                              "checkpoint": _checkpoint, "end_turn": _end, "cancel": _cancel,
                              "delete": _delete}
# (fsio op, path part) pairs where a failure can hit each action
SITES: dict[str, list[tuple[str, str]]] = {
    "create": [("create", "sessions"), ("write", "sessions"), ("fsync", "sessions"),
               ("rename", "sessions"), ("fsync_dir", "sessions")],
    "patch": [("write", "sessions"), ("fsync", "sessions"), ("rename", "sessions"),
              ("fsync_dir", "sessions")],
    "begin_turn": [("create", "markers"), ("write", "markers"), ("fsync", "markers"),
                   ("rename", "markers"), ("fsync_dir", "markers"), ("write", "sessions"),
                   ("fsync", "sessions"), ("fsync_dir", "sessions")],
    "checkpoint": [("write", "sessions"), ("fsync", "sessions"), ("rename", "sessions")],
    "end_turn": [("write", "sessions"), ("fsync", "sessions"), ("unlink", "markers"),
                 ("fsync_dir", "markers")],
    "cancel": [("fsync", "sessions"), ("unlink", "markers")],
    "delete": [("unlink", "sessions"), ("fsync_dir", "sessions")],
}
ERRNOS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO, "EACCES": errno.EACCES,
          "EROFS": errno.EROFS}


@attrs.frozen
class Scenario:
    action: str
    op: str
    where: str
    err: str

    @property
    def name(self) -> str:
        return f"{self.action}:{self.op}@{self.where}:{self.err}"


def scenarios() -> list[Scenario]:
    out = []
    for action, sites in SITES.items():
        for op, where in sites:
            errs = ("ENOSPC", "EIO") if op in ("write", "fsync") else ("EIO", "EACCES", "EROFS")
            for err in errs:
                out.append(Scenario(action, op, where, err))
    return out


def seed(root: str) -> tuple[Store, dict[str, Session]]:
    """Session ``a`` idle, ``b`` with a turn in progress."""
    st = Store(root)
    st.create("a", metadata={"seed": True})
    st.create("b")
    st.begin_turn("b", "working")
    return st, {"a": st.load("a"), "b": st.load("b")}


def run_scenario(sc: Scenario, root: str) -> list[str]:
    """Run one fault scenario in a fresh store at ``root``; returns the violations."""
    st, before = seed(root)
    out: list[str] = []
    raised: StorageError | None = None
    with failing(sc.op, ERRNOS[sc.err], where=sc.where) as fired:
        try:
            ACTIONS[sc.action](st)
        except StorageError as e:
            raised = e
            if e.errno != ERRNOS[sc.err]:
                out.append(f"StorageError with errno {e.errno}, not {sc.err}")
            if not e.path:
                out.append("StorageError without a path")
        except Exception as e:
            out.append(f"untyped error {type(e).__name__}: {e}")
    if not fired:
        return [f"the fault site {sc.op}@{sc.where} was never reached"]
    out += _committed_iff_told(sc, root, before, raised)
    out += files_under_final_names_parse(root)
    out += biconditional(root)
    fresh = Store(root)
    for sid, old in before.items():
        try:
            now = fresh.load(sid)
        except Exception as e:
            if sc.action == "delete" and sid == "a" and sc.op != "unlink":
                continue  # the unlink happened; only its directory fsync failed
            out.append(f"last committed state of {sid} unreadable: {type(e).__name__}: {e}")
            continue
        if now.version not in (old.version, old.version + 1):
            out.append(f"{sid} at v{now.version}, committed v{old.version}")
        if now.version == old.version and now != old:
            out.append(f"{sid} changed without a new version")
    # the store keeps working: doctor repairs what the fault left, then a commit succeeds
    from fsdurable._doctor import doctor, problems

    doctor(fresh, repair=True)
    left = problems(doctor(fresh))
    if left:
        out.append(f"doctor --repair left {[f.code for f in left]}")
    try:
        fresh.patch("b", lambda s: attrs.evolve(s, metadata={"after": True}))
    except Exception as e:
        out.append(f"store unusable after the fault: {type(e).__name__}: {e}")
    return out


TARGET = {"create": "new", "patch": "a", "begin_turn": "a", "checkpoint": "b", "end_turn": "b",
          "cancel": "b"}


def _committed_iff_told(sc: Scenario, root: str, before: dict[str, Session],
                        raised: StorageError | None) -> list[str]:
    """A commit that committed never raises as if it had not (issue 9 item 17): it returns, or
    raises DurabilityUnknown carrying exactly the session now on disk; one that did not commit
    raises a plain StorageError."""
    sid = TARGET.get(sc.action)
    if sid is None:  # delete: not a commit
        return [] if raised is not None else ["no error raised"]
    try:
        now: Session | None = Store(root).load(sid)
    except Exception:
        now = None
    old = before.get(sid)
    committed = now is not None and (old is None or now.version == old.version + 1)
    if not committed:
        return [] if raised is not None and not isinstance(raised, DurabilityUnknown) else [
            f"not committed, but the call {'returned' if raised is None else 'said it was'}"]
    if raised is None:
        return []
    if not isinstance(raised, DurabilityUnknown):
        return [f"committed v{now.version if now else '?'}, but raised as if not: {raised}"]
    if raised.session != now:
        return ["DurabilityUnknown.session is not the session on disk"]
    return []


# ---------------------------------------------------------------------- real-world faults


def _snapshot(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(root):
        if os.sep + "events" in dirpath:
            continue
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def probe(root: str, *prefix: str) -> dict[str, dict[str, Any]]:
    """Run tests/torture/probe.py on ``root`` in a child (under ``prefix``, e.g. setpriv)."""
    import json
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([*prefix, sys.executable, "-m", "tests.torture.probe", root],
                         env=env, capture_output=True, text=True, cwd=repo, timeout=120)
    if out.returncode != 0:
        raise AssertionError(out.stderr)
    return {r["op"]: r for r in map(json.loads, out.stdout.splitlines())}


def no_caps_prefix() -> list[str] | None:
    """How to make mode bits bind: nothing for a normal user; as root, drop every capability
    with setpriv (the owner then meets the mode bits like anyone). None if impossible."""
    import shutil

    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--inh-caps=-all", "--bounding-set=-all"] if setpriv else None


WRITES = ("patch", "begin_turn", "checkpoint", "end_turn", "create", "delete")


def _refused_writes(res: dict[str, dict[str, Any]], reason: str) -> list[str]:
    out = []
    for op in WRITES:
        r = res[op]
        if r["ok"] or r.get("type") != "StorageError" or r.get("reason") != reason:
            out.append(f"{op}: expected StorageError {reason}, got {r}")
    for op in ("load", "interrupted", "doctor", "doctor_repair"):
        if not res[op]["ok"]:
            out.append(f"{op} failed on a store that can be read: {res[op]}")
    if not res["recover"]["ok"] and res["recover"].get("type") != "StorageError":
        out.append(f"recover: untyped failure {res['recover']}")
    return out


def eacces_not_writable(root: str) -> list[str] | None:
    """A store whose files and directories are read-only by mode: writes get EACCES."""
    prefix = no_caps_prefix()
    if prefix is None:
        return None
    seed(root)
    before = _snapshot(root)
    for dirpath, _, files in os.walk(root):
        os.chmod(dirpath, 0o500)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o400)
    try:
        res = probe(root, *prefix)
    finally:
        for dirpath, _, _files in os.walk(root):
            os.chmod(dirpath, 0o700)
    out = _refused_writes(res, "EACCES")
    if res["interrupted"].get("value") != "['b']":
        out.append(f"discovery on a read-only store: {res['interrupted']}")
    if _snapshot(root) != before:
        out.append("a refused store was modified")
    return out + files_under_final_names_parse(root)


def eacces_not_readable(root: str) -> list[str] | None:
    """Files that cannot even be read: opening the store is a typed StorageError."""
    prefix = no_caps_prefix()
    if prefix is None:
        return None
    seed(root)
    for dirpath, _, files in os.walk(root):
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0)
    try:
        res = probe(root, *prefix)
    finally:
        for dirpath, _, files in os.walk(root):
            for f in files:
                os.chmod(os.path.join(dirpath, f), 0o600)
    r = res["open"]
    out = []
    if r["ok"] or r.get("type") != "StorageError" or r.get("reason") != "EACCES":
        out.append(f"open of an unreadable store: {r}")
    if not Store(root).load("b").in_progress:
        out.append("the last committed state was lost")
    return out


def one_file_unreadable(root: str) -> list[str] | None:
    """One marker and one session the disk refuses to read (EACCES): discovery and doctor go on
    (the marker is skipped with an event and kept), a load of that session is a typed error."""
    prefix = no_caps_prefix()
    if prefix is None:
        return None
    seed(root)
    bad = [os.path.join(root, "markers", "b.json"), os.path.join(root, "sessions", "a.json")]
    for p in bad:
        os.chmod(p, 0)
    try:
        res = probe(root, *prefix)
    finally:
        for p in bad:
            if os.path.lexists(p):
                os.chmod(p, 0o600)
    out = []
    if not res["interrupted"]["ok"]:
        out.append(f"discovery raised on one unreadable marker: {res['interrupted']}")
    if not res["doctor"]["ok"] or "refused_read" not in res["doctor"].get("value", ""):
        out.append(f"doctor on one unreadable file: {res['doctor']}")
    r = res["load"]
    if r["ok"] or r.get("type") != "StorageError" or r.get("reason") != "EACCES":
        out.append(f"load of an unreadable session: {r}")
    if not res["sessions"]["ok"]:
        out.append("listing failed")
    if Store(root).load("a").version != 1:  # the probe's writes to it were all refused
        out.append("the unreadable session was not kept as it was")
    return out


def read_only_mount(base: str) -> list[str] | None:
    """A read-only bind mount of a store (needs root and mount): writes get EROFS."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("mount") is None:
        return None
    src, dst = os.path.join(base, "store"), os.path.join(base, "ro")
    seed(src)
    os.makedirs(dst)
    if subprocess.run(["mount", "--bind", src, dst], capture_output=True).returncode != 0:
        return None
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", dst],
                          capture_output=True).returncode != 0:
            return None
        before = _snapshot(src)
        res = probe(dst)
        out = _refused_writes(res, "EROFS")
        if res["interrupted"].get("value") != "['b']":
            out.append(f"discovery on a read-only mount: {res['interrupted']}")
        if _snapshot(src) != before:
            out.append("a read-only store was modified")
        return out
    finally:
        subprocess.run(["umount", dst], check=True)


LOCKER = """
import sys, time
from fsdurable import Store
st = Store(sys.argv[1])
with st._commit_lock("a"), st.lock("session:a"):
    print("locked", flush=True)
    time.sleep(600)
"""


def dead_lock_holder(root: str) -> list[str]:
    """A process holding the commit and route locks hangs (SIGSTOP: LockTimeout, typed, the
    state readable), then is SIGKILLed: the kernel frees its locks and work goes on."""
    import signal
    import subprocess
    import sys

    from fsdurable._config import Config
    from fsdurable._errors import LockTimeout

    out = []
    st = Store(root, config=Config(commit_lock_timeout=0.3, route_lock_timeout=0.3))
    st.create("a")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    child = subprocess.Popen([sys.executable, "-c", LOCKER, root], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "locked":
            return ["the lock holder did not start"]
        os.kill(child.pid, signal.SIGSTOP)
        try:
            st.patch("a", lambda s: attrs.evolve(s, metadata={"k": 1}))
            out.append("a commit went through a held commit lock")
        except LockTimeout as e:
            if e.reason != "timeout" or e.session_id != "a":
                out.append(f"LockTimeout without reason/session: {e!r}")
        try:
            with st.lock("session:a"):
                out.append("a held route lock was taken")
        except LockTimeout:
            pass
        if Store(root).load("a").version != 1:
            out.append("state unreadable while a lock is held")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    s = st.begin_turn("a", "after the holder died")
    with st.lock("session:a"):
        st.end_turn(s, "ok")
    if Store(root).load("a").version != 3:
        out.append("work did not go on after the holder died")
    return out + files_under_final_names_parse(root)


REAL = ("eacces_not_writable", "eacces_not_readable", "one_file_unreadable", "read_only_mount",
        "dead_lock_holder")


def run_real(name: str, base: str) -> list[str] | None:
    """One real-world fault in a fresh directory ``base``; None if this machine cannot do it."""
    root = os.path.join(base, "store")
    if name == "eacces_not_writable":
        return eacces_not_writable(root)
    if name == "eacces_not_readable":
        return eacces_not_readable(root)
    if name == "one_file_unreadable":
        return one_file_unreadable(root)
    if name == "read_only_mount":
        return read_only_mount(base)
    if name == "dead_lock_holder":
        return dead_lock_holder(root)
    raise ValueError(name)
