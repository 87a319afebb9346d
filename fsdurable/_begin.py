"""How a live turn begins (``TurnRun.begin``/``abegin``): the route lock taken and the begin
commit made under it.

The session's route lock is taken first and HELD — the returned ``ExitStack`` releases it, and
the ``TurnRun`` keeps it until the turn ends. Under the lock, the session is committed in progress
with its marker (``Store.begin_turn``: marker first) and ``turn_started`` names the driver, the
run id and the attempt id — before the driver calls any model. A session re-routed while the
lock was awaited is begun under its new route instead. ``resume=True`` continues a turn of the
same driver that a dead run left in progress (a new attempt id, the run id and ledger kept).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import attrs

from . import _events as ev
from ._errors import ConflictError, SessionNotFound
from ._layout import new_id
from ._model import Session, turn_driver
from ._store import Store

Change = Callable[[Session], Session]


def begin_locked(store: Store, session_id: str, content: str | None, *, driver: str,
                 attended: bool, change: Change | None, create: bool, source: str,
                 lock_timeout: float | None,
                 resume: bool) -> tuple[Session, contextlib.ExitStack]:
    """The begin commit under the route lock; the session and the lock's hold."""
    route = route_of(store, session_id, create=create, source=source)
    while True:
        hold = contextlib.ExitStack()
        hold.enter_context(store.lock(route, timeout=lock_timeout))
        try:
            got = start(store, session_id, content, route, driver, attended, change,
                        resume=resume)
        except BaseException:
            hold.close()
            raise
        if isinstance(got, str):  # re-routed while we waited: take its new route
            route = got
            hold.close()
            continue
        return got, hold


async def abegin_locked(store: Store, session_id: str, content: str | None, *, driver: str,
                        attended: bool, change: Change | None, create: bool, source: str,
                        lock_timeout: float | None) -> tuple[Session, contextlib.ExitStack]:
    """``begin_locked`` on an event loop (the lock wait cancellable, the disk work off the
    loop); a task cancelled during its begin commit cancels the turn that commit began."""
    from ._aio import run_sync
    from ._async import _acquire

    route = await run_sync(route_of, store, session_id, create=create, source=source)
    timeout = store.config.route_lock_timeout if lock_timeout is None else lock_timeout
    while True:
        held = await _acquire(store, route, timeout)
        hold = contextlib.ExitStack()
        hold.push(held.__exit__)
        made: list[Session] = []
        try:
            got = await run_sync(start, store, session_id, content, route, driver, attended,
                                 change, made)
        except BaseException:
            if made and made[0].turn is not None:
                tid = made[0].turn.id
                await run_sync(store.cancel, session_id, turn_id=tid)
            await run_sync(hold.close)
            raise
        if isinstance(got, str):
            route = got
            await run_sync(hold.close)
            continue
        return got, hold


def start(store: Store, sid: str, content: str | None, route: str, driver: str,
          attended: bool, change: Change | None, made: list[Session] | None = None, *,
          resume: bool = False) -> Session | str:
    """Under the route lock: the begin commit, or the session's new route if it was re-routed
    before the lock was taken."""
    cur = store.load(sid)
    if cur.in_progress and cur.turn is not None and resume and \
            turn_driver(cur) == driver and content is None:
        if cur.turn.route_key and cur.turn.route_key != route:
            return cur.turn.route_key  # the turn's own route is the lock to hold
        return continued(store, cur, driver, attended, change)
    current = cur.route_key
    if current != route:
        return current
    run_id, attempt_id = new_id(), new_id()

    def begun(s: Session) -> Session:
        assert s.turn is not None
        s = attrs.evolve(s, turn=attrs.evolve(s.turn, driver=driver, run_id=run_id,
                                              attempt_id=attempt_id))
        return change(s) if change is not None else s

    s = store.begin_turn(sid, content, route_key=route, change=begun,
                         detail={"driver": driver, "run_id": run_id, "attempt_id": attempt_id,
                                 "attended": attended})
    if made is not None:
        made.append(s)
    return s


def continued(store: Store, cur: Session, driver: str, attended: bool,
              change: Change | None) -> Session:
    """``begin(resume=True)`` on a turn a dead run left in progress: a new attempt id."""
    assert cur.turn is not None
    attempt_id, tid = new_id(), cur.turn.id

    def go(s: Session) -> Session:
        if not s.in_progress or s.turn is None or s.turn.id != tid:
            raise ConflictError(f"session {s.id!r} moved on", session_id=s.id, reason="moved")
        s = attrs.evolve(s, turn=attrs.evolve(s.turn, attempt_id=attempt_id))
        return change(s) if change is not None else s

    s = store.patch(cur.id, go)
    assert s.turn is not None
    store.emit(ev.TURN_STARTED, session_id=s.id, turn_id=tid, driver=driver,
               run_id=s.turn.run_id, attempt_id=attempt_id, attended=attended, continued=True)
    return s


def route_of(store: Store, sid: str, *, create: bool, source: str) -> str:
    """The session's route key (``create``: a missing session is created first)."""
    try:
        return store.load(sid).route_key
    except SessionNotFound:
        if not create:
            raise
        try:
            return store.create(sid, source=source).route_key
        except ConflictError:  # created meanwhile by another writer
            return store.load(sid).route_key


__all__ = ["abegin_locked", "begin_locked", "continued", "route_of", "start"]
