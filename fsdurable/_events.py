"""The event log: append-only JSON lines, one writer node per file, one directory per session.

Layout (docs/events.md): ``events/<node_id>/<session_id>/<YYYY-MM-DD>.jsonl``; events about no
session go to ``events/<node_id>/@store/<YYYY-MM-DD>.jsonl``. So ``events(session_id)`` opens one
directory per node — its cost is that session's events, never the rest of the store's history —
and retention (``Config.event_retention``, applied by ``doctor --repair``) drops whole day files
of this node only. A node directory written by fsdurable before this layout (flat
``<YYYY-MM-DD>.jsonl`` files) has no ``@layout2`` file: its day files are read as they are; this
node moves its own into ``@legacy/`` at its first append.

Every decision recovery makes, every quarantine and every repair is an event: nothing surprising
happens silently. Events are appended durably (fsync) and fanned out to in-process subscribers;
one that restates a commit already durable (``turn_started``, ``turn_completed``) is appended
with ``note``, its fsync left to the log's next durable append or to the next note once it has
waited ``Config.event_note_fsync_after`` (docs/events.md, "When a line is fsynced").
An event that cannot be written is never dropped silently: the subscribers still get it, it is
logged (``logging``, logger ``fsdurable``) and kept in memory, and written before the next event.
An appender always starts on a fresh line (a torn tail stays one bad line). A directory of the log
that is a symlink is never followed: the appender writes beside it (``<name>.alt``) and readers
report it. Readers stream files (no size cap, a per-line cap) and report what they could not read
as ``event_log_damaged`` events in their answer (never written: a read changes nothing).
"""

from __future__ import annotations

import _thread
import collections
import os
import re
import stat as _stat
import time

from . import _fsio
from ._errors import FsDurableError, StorageError, UnreadableState
from ._recordcodec import encode_event, parse_event
from ._records import Event

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    Subscriber = Callable[[Event], None]

# Event codes (the names hosts match on).
TURN_STARTED = "turn_started"
TURN_COMPLETED = "turn_completed"
TURN_CANCELLED = "turn_cancelled"
TURN_FAILED = "turn_failed"  # a host's programming error ended the turn (never retried)
TURN_PAUSED = "turn_paused"  # the run waits for a human (approval, interrupt): not interrupted
RESUMING = "interrupted_turn_resuming"
RESUMED = "interrupted_turn_resumed"
RESUME_FAILED = "interrupted_turn_resume_failed"
ABANDONED = "interrupted_turn_abandoned"
SKIPPED = "interrupted_turn_skipped"  # found, kept, not run (disabled, foreign, busy, unreadable)
REVIEW_REQUIRED = "interrupted_turn_review_required"
MARKER_REPAIRED = "marker_repaired"
SESSION_QUARANTINED = "session_quarantined"
FILE_QUARANTINED = "file_quarantined"
SESSION_MIGRATED = "session_migrated"
SESSION_DELETED = "session_deleted"
REPAIRED = "doctor_repaired"
ADOPTED = "interrupted_turn_adopted"
CONFLICT_RESOLVED = "conflict_resolved"
TOOL_REFUSED = "tool_refused"
CLOCK_STEP = "clock_step"  # a checkpoint time from the future: never used to judge staleness
SEGMENT_REMOVED = "segment_removed"  # the repair gate removed an unreferenced history segment
# an item log's rewrite failed after the change it followed was durable: left for the next one
ITEM_LOG_REWRITE_FAILED = "item_log_rewrite_failed"
HISTORY_UNREADABLE = "history_unreadable"  # doctor --repair met a history that does not read
EVENTS_PRUNED = "events_pruned"  # retention removed day files of this node's log
ARCHIVE_PRUNED = "archive_pruned"  # retention released a session's oldest archived segments
LOG_DAMAGED = "event_log_damaged"  # only in a reader's answer: part of the log could not be read
REVIEW_ANSWERED = "review_answered"  # a human said whether a parked call ran (fsdurable review)
REVIEW_RERUN = "review_rerun"  # a call answered "did not run" was run again, attended, same key

STORE_KEY = "@store"  # the directory of events about no session (not a valid session id)
LEGACY_KEY = "@legacy"  # this node's day files from the flat layout, moved aside at first append
LAYOUT_FLAG = "@layout2"  # an empty directory in a node directory written with this layout
ALT = ".alt"  # beside a directory that is a symlink or a file: never followed, never replaced
_DAY = r"(\d{4}-\d\d-\d\d)\.jsonl"
_DAY_RE: list[re.Pattern[str]] = []  # compiled on first use: an append to a migrated log needs none
# A line of the log is one event (a few hundred bytes); a longer one is skipped and reported.
MAX_LINE = 1 << 20
MAX_UNWRITTEN = 10_000  # events kept in memory while the disk refuses them (oldest dropped, logged)


