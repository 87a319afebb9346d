"""Live changes of a store: markers appearing and disappearing, sessions changing, conflict copies.

``watch(store)`` (also ``store.watch()`` and ``fsdurable watch``) yields a ``Change`` for each, on
top of watchfiles. Rules that make it right when files are moved by the store itself or by a sync
tool:

- every decision is made on what the file SAYS (its version, turn and node), never on its mtime: a
  commit replaces the file by a rename, which a watcher reports as "added" (not "modified") for a
  name it already knew, and a polling watcher sees mtimes in whole seconds only on many network
  filesystems. So each reported path is re-read and compared with what was seen before: same
  version -> nothing; a higher (or different) one -> ``changed``; a new name -> ``added``.
- the store's own temp files (``~<name>.<random>.tmp``) and the in-flight files of sync tools are
  filtered out before Python sees them; foreign files are ignored.
- ``poll=True`` uses watchfiles' polling backend (network filesystems, where inotify sees no remote
  change) and also re-lists both directories every ``Config.watch_poll_interval``, re-reading a
  file whose (inode, size, mtime, ctime) moved, so a same-second rewrite is not missed.
- it only reads: nothing is quarantined, migrated or repaired by watching.

This module imports watchfiles (a compiled extension): it is never imported on the startup path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

import attrs

from . import _fsio
from ._names import NameKind, classify
from ._store import Store

MARKER = "marker"
SESSION = "session"
CONFLICT = "conflict"
ADDED = "added"
CHANGED = "changed"
REMOVED = "removed"
UNREADABLE = "unreadable"


class StopEvent(Protocol):
    def is_set(self) -> bool: ...


@attrs.frozen
class Change:
    """One observed change. ``version`` is the session's version (a marker: the session version
    it was written at; a conflict copy: the copy's version); ``previous`` the one seen before."""

    kind: str  # "marker" | "session" | "conflict"
    action: str  # "added" | "changed" | "removed" | "unreadable"
    session_id: str
    path: str
    version: int | None = None
    previous: int | None = None
    turn_id: str | None = None
    node_id: str | None = None  # markers: the node owning the turn
    of: str | None = None  # conflict copies: "session" or "marker"
    in_progress: bool | None = None
    error: str | None = None
    at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def describe(self) -> str:
        what = f"{self.kind} {self.session_id}"
        if self.kind == CONFLICT:
            what = f"conflict copy of {self.of} {self.session_id} ({os.path.basename(self.path)})"
        if self.action == UNREADABLE:
            return f"{what}: unreadable ({self.error})"
        v = f" v{self.version}" if self.version is not None else ""
        if self.action == CHANGED and self.previous is not None:
            v = f" v{self.previous} -> v{self.version}"
        extra = ""
        if self.kind == MARKER and self.action != REMOVED:
            extra = f" turn {self.turn_id} node {self.node_id}"
        elif self.kind == SESSION and self.in_progress is not None and self.action != REMOVED:
            extra = " (in progress)" if self.in_progress else " (idle)"
        return f"{self.action:<10} {what}{v}{extra}"


# What a file says: (version, turn_id, node_id, in_progress, resume_attempts) or an error.
Token = tuple[Any, ...]
StatKey = tuple[int, int, int, int]


def _stat_key(st: os.stat_result) -> StatKey:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_token(path: str, kind: str, max_bytes: int) -> tuple[Token, StatKey] | None:
    """Read the identifying fields of a session or marker; None if the file is gone."""
    import orjson

    try:
        data, st = _fsio.read_bounded(path, max_bytes)
    except FileNotFoundError:
        return None
    except Exception as e:  # symlink, oversized, not a file: reported, never fatal
        return ("error", getattr(e, "reason", None) or type(e).__name__), (0, 0, 0, 0)
    key = _stat_key(st)
    try:
        d = orjson.loads(data)
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        if kind == MARKER:
            v, turn, node = d["session_version"], d["turn_id"], d.get("node_id")
            return (v, turn, node, True, d.get("resume_attempts")), key
        v = d["version"]
        turn = d.get("turn")
        tid = turn.get("id") if isinstance(turn, dict) else None
        return (v, tid, None, bool(d.get("in_progress")), None), key
    except (ValueError, KeyError, TypeError) as e:  # orjson.JSONDecodeError is a ValueError
        return ("error", f"{type(e).__name__}: {str(e)[:80]}"), key


