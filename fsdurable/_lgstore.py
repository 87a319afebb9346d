"""LangGraph threads on a store: a session per thread (its head) and append-only record files.

Framework-free (no langgraph import): ``fsdurable.langgraph`` turns LangGraph's checkpoints into
the serializer's typed bytes and calls this module; the bench and the crash tests drive it too.

On disk (format ``fsdurable/1``)::

    sessions/lg-<hash>.json            the thread's HEAD, committed by the one commit function:
                                       metadata["langgraph"] = {thread_id, seq, ns, gone, run}
    langgraph/lg-<hash>/<seq>.ckpt     one immutable record per put (checkpoint, metadata and the
                                       blobs of the channels it changed)
    langgraph/lg-<hash>/<seq>.writes   one immutable record per put_writes call

A thread id is an arbitrary string: its session id is ``lg-`` + the first 32 hex digits of its
SHA-256 (no path escape, no case clash, 128 bits); the id itself is kept in the head and in every
record. Records are numbered by the head's counter ``seq`` and written once, BEFORE the head
that counts them is committed; a record numbered above the head's ``seq`` was never
acknowledged and is invisible (and replaced by the next write). So a record needs no temp file:
it is created under its own name (O_EXCL, ``_fsio.write_new``), fsynced, and its directory
fsynced. A put therefore never rewrites the history: its cost is one record and one small head,
whatever the length of the thread. Deleting records (prune, delete_for_runs) first commits them
into the head's ``gone`` list (invisible from then on), then unlinks the ones no surviving
checkpoint needs a blob from.

Record file: one JSON header line (``schemas/lgrecord.schema.json``), then the
payload: the serializer's typed bytes of every part, concatenated, exactly as given (crc32 in
the header).
"""

from __future__ import annotations

import hashlib
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs

from . import _fsio
from ._errors import InvalidState, SessionNotFound, UnreadableState
from ._layout import new_id, validate_session_id
from ._model import Session
from ._store import Store

PREFIX = "lg-"
SOURCE = "langgraph"  # the thread sessions' source: recovery selects their markers by it
RECORD_FORMAT = "fsdurable.lgrecord/1"
HEAD_FORMAT = "fsdurable.lghead/1"
KINDS = ("ckpt", "writes")
Typed = tuple[str, bytes]
# run states kept in the head; only "running" is an interrupted run after a crash
RUNNING, ENDED, PAUSED, FAILED = "running", "ended", "paused", "failed"
_HEADER_PEEK = 1 << 16
# commits a thread's new head (and run state) for a graph run: (session, head, state) -> session
Through = Callable[[Session, dict[str, Any], "str | None"], Session]
_CACHE = 256  # records kept parsed in memory (immutable: a cached record is never stale)


def thread_session_id(thread_id: object) -> str:
    """The session id of a LangGraph thread id (``lg-`` + 128 bits of its SHA-256)."""
    raw = str(thread_id).encode("utf-8", "surrogatepass")
    return PREFIX + hashlib.sha256(raw).hexdigest()[:32]


@attrs.frozen
class Record:
    """One parsed record: its header and its parts' typed bytes."""

    header: dict[str, Any]
    parts: tuple[Typed, ...]

    def blob(self, channel: str, version: Any) -> Typed | None:
        for meta, typed in zip(self.header["parts"], self.parts, strict=True):
            if meta[0] == "blob" and meta[3] == channel and meta[4] == version:
                return typed
        return None


def encode_record(header: dict[str, Any], parts: list[tuple[list[Any], Typed]]) -> bytes:
    """Header line + payload; ``parts`` is ``[(descriptor tail, (type, bytes))]``."""
    import orjson

    metas, payload = [], []
    for tail, (typ, data) in parts:
        metas.append([tail[0], typ, len(data), *tail[1:]])
        payload.append(data)
    body = b"".join(payload)
    head = {"format": RECORD_FORMAT, **header, "parts": metas, "crc32": zlib.crc32(body)}
    return orjson.dumps(head) + b"\n" + body


