"""The event log: ``events/<node_id>/<YYYY-MM-DD>.jsonl``, append-only, one writer node per file.

Every decision recovery makes, every quarantine and every repair is an event: nothing surprising
happens silently. Events are appended durably (fsync) and fanned out to in-process subscribers.
A torn last line (a crash mid-append) is skipped on read, never fatal.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import _fsio
from ._errors import FsDurableError, UnreadableState
from ._recordcodec import encode_event, parse_event
from ._records import Event

# Event codes (the names hosts match on).
TURN_STARTED = "turn_started"
TURN_COMPLETED = "turn_completed"
TURN_CANCELLED = "turn_cancelled"
TURN_FAILED = "turn_failed"  # a host's programming error ended the turn (never retried)
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
REVIEW_ANSWERED = "review_answered"  # a human said whether a parked call ran (fsdurable review)
REVIEW_RERUN = "review_rerun"  # a call answered "did not run" was run again, attended, same key

Subscriber = Callable[[Event], None]


class EventLog:
    """Appends this node's events; reads every node's."""

    def __init__(self, directory: str, node_id: str, *, durable: bool = True,
                 max_file_bytes: int = 64 * 1024 * 1024,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.node_id = node_id
        self._durable = durable
        self._max = max_file_bytes
        self._clock = clock
        self._subs: list[Subscriber] = []
        self._lock = threading.Lock()
        self._made: str | None = None

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(event)`` for each event this process emits; returns an unsubscribe function."""
        with self._lock:
            self._subs.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subs:
                    self._subs.remove(fn)

        return unsubscribe

    def emit(self, code: str, *, session_id: str | None = None, turn_id: str | None = None,
             reason: str | None = None, **detail: Any) -> Event:
        """Append one event durably, then tell the subscribers.

        If the disk refuses the append, the event still reaches the subscribers and the error is
        raised afterwards: a decision is never lost from view.
        """
        ev = Event(at=self._clock(), code=code, session_id=session_id, turn_id=turn_id,
                   node_id=self.node_id, reason=reason, detail=detail)
        failure: FsDurableError | OSError | None = None
        try:
            self._append(ev)
        except (FsDurableError, OSError) as e:
            failure = e
        with self._lock:
            subs = list(self._subs)
        for fn in subs:
            fn(ev)
        if failure is not None:
            raise failure
        return ev

    def _append(self, ev: Event) -> None:
        node_dir = os.path.join(self.directory, self.node_id)
        if self._made != node_dir:
            _fsio.makedirs(node_dir, durable=self._durable)
            self._made = node_dir
        day = time.strftime("%Y-%m-%d", time.gmtime(ev.at))
        _fsio.append_line(os.path.join(node_dir, day + ".jsonl"), encode_event(ev),
                          durable=self._durable)

    def read(self, session_id: str | None = None, *, since: float | None = None) -> list[Event]:
        """Every node's events (optionally for one session), oldest first."""
        out = [e for e in self._iter_all()
               if (session_id is None or e.session_id == session_id)
               and (since is None or e.at >= since)]
        out.sort(key=lambda e: e.at)
        return out

    def _iter_all(self) -> Iterator[Event]:
        for node in sorted(_fsio.list_names(self.directory)):
            node_dir = os.path.join(self.directory, node)
            for name in sorted(_fsio.list_names(node_dir)):
                if not name.endswith(".jsonl") or name.startswith(("~", ".")):
                    continue
                path = os.path.join(node_dir, name)
                try:
                    data, _ = _fsio.read_bounded(path, self._max)
                except (OSError, UnreadableState):
                    continue  # a log we cannot read is reported by doctor, never fatal here
                for line in data.split(b"\n"):
                    if not line.strip():
                        continue
                    try:
                        yield parse_event(line, path=path)
                    except UnreadableState:
                        continue  # a torn last line after a crash mid-append
