"""``AsyncStore``: the awaitable twin of every ``Store`` operation that touches the disk or waits.

Disk work runs through ``fsdurable._aio.run_sync`` (a worker thread; shielded, so a task cancelled
in the middle of a commit waits for the commit to end and then sees ``CancelledError``: the commit
happened whole or not at all). The route lock is waited for ON the loop: one non-blocking try in a
worker thread, then ``await asyncio.sleep`` before the next, so the wait never blocks the event
loop, honours its timeout, and is cancellable; a lock taken by a try whose task was cancelled
meanwhile is released before the ``CancelledError`` propagates.

``AsyncStore`` holds a ``Store`` (``astore.store``): in-memory work (``subscribe``, ``config``,
``layout``) is done there directly.

This module imports ``asyncio``: it is never on the startup path (``import fsdurable`` loads it on
first use of ``fsdurable.AsyncStore``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from . import _events as ev
from ._aio import run_sync
from ._config import DEFAULT_CONFIG, Config
from ._errors import HistoryUnavailable, LockTimeout
from ._model import Event, Marker, Message, Session
from ._store import Store


def _with_history(load: Callable[[str], Session], session_id: str) -> Session:
    """``load(session_id)`` with its history read (in the calling thread)."""
    s = load(session_id)
    with contextlib.suppress(HistoryUnavailable):
        tuple(s.messages)  # the History keeps what it read
    return s

# The first pause between two tries of a held route lock, and the longest: short enough that a
# released lock is taken within ~50 ms, long enough that a long wait costs ~20 tries a second.
_POLL_FIRST = 0.002
_POLL_MAX = 0.05


class AsyncStore:
    """The asyncio face of a ``Store``: the same operations, awaited, never blocking the loop.

    Build it around a store (``AsyncStore(store)``) or open one off the loop
    (``await AsyncStore.open(root, ...)``, same arguments as ``Store``).
    """

    __slots__ = ("store",)

    def __init__(self, store: Store) -> None:
        self.store = store

    @classmethod
    async def open(cls, root: str | os.PathLike[str] | None = None, *,
                   config: Config = DEFAULT_CONFIG, node_id: str | None = None,
                   clock: Callable[[], float] = time.time, create: bool = True) -> AsyncStore:
        """Open (or create) the store at ``root`` in a worker thread."""
        def opened() -> Store:
            s = Store(root, config=config, node_id=node_id, clock=clock, create=create)
            s.node_id  # noqa: B018 — resolved here: it may read its file once
            return s

        return cls(await run_sync(opened))

    @property
    def root(self) -> str:
        return self.store.root

    @property
    def config(self) -> Config:
        return self.store.config

    @property
    def node_id(self) -> str:
        return self.store.node_id

    def __repr__(self) -> str:
        return f"AsyncStore({self.store.root!r})"

    # ------------------------------------------------------------------ sessions

    async def create(self, session_id: str | None = None, *, source: str = "api",
                     route_key: str | None = None, metadata: dict[str, Any] | None = None,
                     lanes: Mapping[str, Sequence[Any]] | None = None) -> Session:
        return await run_sync(self.store.create, session_id, source=source,
                              route_key=route_key, metadata=metadata, lanes=lanes)

    async def load(self, session_id: str) -> Session:
        """The session, its history read too, in the worker thread: ``session.messages`` is
        read from its segments on first use (docs/storage.md), which must not happen on the
        event loop. A history that does not read (HistoryUnavailable) raises when used."""
        return await run_sync(_with_history, self.store.load, session_id)

    async def archive(self, session_id: str) -> tuple[Message, ...]:
        return await run_sync(self.store.archive, session_id)

    async def exists(self, session_id: str) -> bool:
        return await run_sync(self.store.exists, session_id)

    async def sessions(self) -> list[str]:
        return await run_sync(self.store.sessions)

    async def save(self, session: Session) -> Session:
        return await run_sync(self.store.save, session)

    async def patch(self, session_id: str, fn: Callable[[Session], Session]) -> Session:
        """``Store.patch``; ``fn`` is a plain function, called in the worker thread under the
        session's commit lock (keep it short; it must not touch the event loop)."""
        return await run_sync(self.store.patch, session_id, fn)

    async def commit(self, new: Session, base_version: int, *, at_least: int = 0,
                     owner: str | None = None, base_commit_id: str | None = None) -> Session:
        return await run_sync(self.store.commit, new, base_version, at_least=at_least,
                              owner=owner, base_commit_id=base_commit_id)

    async def delete(self, session_id: str, *, base_version: int | None = None) -> None:
        await run_sync(self.store.delete, session_id, base_version=base_version)

    # ------------------------------------------------------------------ turns

    async def begin_turn(self, session_id: str, content: str | None = None, *,
                         role: str = "user", turn_id: str | None = None,
                         route_key: str | None = None,
                         change: Callable[[Session], Session] | None = None,
                         detail: dict[str, Any] | None = None) -> Session:
        return await run_sync(self.store.begin_turn, session_id, content, role=role,
                              turn_id=turn_id, route_key=route_key, change=change,
                              detail=detail)

    async def checkpoint(self, session: Session, *, phase: str | None = None) -> Session:
        return await run_sync(self.store.checkpoint, session, phase=phase)

    async def end_turn(self, session: Session, reply: str | None = None) -> Session:
        return await run_sync(self.store.end_turn, session, reply)

    async def cancel(self, session_id: str, *, turn_id: str | None = None) -> Session:
        return await run_sync(self.store.cancel, session_id, turn_id=turn_id)

    async def abandon_turn(self, session_id: str, turn_id: str, *, reason: str,
                           **detail: Any) -> Session | None:
        return await run_sync(self.store.abandon_turn, session_id, turn_id, reason=reason,
                              **detail)

    async def repair_marker(self, session_id: str) -> str | None:
        """The repair gate's ``repair_marker`` off the loop: the act it did (``wrote_marker``,
        ``rebuilt_marker``, ``removed_orphan``, ``quarantined``), else None."""
        from ._repair import repair_marker

        act = await run_sync(repair_marker, self.store, session_id)
        return act.action if act.acted else None

    async def quarantine(self, path: str, *, kind: str, reason: str,
                         session_id: str | None = None, code: str = ev.FILE_QUARANTINED,
                         expect: os.stat_result | None = None) -> str | None:
        """The repair gate's ``quarantine`` off the loop: moves ``path`` only if it is still the
        file judged (``expect``; None: nothing is moved)."""
        from ._repair import quarantine

        return await run_sync(quarantine, self.store, path, kind=kind, reason=reason,
                              expect=expect, session_id=session_id, code=code)

    async def interrupted(self) -> list[Marker]:
        return await run_sync(self.store.interrupted)

    async def scan_markers(self) -> tuple[list[Marker], list[tuple[str, str]]]:
        return await run_sync(self.store.scan_markers)

    async def read_marker(self, session_id: str) -> Marker | None:
        return await run_sync(self.store.read_marker, session_id)

    # ------------------------------------------------------------------ events

    async def events(self, session_id: str | None = None) -> list[Event]:
        return await run_sync(self.store.events, session_id)

    async def prune_events(self, *, now: float | None = None) -> dict[str, Any]:
        """``Store.prune_events`` (the event log's retention) off the loop."""
        return await run_sync(self.store.prune_events, now=now)

    async def emit(self, code: str, **kw: Any) -> Event | None:
        return await run_sync(self.store.emit, code, **kw)

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """In-process subscriber (no disk): called in the thread that emits, often a worker."""
        return self.store.subscribe(fn)

    # ------------------------------------------------------------------ locks

    @contextlib.asynccontextmanager
    async def lock(self, route_key: str, *, timeout: float | None = None) -> AsyncIterator[None]:
        """``async with astore.lock(route_key, timeout=...)``: the route lock of ``Store.lock``
        (the same lock: threads, processes and coroutines exclude each other), waited for
        without blocking the loop. ``LockTimeout`` after ``timeout`` seconds (default
        ``Config.route_lock_timeout``); a cancelled wait leaves the lock free."""
        t = self.store.config.route_lock_timeout if timeout is None else timeout
        held = await _acquire(self.store, route_key, t)
        try:
            yield
        finally:
            await run_sync(held.__exit__, None, None, None)

    # ------------------------------------------------------------------ watching

    async def awatch(self, *, poll: bool = False, initial: bool = False,
                     stop_event: asyncio.Event | None = None, debounce: float | None = None,
                     poll_interval: float | None = None) -> AsyncIterator[Any]:
        """``Store.watch`` for asyncio, on ``watchfiles.awatch``: an async iterator of ``Change``
        until ``stop_event`` is set (or the consumer stops). Each round's re-reads run off the
        loop."""
        import watchfiles

        from ._watch import _options, _Rounds, _Watcher

        opts, every = _options(self.store, poll, debounce, poll_interval)
        w = _Watcher(self.store)
        first = await run_sync(w.rescan, trust_stat=False)
        if initial:
            for c in first:
                yield c
        r = _Rounds(w, poll, every)
        async for raw in watchfiles.awatch(*w.dirs, watch_filter=r.keep, stop_event=stop_event,
                                           **opts):
            for c in await run_sync(r.round, raw):
                yield c
            if stop_event is not None and stop_event.is_set():
                return


