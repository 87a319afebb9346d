"""The store: a directory of sessions, markers and events, and the API over them.

Every change to a session goes through the one commit function (``_commit``), which keeps "in
progress => ``markers/<id>.json`` exists" true at every crash point. A marker whose session is
not in progress (a crash between the session write and the marker removal) is repaired, with a
``marker_repaired`` event, when recovery or doctor meets it — through the repair gate
(``_repair``), which sits above the store: reads here never repair. What this process last read
or wrote of each file is remembered by stat in a ``FileCache`` (``_filecache``). The turn API
(``begin_turn`` ... ``abandon_turn``) is ``_storeturns``'s, bound here as methods.
"""

from __future__ import annotations

import _thread
import os
import time

from . import _discovery, _fsio
from ._config import DEFAULT_CONFIG, Config
from ._errors import (
    ConflictError,
    FsDurableError,
    InvalidState,
    SessionNotFound,
    StorageError,
    UnreadableState,
)
from ._filecache import FileCache
from ._layout import (
    Layout,
    default_root,
    new_id,
    own_id,
    real_root,
    validate_node_id,
    validate_session_id,
)
from ._recordcodec import encode_manifest, parse_manifest
from ._records import Event, Manifest, Marker

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from typing import Any

    from . import _commit, _storelocks, _storeturns
    from . import _events as ev
    from ._model import Message, Session, Turn
    from ._watch import Change, StopEvent

# Opening a store and listing its markers imports only the standard library (DESIGN.md "Layers",
# tests/test_startup_imports.py): attrs, the model and the session codec are imported where a
# session is read or built; the commit function, the event log, the locks and the turn API (and
# contextlib) where a session is changed or an event written.


