"""What this process last read or wrote of each session and marker file, keyed by the file's stat
(stdlib only: the store's startup path holds one).

The commit function's compare-and-swap needs the identity of the commit on disk (version and
commit id) before every write; the marker check needs the marker on disk. Re-reading and parsing
a megabyte session file per commit to learn two fields would make every checkpoint cost the
whole transcript twice, so the store remembers, per file, the stat it saw and what it found.
A file whose stat is unchanged is the file it saw — once that stat is old enough to prove it
(below). Anything else is read again by the store.
"""

from __future__ import annotations

import _thread
import time

from . import _fsio
from ._errors import UnreadableState

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    import os
    from typing import Any

    from ._history import Chain, HistoryRef
    from ._model import Session
    from ._records import Marker

StatKey = tuple[int, int, int, int, int]
# A file's stat is trusted as "unchanged since we read or wrote it" only once its mtime is older
# than this: within one timestamp granule (1-2 s on coarse filesystems: ext4 with small inodes,
# FAT, many network filesystems) a replace by another process can repeat size, mtime and even the
# freed inode number. Until then the version is re-checked from the file's first bytes (git's
# "racily clean" rule): one open, whose fstat and read are of one inode (``racy_ident``; no
# lstat first), the bytes compared with those encode_session writes for version and commit id.
RACY_WINDOW = 2.0
# the file's first bytes as encode_session writes them: "version":N,"commit_id":"...", ...
# (the format and the id before them: no value a user chose comes first)
_VERSION = b'"version":'
_IDENT = b'"version":%d,"commit_id":"%s",'


def key(st: os.stat_result) -> StatKey:
    """What tells one file apart from its replacement: device, inode, size, mtime, ctime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def racy(st: os.stat_result) -> bool:
    return time.time() - st.st_mtime < RACY_WINDOW


class Seen:
    """What this process last read or wrote of one session file: its stat and its commit's
    identity (version and commit id)."""

    __slots__ = ("chain", "commit_id", "key", "racy", "ref", "version")

    def __init__(self, st: os.stat_result, s: Session) -> None:
        self.key = key(st)
        self.version = s.version
        self.commit_id = s.commit_id
        self.racy = racy(st)
        # the history chain the document names (weakly: what was read of it stays in memory
        # only while a session of the caller holds it); None if it names none
        c = getattr(s.messages, "chain", None)
        self.chain: Any = None
        self.ref: Any = None
        if c is not None:
            import weakref  # not at the top: opening a store and listing markers never needs it

            self.chain = weakref.ref(c)
            self.ref = c.ref


def _prefix_matches(path: str, seen: Seen) -> bool:
    """Do the file's first bytes still carry the version and commit id we cached?"""
    try:
        head = _fsio.read_prefix(path, 1024)
    except (OSError, UnreadableState):
        return False
    return _carries(head, seen)


def _carries(head: bytes, seen: Seen) -> bool:
    """Is ``head``'s first ``"version":`` followed by exactly the bytes ``encode_session``
    writes for ``seen``'s version and commit id? (A byte comparison: anything else, even the
    same numbers written otherwise, is read again.)"""
    at = head.find(_VERSION)
    return at >= 0 and head.startswith(_IDENT % (seen.version, seen.commit_id.encode()), at)


class FileCache:
    """Per session id: the session file seen (``Seen``) and the marker seen (its stat key and
    the parsed marker). Thread-safe; one per ``Store``."""

    __slots__ = ("_marks", "_mu", "_seen")

    def __init__(self) -> None:
        self._mu = _thread.allocate_lock()  # threading.Lock without importing threading
        self._seen: dict[str, Seen] = {}
        self._marks: dict[str, tuple[StatKey, Marker]] = {}

    def saw_session(self, sid: str, st: os.stat_result, s: Session, *,
                    trusted: bool = False) -> None:
        """``s`` is what the file of stat ``st`` holds (``trusted``: even while the stat is
        racy, e.g. an old format, which has no current-format prefix to re-check)."""
        seen = Seen(st, s)
        if trusted:
            seen.racy = False
        with self._mu:
            self._seen[sid] = seen

    def session_ident(self, sid: str, path: str, st: os.stat_result) -> tuple[int, str] | None:
        """The (version, commit id) of the session file of stat ``st`` if it is the one seen
        (a racy stat is confirmed from the file's first bytes); None: read it again."""
        with self._mu:
            seen = self._seen.get(sid)
        if seen is None or seen.key != key(st):
            return None
        if seen.racy:
            if not _prefix_matches(path, seen):
                return None
            seen.racy = racy(st)
        return seen.version, seen.commit_id

    def racy_ident(self, sid: str, path: str) -> tuple[int, str] | None:
        """``session_ident`` of a file last seen with a racy stat, with one open and no
        ``lstat``: the stat and the first bytes from the same descriptor (so of one inode).
        None: not seen, not racy, or not that file (the caller judges it by ``lstat``)."""
        with self._mu:
            seen = self._seen.get(sid)
        if seen is None or not seen.racy:
            return None
        try:
            head, st = _fsio.read_head(path, 1024)
        except (OSError, UnreadableState):
            return None
        if seen.key != key(st) or not _carries(head, seen):
            return None
        seen.racy = racy(st)
        return seen.version, seen.commit_id

    def chain(self, sid: str) -> tuple[HistoryRef | None, Chain | None]:
        """The history the session document last seen names (the commit function checked it
        is the one on disk): its ref (None: it names none) and its chain if still in memory."""
        with self._mu:
            seen = self._seen.get(sid)
        if seen is None or seen.chain is None:
            return None, None
        c: Chain | None = seen.chain()
        return seen.ref, c

    def saw_marker(self, sid: str, st: os.stat_result, m: Marker) -> None:
        with self._mu:
            self._marks[sid] = (key(st), m)

    def saw_markers(self, seen: list[tuple[Marker, os.stat_result]]) -> None:
        """``saw_marker`` of each (marker, stat) of a listing, under one hold of the lock."""
        marks = self._marks
        with self._mu:
            for m, st in seen:
                marks[m.session_id] = (key(st), m)

    def marker(self, sid: str, st: os.stat_result) -> Marker | None:
        """The marker seen in the file of stat ``st``; None if that file was not seen."""
        with self._mu:
            cached = self._marks.get(sid)
        return cached[1] if cached is not None and cached[0] == key(st) else None

    def forget(self, sid: str) -> None:
        with self._mu:
            self._seen.pop(sid, None)
            self._marks.pop(sid, None)

    def forget_marker(self, sid: str) -> None:
        with self._mu:
            self._marks.pop(sid, None)


__all__ = ["RACY_WINDOW", "FileCache", "Seen", "StatKey", "key", "racy"]
