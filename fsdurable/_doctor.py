"""``doctor``: the full scan of a store. It collects EVERY finding; it repairs only when asked.

Checks: the marker <=> in-progress biconditional both ways, that every session and marker parses
in the current format (and so validates against ``schemas/``), sync-tool conflict copies, leftover
temp files, symlinks, foreign files, permissions and the contents of ``quarantine/``;
each session's history (a symlink or a file in place of ``history/`` or ``history/<id>/``:
``history_not_a_directory``, never followed), and each LangGraph thread's files against its
document (``_doctorlg``).
It also checks the event log (a day file over the size cap, a symlinked node directory: events
that would vanish silently). Each repair goes through the repair gate (``_repair``: the exact
file judged, never another node's file or a newer format, the replacement first) and is an event;
what the gate may not touch is reported (``waiting_for_sync``, ``needs_newer``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from . import _events as ev
from . import _fsio, _repair
from ._errors import (
    FsDurableError,
    HistoryUnavailable,
    LockTimeout,
    StorageError,
    UnreadableState,
)
from ._layout import own_id
from ._model import Marker, Session
from ._names import NameKind, classify
from ._store import Store

T = TypeVar("T")
PROBLEM = "problem"
INFO = "info"
# progress(stage, done, total): how far the scan has got, per stage ("session files", "marker
# files", "sessions", "markers", "history"), called once per file; a CLI draws it, a host may log it
ProgressFn = Callable[[str, int, int], None]


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


def _quiet(stage: str, done: int, total: int) -> None:
    """The progress callback of a scan nobody watches."""


class _Scan:
    def __init__(self, store: Store, repair: bool, progress: ProgressFn | None = None) -> None:
        self.store = store
        self.repair = repair
        self.progress = progress or _quiet
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

    def quarantine_fix(self, path: str, kind: str, reason: str, sid: str | None,
                       st: os.stat_result) -> Any:
        """Move exactly the file judged (``st``) into quarantine/, through the repair gate."""
        def fix() -> None:
            if _repair.quarantine(self.store, path, kind=kind, reason=reason, expect=st,
                                  session_id=sid) is None:
                raise OSError(f"could not move {path} to quarantine (changed, or refused)")

        return fix

    def gate_fix(self, act: Any) -> Any:
        """Run a repair-gate function; a repair it declines is a repair that failed."""
        def fix() -> None:
            done = act()
            if not done.acted and done.action != _repair.NOTHING:
                raise OSError(f"not repaired: {done.action} ({done.detail or done.reason})")

        return fix

    def declined(self, plan: Any, path: str) -> bool:
        """The gate's plan says hands off (another node's file, or a newer format): report it."""
        if plan.action == _repair.NEEDS_NEWER:
            self.add("needs_newer", path, f"written by a newer fsdurable ({plan.reason}): left "
                     "in place, never written; upgrade fsdurable here", session_id=plan.session_id)
            return True
        if plan.action == _repair.WAITING:
            self.add("waiting_for_sync", path, f"{plan.detail or plan.reason}; left untouched "
                     "(`fsdurable adopt` takes a turn over explicitly)", severity=INFO,
                     session_id=plan.session_id)
            return True
        return False

    # -------------------------------------------------------------- per directory

    def entries(self, directory: str, kind: str) -> dict[str, str]:
        """Check every entry of ``sessions/`` or ``markers/``; returns {id: path} of own files."""
        own: dict[str, str] = {}
        names = sorted(_fsio.list_names(directory))
        for n, name in enumerate(names, 1):
            self.progress(f"{kind} files", n, len(names))
            path = os.path.join(directory, name)
            st = _fsio.lstat(path)
            if st is None:
                continue
            k, sid = classify(name)
            if stat.S_ISLNK(st.st_mode):
                self.add("symlink", path, f"a symlink in {kind}s/ (never followed)",
                         session_id=sid, repair="move to quarantine",
                         fix=self.quarantine_fix(path, kind, "symlink", sid, st))
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
        st = _fsio.lstat(path)
        if sid is None or st is None:
            self.add("sync_temp", path, "a sync tool's temp file (left to the tool)",
                     severity=INFO)
            return
        self.own_temp(path, sid, kind, st)

    def own_temp(self, path: str, sid: str, kind: str, st: os.stat_result) -> None:
        """One of our temp files, of session ``sid``: a leftover if its commit lock is free."""
        try:
            with self.store.commit_lock(sid, timeout=0):
                if _fsio.lstat(path) is None:
                    return  # its commit finished while we looked
                self.add("temp_leftover", path, "temp file left by an interrupted write",
                         session_id=sid, repair="move to quarantine",
                         fix=self.quarantine_fix(path, f"{kind}-temp", "temp_leftover", sid,
                                                 st))
        except LockTimeout:
            self.add("temp_in_flight", path, "temp file of a commit in progress", session_id=sid,
                     severity=INFO)

    def permissions(self, path: str, st: os.stat_result, want: int) -> None:
        mode = stat.S_IMODE(st.st_mode)
        if mode & ~want and _fsio.holds_modes(path):  # exFAT/FAT, Windows: nothing to hold
            self.add("permissions", path, f"mode {mode:o}, expected {want:o} or narrower",
                     repair=f"chmod {want:o}", fix=lambda: _fsio.chmod(path, want))

    def read(self, sid: str, path: str, read: Callable[[], T | None]) -> T | None:
        """Read one file without changing anything; None if it is missing or refused."""
        try:
            return read()
        except FileNotFoundError:
            return None
        except StorageError as e:  # EACCES, EIO: reported, left alone (it may be transient)
            self.add("refused_read", path, f"the disk refused to read it: {e.message}",
                     session_id=sid)
        return None

    def session(self, sid: str, path: str) -> Session | None:
        got = self.read(sid, path, lambda: _repair.judge_session(self.store, sid))
        if got is None:
            return None
        j, s, migrated = got
        if s is not None:
            from ._review import ambiguous_answers, parked  # a human's to answer: never healthy

            for cid in ambiguous_answers(s):
                self.add("review_answer_ambiguous", path, f"an answer an older fsdurable "
                         f"recorded for call {cid!r} may be about several turns' calls of that "
                         "id: none carries it; each is answered again by its idempotency key "
                         f"(`fsdurable review {sid} --ran|--did-not-run --call KEY`)",
                         session_id=sid)

            waiting = [c for c in parked(s) if c["answer"] is None]
            if waiting:
                self.add("review_required", path, f"{len(waiting)} call(s) may or may not have "
                         f"run ({', '.join(str(c.get('tool')) for c in waiting)}): a human "
                         f"answers with `fsdurable review {sid} --ran|--did-not-run`",
                         session_id=sid)
        if j.error is None and not migrated:
            return s
        plan = _repair.repair_session(self.store, sid, dry_run=True)
        if self.declined(plan, path):
            return s
        if j.error is not None:
            self.add("unreadable_session", path, f"{j.error.message} ({j.reason})",
                     session_id=sid, repair="move to quarantine",
                     fix=self.gate_fix(lambda: _repair.repair_session(self.store, sid)))
        elif plan.action != _repair.NOTHING:
            self.add("old_format", path, "an older session format", session_id=sid,
                     repair="migrate to the current format",
                     fix=self.gate_fix(lambda: _repair.repair_session(self.store, sid)))
        return s

    def marker(self, sid: str, path: str) -> Marker | None:
        def read() -> Marker | None:
            try:
                return self.store.read_marker(sid)
            except UnreadableState as e:
                plan = _repair.repair_marker(self.store, sid, dry_run=True)
                if not self.declined(plan, path):
                    self.add("unreadable_marker", path, f"{e.message} ({e.reason})",
                             session_id=sid, repair="keep it in quarantine; rebuild it if its "
                             "session is in progress", fix=self.repair_fix(sid))
                return None

        return self.read(sid, path, read)

    def disagree(self, code: str, sid: str, path: str, detail: str, repair: str) -> None:
        """Marker and session disagree: the gate's plan decides what --repair may do."""
        plan = _repair.repair_marker(self.store, sid, dry_run=True)
        if not self.declined(plan, path):
            self.add(code, path, detail, session_id=sid, repair=repair,
                     fix=self.repair_fix(sid))

    def events(self) -> None:
        """Events that would vanish silently: what the log's own reader could not read (a
        symlinked node or session directory or day file — never followed, so those events are
        not read —, a file that is not a file, torn or overlong lines)."""
        for d in self.store.log.read():
            if d.code != ev.LOG_DAMAGED:
                continue
            path = str(d.detail.get("path", self.store.layout.events))
            st = _fsio.lstat(path)
            if d.reason == "symlink" and st is not None and stat.S_ISLNK(st.st_mode):
                self.add("events_symlink", path, "a symlink in the event log: never followed, "
                         "so events are neither written through it nor read from it",
                         repair="move to quarantine",
                         fix=self.quarantine_fix(path, "events", "symlink", None, st))
            elif d.reason == "bad_lines":  # a crash mid-append leaves a torn line: expected
                self.add("events_damaged", path, f"{d.detail.get('unreadable_lines', 0)} "
                         f"unreadable and {d.detail.get('overlong_lines', 0)} overlong line(s) "
                         "skipped; every other event of the file is read", severity=INFO)
            else:
                self.add("events_unreadable", path, f"part of the event log cannot be read "
                         f"({d.reason})", repair=None)

    def manifest(self) -> None:
        plan = _repair.repair_manifest(self.store, dry_run=True)
        path = self.store.layout.manifest
        if not self.declined(plan, path) and plan.action != _repair.NOTHING:
            self.add("manifest_unreadable", path, f"fsdurable.json cannot be read ({plan.reason}):"
                     " the store runs on a stand-in id", repair="keep it in quarantine and "
                     "write a new one", fix=self.gate_fix(
                         lambda: _repair.repair_manifest(self.store)))

    def run(self) -> list[Finding]:
        lay = self.store.layout
        self.manifest()
        for d in lay.directories():
            st = _fsio.lstat(d)
            if st is not None:
                self.permissions(d, st, 0o700)
        sessions = self.entries(lay.sessions, "session")
        markers = self.entries(lay.markers, "marker")
        parsed: dict[str, Session | None] = {}
        for n, (sid, path) in enumerate(sessions.items(), 1):
            parsed[sid] = self.session(sid, path)
            self.progress("sessions", n, len(sessions))
        for n, (sid, path) in enumerate(markers.items(), 1):
            self.progress("markers", n, len(markers))
            m = self.marker(sid, path)
            if m is None:
                continue
            s = parsed.get(sid)
            if sid not in sessions:
                self.disagree("orphan_marker", sid, path, "marker without a session",
                              "remove the marker (marker_repaired event)")
            elif s is not None and not s.in_progress:
                self.disagree("orphan_marker", sid, path, "marker of a session not in progress",
                              "remove the marker (marker_repaired event)")
            elif s is not None and s.turn is not None and s.turn.id != m.turn_id:
                self.disagree("marker_mismatch", sid, path,
                              f"marker for turn {m.turn_id}, session is on turn {s.turn.id}",
                              "rewrite the marker")
        self.history(parsed)
        from ._doctorlg import threads

        threads(self, parsed)
        for sid, s in parsed.items():
            if s is not None and s.in_progress and sid not in markers:
                self.disagree("missing_marker", sid, sessions[sid],
                              "session in progress without a marker: recovery would never "
                              "find it", "write the marker")
        self.events()
        from ._quarantine import listing

        for q in listing(self.store):
            self.add("quarantined", q.path, f"{q.describe()}; kept aside, never deleted: "
                     "`fsdurable quarantine restore NAME` after fixing it, or `--purge`",
                     severity=INFO, session_id=q.session_id)
        return self.findings

    def history(self, parsed: dict[str, Session | None]) -> None:
        """Each session's history reads whole, its archive included (docs/storage.md); the
        archive's retention; unreferenced segments."""
        from ._history import History
        from ._segments import (
            WOULD_REMOVE,
            history_sessions,
            prune_archive,
            refused_dirs,
            repair_history,
        )

        for a in refused_dirs(self.store):  # never followed: reported, left for a human
            st = _fsio.lstat(a.path)
            kind = "a symlink" if st is not None and stat.S_ISLNK(st.st_mode) else "a file"
            self.add("history_not_a_directory", a.path, f"{kind} in place of a history "
                     "directory, never followed: no segment is written, read, listed or removed "
                     "through it (a session whose history it held is history_unreadable); put "
                     "the real directory in its place", session_id=a.session_id)

        for n, (sid, s) in enumerate(parsed.items(), 1):
            self.progress("history", n, len(parsed))
            if s is None:
                continue
            try:
                for seq in (s.messages, *s.lanes.values()):
                    tuple(seq)  # every segment of each chain read and verified
                if isinstance(s.messages, History) and s.messages.chain is not None:
                    s.messages.chain.archive()  # and what a compaction replaced, still kept
                act = prune_archive(self.store, sid, dry_run=True)
                if act is not None:
                    self.add("archive_expired", act.path,
                             f"{act.detail} of the compaction archive, written longer ago "
                             "than Config.archive_retention", severity=INFO, session_id=sid,
                             repair="release them (archive_pruned event); this node's are then "
                             "removed (segment_removed events)",
                             fix=lambda sid=sid: prune_archive(self.store, sid))
                self.item_logs(sid, s)
            except HistoryUnavailable as e:
                waiting = e.reason == "waiting_for_sync"
                self.add("history_waiting" if waiting else "history_unreadable",
                         e.path or self.store.layout.session(sid),
                         f"{e.message} ({e.reason}); the document is left as it is",
                         severity=INFO if waiting else PROBLEM, session_id=sid)
                if self.repair and not waiting:  # never silently short: on the record
                    self.store.emit(ev.HISTORY_UNREADABLE, session_id=sid, reason=e.reason,
                                    path=e.path)
        for sid in history_sessions(self.store):
            acts = repair_history(self.store, sid, dry_run=True)
            if any(a.reason == "not_a_directory" for a in acts):
                continue  # reported above
            gone = [a for a in acts if a.action == WOULD_REMOVE]
            if gone:
                self.add("orphan_segments", self.store.layout.history_dir(sid),
                         f"{len(gone)} history segment(s) no document refers to (a commit that "
                         "died before its document, a rewritten history, a deleted session)",
                         severity=INFO, session_id=sid,
                         repair="remove them (segment_removed events)",
                         fix=lambda sid=sid: repair_history(self.store, sid))
            for a in acts:
                if a.action == _repair.WAITING:
                    self.declined(a, a.path)

    def item_logs(self, sid: str, s: Session) -> None:
        """Each item log the document names (docs/storage.md, "Item logs"): short (lost, or
        not delivered by a sync tool yet), unreadable, or with a torn tail (a write a crash cut
        short: readers ignore it, the next write cuts it). Reported only: nothing to repair."""
        from ._itemlog import log_name, named, refs, scan, short

        directory = self.store.layout.history_dir(sid)
        try:
            named_logs = refs(s)
        except UnreadableState as e:  # a malformed reference: the repair gate keeps every file
            self.add("item_log_unreadable", self.store.layout.session(sid),
                     f"{e.message}; left as it is", session_id=sid)
            return
        for ref in named_logs.values():
            path = f"{directory}/{log_name(ref['n'])}"
            try:
                _fsio.own_dirs(self.store.layout.history, directory)
                view = scan(path, None, self.store.config.max_file_bytes)
            except UnreadableState as e:
                if e.reason == "not_a_directory":
                    continue  # reported as history_not_a_directory
                self.add("item_log_unreadable", e.path or path, f"{e.message}; left as it is",
                         session_id=sid)
                continue
            if not named(view, ref):  # what every reader of the session meets (_itemlog)
                self.add("item_log_short", path, f"{short(path, view, ref).message}; left as "
                         "it is", session_id=sid)
            elif view is not None and view.torn:
                self.add("item_log_torn_tail", path, f"bytes after the last valid frame "
                         f"(byte {view.end}): a write a crash cut short; readers ignore them, "
                         "the next write cuts them", severity=INFO, session_id=sid)

    def repair_fix(self, sid: str) -> Any:
        return self.gate_fix(lambda: _repair.repair_marker(self.store, sid))