def _day_file(name: str) -> re.Match[str] | None:
    """``name`` as a day file's (its day in group 1), or None."""
    if not _DAY_RE:
        _DAY_RE.append(re.compile(_DAY))
    return _DAY_RE[0].fullmatch(name)


def day_of(at: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(at))


class EventLog:
    """Appends this node's events; reads every node's."""

    def __init__(self, directory: str, node_id: str, *, durable: bool = True,
                 max_file_bytes: int = 64 * 1024 * 1024,
                 clock: Callable[[], float] = time.time,
                 note_fsync_after: float = 30.0) -> None:
        self.directory = directory
        self.node_id = node_id
        self._durable = durable
        self._max_line = min(max_file_bytes, MAX_LINE)
        self._clock = clock
        self._subs: list[Subscriber] = []
        self._lock = _thread.allocate_lock()  # subscribers (threading.Lock, without threading)
        self._write = _thread.allocate_lock()  # the appender's state below
        self._made: set[str] = set()  # directories this process made or checked
        self._node_dir: str | None = None
        self._unwritten: collections.deque[Event] = collections.deque()
        # day files a ``note`` appended to, not fsynced yet: when (``clock``) the oldest line
        # left unsynced was appended
        self._unsynced: dict[str, float] = {}
        self._note_fsync_after = note_fsync_after

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(event)`` for each event this process emits; returns an unsubscribe function."""
        with self._lock:
            self._subs.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subs:
                    self._subs.remove(fn)

        return unsubscribe

    @property
    def unwritten(self) -> int:
        """Events the disk refused, kept in memory and retried before the next one."""
        return len(self._unwritten)

    def emit(self, code: str, *, session_id: str | None = None, turn_id: str | None = None,
             reason: str | None = None, **detail: Any) -> Event:
        """Append one event durably, then tell the subscribers.

        If the disk refuses the append, the event still reaches the subscribers, is logged and
        kept for the next append, and the error is raised afterwards: a decision is never lost
        from view. The lines ``note`` left unsynced are fsynced with it.
        """
        return self._emit(code, session_id, turn_id, reason, detail, durable=True)

    def note(self, code: str, *, session_id: str | None = None, turn_id: str | None = None,
             reason: str | None = None, **detail: Any) -> Event:
        """``emit`` for an event that restates a commit already durable in its session
        (``turn_started``: the document in progress names the turn, its driver, run and
        attempt; ``turn_completed``: the document says the turn ended, its reply in its
        history): appended without an fsync of its own. The next durable append of this log
        (any ``emit``: a decision) fsyncs its file, and so does the next ``note`` once the
        oldest line left unsynced has waited ``note_fsync_after`` seconds. A process that dies
        loses nothing (the line is in the page cache); a power cut before that fsync may lose
        the line, never the turn (its marker and session are durable). The page the lines of
        a stretch of turns share is then written to storage once, not once a turn
        (docs/events.md)."""
        return self._emit(code, session_id, turn_id, reason, detail, durable=False)

    def _emit(self, code: str, session_id: str | None, turn_id: str | None,
              reason: str | None, detail: dict[str, Any], *, durable: bool) -> Event:
        ev = Event(at=self._clock(), code=code, session_id=session_id, turn_id=turn_id,
                   node_id=self.node_id, reason=reason, detail=detail)
        failure: FsDurableError | OSError | None = None
        with self._write:
            self._unwritten.append(ev)
            try:
                while self._unwritten:  # the ones the disk refused before go first, in order
                    head = self._unwritten[0]
                    self._append(head, durable=durable or head is not ev)
                    self._unwritten.popleft()
                self._sync_unsynced(all_=durable)
            except (FsDurableError, OSError) as e:
                failure = e
                while len(self._unwritten) > MAX_UNWRITTEN:
                    self._unwritten.popleft()
        if failure is not None:
            _warn(f"event {code!r} could not be written ({failure}); kept in memory "
                  f"({len(self._unwritten)} unwritten), retried with the next event")
        with self._lock:
            subs = list(self._subs)
        for fn in subs:
            fn(ev)
        if failure is not None:
            raise failure
        return ev

    # ------------------------------------------------------------------ appending

    def _append(self, ev: Event, *, durable: bool = True) -> None:
        d = self._session_dir(ev.session_id or STORE_KEY)
        path = os.path.join(d, day_of(ev.at) + ".jsonl")
        line = encode_event(ev)
        try:
            left = _fsio.append_line(path, line, durable=self._durable, lazy=not durable)
        except FileNotFoundError:  # its directory was pruned meanwhile: make it again
            self._made.discard(d)
            path = os.path.join(self._session_dir(ev.session_id or STORE_KEY),
                                day_of(ev.at) + ".jsonl")
            left = _fsio.append_line(path, line, durable=self._durable, lazy=not durable)
        if left:
            self._unsynced.setdefault(path, ev.at)
        else:  # fsynced: whatever a note left in this file is durable with it
            self._unsynced.pop(path, None)

    def _sync_unsynced(self, *, all_: bool) -> None:
        """fsync the day files ``note`` appended to since (a file pruned meanwhile is gone):
        every one (``all_``: a durable append), else those whose oldest unsynced line has
        waited ``note_fsync_after`` (or whose time is ahead of the clock: a clock set back
        never holds a line back longer). A refusal (EIO) is logged and the file kept for the
        next append: the event that asked is written, and a note's line is only as durable as
        the page cache until then."""
        if not self._unsynced:
            return
        now = self._clock()
        for path, since in list(self._unsynced.items()):
            if not all_ and since <= now < since + self._note_fsync_after:
                continue
            try:
                _fsio.fsync_file(path)
            except (FsDurableError, OSError) as e:
                _warn(f"the event log file {path} could not be fsynced ({e}); retried with the "
                      "next event")
                continue
            self._unsynced.pop(path, None)

    def _dir(self, parent: str, name: str) -> str:
        """``parent/name`` made (0700), or ``parent/name.alt`` if that is a symlink or a file."""
        for candidate in (os.path.join(parent, name), os.path.join(parent, name + ALT)):
            if candidate in self._made:
                return candidate
            try:
                _fsio.makedirs(candidate, durable=self._durable)
            except UnreadableState:  # a symlink or a file in the way: never followed
                continue
            if len(self._made) > 4096:
                self._made.clear()
            self._made.add(candidate)
            return candidate
        raise UnreadableState(f"{parent}/{name} and {name}{ALT} are both unusable",
                              path=os.path.join(parent, name), reason="not_a_directory")

    def _session_dir(self, key: str) -> str:
        if self._node_dir is None or self._node_dir not in self._made:
            self._node_dir = self._dir(self.directory, self.node_id)
            self._migrate(self._node_dir)
        return self._dir(self._node_dir, key)

    def _migrate(self, node_dir: str) -> None:
        """Move this node's flat day files (the layout before per-session directories) into
        ``@legacy/``, once: the empty directory ``@layout2`` records that it was done (a crash
        before it means the next process does it again; a moved file is not moved twice)."""
        flag = os.path.join(node_dir, LAYOUT_FLAG)
        if _fsio.lstat(flag) is not None:
            return
        names = [n for n in _fsio.list_names(node_dir) if _day_file(n)]
        if names:
            legacy = self._dir(node_dir, LEGACY_KEY)
            for n in names:
                src = os.path.join(node_dir, n)
                dst = os.path.join(legacy, n)
                if _fsio.lstat(dst) is None:
                    _fsio.rename(src, dst, durable=self._durable)
        _fsio.makedirs(flag, durable=self._durable)  # a directory: one atomic mkdir

    # ------------------------------------------------------------------ reading

    def read(self, session_id: str | None = None, *, since: float | None = None) -> list[Event]:
        """Every node's events (optionally for one session), oldest first; what could not be
        read is reported as ``event_log_damaged`` events at the end (never written)."""
        out: list[Event] = []
        damage: list[Event] = []
        for node, node_dir in self._nodes(damage):
            for path in self._files(node, node_dir, session_id, damage):
                for e in self._events_in(path, node, damage):
                    if ((session_id is None or e.session_id == session_id)
                            and (since is None or e.at >= since)):
                        out.append(e)
        out.sort(key=lambda e: e.at)
        return out + damage

    def _damaged(self, damage: list[Event], node: str | None, path: str, reason: str,
                 **detail: Any) -> None:
        damage.append(Event(at=self._clock(), code=LOG_DAMAGED, node_id=node, reason=reason,
                            detail={"path": path, **detail}))

    def _kind(self, path: str, node: str | None, damage: list[Event]) -> str | None:
        """"dir", "file", or None (missing; a symlink or another thing, reported)."""
        st = _fsio.lstat(path)
        if st is None:
            return None
        if _stat.S_ISDIR(st.st_mode):
            return "dir"
        if _stat.S_ISREG(st.st_mode):
            return "file"
        self._damaged(damage, node, path,
                      "symlink" if _stat.S_ISLNK(st.st_mode) else "not_a_file")
        return None

    def _nodes(self, damage: list[Event]) -> Iterator[tuple[str, str]]:
        for name in sorted(_fsio.list_names(self.directory)):
            if name.startswith(("~", ".")):
                continue
            path = os.path.join(self.directory, name)
            node = name[:-len(ALT)] if name.endswith(ALT) else name
            kind = self._kind(path, node, damage)
            if kind == "dir":
                yield node, path

    def _files(self, node: str, node_dir: str, session_id: str | None,
               damage: list[Event]) -> Iterator[str]:
        """The day files to read in one node directory: every one, or those that can hold
        ``session_id``'s events (its directory, the legacy ones) — never another session's."""
        if session_id is None:
            keys = sorted(_fsio.list_names(node_dir))
        else:
            keys = [session_id, session_id + ALT, LEGACY_KEY]
            if _fsio.lstat(os.path.join(node_dir, LAYOUT_FLAG)) is None:  # the flat layout
                keys += sorted(n for n in _fsio.list_names(node_dir) if _day_file(n))
        for key in keys:
            if key.startswith(("~", ".")) or key == LAYOUT_FLAG:
                continue
            path = os.path.join(node_dir, key)
            kind = self._kind(path, node, damage)
            if kind == "file" and _day_file(key):  # a flat-layout day file
                yield path
            elif kind == "dir":
                for name in sorted(_fsio.list_names(path)):
                    if _day_file(name):
                        yield os.path.join(path, name)

    def _events_in(self, path: str, node: str, damage: list[Event]) -> Iterator[Event]:
        bad = long = 0
        try:
            for line in _fsio.iter_lines(path, self._max_line):
                if line is None:
                    long += 1
                    continue
                if not line.strip():
                    continue
                try:
                    yield parse_event(line, path=path)
                except UnreadableState:
                    bad += 1  # a torn line (a crash mid-append), garbage
        except FileNotFoundError:
            return  # pruned meanwhile
        except (UnreadableState, StorageError) as e:
            self._damaged(damage, node, path, e.reason or "unreadable")
            return
        if bad or long:
            self._damaged(damage, node, path, "bad_lines", unreadable_lines=bad,
                          overlong_lines=long)

    # ------------------------------------------------------------------ retention

    def prune(self, before: float) -> dict[str, Any]:
        """Remove this node's day files of days before ``before`` (whole UTC days) and the
        directories they leave empty. Never touches another node's files. Returns what it did."""
        cutoff = day_of(before)
        files = 0
        size = 0
        sessions: set[str] = set()
        for name in sorted(_fsio.list_names(self.directory)):
            node = name[:-len(ALT)] if name.endswith(ALT) else name
            if node != self.node_id:
                continue  # another node's log is that node's to prune
            node_dir = os.path.join(self.directory, name)
            if _fsio.lstat(node_dir) is None or not _is_dir(node_dir):
                continue
            for key in sorted(_fsio.list_names(node_dir)):
                path = os.path.join(node_dir, key)
                if key == LAYOUT_FLAG or not _is_dir(path):
                    continue
                for day_file in sorted(_fsio.list_names(path)):
                    m = _day_file(day_file)
                    if m is None or m.group(1) >= cutoff:
                        continue
                    fp = os.path.join(path, day_file)
                    st = _fsio.lstat(fp)
                    if st is None or not _stat.S_ISREG(st.st_mode):
                        continue
                    if _fsio.unlink(fp, durable=self._durable):
                        files += 1
                        size += st.st_size
                        sessions.add(key)
                if key not in (STORE_KEY, LEGACY_KEY, LAYOUT_FLAG):
                    with self._write:
                        try:
                            if _fsio.rmdir(path, durable=self._durable):
                                self._made.discard(path)
                        except (FsDurableError, OSError):
                            pass  # an empty directory left behind costs nothing
        return {"before_day": cutoff, "files": files, "bytes": size,
                "sessions": len(sessions - {STORE_KEY, LEGACY_KEY})}


def _is_dir(path: str) -> bool:
    st = _fsio.lstat(path)
    return st is not None and _stat.S_ISDIR(st.st_mode)


def _warn(message: str) -> None:
    import logging  # only when the disk refused an event: off the startup path

    logging.getLogger("fsdurable").warning(message)