def parse_record(data: bytes, *, path: str | None = None) -> Record:
    """Parse a record; UnreadableState (reason ``corrupt`` / ``unknown_version``) if it is not
    exactly what a writer wrote."""
    header = _header(data, path)
    body = memoryview(data)[data.index(b"\n") + 1:]
    if zlib.crc32(body) != header.get("crc32"):
        raise UnreadableState(f"record {path} fails its checksum", path=path, reason="corrupt")
    parts, at = [], 0
    for meta in header["parts"]:
        n = meta[2]
        parts.append((meta[1], bytes(body[at:at + n])))
        at += n
    if at != len(body):
        raise UnreadableState(f"record {path} has {len(body) - at} stray bytes", path=path,
                              reason="corrupt")
    return Record(header, tuple(parts))


def _header(data: bytes, path: str | None) -> dict[str, Any]:
    import orjson

    nl = data.find(b"\n")
    try:
        head = orjson.loads(data[:nl]) if nl >= 0 else None
    except orjson.JSONDecodeError:
        head = None
    if not isinstance(head, dict) or not isinstance(head.get("parts"), list):
        raise UnreadableState(f"record {path} has no header", path=path, reason="corrupt")
    if head.get("format") != RECORD_FORMAT:
        raise UnreadableState(f"record {path} is {head.get('format')!r}", path=path,
                              reason="unknown_version")
    return head


@attrs.define
class _Index:
    """Every visible record of one thread, by checkpoint (built from one listing)."""

    seq: int
    gone: frozenset[int]
    ckpts: dict[tuple[str, str], int] = attrs.Factory(dict)  # (ns, id) -> seq
    writes: dict[tuple[str, str], list[int]] = attrs.Factory(dict)
    runs: dict[int, str | None] = attrs.Factory(dict)  # ckpt seq -> run id


def new_head(thread_id: str) -> dict[str, Any]:
    """A new thread's head. ``gen``: this incarnation of the thread — a thread deleted and
    started again under the same id (its records numbered from 1 again) is another ``gen``,
    so no cache keyed by it answers from the deleted thread's records."""
    return {"format": HEAD_FORMAT, "thread_id": thread_id, "gen": new_id(), "seq": 0,
            "epoch": 0, "ns": {}, "gone": [], "run": {"state": ENDED, "run_id": None}}


def gen_of(s: Session) -> str:
    """The thread's incarnation (a head written before ``gen`` existed: its creation time)."""
    gen = head_of(s).get("gen")
    return gen if isinstance(gen, str) else repr(s.created_at)


def with_state(head: dict[str, Any], state: str | None) -> dict[str, Any]:
    """``head`` with its run state set (None: unchanged)."""
    return head if state is None else {**head, "run": {**head["run"], "state": state}}


def describe(s: Session) -> dict[str, Any]:
    """What a thread session is, for a listing (the CLI): its LangGraph thread id, its run's
    state, the latest checkpoint of each namespace, its record count. Stdlib only; raises
    UnreadableState if the session is not a LangGraph thread."""
    h = head_of(s)
    return {"session_id": s.id, "thread_id": h["thread_id"], "run": h["run"].get("state"),
            "in_progress": s.in_progress, "records": h["seq"],
            "checkpoints": {ns: e["id"] for ns, e in h["ns"].items()}}


def head_of(s: Session) -> dict[str, Any]:
    h = s.metadata.get("langgraph")
    if not isinstance(h, dict) or h.get("format") != HEAD_FORMAT:
        raise UnreadableState(f"session {s.id!r} is not a LangGraph thread", session_id=s.id,
                              reason="not_a_thread")
    return h