class _Watcher:
    def __init__(self, store: Store) -> None:
        self.store = store
        lay = store.layout
        self.dirs = {lay.sessions: SESSION, lay.markers: MARKER}
        self.max = min(store.config.max_file_bytes, 1 << 26)
        self.seen: dict[str, tuple[Token, StatKey]] = {}

    def relevant(self, path: str) -> tuple[str, str, str] | None:
        """(kind, of, session id) for a path worth reading, else None (temp, foreign, elsewhere)."""
        where = self.dirs.get(os.path.dirname(path))
        if where is None:
            return None
        k, sid = classify(os.path.basename(path))
        if sid is None:
            return None
        if k is NameKind.OWN:
            return where, where, sid
        if k is NameKind.CONFLICT:
            return CONFLICT, where, sid
        return None

    def check(self, path: str, *, trust_stat: bool = False) -> Change | None:
        """Re-read one path and compare with what was seen: the one place a Change is made."""
        rel = self.relevant(path)
        if rel is None:
            return None
        kind, of, sid = rel
        before = self.seen.get(path)
        if trust_stat and before is not None:
            st = _fsio.lstat(path)
            if st is not None and _stat_key(st) == before[1]:
                return None
        got = _read_token(path, of, self.max)
        now = time.time()
        prev_v = before[0][0] if before is not None and before[0][0] != "error" else None
        if got is None:
            if before is None:
                return None
            del self.seen[path]
            return Change(kind=kind, action=REMOVED, session_id=sid, path=path, previous=prev_v,
                          of=of if kind == CONFLICT else None, at=now)
        token, key = got
        self.seen[path] = (token, key)
        if before is not None and before[0] == token:
            return None  # replaced or touched, but it says the same thing: not a change
        if token[0] == "error":
            return Change(kind=kind, action=UNREADABLE, session_id=sid, path=path,
                          previous=prev_v, error=str(token[1]),
                          of=of if kind == CONFLICT else None, at=now)
        version, turn, node, in_progress, _ = token
        return Change(kind=kind, action=ADDED if before is None else CHANGED, session_id=sid,
                      path=path, version=version if isinstance(version, int) else None,
                      previous=prev_v, turn_id=turn, node_id=node, in_progress=in_progress,
                      of=of if kind == CONFLICT else None, at=now)

    def rescan(self, *, trust_stat: bool) -> list[Change]:
        """List both directories; check every relevant name, and report the ones gone."""
        present: set[str] = set()
        out: list[Change] = []
        for d in self.dirs:
            for name in sorted(_fsio.list_names(d)):
                path = os.path.join(d, name)
                if self.relevant(path) is None:
                    continue
                present.add(path)
                # markers are tiny: always re-read; a session only when its stat moved
                c = self.check(path, trust_stat=trust_stat and self.dirs[d] == SESSION)
                if c is not None:
                    out.append(c)
        for path in sorted(set(self.seen) - present):
            c = self.check(path)
            if c is not None:
                out.append(c)
        return out


def _options(store: Store, poll: bool, debounce: float | None,
             poll_interval: float | None) -> tuple[dict[str, Any], float]:
    """watchfiles' keyword arguments for ``watch`` and ``awatch`` (filter added by the caller)."""
    cfg = store.config
    deb = cfg.watch_debounce if debounce is None else debounce
    every = cfg.watch_poll_interval if poll_interval is None else poll_interval
    tick_ms = max(50, int(every * 1000)) if poll else 500
    return {"debounce": max(1, int(deb * 1000)), "step": min(50, max(1, int(deb * 1000))),
            "rust_timeout": tick_ms, "yield_on_timeout": True, "force_polling": poll,
            "poll_delay_ms": max(10, int(every * 1000)), "recursive": False}, every


class _Rounds:
    """What one watcher round reports: the paths watchfiles gave, re-read; on the first round
    (and every ``every`` seconds when polling) a re-listing too. Shared by ``watch`` and
    ``awatch`` (which runs each round off the event loop)."""

    def __init__(self, w: _Watcher, poll: bool, every: float) -> None:
        self.w, self.poll, self.every = w, poll, every
        self.started = False
        self.last_scan = 0.0

    def keep(self, change: Any, path: str) -> bool:
        return self.w.relevant(path) is not None

    def round(self, raw: set[tuple[Any, str]]) -> list[Change]:
        changes: list[Change] = []
        for path in sorted({p for _, p in raw}):
            c = self.w.check(path)
            if c is not None:
                changes.append(c)
        now = time.monotonic()
        if not self.started or (self.poll and now - self.last_scan >= self.every):
            # first round: the watcher is running now, catch what happened before it started;
            # polling: re-list, as a same-second rewrite may be invisible to the poller
            changes.extend(self.w.rescan(trust_stat=self.started))
            self.started, self.last_scan = True, now
        return changes


def watch(store: Store, *, poll: bool = False, initial: bool = False,
          stop_event: StopEvent | None = None, debounce: float | None = None,
          poll_interval: float | None = None) -> Iterator[Change]:
    """Yield a ``Change`` for every marker, session and conflict copy that appears, changes or
    disappears, until ``stop_event`` is set (or the consumer stops iterating).

    ``initial=True`` first reports what is already there (as ``added``). ``poll=True`` polls
    (network filesystems). Start-up leaves no gap: the directories are listed before the watcher
    starts and again once it runs, so a change in between is reported, not lost.
    """
    import watchfiles

    opts, every = _options(store, poll, debounce, poll_interval)
    w = _Watcher(store)
    first = w.rescan(trust_stat=False)
    if initial:
        yield from first
    r = _Rounds(w, poll, every)
    for raw in watchfiles.watch(*w.dirs, watch_filter=r.keep, stop_event=stop_event,
                                raise_interrupt=False, **opts):
        yield from r.round(raw)
        if stop_event is not None and stop_event.is_set():
            return
