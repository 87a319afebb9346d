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
from fsdurable._errors import StorageError
from fsdurable._layout import NameKind, classify
from fsdurable._model import Session
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
    with failing(sc.op, ERRNOS[sc.err], where=sc.where) as fired:
        try:
            ACTIONS[sc.action](st)
            out.append("no error raised")
        except StorageError as e:
            if e.errno != ERRNOS[sc.err]:
                out.append(f"StorageError with errno {e.errno}, not {sc.err}")
            if not e.path:
                out.append("StorageError without a path")
        except Exception as e:
            out.append(f"untyped error {type(e).__name__}: {e}")
    if not fired:
        return [f"the fault site {sc.op}@{sc.where} was never reached"]
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
