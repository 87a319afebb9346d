"""One exception base; every subclass also inherits the builtin a caller would catch.

Each error carries data, not only a message: ``path``, ``session_id`` and ``reason`` (a short,
stable, machine-readable word such as ``"oversized"`` or ``"version_mismatch"``).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from typing import Any


class FsDurableError(Exception):
    """Base of every error fsdurable raises on purpose."""

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        session_id: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = os.fspath(path) if path is not None else None
        self.session_id = session_id
        self.reason = reason

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (the CLI prints it with ``--json``)."""
        return {
            "error": type(self).__name__,
            "message": self.message,
            "path": self.path,
            "session_id": self.session_id,
            "reason": self.reason,
        }


class ConflictError(FsDurableError, RuntimeError):
    """The session on disk is not at the base version the new state was derived from."""

    def __init__(
        self,
        message: str,
        *,
        expected: int | None = None,
        actual: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.expected = expected
        self.actual = actual


class SessionNotFound(FsDurableError, LookupError):
    """No session file for that id."""


class InvalidSessionId(FsDurableError, ValueError):
    """The id could escape its directory or be confused with a foreign file; nothing was touched."""


class InvalidRoot(FsDurableError, ValueError):
    """The store's root can be no directory: a symlink loop lies on its path (``reason``
    ``"symlink_loop"``). A bad argument, like a bad id; nothing was touched."""


class UnreadableState(FsDurableError, ValueError):
    """Not a valid fsdurable file (garbage, truncated, wrong type, unknown version, ...)."""


class HistoryUnavailable(FsDurableError, LookupError):
    """A session's history cannot be read (its document can): ``reason`` ``waiting_for_sync``
    (a segment not on disk yet — a sync tool may deliver it; never corrupt), ``history_corrupt``
    (a segment that does not match the digest naming it), ``history_short`` (the chain ends
    before what the document names), ``not_a_directory`` (a symlink or a file in place of
    ``history/`` or ``history/<id>/``: never read through) or ``needs_newer``. The document is
    never moved for it."""


class InvalidState(FsDurableError, ValueError):
    """A value cannot be stored (not JSON-serialisable, inconsistent turn state, ...)."""


class LockTimeout(FsDurableError, TimeoutError):
    """A route or commit lock could not be taken in time."""


class TurnStateError(FsDurableError, RuntimeError):
    """The operation does not fit the session's turn state (e.g. a turn already in progress)."""


class TurnStopped(TurnStateError):
    """The turn a driver is running was cancelled or superseded (here or in another process):
    the driver stops at this boundary. ``status``: ``cancelled`` or ``superseded`` (also its
    ``reason``); ``turn_id``: the turn that stopped."""

    def __init__(self, status: str, session_id: str, turn_id: str) -> None:
        super().__init__(f"turn {turn_id!r} of session {session_id!r} was {status}",
                         session_id=session_id, reason=status)
        self.status = status
        self.turn_id = turn_id


class HostError(FsDurableError, RuntimeError):
    """The host used the loop in a way that cannot work — an async model or tool called from the
    sync ``run`` inside a running event loop, a model that returns no ``Reply``. A programming
    error, not a crash: the turn ends ``failed`` (``turn_failed`` event), it is never left for
    recovery to retry."""


class StorageError(FsDurableError, OSError):
    """The disk refused an operation (ENOSPC, EIO, EACCES, read-only store, ...).

    ``errno`` is the underlying error number. The last committed state is left as it was.
    """

    def __init__(self, message: str, *, errno: int | None = None, **kw: Any) -> None:
        FsDurableError.__init__(self, message, **kw)
        self.errno = errno

    def __str__(self) -> str:
        return self.message


class DurabilityUnknown(StorageError):
    """The change IS made: the new content is in place under its name, but the disk refused to
    confirm it durable (EIO on the directory fsync after the rename), so a power cut might still
    undo it. For a commit, ``session`` is the session now on disk at its new version: do not
    retry the change (that would be a ConflictError); continue from ``session``.
    ``stat`` is the new file's stat."""

    def __init__(self, message: str, *, session: Any = None, stat: Any = None,
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        self.session = session
        self.stat = stat


__all__ = [
    "ConflictError",
    "DurabilityUnknown",
    "FsDurableError",
    "HistoryUnavailable",
    "HostError",
    "InvalidRoot",
    "InvalidSessionId",
    "InvalidState",
    "LockTimeout",
    "SessionNotFound",
    "StorageError",
    "TurnStateError",
    "TurnStopped",
    "UnreadableState",
]