def doctor(store: Store, *, repair: bool = False,
           progress: ProgressFn | None = None) -> list[Finding]:
    """Scan ``store`` and return every finding; with ``repair=True`` also fix what it can.

    Never raises because of a bad file. Problems with ``repaired=False`` remain.
    ``progress(stage, done, total)``, if given, is called as the scan goes, once per file:
    ``session files`` and ``marker files`` (each directory entry checked), ``sessions`` (each
    session read and judged), ``markers``, ``history`` (each session's history verified),
    ``langgraph threads`` (each entry of ``langgraph/``),
    ``done`` counting from 1 up to ``total``. It should return at once
    (store the numbers, draw them elsewhere).
    """
    findings = _Scan(store, repair, progress).run()
    if repair:  # the event log's retention (Config.event_retention): this node's old day files
        try:
            pruned = store.prune_events()
        except (FsDurableError, OSError) as e:
            pruned = {"files": 0}
            findings.append(Finding(code="events_not_pruned", severity=PROBLEM,
                                    path=store.layout.events, repair="prune",
                                    detail=f"the event log's retention could not be applied: {e}"))
        if pruned["files"]:
            findings.append(Finding(code="events_pruned", severity=INFO, path=store.layout.events,
                                    detail=f"{pruned['files']} day files before "
                                    f"{pruned['before_day']} removed (event_retention)",
                                    repair="prune", repaired=True))
    if repair and any(f.repaired for f in findings):
        store.emit(ev.REPAIRED, repaired=sum(f.repaired for f in findings),
                   codes=sorted({f.code for f in findings if f.repaired}))
    return findings


def problems(findings: list[Finding]) -> list[Finding]:
    """The findings that still need attention."""
    return [f for f in findings if f.severity == PROBLEM and not f.repaired]
