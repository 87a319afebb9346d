"""``doctor``: the full scan of a store. It collects EVERY finding; it repairs only when asked.

Checks: the marker <=> in-progress biconditional both ways, that every session and marker parses
in the current format (and so validates against ``schemas/``), sync-tool conflict copies, leftover
temp files, symlinks, foreign files, permissions and the contents of ``quarantine/``.
Each repair goes through the store (the one commit function, or quarantine) and is an event.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from . import _events as ev
from . import _fsio
from ._codec import parse_session
from ._errors import FsDurableError, LockTimeout, StorageError, UnreadableState
from ._layout import NameKind, classify, own_id, validate_session_id
from ._model import Marker, Session
from ._store import Store

T = TypeVar("T")
PROBLEM = "problem"
INFO = "info"


@attrs.frozen
class Finding:
    """One thing doctor saw. ``repaired`` tells whether ``--repair`` fixed it (and how)."""

    code: str
    severity: str
    path: str
    detail: str
    session_id: str | None = None
    repair: str | None = None  # what --repair does (or did) about it; None: nothing automatic
    repaired: bool = False

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


class _Scan:
    def __init__(self, store: Store, repair: bool) -> None:
        self.store = store
        self.repair = repair
        self.findings: list[Finding] = []
        self.now = store.clock()

    def add(self, code: str, path: str, detail: str, *, severity: str = PROBLEM,
            session_id: str | None = None, repair: str | None = None,
            fix: Any = None) -> None:
        repaired = False
        if self.repair and fix is not None:
            try:
                fix()
                repaired = True
            except (FsDurableError, OSError) as e:
                detail = f"{detail}; repair failed: {e}"
        self.findings.append(Finding(code=code, severity=severity, path=path, detail=detail,
                                     session_id=session_id, repair=repair, repaired=repaired))

    def quarantine_fix(self, path: str, kind: str, reason: str, sid: str | None) -> Any:
        def fix() -> None:
            if self.store.quarantine(path, kind=kind, reason=reason, session_id=sid) is None:
                raise OSError(f"could not move {path} to quarantine")

        return fix

    # -------------------------------------------------------------- per directory

    def entries(self, directory: str, kind: str) -> dict[str, str]:
        """Check every entry of ``sessions/`` or ``markers/``; returns {id: path} of own files."""
        own: dict[str, str] = {}
        for name in sorted(_fsio.list_names(directory)):
            path = os.path.join(directory, name)
            st = _fsio.lstat(path)
            if st is None:
                continue
            k, sid = classify(name)
            if stat.S_ISLNK(st.st_mode):
                self.add("symlink", path, f"a symlink in {kind}s/ (never followed)",
                         session_id=sid, repair="move to quarantine",
                         fix=self.quarantine_fix(path, kind, "symlink", sid))
            elif k is NameKind.OWN and sid is not None:
                own[sid] = path
                self.permissions(path, st, 0o600)
            elif k is NameKind.CONFLICT and sid is not None:
                from ._sync import conflict_detail  # both versions, and what resolve keeps

                self.add("conflict_copy", path, conflict_detail(self.store, path, sid, kind),
                         session_id=sid)
            elif k is NameKind.TEMP:
                self.temp(path, name, kind)
            else:
                self.add("foreign_file", path, f"not an fsdurable file; {kind} listings skip it",
                         severity=INFO)
        return own

    def temp(self, path: str, name: str, kind: str) -> None:
        """Our temp files (``~<id>.json.<random>.tmp``) exist only while their session's commit
        lock is held: if the lock is free, the file is a crash leftover. A sync tool's temp file
        is the tool's business and only reported."""
        sid = own_id(name[1:].rsplit(".", 2)[0]) if name.startswith("~") else None
        if sid is None:
            self.add("sync_temp", path, "a sync tool's temp file (left to the tool)",
                     severity=INFO)
            return
        try:
            with self.store.commit_lock(sid, timeout=0):
                if _fsio.lstat(path) is None:
                    return  # its commit finished while we looked
                self.add("temp_leftover", path, "temp file left by an interrupted write",
                         session_id=sid, repair="move to quarantine",
                         fix=self.quarantine_fix(path, f"{kind}-temp", "temp_leftover", sid))
        except LockTimeout:
            self.add("temp_in_flight", path, "temp file of a commit in progress", session_id=sid,
                     severity=INFO)

    def permissions(self, path: str, st: os.stat_result, want: int) -> None:
        if not _fsio.MODES_HELD:  # Windows: no modes to hold, so none to report
            return
        mode = stat.S_IMODE(st.st_mode)
        if mode & ~want and _fsio.holds_modes(path):  # exFAT/FAT: the mount's mask, no problem
            self.add("permissions", path, f"mode {mode:o}, expected {want:o} or narrower",
                     repair=f"chmod {want:o}", fix=lambda: _fsio.chmod(path, want))

    def read(self, sid: str, path: str, kind: str, read: Callable[[], T | None],
             fix: Any) -> T | None:
        """Read one file without changing anything; every way it can be bad is a finding."""
        try:
            return read()
        except FileNotFoundError:
            return None
        except StorageError as e:  # EACCES, EIO: reported, left alone (it may be transient)
            self.add("refused_read", path, f"the disk refused to read it: {e.message}",
                     session_id=sid)
        except UnreadableState as e:
            self.add(f"unreadable_{kind}", path, f"{e.message} ({e.reason})", session_id=sid,
                     repair="move to quarantine" + ("; rebuild it if its session is in progress"
                                                    if kind == "marker" else ""),
                     fix=fix(e.reason or "unreadable"))
        return None

    def session(self, sid: str, path: str) -> Session | None:
        def read() -> tuple[Session, bool]:
            data, _ = _fsio.read_bounded(path, self.store.config.max_file_bytes)
            return parse_session(data, path=path, session_id=sid)

        got = self.read(sid, path, "session", read,
                        lambda why: self.quarantine_fix(path, "session", why, sid))
        if got is None:
            return None
        s, migrated = got
        from ._review import parked  # a parked call is a human's to answer: never "healthy"

        waiting = [c for c in parked(s) if c["answer"] is None]
        if waiting:
            self.add("review_required", path, f"{len(waiting)} call(s) may or may not have run "
                     f"({', '.join(str(c.get('tool')) for c in waiting)}): a human answers with "
                     f"`fsdurable review {sid} --ran|--did-not-run`", session_id=sid)
        if migrated:
            self.add("old_format", path, "an older session format", session_id=sid,
                     repair="migrate to the current format", fix=lambda: self.store.load(sid))
        return s

    def marker(self, sid: str, path: str) -> Marker | None:
        return self.read(sid, path, "marker", lambda: self.store._marker_raw(sid),
                         lambda why: self.marker_fix(sid))

    def run(self) -> list[Finding]:
        lay = self.store.layout
        for d in lay.directories():
            st = _fsio.lstat(d)
            if st is not None:
                self.permissions(d, st, 0o700)
        sessions = self.entries(lay.sessions, "session")
        markers = self.entries(lay.markers, "marker")
        parsed: dict[str, Session | None] = {}
        for sid, path in sessions.items():
            parsed[sid] = self.session(sid, path)
        for sid, path in markers.items():
            m = self.marker(sid, path)
            if m is None:
                continue
            s = parsed.get(sid)
            fix = self.repair_fix(sid)
            if sid not in sessions:
                self.add("orphan_marker", path, "marker without a session", session_id=sid,
                         repair="remove the marker (marker_repaired event)", fix=fix)
            elif s is not None and not s.in_progress:
                self.add("orphan_marker", path, "marker of a session not in progress",
                         session_id=sid, repair="remove the marker (marker_repaired event)",
                         fix=fix)
            elif s is not None and s.turn is not None and s.turn.id != m.turn_id:
                self.add("marker_mismatch", path,
                         f"marker for turn {m.turn_id}, session is on turn {s.turn.id}",
                         session_id=sid, repair="rewrite the marker", fix=fix)
        for sid, s in parsed.items():
            if s is not None and s.in_progress and sid not in markers:
                self.add("missing_marker", sessions[sid],
                         "session in progress without a marker: recovery would never find it",
                         session_id=sid, repair="write the marker", fix=self.repair_fix(sid))
        for name in sorted(_fsio.list_names(lay.quarantine)):
            self.add("quarantined", os.path.join(lay.quarantine, name),
                     "kept aside, never deleted: inspect, then remove it by hand", severity=INFO)
        return self.findings

    def marker_fix(self, sid: str) -> Any:
        def fix() -> None:
            self.store.read_marker(sid)  # quarantines it, then rebuilds or abandons the turn
            try:
                self.store._marker_raw(sid)
            except UnreadableState as e:
                raise OSError(f"marker of {sid} is still unreadable") from e

        return fix

    def repair_fix(self, sid: str) -> Any:
        def fix() -> None:
            self.store.repair_marker(validate_session_id(sid))

        return fix


def doctor(store: Store, *, repair: bool = False) -> list[Finding]:
    """Scan ``store`` and return every finding; with ``repair=True`` also fix what it can.

    Never raises because of a bad file. Problems with ``repaired=False`` remain.
    """
    findings = _Scan(store, repair).run()
    if repair and any(f.repaired for f in findings):
        store.emit(ev.REPAIRED, repaired=sum(f.repaired for f in findings),
                   codes=sorted({f.code for f in findings if f.repaired}))
    return findings


def problems(findings: list[Finding]) -> list[Finding]:
    """The findings that still need attention."""
    return [f for f in findings if f.severity == PROBLEM and not f.repaired]