StoreLike = Store | AsyncStore | str | os.PathLike[str] | None


def as_store(store: StoreLike) -> Store:
    """The ``Store`` behind what an adapter was given: a ``Store``, an ``AsyncStore``, or a root
    path (opened here and now — in a coroutine, pass ``await AsyncStore.open(root)`` instead to
    keep even the opening off the loop; None: ``$FSDURABLE_ROOT``)."""
    if isinstance(store, AsyncStore):
        return store.store
    if isinstance(store, Store):
        return store
    return Store(store)


async def _acquire(store: Store, route_key: str, timeout: float
                   ) -> contextlib.AbstractContextManager[None]:
    """Take the route lock by non-blocking tries off the loop, sleeping on the loop between
    them. Returns the entered context manager (exit it to release)."""
    got: list[contextlib.AbstractContextManager[None]] = []

    def attempt() -> LockTimeout | None:
        cm = store.lock(route_key, timeout=0)
        try:
            cm.__enter__()
        except LockTimeout as e:
            return e
        got.append(cm)
        return None

    deadline = time.monotonic() + timeout
    delay = _POLL_FIRST
    try:
        while (busy := await run_sync(attempt)) is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LockTimeout(f"route lock for {route_key!r} still held after {timeout:g}s",
                                  path=busy.path, reason="timeout")
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX)
    except BaseException:
        # cancelled while a try that succeeded was running (run_sync waited for it): release
        for cm in got:
            await run_sync(cm.__exit__, None, None, None)
        raise
    return got[0]


__all__ = ["AsyncStore"]