class _Later:
    """A method of ``Store`` defined in another module (``self`` the store), imported on its first
    lookup and then set on ``Store`` itself, where later lookups find a plain function: opening a
    store and listing its markers never loads the locks, the turn API, the commit function or
    the event log (tests/test_startup_imports.py)."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        fn = getattr(__import__(f"{__package__}.{self.module}", fromlist=[self.name]), self.name)
        setattr(Store, self.name, fn)
        return fn if obj is None else fn.__get__(obj, owner)


class Store:
    """A directory of sessions, markers and events. Thread-safe; many processes may share it."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *,
                 config: Config = DEFAULT_CONFIG, node_id: str | None = None,
                 clock: Callable[[], float] = time.time, create: bool = True) -> None:
        raw = os.fspath(root) if root is not None else default_root()
        self.layout = Layout(real_root(raw))
        self.root = self.layout.root
        self.config = config
        self.clock = clock
        self._durable = config.fsync
        self._node_id = validate_node_id(node_id) if node_id is not None else None
        self._cache = FileCache()  # the session and marker files this store read or wrote
        self._held = _thread._local()  # threading.local, likewise
        self._locks: Any = None
        self._log: ev.EventLog | None = None
        self._context: _commit.Context | None = None  # _ctx, made by the first commit
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
            if not _fsio.is_dir(d):  # there: nothing to write (and _fsio._write not loaded)
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
    def _ctx(self) -> _commit.Context:
        """The narrow view of this store the one commit function works over."""
        if self._context is None:
            from . import _commit

            self._context = _commit.Context(
                layout=self.layout, config=self.config, clock=self.clock, cache=self._cache,
                node=lambda: self.node_id, ident=self._disk_ident, marker=self._marker_raw)
        return self._context

    @property
    def log(self) -> ev.EventLog:
        if self._log is None:
            from . import _events as ev

            self._log = ev.EventLog(self.layout.events, self.node_id, durable=self._durable,
                                    max_file_bytes=self.config.max_file_bytes, clock=self.clock,
                                    note_fsync_after=self.config.event_note_fsync_after)
        return self._log

    def emit(self, code: str, **kw: Any) -> Event | None:
        """Record an event; a disk that refuses it never turns a decision into a crash (the
        in-process subscribers still see it)."""
        try:
            return self.log.emit(code, **kw)
        except (OSError, FsDurableError):
            return None

    def _note(self, code: str, **kw: Any) -> Event | None:
        """``emit`` for an event restating a commit already durable (``EventLog.note``: its
        line is fsynced with the log's next durable event, or with a later note once it has
        waited ``Config.event_note_fsync_after``, not on its own)."""
        try:
            return self.log.note(code, **kw)
        except (OSError, FsDurableError):
            return None

    def events(self, session_id: str | None = None) -> list[Event]:
        """Every node's events (optionally one session's, a validated id), oldest first."""
        return self.log.read(None if session_id is None else validate_session_id(session_id))

    def prune_events(self, *, now: float | None = None) -> dict[str, Any]:
        """Apply ``Config.event_retention`` to this node's event log: remove its day files older
        than the window (whole UTC days), with one ``events_pruned`` event saying what went.
        Never touches another node's log. ``doctor --repair`` calls this."""
        from . import _events as ev

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

    # ------------------------------------------------------------------ locks (_storelocks)

    if TYPE_CHECKING:
        _lockdir = _storelocks._lockdir
        lock = _storelocks.lock
        commit_lock = _storelocks.commit_lock
        _commit_lock = _storelocks._commit_lock
    else:  # bound on first use (_Later), as the turn API below
        _lockdir = _Later("_storelocks")
        lock = _Later("_storelocks")
        commit_lock = _Later("_storelocks")
        _commit_lock = _Later("_storelocks")

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

    def archive(self, session_id: str) -> tuple[Message, ...]:
        """The messages a compaction summary replaced (docs/storage.md): the first ``start``
        messages of the session's history chain, those the retention rule
        (``Config.archive_retention``) removed excepted. Reads the history;
        HistoryUnavailable if a segment is missing or does not match."""
        from ._history import History

        s = self.load(session_id)
        msgs = s.messages
        if not isinstance(msgs, History) or msgs.chain is None:
            return ()
        out: tuple[Message, ...] = msgs.chain.archive()
        return out

    def _read(self, sid: str) -> Session | None:
        from ._codec import parse_session

        path = self.layout.session(sid)
        try:
            data, st = _fsio.read_bounded(path, self.config.max_file_bytes)
            s, migrated = parse_session(data, path=path, session_id=sid,
                                        history_dir=self.layout.history_dir(sid),
                                        max_bytes=self.config.max_file_bytes)
        except FileNotFoundError:
            self._cache.forget(sid)
            return None
        except UnreadableState as e:  # reported, never moved by a read (the repair gate does)
            if e.reason == "wrong_id":
                self._refuse_case_alias(sid)
            e.session_id = sid
            raise
        # an old format has no current-format prefix to re-check: trust this read
        self._cache.saw_session(sid, st, s, trusted=migrated)
        return s

    def _load_known(self, sid: str, known: Session | None) -> Session:
        """``known`` (a session of ``sid`` this store read or committed) if the file on disk is
        still that commit, judged as the compare-and-swap judges it (``FileCache``: by stat, a
        recent stat confirmed from the file's first bytes); else ``load(sid)``. A caller that
        keeps the session it last committed pays one ``lstat`` (one open while the file is
        younger than 2 s) instead of a parse per read-modify-write; anything another process
        or a sync tool wrote is read again. (A caller that commits what it derives from
        ``known`` need not ask: the compare-and-swap judges the file alike, ConflictError if it
        is another commit.)"""
        if known is not None and known.id == sid and self._cached_ident(
                sid, self.layout.session(sid)) == (known.version, known.commit_id):
            return known
        return self.load(sid)

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

    def _cached_ident(self, sid: str, path: str) -> tuple[int, str] | None:
        """(version, commit id) of the file at ``path`` as the cache can prove it without a
        parse — a young file by one open (its stat and first bytes), else by ``lstat`` — and
        (0, "") if there is none; None: it must be read."""
        known = self._cache.racy_ident(sid, path)  # the commit just before: one open, no lstat
        if known is not None:
            return known
        st = _fsio.lstat(path)
        if st is None:
            self._cache.forget(sid)
            return 0, ""
        return self._cache.session_ident(sid, path, st)

    def _disk_version(self, sid: str) -> int:
        """Version on disk (0 if absent); see ``_disk_ident``."""
        return self._disk_ident(sid)[0]

    def _disk_ident(self, sid: str) -> tuple[int, str]:
        """Identity of the commit on disk: (version, commit id); (0, "") if absent. The file is
        re-read only if its stat changed, or if the stat is too recent to prove anything (then
        only its first bytes are read: version and commit id come first)."""
        path = self.layout.session(sid)
        known = self._cached_ident(sid, path)
        if known is not None:
            return known
        try:
            s = self._read(sid)  # UnreadableState: never write over a file we cannot read
        except SessionNotFound as e:  # the name is another session's (case-insensitive fs)
            raise ConflictError(e.message, session_id=sid, path=e.path,
                                reason="case_collision") from e
        return (s.version, s.commit_id) if s is not None else (0, "")

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
        self._cache.saw_markers(listing.markers)
        bad = sorted((sid, "refused" if isinstance(err, StorageError)
                      else (err.reason or "unreadable")) for sid, err in listing.bad)
        return [m for m, _ in listing.markers], bad

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
        self._cache.saw_marker(sid, st, m)
        return m

    # ------------------------------------------------------------------ the commit function

    def _commit_locked(self, new: Session, base: int, *, at_least: int = 0,
                       owner: str | None = None, base_commit_id: str | None = None,
                       turn: Turn | None = None) -> Session:
        """THE commit (``_commit.commit_locked``), under the session's commit lock."""
        from . import _commit

        return _commit.commit_locked(self._ctx, new, base, at_least=at_least, owner=owner,
                                     base_commit_id=base_commit_id, turn=turn)

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
               route_key: str | None = None, metadata: dict[str, Any] | None = None,
               lanes: Mapping[str, Sequence[Any]] | None = None) -> Session:
        """Create a new, idle session (ConflictError if the id is taken); ``lanes``: an
        adapter's first values, by lane (docs/storage.md, "Lanes")."""
        from ._model import Session

        sid = validate_session_id(session_id) if session_id is not None else new_id()
        now = self.clock()
        s = Session(id=sid, created_at=now, updated_at=now, source=source,
                    route_key=route_key if route_key is not None else f"session:{sid}",
                    metadata=dict(metadata or {}), lanes=dict(lanes or {}))
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
            self._cache.forget(sid)
        from . import _events as ev

        self.emit(ev.SESSION_DELETED, session_id=sid, version=disk)

    # ------------------------------------------------------------------ turn API (_storeturns)

    if TYPE_CHECKING:
        begin_turn = _storeturns.begin_turn
        checkpoint = _storeturns.checkpoint
        end_turn = _storeturns.end_turn
        cancel = _storeturns.cancel
        abandon_turn = _storeturns.abandon_turn
    else:
        begin_turn = _Later("_storeturns")
        checkpoint = _Later("_storeturns")
        end_turn = _Later("_storeturns")
        cancel = _Later("_storeturns")
        abandon_turn = _Later("_storeturns")
