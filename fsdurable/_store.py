"""The store, and the one commit function every change to a session goes through.

Invariant: on disk, ``session.in_progress`` is true  =>  ``markers/<id>.json`` exists, at every
crash point. A marker whose session is not in progress (a crash between the session write and the
marker removal) is repaired, with a ``marker_repaired`` event, when recovery or doctor meets it —
through the repair gate (``_repair``), which sits above the store: reads here never repair.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import re
import time
from contextlib import contextmanager

from . import _discovery, _fsio
from . import _events as ev
from ._config import DEFAULT_CONFIG, Config
from ._errors import (
    ConflictError,
    DurabilityUnknown,
    FsDurableError,
    InvalidState,
    SessionNotFound,
    StorageError,
    TurnStateError,
    UnreadableState,
)
from ._layout import Layout, new_id, own_id, state_dir, validate_node_id, validate_session_id
from ._recordcodec import encode_manifest, encode_marker, parse_manifest
from ._records import Event, Manifest, Marker

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any, TypeVar

    from ._model import Session
    from ._watch import Change, StopEvent

    _T = TypeVar("_T")

# Opening a store and listing its markers imports only the standard library (DESIGN.md "Layers",
# tests/test_startup_imports.py): attrs, the model and the session codec are imported where a
# session is read or built.


def _evolve(inst: _T, **changes: Any) -> _T:
    """``attrs.evolve``, with attrs imported on first use (off the startup path)."""
    import attrs

    new: _T = attrs.evolve(inst, **changes)  # type: ignore[misc]
    return new


StatKey = tuple[int, int, int, int, int]
# A file's stat is trusted as "unchanged since we read or wrote it" only once its mtime is older
# than this: within one timestamp granule (1-2 s on coarse filesystems: ext4 with small inodes,
# FAT, many network filesystems) a replace by another process can repeat size, mtime and even the
# freed inode number. Until then the version is re-checked from the file's first bytes (git's
# "racily clean" rule).
_RACY_WINDOW = 2.0
# the file's first bytes as encode_session writes them: "version":N,"commit_id":"...", ...
_PREFIX_RE = re.compile(rb'"version":(\d+),"commit_id":"([0-9A-Za-z]*)",', re.S)


def _key(st: os.stat_result) -> StatKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _racy(st: os.stat_result) -> bool:
    return time.time() - st.st_mtime < _RACY_WINDOW


class _Seen:
    """What this process last read or wrote of one session file: its stat and its commit's
    identity (version and commit id)."""

    __slots__ = ("commit_id", "key", "racy", "version")

    def __init__(self, st: os.stat_result, s: Session) -> None:
        self.key = _key(st)
        self.version = s.version
        self.commit_id = s.commit_id
        self.racy = _racy(st)


def default_root() -> str:
    """``FSDURABLE_ROOT``, else ``<user data dir>/fsdurable/store``."""
    env = os.environ.get("FSDURABLE_ROOT")
    if env:
        return env
    import platformdirs

    return os.path.join(platformdirs.user_data_dir("fsdurable", appauthor=False), "store")


class Store:
    """A directory of sessions, markers and events. Thread-safe; many processes may share it."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *,
                 config: Config = DEFAULT_CONFIG, node_id: str | None = None,
                 clock: Callable[[], float] = time.time, create: bool = True) -> None:
        raw = os.fspath(root) if root is not None else default_root()
        self.layout = Layout(os.path.realpath(raw))
        self.root = self.layout.root
        self.config = config
        self.clock = clock
        self._durable = config.fsync
        self._node_id = validate_node_id(node_id) if node_id is not None else None
        self._mu = _thread.allocate_lock()  # threading.Lock without importing threading
        self._seen: dict[str, _Seen] = {}  # session id -> what we last read or wrote
        self._marks: dict[str, tuple[StatKey, Marker]] = {}  # markers this store read or wrote
        self._held = _thread._local()  # threading.local, likewise
        self._locks: Any = None
        self._log: ev.EventLog | None = None
        # why fsdurable.json could not be read at open (None: it could); see _open
        self.manifest_problem: str | None = None
        self.manifest = self._open(create)

    # ------------------------------------------------------------------ opening

    def _open(self, create: bool) -> Manifest:
        lay = self.layout
        st = _fsio.lstat(lay.manifest)
        if st is None:
            if not create:
                raise SessionNotFound(f"no fsdurable store at {lay.root}", path=lay.root,
                                      reason="no_store")
            _fsio.makedirs(lay.root, durable=self._durable)
        for d in (lay.sessions, lay.markers, lay.events, lay.quarantine):
            _fsio.makedirs(d, durable=self._durable)
        if st is not None:
            try:
                data, _ = _fsio.read_bounded(lay.manifest, 1 << 16)
                return parse_manifest(data, path=lay.manifest)
            except UnreadableState as e:
                if e.reason == "unknown_version":
                    raise  # a newer fsdurable's store: writing to it could corrupt it
                # opening never repairs: the store works on a stand-in (the manifest holds no
                # user data) and the file stays until the repair gate replaces it (recover,
                # doctor --repair: _repair.repair_manifest)
                self.manifest_problem = e.reason or "unreadable"
                return Manifest(store_id="", created_at=0.0)
        m = Manifest(store_id=new_id(), created_at=self.clock())
        try:
            _fsio.write_atomic(lay.manifest, encode_manifest(m), overwrite=False,
                               durable=self._durable)
        except FileExistsError:  # another process initialised it first
            data, _ = _fsio.read_bounded(lay.manifest, 1 << 16)
            return parse_manifest(data, path=lay.manifest)
        return m

    @property
    def node_id(self) -> str:
        if self._node_id is None:
            from ._layout import node_id

            self._node_id = node_id(self.root)
        return self._node_id

    @property
    def log(self) -> ev.EventLog:
        if self._log is None:
            self._log = ev.EventLog(self.layout.events, self.node_id, durable=self._durable,
                                    max_file_bytes=self.config.max_file_bytes, clock=self.clock)
        return self._log

    def emit(self, code: str, **kw: Any) -> Event | None:
        """Record an event; a disk that refuses it never turns a decision into a crash (the
        in-process subscribers still see it)."""
        try:
            return self.log.emit(code, **kw)
        except (OSError, FsDurableError):
            return None

    def events(self, session_id: str | None = None) -> list[Event]:
        """Every node's events (optionally one session's), oldest first."""
        return self.log.read(session_id)

    def prune_events(self, *, now: float | None = None) -> dict[str, Any]:
        """Apply ``Config.event_retention`` to this node's event log: remove its day files older
        than the window (whole UTC days), with one ``events_pruned`` event saying what went.
        Never touches another node's log. ``doctor --repair`` calls this."""
        at = self.clock() if now is None else now
        done = self.log.prune(at - self.config.event_retention)
        if done["files"]:
            self.emit(ev.EVENTS_PRUNED, retention=self.config.event_retention, **done)
        return done

    def watch(self, *, poll: bool = False, initial: bool = False,
              stop_event: StopEvent | None = None, debounce: float | None = None,
              poll_interval: float | None = None) -> Iterator[Change]:
        """Live changes of markers, sessions and conflict copies, judged by version (a generator
        of ``Change``; see ``fsdurable.watch`` for ``poll``, ``initial``, ``stop_event``)."""
        from ._watch import watch

        return watch(self, poll=poll, initial=initial, stop_event=stop_event,
                     debounce=debounce, poll_interval=poll_interval)

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``fn(event)`` for each event this process emits; returns an unsubscribe function."""
        return self.log.subscribe(fn)

    # ------------------------------------------------------------------ locks

    def _lockdir(self) -> Any:
        if self._locks is None:
            from ._locks import Locks

            self._locks = Locks(os.path.join(state_dir(self.root), "locks"))
        return self._locks

    @contextmanager
    def lock(self, route_key: str, *, timeout: float | None = None) -> Iterator[None]:
        """Exclusive lock on a route (across threads and processes) for the length of a turn."""
        t = self.config.route_lock_timeout if timeout is None else timeout
        with self._lockdir().hold("route", route_key, timeout=t, poll=0.01):
            yield

    def commit_lock(self, session_id: str, *, timeout: float | None = None
                    ) -> contextlib.AbstractContextManager[None]:
        """The short per-session lock every commit holds (re-entrant within a thread)."""
        return self._commit_lock(validate_session_id(session_id), timeout)

    @contextmanager
    def _commit_lock(self, sid: str, timeout: float | None = None) -> Iterator[None]:
        # keyed by the lower-cased id: where the filesystem ignores case, "Bob" and "bob" are one
        # file, so they must be one lock (elsewhere sharing it costs nothing)
        key = sid.lower()
        held: set[str] = self._held.__dict__.setdefault("ids", set())
        if key in held:  # re-entered by a patch that migrates or quarantines
            yield
            return
        t = self.config.commit_lock_timeout if timeout is None else timeout
        with self._lockdir().hold("commit", key, timeout=t, session_id=sid):
            held.add(key)
            try:
                yield
            finally:
                held.discard(key)

    # ------------------------------------------------------------------ reading

    def sessions(self) -> list[str]:
        """Ids of the sessions on disk, from one listing; foreign and temp files are skipped."""
        ids = [sid for sid in map(own_id, _fsio.list_names(self.layout.sessions)) if sid]
        ids.sort()
        return ids

    def exists(self, session_id: str) -> bool:
        """Is there a session file of exactly this id? (Where the filesystem ignores case, a
        file of an id differing only by case answers the name too: that one is not it.)"""
        sid = validate_session_id(session_id)
        st = _fsio.lstat(self.layout.session(sid))
        if st is None:
            return False
        if sid == sid.swapcase() or _fsio.lstat(self.layout.session(sid.swapcase())) is None:
            return True  # no letters, or the name's case matters here: the name is exact
        # both spellings answer (exfat-fuse even gives each its own inode number): one listing
        return sid + ".json" in _fsio.list_names(self.layout.sessions)

    def load(self, session_id: str) -> Session:
        """The session as on disk. Reads never repair: an unreadable file raises UnreadableState
        and stays where it is (``doctor --repair`` or recovery quarantine it, through the repair
        gate); an older format is migrated in memory (the next commit writes the current one)."""
        sid = validate_session_id(session_id)
        s = self._read(sid)
        if s is None:
            raise SessionNotFound(f"no session {sid!r}", session_id=sid,
                                  path=self.layout.session(sid), reason="missing")
        return s

    def _read(self, sid: str) -> Session | None:
        from ._codec import parse_session

        path = self.layout.session(sid)
        try:
            data, st = _fsio.read_bounded(path, self.config.max_file_bytes)
            s, migrated = parse_session(data, path=path, session_id=sid)
        except FileNotFoundError:
            self._forget(sid)
            return None
        except UnreadableState as e:  # reported, never moved by a read (the repair gate does)
            if e.reason == "wrong_id":
                self._refuse_case_alias(sid)
            e.session_id = sid
            raise
        seen = _Seen(st, s)
        if migrated:  # an old format has no current-format prefix to re-check: trust this read
            seen.racy = False
        with self._mu:
            self._seen[sid] = seen
        return s

    def _refuse_case_alias(self, sid: str) -> None:
        """On a case-insensitive filesystem (macOS and Windows defaults, exFAT) ``chat.json``
        opens ``Chat.json``: another session's good file, never to be moved. SessionNotFound
        (reason ``case_collision``) if ``sid``'s name is taken by an id differing only by case
        (one listing, on this rare path only)."""
        want = sid + ".json"
        names = _fsio.list_names(self.layout.sessions)
        if want in names:
            return  # the exact name exists: a genuinely wrong file
        other = next((n for n in names if n.lower() == want.lower()), None)
        if other is not None:
            raise SessionNotFound(
                f"no session {sid!r}: its file name is taken by session {other[:-5]!r} (this "
                "filesystem ignores case in names; ids that differ only by case are one file)",
                session_id=sid, path=os.path.join(self.layout.sessions, other),
                reason="case_collision")

    def _load_or_none(self, sid: str) -> Session | None:
        """The session, or None if it is missing or unreadable (left where it is)."""
        try:
            return self._read(sid)
        except UnreadableState:
            return None

    def _forget(self, sid: str) -> None:
        with self._mu:
            self._seen.pop(sid, None)
            self._marks.pop(sid, None)

    def _forget_marker(self, sid: str) -> None:
        with self._mu:
            self._marks.pop(sid, None)

    def _disk_version(self, sid: str) -> int:
        """Version on disk (0 if absent); see ``_disk_ident``."""
        return self._disk_ident(sid)[0]

    def _disk_ident(self, sid: str) -> tuple[int, str]:
        """Identity of the commit on disk: (version, commit id); (0, "") if absent. The file is
        re-read only if its stat changed, or if the stat is too recent to prove anything (then
        only its first bytes are read: version and commit id come first)."""
        path = self.layout.session(sid)
        st = _fsio.lstat(path)
        if st is None:
            self._forget(sid)
            return 0, ""
        with self._mu:
            seen = self._seen.get(sid)
        if seen is not None and seen.key == _key(st) and (
                not seen.racy or self._prefix_matches(path, seen)):
            seen.racy = _racy(st)
            return seen.version, seen.commit_id
        try:
            s = self._read(sid)  # UnreadableState: never write over a file we cannot read
        except SessionNotFound as e:  # the name is another session's (case-insensitive fs)
            raise ConflictError(e.message, session_id=sid, path=e.path,
                                reason="case_collision") from e
        return (s.version, s.commit_id) if s is not None else (0, "")

    def _prefix_matches(self, path: str, seen: _Seen) -> bool:
        """Do the file's first bytes still carry the version and commit id we cached?"""
        try:
            head = _fsio.read_prefix(path, 1024)
        except (OSError, UnreadableState):
            return False
        m = _PREFIX_RE.search(head)
        if m is None:
            return False
        return int(m.group(1)) == seen.version and m.group(2).decode() == seen.commit_id

    def interrupted(self) -> list[Marker]:
        """Every interrupted turn, from ONE listing of ``markers/`` and the markers themselves.

        Never reads ``sessions/``, never raises because of one bad marker and never changes
        anything on disk: a marker that cannot be read is left out (``scan_markers`` lists it;
        recovery and ``doctor --repair`` repair it through the repair gate). Oldest checkpoint
        first.
        """
        return self.scan_markers()[0]

    def scan_markers(self) -> tuple[list[Marker], list[tuple[str, str]]]:
        """One listing of ``markers/`` (``_discovery``): the good markers (oldest checkpoint
        first) and the bad ones as ``(session_id, reason)`` — unreadable, a newer format, or
        ``refused`` (the disk refused: EACCES, EIO). Reads only."""
        listing = _discovery.scan(self.layout, _discovery.marker_cap(self.config.max_file_bytes))
        out = []
        for m, st in listing.markers:
            with self._mu:
                self._marks[m.session_id] = (_key(st), m)
            out.append(m)
        bad = sorted((sid, "refused" if isinstance(err, StorageError)
                      else (err.reason or "unreadable")) for sid, err in listing.bad)
        return out, bad

    def read_marker(self, sid: str) -> Marker | None:
        """The marker of ``sid`` (None if there is none); UnreadableState if it is bad — a read
        never repairs (the repair gate rebuilds it from its session, keeping its owner)."""
        return self._marker_raw(validate_session_id(sid))

    def _marker_raw(self, sid: str) -> Marker | None:
        """Read and parse a marker (cached by stat); UnreadableState if it is bad."""
        got = _discovery.read_marker(self.layout, sid,
                                     _discovery.marker_cap(self.config.max_file_bytes))
        if got is None:
            return None
        m, st = got
        with self._mu:
            self._marks[sid] = (_key(st), m)
        return m

    # ------------------------------------------------------------------ the commit function

    def _commit_locked(self, new: Session, base: int, *, at_least: int = 0,
                       owner: str | None = None, base_commit_id: str | None = None) -> Session:
        """THE commit: every change to a session file goes through here, under its commit lock.

        1. compare-and-swap on the commit's identity: the file on disk must be the commit
           ``new`` was derived from — version ``base`` (0 = absent) and commit id
           ``base_commit_id`` (default ``new.commit_id``) — else ConflictError: a file a sync
           tool replaced with another node's commit of the same version is told apart;
        2. entering or staying in progress: write the marker first (fsync, rename, dir fsync)
           unless the one on disk already says the same (``Config.marker_refresh``);
        3. write the session (temp, fsync, rename, dir fsync);
        4. not in progress: remove the marker if one exists (unlink, dir fsync).
        A crash between any two steps leaves "in progress => marker exists" true; the reverse gap
        (a marker without an in-progress session) is repaired by recovery and doctor.
        Returns the session at its new version: ``base + 1``, or ``at_least`` if that is higher
        (resolving a sync conflict keeps versions increasing across every copy that was seen).
        The marker's node is ``owner`` if given (a claim, an adoption), else the node that owns
        the turn already, else (a new turn) this node: a commit never moves a turn silently.
        Raises InvalidState (nothing written) if the file would exceed ``max_file_bytes``.
        """
        from ._codec import encode_session

        sid = validate_session_id(new.id)
        disk, disk_commit = self._disk_ident(sid)
        want = new.commit_id if base_commit_id is None else base_commit_id
        if disk != base:
            raise ConflictError(
                f"session {sid!r} is at version {disk} on disk, not {base}",
                session_id=sid, path=self.layout.session(sid), reason="version_mismatch",
                expected=base, actual=disk,
            )
        if disk and disk_commit != want:
            raise ConflictError(
                f"session {sid!r} on disk is another commit of version {disk} (commit "
                f"{disk_commit or '-'}, not {want or '-'}): replaced, e.g. by a sync tool",
                session_id=sid, path=self.layout.session(sid), reason="commit_mismatch",
                expected=base, actual=disk,
            )
        s = _evolve(new, version=max(base + 1, at_least), updated_at=self.clock(),
                    commit_id=os.urandom(8).hex())
        m: Marker | None = None
        if s.turn is not None:
            m, s = self._marker_due(sid, s, owner)
        data = encode_session(s)
        if len(data) > self.config.max_file_bytes:  # it could never be read back
            raise InvalidState(
                f"session {sid!r} would be {len(data)} bytes, over max_file_bytes "
                f"({self.config.max_file_bytes}): compact it", session_id=sid,
                reason="too_large")
        mdata = b""
        if m is not None:  # every marker a commit writes is one discovery reads: checked first
            mdata = encode_marker(m)
            cap = _discovery.marker_cap(self.config.max_file_bytes)
            if len(mdata) > cap:
                raise InvalidState(
                    f"the marker of session {sid!r} would be {len(mdata)} bytes, over the {cap} "
                    f"discovery reads (source {len(m.source)}, route_key {len(m.route_key)}, "
                    f"turn id {len(m.turn_id)} characters)", session_id=sid, reason="too_large")
        mpath = self.layout.marker(sid)
        if m is not None:
            try:
                mst = _fsio.write_atomic(mpath, mdata, durable=self._durable)
            except DurabilityUnknown as e:  # the marker is in place; the session is not written
                with self._mu:
                    self._marks[sid] = (_key(e.stat), m)
                raise StorageError(f"session {sid!r} was not committed: {e.message}",
                                   path=mpath, session_id=sid, reason=e.reason,
                                   errno=e.errno) from e
            with self._mu:
                self._marks[sid] = (_key(mst), m)
        try:
            st = _fsio.write_atomic(self.layout.session(sid), data, durable=self._durable)
        except DurabilityUnknown as e:  # renamed: committed, say so (the caller never retries)
            with self._mu:
                self._seen[sid] = _Seen(e.stat, s)
            e.session, e.session_id = s, sid
            e.message = (f"session {sid!r} was committed at version {s.version} (err.session), "
                         f"but {e.message}")
            raise
        with self._mu:
            self._seen[sid] = _Seen(st, s)
        # committed (the session's rename and its directory fsync are done): from here nothing
        # raises as if it had not. A marker the disk refuses to remove is an orphan, the harmless
        # reverse gap recovery and doctor repair.
        if not s.in_progress and _fsio.lstat(mpath) is not None:
            with contextlib.suppress(OSError):
                _fsio.unlink(mpath, durable=self._durable)
            with self._mu:
                self._marks.pop(sid, None)
        return s

    def _marker_due(self, sid: str, s: Session, owner: str | None
                    ) -> tuple[Marker | None, Session]:
        """For in-progress ``s``: (the marker to write, or None if the one on disk says the same —
        same turn, node, route, source and attempts, checkpoint within ``marker_refresh``; ``s``
        with its turn's owner node and route filled in).

        The owner is ``owner`` if given (a claim, an adoption), else the one the session names,
        else the one the marker of the same turn names (a session of format 2), else this node.
        The turn's route is the one it started under (the session's if not yet set)."""
        turn = s.turn
        assert turn is not None
        st = _fsio.lstat(self.layout.marker(sid))
        cur: Marker | None = None
        if st is not None:
            with self._mu:
                cached = self._marks.get(sid)
            if cached is not None and cached[0] == _key(st):
                cur = cached[1]
            else:
                try:
                    cur = self._marker_raw(sid)
                except UnreadableState as e:
                    if e.reason == "unknown_version":
                        raise  # a newer fsdurable's marker: never written over
                    cur = None  # ours, and corrupt: the rewrite below replaces it
        same_turn = cur is not None and cur.turn_id == turn.id
        node = (owner or turn.node_id or (cur.node_id if cur is not None and same_turn else None)
                or self.node_id)
        route = turn.route_key or s.route_key
        if node != turn.node_id or route != turn.route_key:
            s = _evolve(s, turn=_evolve(turn, node_id=node, route_key=route))
            turn = s.turn
            assert turn is not None
        if (cur is not None and same_turn and cur.node_id == node
                and cur.route_key == route and cur.source == s.source
                and cur.resume_attempts == turn.resume_attempts
                # a marker time ahead of the turn's (the clock stepped back since) is rewritten:
                # else the gate would judge the turn by a time from the future
                and 0 <= turn.checkpoint_at - cur.checkpoint_at < self.config.marker_refresh):
            return None, s
        return Marker.of(s, node), s

    def commit(self, new: Session, base_version: int, *, at_least: int = 0,
               owner: str | None = None, base_commit_id: str | None = None) -> Session:
        """Commit ``new`` if the session on disk is the commit it was derived from: version
        ``base_version`` (0: must not exist) and commit id ``base_commit_id`` (default
        ``new.commit_id``, the id of the session ``new`` was loaded as); else ConflictError.

        The new version is ``base_version + 1``, or ``at_least`` if higher. ``owner`` makes that
        node the owner of the turn in progress (recovery's claim, an explicit adoption)."""
        with self._commit_lock(validate_session_id(new.id)):
            return self._commit_locked(new, base_version, at_least=at_least, owner=owner,
                                       base_commit_id=base_commit_id)

    # ------------------------------------------------------------------ session API

    def create(self, session_id: str | None = None, *, source: str = "api",
               route_key: str | None = None, metadata: dict[str, Any] | None = None) -> Session:
        """Create a new, idle session (ConflictError if the id is taken)."""
        from ._model import Session

        sid = validate_session_id(session_id) if session_id is not None else new_id()
        now = self.clock()
        s = Session(id=sid, created_at=now, updated_at=now, source=source,
                    route_key=route_key if route_key is not None else f"session:{sid}",
                    metadata=dict(metadata or {}))
        try:
            return self.commit(s, 0)
        except ConflictError as e:
            if e.reason == "case_collision":  # its own message names the other id
                raise
            raise ConflictError(f"session {sid!r} already exists (load it, or create another "
                                "id)", expected=0, actual=e.actual, session_id=sid,
                                reason="exists") from e

    def save(self, session: Session) -> Session:
        """Full save of a session loaded (or last returned) at ``session.version``."""
        return self.commit(session, session.version)

    def patch(self, session_id: str, fn: Callable[[Session], Session]) -> Session:
        """Read-modify-write under the session's commit lock: ``fn(current) -> new``."""
        from ._model import Session

        sid = validate_session_id(session_id)
        with self._commit_lock(sid):
            cur = self.load(sid)
            new = fn(cur)
            if new is cur:
                return cur
            if not isinstance(new, Session) or new.id != sid:
                raise InvalidState("patch function must return the same session", session_id=sid,
                                   reason="bad_patch")
            return self._commit_locked(new, cur.version)

    def delete(self, session_id: str, *, base_version: int | None = None) -> None:
        """Delete a session and its marker (explicit, with a ``session_deleted`` event)."""
        sid = validate_session_id(session_id)
        with self._commit_lock(sid):
            disk = self._disk_version(sid)
            if disk == 0:
                raise SessionNotFound(f"no session {sid!r}", session_id=sid, reason="missing")
            if base_version is not None and disk != base_version:
                raise ConflictError(f"session {sid!r} is at version {disk}, not {base_version}",
                                    session_id=sid, reason="version_mismatch",
                                    expected=base_version, actual=disk)
            # session first, marker second: a crash between leaves an orphan marker (repaired),
            # never an in-progress session without its marker
            _fsio.unlink(self.layout.session(sid), durable=self._durable)
            _fsio.unlink(self.layout.marker(sid), durable=self._durable)
            self._forget(sid)
        self.emit(ev.SESSION_DELETED, session_id=sid, version=disk)

    # ------------------------------------------------------------------ turn API

    def begin_turn(self, session_id: str, content: str | None = None, *, role: str = "user",
                   turn_id: str | None = None, route_key: str | None = None) -> Session:
        """Start a turn: commit in progress (marker first) BEFORE any model call.

        ``route_key``: the route lock the caller holds — the turn's route until it ends, even if
        the session's ``route_key`` changed since the caller looked (default: the session's)."""
        from ._model import Message, Turn

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
            msgs = s.messages + ((Message(role, content),) if content is not None else ())
            return _evolve(s, in_progress=True, messages=msgs,
                           turn=Turn(id=tid, started_at=now, checkpoint_at=now,
                                     route_key=s.route_key if route_key is None else route_key))

        s = self.patch(session_id, start)
        self.emit(ev.TURN_STARTED, session_id=s.id, turn_id=tid)
        return s

    def checkpoint(self, session: Session, *, phase: str | None = None) -> Session:
        """Commit the turn's progress (ConflictError if the session moved on, e.g. cancelled)."""
        turn = session.turn
        if turn is None:
            raise TurnStateError(f"session {session.id!r} has no turn in progress",
                                 session_id=session.id, reason="not_in_progress")
        t = _evolve(turn, checkpoint_at=self.clock(), phase=phase or turn.phase)
        return self.commit(_evolve(session, turn=t), session.version)

    def end_turn(self, session: Session, reply: str | None = None) -> Session:
        """Finish the turn: commit not in progress (marker removed after the session)."""
        from ._model import Message

        turn = session.turn
        if turn is None:
            raise TurnStateError(f"session {session.id!r} has no turn in progress",
                                 session_id=session.id, reason="not_in_progress")
        msgs = session.messages + ((Message("assistant", reply),) if reply is not None else ())
        s = self.commit(_evolve(session, in_progress=False, turn=None, messages=msgs),
                        session.version)
        self.emit(ev.TURN_COMPLETED, session_id=s.id, turn_id=turn.id)
        return s

    def cancel(self, session_id: str) -> Session:
        """Cancel the turn in progress: it never comes back. No-op if none is in progress.
        An effectful call that may have run (its ledger entry still at ``intent``) stays on
        record and goes to the review queue (``fsdurable review``), never dropped silently."""
        cancelled: list[str] = []
        doubt: list[dict[str, Any]] = []

        def stop(s: Session) -> Session:
            if not s.in_progress or s.turn is None:
                return s
            cancelled[:] = [s.turn.id]
            meta = s.metadata
            intents = [e for e in s.turn.ledger if e.status == "intent"]
            if intents:
                from ._model import REVIEW, review_record

                rr = review_record(s.turn.id, intents, at=self.clock(), reason="cancelled",
                                   previous=meta.get(REVIEW))
                doubt[:] = rr["calls"][-len(intents):]
                meta = {**meta, REVIEW: rr}
            return _evolve(s, in_progress=False, turn=None, metadata=meta)

        s = self.patch(session_id, stop)
        if cancelled:
            self.emit(ev.TURN_CANCELLED, session_id=s.id, turn_id=cancelled[0])
        if doubt:
            self.emit(ev.REVIEW_REQUIRED, session_id=s.id, turn_id=cancelled[0],
                      reason="cancelled", calls=doubt)
        return s

    def abandon_turn(self, session_id: str, turn_id: str, *, reason: str,
                     **detail: Any) -> Session | None:
        """Clear an interrupted turn that will not be resumed, with an
        ``interrupted_turn_abandoned`` event; its marker goes with it (the commit function).
        Returns None, touching nothing, if the session is gone, unreadable or no longer on that
        turn (a marker left then is the repair gate's: ``_repair.repair_marker``)."""
        sid = validate_session_id(session_id)
        with self._commit_lock(sid):
            s = self._load_or_none(sid)
            if s is not None and s.in_progress and s.turn is not None and s.turn.id == turn_id:
                s = self._commit_locked(_evolve(s, in_progress=False, turn=None), s.version)
            else:
                s = None
        self.emit(ev.ABANDONED, session_id=sid, turn_id=turn_id, reason=reason, **detail)
        return s
