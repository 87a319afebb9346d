"""The store's turn API: a turn's life as commits of its session, each with its event.

``begin_turn`` (in progress, marker first, before any model call), ``checkpoint``, ``end_turn``
(the marker removed after the session), ``cancel`` and ``abandon_turn`` (in-doubt calls to the
review queue, never dropped). ``Store`` binds these functions as its methods: ``self`` is the
store, and every change goes through its commit function (``Store.patch``/``commit``).
The event log (``_events``) is imported by the functions that write an event, not here: a
checkpoint writes none, and the first one of a process would pay for loading it.
"""

from __future__ import annotations

from ._commit import evolve
from ._errors import TurnStateError
from ._layout import new_id, validate_session_id

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ._model import Session
    from ._store import Store


def begin_turn(self: Store, session_id: str, content: str | None = None, *, role: str = "user",
               turn_id: str | None = None, route_key: str | None = None,
               change: Callable[[Session], Session] | None = None,
               detail: dict[str, Any] | None = None) -> Session:
    """Start a turn: commit in progress (marker first) BEFORE any model call.

    ``route_key``: the route lock the caller holds — the turn's route until it ends, even if
    the session's ``route_key`` changed since the caller looked (default: the session's).
    ``change(session)``: applied to the new in-progress session in the same commit (the turn
    protocol records the driver and the run's identity there). ``detail``: added to the
    ``turn_started`` event."""
    from . import _events as ev
    from ._model import Message, Turn, extended

    tid = turn_id or new_id()

    def start(s: Session) -> Session:
        if s.in_progress:
            running = s.turn.id if s.turn else "?"
            raise TurnStateError(
                f"session {s.id!r} already has a turn in progress (turn {running}): wait for "
                f"it, stop it with `fsdurable cancel {s.id}`, or if its process died let "
                "`fsdurable recover` (or the host's recover) settle it",
                session_id=s.id, reason="in_progress")
        now = self.clock()
        msgs = extended(s.messages, *((Message(role, content),) if content is not None else ()))
        new = evolve(s, in_progress=True, messages=msgs,
                     turn=Turn(id=tid, started_at=now, checkpoint_at=now,
                               route_key=s.route_key if route_key is None else route_key))
        return change(new) if change is not None else new

    s = self.patch(session_id, start)
    # the document just committed says what this event says: a note (``EventLog.note``)
    self._note(ev.TURN_STARTED, session_id=s.id, turn_id=tid, **(detail or {}))
    return s

def checkpoint(self: Store, session: Session, *, phase: str | None = None) -> Session:
    """Commit the turn's progress (ConflictError if the session moved on, e.g. cancelled)."""
    turn = session.turn
    if turn is None:
        raise TurnStateError(f"session {session.id!r} has no turn in progress",
                             session_id=session.id, reason="not_in_progress")
    t = evolve(turn, checkpoint_at=self.clock(), phase=phase or turn.phase)
    # ``commit`` of the session with its new turn, the turn put in by the commit function's own
    # copy (one copy of the session per checkpoint, not two)
    with self._commit_lock(validate_session_id(session.id)):
        return self._commit_locked(session, session.version, turn=t)

def end_turn(self: Store, session: Session, reply: str | None = None) -> Session:
    """Finish the turn: commit not in progress (marker removed after the session)."""
    from . import _events as ev
    from ._model import Message, extended

    turn = session.turn
    if turn is None:
        raise TurnStateError(f"session {session.id!r} has no turn in progress",
                             session_id=session.id, reason="not_in_progress")
    msgs = extended(session.messages,
                    *((Message("assistant", reply),) if reply is not None else ()))
    s = self.commit(evolve(session, in_progress=False, turn=None, messages=msgs),
                    session.version)
    # the document just committed says the turn ended: its line is a note, as turn_started's
    self._note(ev.TURN_COMPLETED, session_id=s.id, turn_id=turn.id)
    return s

def cancel(self: Store, session_id: str, *, turn_id: str | None = None) -> Session:
    """Cancel the turn in progress (``turn_id``: only that turn): it never comes back. No-op
    if none is in progress. An effectful call that may have run (its ledger entry still at
    ``intent``) stays on record and goes to the review queue (``fsdurable review``), never
    dropped silently."""
    from . import _events as ev
    from ._model import closed_turn

    cancelled: list[str] = []
    doubt: list[dict[str, Any]] = []

    def stop(s: Session) -> Session:
        if not s.in_progress or s.turn is None or turn_id not in (None, s.turn.id):
            return s
        cancelled[:] = [s.turn.id]
        new, doubt[:] = closed_turn(s, at=self.clock(), reason="cancelled")
        return new

    s = self.patch(session_id, stop)
    if cancelled:
        self.emit(ev.TURN_CANCELLED, session_id=s.id, turn_id=cancelled[0])
    if doubt:
        self.emit(ev.REVIEW_REQUIRED, session_id=s.id, turn_id=cancelled[0],
                  reason="cancelled", calls=doubt)
    return s

def abandon_turn(self: Store, session_id: str, turn_id: str, *, reason: str,
                 **detail: Any) -> Session | None:
    """Clear an interrupted turn that will not be resumed, with an
    ``interrupted_turn_abandoned`` event; its marker goes with it (the commit function).
    Its in-doubt calls go to the review queue first (``interrupted_turn_review_required``):
    a stale or exhausted turn's side effects are checked, never dropped with it.
    Returns None, touching nothing, if the session is gone, unreadable or no longer on that
    turn (a marker left then is the repair gate's: ``_repair.repair_marker``)."""
    from . import _events as ev
    from ._model import closed_turn

    sid = validate_session_id(session_id)
    doubt: list[dict[str, Any]] = []
    with self._commit_lock(sid):
        s = self._load_or_none(sid)
        if s is not None and s.in_progress and s.turn is not None and s.turn.id == turn_id:
            new, doubt = closed_turn(s, at=self.clock(), reason=reason)
            s = self._commit_locked(new, s.version)
        else:
            s = None
    self.emit(ev.ABANDONED, session_id=sid, turn_id=turn_id, reason=reason, **detail)
    if doubt:
        self.emit(ev.REVIEW_REQUIRED, session_id=sid, turn_id=turn_id, reason=reason,
                  calls=doubt)
    return s