class Threads:
    """The LangGraph threads of one store. Thread-safe; many processes may share the store."""

    def __init__(self, store: Store, *, named: bool = False) -> None:
        self.store = store
        self.named = named
        self.layout = store.layout
        self._durable = store.config.fsync
        self._mu = threading.Lock()
        self._records: OrderedDict[tuple[str, str, int], Record] = OrderedDict()
        self._index: dict[str, tuple[tuple[str, int], _Index]] = {}  # sid -> (era, index)

    # ------------------------------------------------------------------ reading

    def sid(self, thread_id: object) -> str:
        """The session id of a thread: ``thread_session_id`` — or, for a store whose threads
        are ``named`` (``FsDurableSaver(session_ids="thread")``), the thread id itself when it
        is a valid session id (``fsdurable show <thread id>``, one id everywhere)."""
        if self.named and isinstance(thread_id, str):
            try:
                return validate_session_id(thread_id)
            except ValueError:
                pass
        return thread_session_id(thread_id)

    def session(self, sid: str) -> Session | None:
        try:
            return self.store.load(sid)
        except SessionNotFound:
            return None

    def record(self, s: Session, seq: int, kind: str) -> Record:
        """One record of the thread ``s`` (cached by the thread's incarnation and number)."""
        sid = s.id
        key = (sid, gen_of(s), seq)
        with self._mu:
            rec = self._records.get(key)
            if rec is not None:
                self._records.move_to_end(key)
                return rec
        path = self.layout.lg_record(sid, seq, kind)
        data, _ = _fsio.read_bounded(path, self.store.config.max_file_bytes)
        rec = parse_record(data, path=path)
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
        return _header(data, path)

    def index(self, s: Session) -> _Index:
        """Every visible record of the thread; only the records new since the last call are read."""
        head = head_of(s)
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
        names = []
        for name in _fsio.list_names(self.layout.lg_thread(s.id), follow=False):
            num, _, kind = name.partition(".")
            if kind in KINDS and len(num) == 12 and num.isdigit() \
                    and idx.seq < int(num) <= seq and int(num) not in gone:
                names.append((int(num), kind))
        for n, kind in sorted(names):
            h = self._peek(s, n, kind)
            key = (h["ns"], h["id"])
            if kind == "ckpt":
                idx.ckpts[key] = n
                idx.runs[n] = h.get("run_id")
            else:
                idx.writes.setdefault(key, []).append(n)
        idx.seq = seq
        with self._mu:
            self._index[s.id] = (era, idx)
        return idx

    def checkpoint(self, s: Session, ns: str, ckid: str | None
                   ) -> tuple[Record, dict[str, Typed], list[tuple[str, str, Typed, str, int]]
                              ] | None:
        """A checkpoint (the latest of ``ns`` if ``ckid`` is None): its record, its blobs by
        channel, and its pending writes in ``writes_sort_key`` order."""
        head = head_of(s)
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

    def writes_of(self, s: Session, seqs: Iterable[int]
                  ) -> list[tuple[str, str, Typed, str, int]]:
        """Pending writes of those records: a repeated (task, idx >= 0) keeps the first, a
        special (negative) index keeps the last; sorted by (task_path, task_id, idx)."""
        kept: dict[tuple[str, int], tuple[str, str, Typed, str, int]] = {}
        for n in sorted(seqs):
            rec = self.record(s, n, "writes")
            h = rec.header
            for meta, typed in zip(h["parts"], rec.parts, strict=True):
                key = (h["task_id"], meta[4])
                if key[1] >= 0 and key in kept:
                    continue
                kept[key] = (h["task_id"], meta[3], typed, h["task_path"], meta[4])
        return sorted(kept.values(), key=lambda w: (w[3], w[0], w[4]))

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
                                                 tuple[list[tuple[str, bytes]], dict[str, Any],
                                                       str | None] | None],
               through: Through | None = None) -> Session | None:
        """Under the thread's commit lock: ``fn(session, head, next_seq)`` returns the records to
        write (kind, bytes), the new head and the run state (None: unchanged) — or None for
        nothing to do. The records are written (write-once) before the head is committed —
        by ``through(session, head, state)`` if given (the graph run's turn protocol), else by
        ``commit``."""
        sid = self.sid(thread_id)
        with self.store.commit_lock(sid):
            s = self.session(sid)
            if s is None:
                self._clear_dir(sid)  # a crashed first put or delete: nothing acknowledged
            head = head_of(s) if s is not None else new_head(str(thread_id))
            out = fn(s, head, head["seq"] + 1)
            if out is None:
                return s
            records, new, state = out
            seq = head["seq"]
            for kind, data in records:
                seq += 1
                self._write_once(sid, seq, kind, data)
            new["seq"] = seq
            if through is not None and s is not None:
                return through(s, new, state)
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
        got = self.mutate(thread_id, lambda s, head, _n: None if s is not None
                          else ([], head, None))
        assert got is not None
        return got

    def _write_once(self, sid: str, seq: int, kind: str, data: bytes) -> None:
        path = self.layout.lg_record(sid, seq, kind)
        for other in KINDS:  # a crashed write may have left this number under the other kind
            stray = self.layout.lg_record(sid, seq, other)
            if other != kind and _fsio.lstat(stray) is not None:
                _fsio.unlink(stray, durable=False)  # made durable by write_new's dir fsync
        for _ in range(3):
            try:
                _fsio.write_new(path, data, durable=self._durable)
            except FileExistsError:  # numbered above the head: never acknowledged, replace it
                _fsio.unlink(path, durable=False)
                with self._mu:
                    for key in [k for k in self._records if k[0] == sid and k[2] == seq]:
                        del self._records[key]
                continue
            except FileNotFoundError:  # the thread's directory is not there yet
                _fsio.makedirs(self.layout.lg_thread(sid), durable=self._durable)
                continue
            return
        raise InvalidState(f"cannot write record {path}", path=path, reason="record_exists")

    def _clear_dir(self, sid: str) -> None:
        """Remove a thread directory whose session is gone (deleted, or never committed)."""
        d = self.layout.lg_thread(sid)
        names = _fsio.list_names(d, follow=False)  # a planted symlink: refused, never followed
        for name in names:
            _fsio.unlink(f"{d}/{name}", durable=False)
        if names or _fsio.lstat(d) is not None:
            _fsio.rmdir(d, durable=self._durable)
        with self._mu:
            self._index.pop(sid, None)
            for key in [k for k in self._records if k[0] == sid]:
                del self._records[key]

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
        """Delete some records of a thread: ``choose(head, index)`` names them. They are first
        committed as ``gone`` (invisible), then unlinked unless a surviving checkpoint still
        reads a blob from them; the head's latest checkpoint per namespace is recomputed."""
        sid = self.sid(thread_id)
        with self.store.commit_lock(sid):
            s = self.session(sid)
            if s is None:
                return
            head = head_of(s)
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
            head = {**head, "ns": ns_map, "gone": sorted(gone),
                    "epoch": head.get("epoch", 0) + 1}
            still = s.in_progress and bool(ns_map)
            s = self.commit(sid, s, head, None if still else ENDED)
            needed: set[int] = set()
            for n in idx.ckpts.values():
                if n not in gone:
                    refs = self.record(s, n, "ckpt").header["refs"]
                    needed.update(b for b, _v in refs.values())
            freed = {n for n in gone if n not in needed}
            d = self.layout.lg_thread(sid)
            for name in _fsio.list_names(d, follow=False):
                num = name.partition(".")[0]
                if num.isdigit() and int(num) in freed:
                    _fsio.unlink(f"{d}/{name}", durable=False)
            if freed and self._durable:
                _fsio.fsync_dir(d)
            self.commit(sid, s, {**head, "gone": sorted(gone - freed)}, None)


def visible(idx: _Index, ns: str | None) -> Iterator[tuple[str, str, int]]:
    """(ns, checkpoint id, seq) of the visible checkpoints, by namespace then newest first."""
    keys = sorted(((k[0], k[1], n) for k, n in idx.ckpts.items() if ns is None or k[0] == ns),
                  key=lambda t: (t[0], t[1]))
    by_ns: dict[str, list[tuple[str, str, int]]] = {}
    for t in keys:
        by_ns.setdefault(t[0], []).append(t)
    for group in by_ns.values():
        yield from reversed(group)


__all__ = ["ENDED", "FAILED", "PAUSED", "PREFIX", "RUNNING", "SOURCE", "Record", "Threads",
           "Through", "describe", "encode_record", "gen_of", "head_of", "new_head",
           "parse_record", "thread_session_id", "visible", "with_state"]
