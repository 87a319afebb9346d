"""The store's locks API: a route's lock, held for the length of a turn, and a session's commit
lock, held for one commit and re-entrant within a thread. ``Store`` binds these functions as its
methods (``self`` is the store) on their first use, like the turn API (``_storeturns``): opening a
store and listing its markers loads neither this module nor contextlib. The lock files are
``_locks``'s (in the machine-local state dir, never in the store).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from ._layout import state_dir, validate_session_id
from ._locks import Locks, acquire, release

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    import contextlib
    from collections.abc import Iterator
    from typing import Any

    from ._store import Store


def _lockdir(self: Store) -> Any:
    if self._locks is None:
        self._locks = Locks(os.path.join(state_dir(self.root, real=True), "locks"))
    return self._locks


@contextmanager
def lock(self: Store, route_key: str, *, timeout: float | None = None) -> Iterator[None]:
    """Exclusive lock on a route (across threads and processes) for the length of a turn."""
    t = self.config.route_lock_timeout if timeout is None else timeout
    with self._lockdir().hold("route", route_key, timeout=t, poll=0.01):
        yield


def commit_lock(self: Store, session_id: str, *, timeout: float | None = None
                ) -> contextlib.AbstractContextManager[None]:
    """The short per-session lock every commit holds (re-entrant within a thread)."""
    return self._commit_lock(validate_session_id(session_id), timeout)


def _commit_lock(self: Store, sid: str, timeout: float | None = None) -> _CommitHold:
    return _CommitHold(self, sid, timeout)


class _CommitHold:
    """One hold of a session's commit lock (``_commit_lock``), re-entrant within a thread (a
    patch that migrates or quarantines takes it again): a class, not a generator, on
    ``_locks.acquire``/``release`` directly — every commit takes one (bench/commit.py,
    ``part_commit_lock``)."""

    __slots__ = ("f", "held", "key", "sid", "store", "timeout")

    def __init__(self, store: Store, sid: str, timeout: float | None) -> None:
        self.store, self.sid, self.timeout = store, sid, timeout
        self.f: Any = None

    def __enter__(self) -> None:
        # keyed by the lower-cased id: where the filesystem ignores case, "Bob" and "bob" are one
        # file, so they must be one lock (elsewhere sharing it costs nothing)
        store, key = self.store, self.sid.lower()
        mine = store._held.__dict__
        held: set[str] | None = mine.get("ids")
        pid = os.getpid()
        if held is None or mine["pid"] != pid:  # a forked child inherits the record, not
            held = mine["ids"] = set()          # the lock (``_locks`` closes its files)
            mine["pid"] = pid
        if key in held:  # re-entered by a patch that migrates or quarantines
            return
        t = store.config.commit_lock_timeout if self.timeout is None else self.timeout
        self.f = acquire(store._lockdir().path("commit", key), "commit", key, t,
                         session_id=self.sid)
        self.held, self.key = held, key  # no call in between: no handler runs
        try:  # Ctrl-C as the hold is recorded (a handler runs after the C call): no commit began,
            held.add(key)  # and ``with`` never calls ``__exit__`` for an ``__enter__`` that raised
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        f, self.f = self.f, None
        if f is not None:
            try:
                self.held.discard(self.key)
            finally:  # Ctrl-C as the record forgets the hold: the lock is given back still
                release(f)


__all__ = ["commit_lock", "lock"]
