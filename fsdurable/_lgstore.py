"""LangGraph threads on a store: a session per thread (its head) and an append-only log.

Framework-free (no langgraph import): ``fsdurable.langgraph`` turns LangGraph's checkpoints into
the serializer's typed bytes and calls this module; the bench and the crash tests drive it too.

On disk (format ``fsdurable/1``; docs/storage.md, "LangGraph threads")::

    sessions/lg-<hash>.json            the thread's document: metadata["langgraph"] = its head
                                       {thread_id, gen, seq, ns, gone, run, log: {n, at}} as of
                                       byte ``at`` of its log; committed by the one commit
                                       function when the RUN changes (begins, ends, pauses,
                                       fails), when the thread is created, and by deletions
    langgraph/lg-<hash>/<n>.lglog      the thread's log (``fsdurable._lglog``): one frame per
                                       record (a put's checkpoint, metadata and changed blobs;
                                       a put_writes call's writes), the last frame of each write
                                       carrying the head it leaves
    langgraph/lg-<hash>/<seq>.ckpt     records of the older layout (format lghead/1), read in
    langgraph/lg-<hash>/<seq>.writes   place (``legacy``) until a deletion copies them into a log

A thread's session id is ``lg-`` + 32 hex digits of its id's SHA-256 (no path escape, no case
clash). A put appends its frame and fdatasyncs the log: ONE fsync. The head is the document's,
or the last valid frame's at or after the document's ``at`` (the run state: the document's).
Deleting records copies the survivors into log n + 1, commits the head naming it, then removes
the old log. Files no document names go to quarantine/ (``_lgrepair``), never deleted.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from . import _fsio
from ._errors import SessionNotFound, UnreadableState
from ._layout import validate_session_id
from ._lglog import (
    ENDED,
    FAILED,
    HEAD_FORMAT,
    KINDS,
    PAUSED,
    PREFIX,
    RECORD_FORMAT,
    RUNNING,
    SOURCE,
    LogView,
    Record,
    Typed,
    _Index,
    describe,
    encode_frames,
    encode_header,
    frames_of,
    gen_of,
    head_of,
    log_name,
    new_head,
    new_record,
    parse_record,
    pending_writes,
    record_header,
    scan,
    thread_session_id,
    visible,
    with_state,
)
from ._lgrepair import set_aside, set_aside_dir
from ._model import Session
from ._store import Store

_HEADER_PEEK = 1 << 16
Encoded = tuple[bytes, Record]  # a record as written, and as read back (``new_record``)
# commits a thread's new head (and run state) for a graph run: (session, head, state, logged)
# -> session; ``logged``: the head is in the log already (the document may stay as it is)
Through = Callable[[Session, dict[str, Any], "str | None", bool], Session]
_CACHE = 256  # records kept parsed in memory (immutable: a cached record is never stale)



class Threads:
    """The LangGraph threads of one store. Thread-safe; many processes may share the store."""

    def __init__(self, store: Store, *, named: bool = False) -> None:
        self.store = store
        self.named = named
        self.layout = store.layout
        self._durable = store.config.fsync
        self._max = store.config.max_file_bytes
        self._mu = threading.Lock()
        self._vmu = threading.RLock()  # the logs' views (parsed in place, incrementally)
        self._records: OrderedDict[tuple[str, str, int], Record] = OrderedDict()
        self._index: dict[str, tuple[tuple[str, int], _Index]] = {}  # sid -> (era, index)
        self._logs: dict[str, tuple[tuple[str, int], LogView]] = {}  # sid -> ((gen, n), view)
        self._docs: dict[str, Session] = {}  # sid -> the document last read (checked by stat)
        self._paths: dict[tuple[str, int], str] = {}
        self._sids: dict[str, str] = {}  # thread id -> session id (a SHA-256 per put, else)

    # ------------------------------------------------------------------ reading

    def sid(self, thread_id: object) -> str:
        """The session id of a thread: ``thread_session_id`` — or, for a store whose threads
        are ``named`` (``FsDurableSaver(session_ids="thread")``), the thread id itself when it
        is a valid session id (``fsdurable show <thread id>``, one id everywhere)."""
        if isinstance(thread_id, str):
            sid = self._sids.get(thread_id)
            if sid is None:
                sid = self._sid(thread_id)
                if len(self._sids) > _CACHE:
                    self._sids.clear()
                self._sids[thread_id] = sid
            return sid
        return self._sid(thread_id)

    def _sid(self, thread_id: object) -> str:
        if self.named and isinstance(thread_id, str):
            try:
                return validate_session_id(thread_id)
            except ValueError:
                pass
        return thread_session_id(thread_id)

    def session(self, sid: str) -> Session | None:
        """The thread's document as on disk: the one last read or committed here if the file
        is still that commit (the store's stat check), else read again."""
        with self._mu:
            cached = self._docs.get(sid)
        try:
            s = self.store._load_known(sid, cached)
        except SessionNotFound:
            return None
        if s is cached:
            return s
        with self._mu:
            if len(self._docs) > _CACHE:
                self._docs.clear()
            self._docs[sid] = s
        return s

    def log_path(self, sid: str, n: int) -> str:
        with self._mu:
            path = self._paths.get((sid, n))
        if path is None:
            path = os.path.join(self.layout.lg_thread(sid), log_name(n))
            with self._mu:
                if len(self._paths) > _CACHE:
                    self._paths.clear()
                self._paths[(sid, n)] = path
        return path

    def _view(self, s: Session, h: dict[str, Any]) -> LogView | None:
        """The thread's log parsed up to its end (only the bytes new since the last call are
        read); None if it has no log file yet."""
        n = h["log"]["n"]
        era = (gen_of(s), n)
        with self._vmu:
            cached = self._logs.get(s.id)
            old = cached[1] if cached is not None and cached[0] == era else None
            view = scan(self.log_path(s.id, n), old, self._max)
            if view is None:
                self._logs.pop(s.id, None)
                return None
            if view.gen != era[0]:
                raise UnreadableState(f"the log of thread {s.id!r} is of another incarnation",
                                      session_id=s.id, reason="corrupt")
            self._logs[s.id] = (era, view)
            return view

    def head(self, s: Session) -> dict[str, Any]:
        """The thread's head as it stands: the last one its log holds (the document's run
        state and log number), or the document's. UnreadableState (reason ``log_short``) if the
        log ends before what the document counts (lost, or not delivered by a sync tool yet)."""
        h = head_of(s)
        log = h.get("log")
        if log is None:  # the record-file layout
            return h
        view = self._view(s, h)
        if view is None or view.head is None or view.head_end < log["at"]:
            if log["at"] == 0:
                return h
            raise UnreadableState(f"the log of thread {s.id!r} ends before byte {log['at']} "
                                  "its document counts", session_id=s.id, reason="log_short")
        return {**view.head, "run": h["run"], "log": {"n": log["n"], "at": view.head_end}}

    def _legacy(self, h: dict[str, Any]) -> int:
        """Records numbered up to this are files of the record-file layout."""
        return int(h.get("legacy", 0)) if "log" in h else int(h["seq"])

    def raw(self, s: Session, seq: int, kind: str) -> bytes:
        """The bytes of one record, from its file (older layout) or its frame."""
        h = head_of(s)
        if seq <= self._legacy(h):
            path = self.layout.lg_record(s.id, seq, kind)
            return _fsio.read_bounded(path, self._max)[0]
        with self._vmu:
            view = self._view(s, h)
            loc = view.locs.get(seq) if view is not None else None
        path = self.log_path(s.id, h["log"]["n"])
        if loc is None or loc[0] != kind:
            raise UnreadableState(f"record {seq} ({kind}) is not in {path}", path=path,
                                  session_id=s.id, reason="corrupt")
        data, _ = _fsio.read_span(path, loc[1], loc[2])
        if len(data) != loc[2]:
            raise UnreadableState(f"record {seq} of {path} is cut short", path=path,
                                  session_id=s.id, reason="corrupt")
        return data

    def record(self, s: Session, seq: int, kind: str) -> Record:
        """One record of the thread ``s`` (cached by the thread's incarnation and number: a
        record is never rewritten, a deletion copies it byte for byte)."""
        sid = s.id
        key = (sid, gen_of(s), seq)
        with self._mu:
            rec = self._records.get(key)
            if rec is not None:
                self._records.move_to_end(key)
                return rec
        rec = parse_record(self.raw(s, seq, kind), path=f"{sid}#{seq}.{kind}")
        with self._mu:
            self._records[key] = rec
            while len(self._records) > _CACHE:
                self._records.popitem(last=False)
        return rec

    def _peek(self, s: Session, seq: int, kind: str) -> dict[str, Any]:
        with self._mu:
            rec = self._records.get((s.id, gen_of(s), seq))
        if rec is not None:
            return rec.header
        path = self.layout.lg_record(s.id, seq, kind)
        data = _fsio.read_prefix(path, _HEADER_PEEK)
        if b"\n" not in data:
            return self.record(s, seq, kind).header
        return record_header(data, path)

    def present(self, s: Session, head: dict[str, Any], above: int = 0
                ) -> list[tuple[int, str, str, str, str | None]]:
        """(seq, kind, ns, checkpoint id, run id) of every record numbered ``above`` ..
        ``head["seq"]`` on disk (deleted ones included), in order."""
        seq, legacy = head["seq"], self._legacy(head)
        out = []
        if above < legacy:
            for name in _fsio.list_names(self.layout.lg_thread(s.id), follow=False):
                num, _, kind = name.partition(".")
                if kind in KINDS and len(num) == 12 and num.isdigit() \
                        and above < int(num) <= min(seq, legacy):
                    h = self._peek(s, int(num), kind)
                    out.append((int(num), kind, h["ns"], h["id"], h.get("run_id")))
        if "log" in head and seq > max(above, legacy):
            with self._vmu:
                view = self._view(s, head)
                locs = dict(view.locs) if view is not None else {}
            for n, loc in locs.items():
                if max(above, legacy) < n <= seq:
                    out.append((n, loc[0], loc[3], loc[4], loc[5]))
        return sorted(out)

    def index(self, s: Session) -> _Index:
        """Every visible record of the thread; only the records new since the last call are read."""
        head = self.head(s)
        seq, gone = head["seq"], frozenset(head["gone"])
        era = (gen_of(s), head.get("epoch", 0))  # a drop bumps the epoch
        with self._mu:
            cached = self._index.get(s.id)
        if cached is not None and cached[0] == era and cached[1].gone == gone \
                and cached[1].seq <= seq:
            idx = cached[1]
            if idx.seq == seq:
                return idx
            idx = attrs.evolve(idx, ckpts=dict(idx.ckpts), runs=dict(idx.runs),
                               writes={k: list(v) for k, v in idx.writes.items()})
        else:
            idx = _Index(0, gone)
        for n, kind, ns, ckid, run_id in self.present(s, head, idx.seq):
            if n in gone:
                continue
            if kind == "ckpt":
                idx.ckpts[(ns, ckid)] = n
                idx.runs[n] = run_id
            else:
                idx.writes.setdefault((ns, ckid), []).append(n)
        idx.seq = seq
        with self._mu:
            self._index[s.id] = (era, idx)
        return idx

    def checkpoint(self, s: Session, ns: str, ckid: str | None
                   ) -> tuple[Record, dict[str, Typed], list[tuple[str, str, Typed, str, int]]
                              ] | None:
        """A checkpoint (the latest of ``ns`` if ``ckid`` is None): its record, its blobs by
        channel, and its pending writes in ``writes_sort_key`` order."""
        head = self.head(s)
        entry = head["ns"].get(ns)
        if ckid is None or (entry is not None and entry["id"] == ckid):
            if entry is None:
                return None
            seq, wseqs = entry["seq"], entry["writes"]
        else:
            idx = self.index(s)
            got = idx.ckpts.get((ns, ckid))
            if got is None:
                return None
            seq, wseqs = got, idx.writes.get((ns, ckid), [])
        rec = self.record(s, seq, "ckpt")
        blobs: dict[str, Typed] = {}
        for ch, (bseq, ver) in rec.header["refs"].items():
            typed = self.record(s, bseq, "ckpt").blob(ch, ver)
            if typed is not None and typed[0] != "empty":
                blobs[ch] = typed
        return rec, blobs, self.writes_of(s, wseqs)

    def writes_of(self, s: Session, seqs: Iterable[int]) -> list[tuple[str, str, Typed, str, int]]:
        """Pending writes of those records (``_lglog.pending_writes``)."""
        return pending_writes(self.record(s, n, "writes") for n in sorted(seqs))

    def thread_ids(self) -> list[tuple[str, str]]:
        """(session id, thread id) of every thread, from one listing of ``sessions/``."""
        out = []
        for sid in self.store.sessions():
            if sid.startswith(PREFIX) or self.named:
                s = self.session(sid)
                if s is not None and (sid.startswith(PREFIX) or "langgraph" in s.metadata):
                    out.append((sid, head_of(s)["thread_id"]))
        return out

    # ------------------------------------------------------------------ writing

    def mutate(self, thread_id: str, fn: Callable[[Session | None, dict[str, Any], int],
                                                 tuple[list[tuple[str, Encoded]], dict[str, Any],
                                                       str | None] | None],
               through: Through | None = None) -> Session | None:
        """Under the thread's commit lock: ``fn(session, head, next_seq)`` returns the records to
        write (kind, ``new_record``'s bytes and record), the new head and the run state (None:
        unchanged) — or None for nothing to do. The records and the new head are appended to
        the log (one fdatasync); the document is committed — by ``through(session, head, state,
        logged)`` if given (the graph run's turn protocol), else by ``commit`` — when the thread
        is new, when the run state changes, or when no frame was written."""
        sid = self.sid(thread_id)
        with self.store.commit_lock(sid):
            s = self.session(sid)
            if s is None:  # files no document names: kept in quarantine/ (_lgrepair)
                self._clear_dir(sid, set_aside="no_session")
            head = self.head(s) if s is not None else new_head(str(thread_id))
            # head() brought the log's view up to date under this lock: no writer can append
            # meanwhile, so _append need not look at the file again
            scanned = s is not None and "log" in head
            out = fn(s, head, head["seq"] + 1)
            if out is None:
                return s
            records, new, state = out
            new = {**new, "format": HEAD_FORMAT}
            migrating = "log" not in head  # the record-file layout: the document must say so
            if migrating:
                new.update(legacy=head["seq"], log={"n": 0, "at": 0},
                           gen=gen_of(s) if s is not None else new["gen"])
            seq = head["seq"]
            frames = []
            for kind, enc in records:
                seq += 1
                frames.append((kind, seq, enc))
            new["seq"] = seq
            if frames:
                end = self._append(sid, new, frames, migrating=migrating, scanned=scanned)
                new["log"] = {**new["log"], "at": end}
            logged = bool(frames) and not migrating
            if through is not None and s is not None:
                return through(s, new, state, logged)
            if s is not None and logged \
                    and with_state(new, state)["run"] == head_of(s)["run"]:
                return s  # the log holds it: the document is not rewritten
            return self.commit(sid, s, new, state)

    def commit(self, sid: str, s: Session | None, head: dict[str, Any],
               state: str | None) -> Session:
        """Commit the head (and the run state) through the store's one commit function, outside
        any graph run (a new thread, a prune, a put by a caller that runs no graph). A turn in
        progress is left to the run that owns it: only the graph run's turn protocol
        (``through``) begins or ends one."""
        now = self.store.clock()
        if s is None:
            s = Session(id=sid, created_at=now, updated_at=now, source=SOURCE,
                        route_key=f"session:{sid}")
        new = attrs.evolve(s, metadata={**s.metadata, "langgraph": with_state(head, state)})
        return self.store.commit(new, s.version)

    def ensure(self, thread_id: str) -> Session:
        """The thread's session, created (with a new head) if missing."""
        got = self.mutate(thread_id, lambda s, h, _n: None if s is not None else ([], h, None))
        assert got is not None
        return got

    def _append(self, sid: str, new: dict[str, Any], frames: list[tuple[str, int, Encoded]],
                *, migrating: bool, scanned: bool = False) -> int:
        """Append ``frames`` (the last carrying ``new``) to the thread's log at its valid end,
        one fdatasync; the log is created (durably) first if missing (``scanned``: the caller
        holds the commit lock since its view was brought up to date). Returns its new end. What
        was appended is taken into the log's view and the record cache as encoded (never read
        back: tests/test_langgraph_log.py checks that a reader parses the same)."""
        n = new["log"]["n"]
        path = self.log_path(sid, n)
        head = {k: v for k, v in new.items() if k not in ("run", "log")}
        data, locs = frames_of([(kind, seq, raw, rec.header)
                                for kind, seq, (raw, rec) in frames], head)
        with self._vmu:
            cached = self._logs.get(sid)
            view = cached[1] if cached is not None and cached[0] == (new["gen"], n) else None
            if migrating:  # a log no document names (a migration a crash cut short)
                set_aside(self.store, sid, path, "migration_cut_short")
                view = None
            elif not (scanned and view is not None):
                view = scan(path, view, self._max)
            if view is None:  # no log yet, or one whose header a crash tore: nothing in it
                _fsio.makedirs(self.layout.lg_thread(sid), durable=self._durable)
                set_aside(self.store, sid, path, "torn_log")  # kept, never deleted
                _fsio.write_new(path, encode_header(new["thread_id"], new["gen"], n),
                                durable=self._durable)
                view = scan(path, None, self._max)
                assert view is not None
            view.cut()
            at = view.end
            end = _fsio.append_at(path, at, data, durable=self._durable)
            view.wrote(at, end, locs, head)
            self._logs[sid] = ((new["gen"], n), view)
        with self._mu:  # the records just written: the next put reads its parent's refs
            for _kind, seq, (_raw, rec) in frames:
                self._records[(sid, new["gen"], seq)] = rec
            while len(self._records) > _CACHE:
                self._records.popitem(last=False)
        return end

    def _clear_dir(self, sid: str, set_aside: str | None = None) -> None:
        """Remove the directory of a thread the caller deletes; ``set_aside``: one no document
        names, whose files go to quarantine/ with that reason instead (_lgrepair)."""
        d = self.layout.lg_thread(sid)
        if set_aside is not None:
            set_aside_dir(self.store, sid, d, set_aside)
        else:  # a planted symlink: refused by the listing, never followed
            for name in _fsio.list_names(d, follow=False):
                _fsio.unlink(f"{d}/{name}", durable=False)
            if _fsio.lstat(d) is not None:
                _fsio.rmdir(d, durable=self._durable)
        with self._mu:
            self._index.pop(sid, None)
            for key in [k for k in self._records if k[0] == sid]:
                del self._records[key]
        with self._vmu:
            self._logs.pop(sid, None)

    def delete(self, thread_id: str) -> bool:
        """Delete a thread: its session first (the one step that decides), then its records."""
        sid = self.sid(thread_id)
        with self.store.commit_lock(sid):
            existed = self.session(sid) is not None
            if existed:
                self.store.delete(sid)
            self._clear_dir(sid)
        return existed

    def drop(self, thread_id: str, choose: Callable[[dict[str, Any], _Index], set[int]]) -> None:
        """Delete some records of a thread: ``choose(head, index)`` names them. The records
        that stay — and the deleted ones a surviving checkpoint still reads a blob from, kept as
        ``gone`` — are copied into a new log (temp, fsync, rename); the head naming it is
        committed; then the old log (and any record file of the older layout) is removed. The
        head's latest checkpoint per namespace is recomputed."""
        sid = self.sid(thread_id)
        with self.store.commit_lock(sid):
            s = self.session(sid)
            if s is None:
                return
            head = self.head(s)
            idx = self.index(s)
            doomed = choose(head, idx)
            if not doomed:
                return
            gone = set(head["gone"]) | doomed
            ns_map: dict[str, dict[str, Any]] = {}
            for (ns, ckid), n in idx.ckpts.items():
                if n in gone:
                    continue
                cur = ns_map.get(ns)
                if cur is None or ckid > cur["id"]:
                    ws = [w for w in idx.writes.get((ns, ckid), []) if w not in gone]
                    ns_map[ns] = {"id": ckid, "seq": n, "writes": ws}
            needed: set[int] = set()
            for n in idx.ckpts.values():
                if n not in gone:
                    needed.update(b for b, _v in self.record(s, n, "ckpt").header["refs"].values())
            n_log = head["log"]["n"] + 1 if "log" in head else 0
            new = {k: v for k, v in head.items() if k not in ("legacy", "run", "log")}
            new.update(format=HEAD_FORMAT, ns=ns_map, gone=sorted(gone & needed),
                       epoch=head.get("epoch", 0) + 1)
            keep = [(kind, n, self.raw(s, n, kind)) for n, kind, *_ in self.present(s, head)
                    if n not in gone or n in needed]
            data = encode_header(head["thread_id"], head["gen"], n_log) + encode_frames(keep, new)
            path = self.log_path(sid, n_log)
            _fsio.makedirs(self.layout.lg_thread(sid), durable=self._durable)
            _fsio.write_atomic(path, data, durable=self._durable)
            new = {**new, "run": head["run"], "log": {"n": n_log, "at": len(data)}}
            still = s.in_progress and bool(ns_map)
            self.commit(sid, s, new, None if still else ENDED)
            d = self.layout.lg_thread(sid)
            old = [name for name in _fsio.list_names(d, follow=False)
                   if name != log_name(n_log) and not name.startswith("~")]
            for name in old:
                _fsio.unlink(f"{d}/{name}", durable=False)
            if old and self._durable:
                _fsio.fsync_dir(d)


__all__ = ["ENDED", "FAILED", "PAUSED", "PREFIX", "RECORD_FORMAT", "RUNNING", "SOURCE", "Encoded",
           "Record", "Threads", "Through", "Typed", "describe", "gen_of", "head_of", "new_head",
           "new_record", "parse_record", "thread_session_id", "visible", "with_state"]
