"""A LangGraph thread's append-only log: checksummed frames, one fdatasync per put.

Framework-free; ``fsdurable._lgstore`` (the threads) calls it. On disk (docs/storage.md,
"LangGraph threads")::

    langgraph/<sid>/<n:06d>.lglog      the thread's log number n (a new n when records are
                                       deleted: the survivors are copied into a new log)

The file starts with one JSON line (``schemas/lglog.schema.json``: format, thread id, the
thread's incarnation ``gen``, ``n``), then frames::

    frame := MAGIC (4 bytes) | length of body (u32, big-endian) | crc32 of body (u32) | body
    body  := header (one JSON line, ``schemas/lgframe.schema.json``) | record bytes

A frame holds at most one record (``fsdurable.lgrecord/1`` bytes, exactly as before) and,
if it ends a write, the thread's head as that write left it. Frames are valid from the start
of the file up to the first one that is torn or wrong (bad magic, length past the end, crc,
header, a record number that does not follow): the rest is a TORN TAIL, ignored by every
reader and cut by the next writer (``_fsio.append_at``). Records after the last frame with a
head were never acknowledged (a write cut short) and are cut with it.

Parsing is incremental: a ``LogView`` remembers where it stopped (keyed by the file's
identity), so a warm reader reads only the frames appended since.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from . import _fsio
from ._errors import UnreadableState
from ._itemlog import catch_up
from ._layout import new_id

if TYPE_CHECKING:
    from ._model import Session

LOG_FORMAT = "fsdurable.lglog/1"
RECORD_FORMAT = "fsdurable.lgrecord/1"
Typed = tuple[str, bytes]
FRAME_FORMAT = "fsdurable.lgframe/1"
MAGIC = b"\x1eLGF"
_ENV = struct.Struct(">4sII")  # magic, body length, crc32(body)
PREFIX = "lg-"
SOURCE = "langgraph"  # the thread sessions' source: recovery selects their markers by it
HEAD_FORMAT = "fsdurable.lghead/2"
HEAD_FORMATS = ("fsdurable.lghead/1", HEAD_FORMAT)  # /1: records as files, no log
KINDS = ("ckpt", "writes")
# run states kept in the head; only "running" is an interrupted run after a crash
RUNNING, ENDED, PAUSED, FAILED = "running", "ended", "paused", "failed"
# a record's header fields a listing needs, kept in its frame's header (no record read)
Loc = tuple[str, int, int, str, str, "str | None"]  # kind, offset, length, ns, id, run_id


def log_name(n: int) -> str:
    return f"{n:06d}.lglog"


def encode_header(thread_id: str, gen: str, n: int) -> bytes:
    import orjson

    return orjson.dumps({"format": LOG_FORMAT, "thread_id": thread_id, "gen": gen,
                         "n": n}) + b"\n"


def encode_frame(record: tuple[str, int, bytes, dict[str, Any]] | None,
                 head: dict[str, Any] | None) -> bytes:
    """One frame: ``record`` is (kind, seq, its bytes, its header), ``head`` the head to keep
    (None: this frame does not end a write)."""
    return _frame_of(record, head)[0]


def _frame_of(record: tuple[str, int, bytes, dict[str, Any]] | None,
              head: dict[str, Any] | None) -> tuple[bytes, Loc | None]:
    """``encode_frame``, and where its record is (offset from the frame's start)."""
    import orjson

    hdr: dict[str, Any] = {"format": FRAME_FORMAT}
    data = b""
    if record is not None:
        kind, seq, data, rh = record
        hdr["record"] = [kind, seq, len(data), rh.get("ns", ""), rh.get("id", ""),
                         rh.get("run_id")]
    if head is not None:
        hdr["head"] = head
    line = orjson.dumps(hdr)
    body = line + b"\n" + data
    loc = None if record is None else (record[0], _ENV.size + len(line) + 1, len(data),
                                        *hdr["record"][3:])
    return _ENV.pack(MAGIC, len(body), zlib.crc32(body)) + body, loc


def encode_frames(records: list[tuple[str, int, bytes]], head: dict[str, Any]) -> bytes:
    """The frames of one write: a frame per record (kind, seq, its bytes), the last carrying
    ``head`` (a frame with the head alone if there is no record)."""
    return frames_of([(kind, seq, raw, record_header(raw, None)) for kind, seq, raw in records],
                     head)[0]


def frames_of(records: list[tuple[str, int, bytes, dict[str, Any]]], head: dict[str, Any]
              ) -> tuple[bytes, list[tuple[int, Loc]]]:
    """``encode_frames`` of records whose headers the caller has (it encoded them), and where
    each record is in the bytes returned (``LogView.wrote`` takes them: a writer never parses
    back what it just encoded)."""
    if not records:
        return encode_frame(None, head), []
    out, locs, at = [], [], 0
    last = len(records) - 1
    for i, rec in enumerate(records):
        frame, loc = _frame_of(rec, head if i == last else None)
        assert loc is not None
        locs.append((rec[1], (loc[0], at + loc[1], *loc[2:])))
        out.append(frame)
        at += len(frame)
    return b"".join(out), locs


@attrs.define
class LogView:
    """What the valid frames of one log file say, parsed up to ``end``."""

    key: tuple[int, int]  # (st_dev, st_ino) of the file parsed
    base: int  # end of the file's header line
    gen: str  # the thread incarnation its header names
    end: int = 0  # end of the last valid frame
    seq: int = 0  # the number of the last record of a valid frame
    head: dict[str, Any] | None = None  # the head of the last frame that carries one
    head_end: int = 0  # where that frame ends (0: no head yet)
    head_seq: int = 0  # records up to this number are counted by ``head``
    locs: dict[int, Loc] = attrs.Factory(dict)  # record seq -> where it is
    torn: bool = False  # parsing stopped on bytes that are no valid frame

    def cut(self) -> None:
        """Forget the frames after the last head (a writer is about to cut them): the newest
        entries of ``locs``, which holds its numbers in ascending order (``_frame`` takes only a
        number above the last), so the cost is theirs, never the whole log's."""
        locs = self.locs
        while locs and next(reversed(locs)) > self.head_seq:
            locs.popitem()
        self.end = self.head_end or self.base
        self.seq = self.head_seq
        self.torn = False

    def wrote(self, at: int, end: int, locs: list[tuple[int, Loc]], head: dict[str, Any]
              ) -> None:
        """Take the frames this process just appended at ``at`` (ending at ``end``, the last
        carrying ``head``; ``frames_of`` says where their records are) as ``feed`` would parse
        them, without reading them back. ``head`` must be what its frame holds: JSON types only
        (``_lgstore`` builds heads of dicts, lists, strings and numbers)."""
        for seq, loc in locs:
            self.locs[seq] = (loc[0], at + loc[1], *loc[2:])
            self.seq = seq
        self.end = self.head_end = end
        self.head, self.head_seq = head, self.seq

    def feed(self, data: bytes, at: int, max_frame: int, size: int | None = None) -> int:
        """Parse the frames of ``data`` (the file's bytes from offset ``at`` = ``self.end``);
        returns how many bytes were consumed. Stops at a torn or wrong frame (``torn``), or at
        a frame cut by the end of ``data`` when the file (``size`` bytes) holds more of it."""
        i = 0
        whole = size is None or at + len(data) >= size  # data runs to the end of the file
        while True:
            if i + _ENV.size > len(data):
                self.torn = self.torn or (whole and i < len(data))  # stray bytes at the end
                break
            magic, n, crc = _ENV.unpack_from(data, i)
            if magic != MAGIC or n > max_frame:
                self.torn = True
                break
            if i + _ENV.size + n > len(data):
                self.torn = whole  # else: the rest is past what was read; read from here
                break
            body = bytes(memoryview(data)[i + _ENV.size:i + _ENV.size + n])
            ok, head = self._frame(body, at + i + _ENV.size) if zlib.crc32(body) == crc \
                else (False, None)
            if not ok:
                self.torn = True
                break
            i += _ENV.size + n
            self.end = at + i
            if head is not None:
                self.head, self.head_end, self.head_seq = head, self.end, self.seq
        return i

    def _frame(self, body: bytes, at: int) -> tuple[bool, dict[str, Any] | None]:
        import orjson

        nl = body.find(b"\n")
        try:
            hdr = orjson.loads(body[:nl]) if nl >= 0 else None
        except orjson.JSONDecodeError:
            return False, None
        if not isinstance(hdr, dict) or hdr.get("format") != FRAME_FORMAT:
            return False, None
        rec, head = hdr.get("record"), hdr.get("head")
        if head is not None and not isinstance(head, dict):
            return False, None
        if rec is not None:
            if not (isinstance(rec, list) and len(rec) == 6 and isinstance(rec[1], int)
                    and rec[1] > self.seq and rec[2] == len(body) - nl - 1):
                return False, None
            self.seq = rec[1]
            self.locs[rec[1]] = (rec[0], at + nl + 1, rec[2], rec[3], rec[4], rec[5])
        elif nl != len(body) - 1:
            return False, None
        return True, head


def scan(path: str, view: LogView | None, max_frame: int) -> LogView | None:
    """The view of the log at ``path`` brought up to date (``view``: what was parsed before,
    reused if it is of the same file and the file did not shrink); None if there is no file,
    or its header is torn (created by a write a crash cut short: nothing was appended to it)."""
    st = _fsio.lstat(path)
    if st is None:
        return None
    key = (st.st_dev, st.st_ino)
    if view is None or view.key != key or st.st_size < view.end:
        try:
            hdr, base, st = _header_line(path)
        except UnreadableState as e:
            if e.reason == "torn_header":
                return None
            raise
        view = LogView(key=(st.st_dev, st.st_ino), base=base, gen=str(hdr.get("gen")), end=base)
    catch_up(path, view, st.st_size, max_frame)
    return view


def _header_line(path: str) -> tuple[dict[str, Any], int, Any]:
    """The log file's header line (its thread, incarnation and number), where it ends, and
    the file's stat."""
    import orjson

    data, st = _fsio.read_span(path, 0, 1 << 16)
    nl = data.find(b"\n")
    if nl < 0 and st.st_size < 1 << 16:  # created, its header not durable yet: no frame after
        raise UnreadableState(f"log {path} has a torn header", path=path, reason="torn_header")
    try:
        hdr = orjson.loads(data[:nl]) if nl >= 0 else None
    except orjson.JSONDecodeError:
        hdr = None
    if not isinstance(hdr, dict) or hdr.get("format") != LOG_FORMAT:
        raise UnreadableState(f"log {path} has no valid header", path=path, reason="corrupt")
    return hdr, nl + 1, st


# ---------------------------------------------------------------------- records


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
    return new_record(header, parts)[0]


def new_record(header: dict[str, Any], parts: list[tuple[list[Any], Typed]]
               ) -> tuple[bytes, Record]:
    """``encode_record``, and the record as ``parse_record`` reads those bytes back (a writer
    keeps it in its cache without parsing what it just encoded)."""
    import orjson

    metas, payload = [], []
    for tail, (typ, data) in parts:
        metas.append([tail[0], typ, len(data), *tail[1:]])
        payload.append(data)
    body = b"".join(payload)
    head = {"format": RECORD_FORMAT, **header, "parts": metas, "crc32": zlib.crc32(body)}
    return (orjson.dumps(head) + b"\n" + body,
            Record(head, tuple((typ, data if type(data) is bytes else bytes(data))
                               for _tail, (typ, data) in parts)))


def parse_record(data: bytes, *, path: str | None = None) -> Record:
    """Parse a record; UnreadableState (reason ``corrupt`` / ``unknown_version``) if it is not
    exactly what a writer wrote."""
    header = record_header(data, path)
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


def record_header(data: bytes, path: str | None) -> dict[str, Any]:
    """A record's header line, parsed (UnreadableState if it is not one)."""
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


def pending_writes(recs: Iterable[Record]) -> list[tuple[str, str, Typed, str, int]]:
    """The pending writes of writes records (in record order): a repeated (task, idx >= 0)
    keeps the first, a special (negative) index keeps the last; sorted by (task_path,
    task_id, idx) as LangGraph's ``writes_sort_key``."""
    kept: dict[tuple[str, int], tuple[str, str, Typed, str, int]] = {}
    for rec in recs:
        h = rec.header
        for meta, typed in zip(h["parts"], rec.parts, strict=True):
            key = (h["task_id"], meta[4])
            if key[1] >= 0 and key in kept:
                continue
            kept[key] = (h["task_id"], meta[3], typed, h["task_path"], meta[4])
    return sorted(kept.values(), key=lambda w: (w[3], w[0], w[4]))


# ---------------------------------------------------------------------- heads


@attrs.define
class _Index:
    """Every visible record of one thread, by checkpoint (built from one listing)."""

    seq: int
    gone: frozenset[int]
    ckpts: dict[tuple[str, str], int] = attrs.Factory(dict)  # (ns, id) -> seq
    writes: dict[tuple[str, str], list[int]] = attrs.Factory(dict)
    runs: dict[int, str | None] = attrs.Factory(dict)  # ckpt seq -> run id


def visible(idx: _Index, ns: str | None) -> Iterator[tuple[str, str, int]]:
    """(ns, checkpoint id, seq) of the visible checkpoints, by namespace then newest first."""
    keys = sorted(((k[0], k[1], n) for k, n in idx.ckpts.items() if ns is None or k[0] == ns),
                  key=lambda t: (t[0], t[1]))
    by_ns: dict[str, list[tuple[str, str, int]]] = {}
    for t in keys:
        by_ns.setdefault(t[0], []).append(t)
    for group in by_ns.values():
        yield from reversed(group)




def thread_session_id(thread_id: object) -> str:
    """The session id of a LangGraph thread id (``lg-`` + 128 bits of its SHA-256)."""
    raw = str(thread_id).encode("utf-8", "surrogatepass")
    return PREFIX + hashlib.sha256(raw).hexdigest()[:32]


def new_head(thread_id: str) -> dict[str, Any]:
    """A new thread's head. ``gen``: this incarnation of the thread — a thread deleted and
    started again under the same id (its records numbered from 1 again) is another ``gen``,
    so no cache keyed by it answers from the deleted thread's records."""
    return {"format": HEAD_FORMAT, "thread_id": thread_id, "gen": new_id(), "seq": 0,
            "epoch": 0, "ns": {}, "gone": [], "run": {"state": ENDED, "run_id": None},
            "log": {"n": 0, "at": 0}}


def gen_of(s: Session) -> str:
    """The thread's incarnation (a head written before ``gen`` existed: its creation time)."""
    gen = head_of(s).get("gen")
    return gen if isinstance(gen, str) else repr(s.created_at)


def with_state(head: dict[str, Any], state: str | None) -> dict[str, Any]:
    """``head`` with its run state set (None: unchanged)."""
    return head if state is None else {**head, "run": {**head["run"], "state": state}}


def describe(s: Session, head: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a thread session is, for a listing (the CLI): its LangGraph thread id, its run's
    state, the latest checkpoint of each namespace, its record count — from ``head`` (the
    thread's head as it stands: ``Threads.head``), else from its document (as of its last
    commit). Raises UnreadableState if the session is not a LangGraph thread."""
    h = head if head is not None else head_of(s)
    return {"session_id": s.id, "thread_id": h["thread_id"], "run": h["run"].get("state"),
            "in_progress": s.in_progress, "records": h["seq"],
            "checkpoints": {ns: e["id"] for ns, e in h["ns"].items()}}


def head_of(s: Session) -> dict[str, Any]:
    h = s.metadata.get("langgraph")
    if not isinstance(h, dict) or h.get("format") not in HEAD_FORMATS:
        raise UnreadableState(f"session {s.id!r} is not a LangGraph thread", session_id=s.id,
                              reason="not_a_thread")
    return h


__all__ = [
    "ENDED",
    "FAILED",
    "FRAME_FORMAT",
    "HEAD_FORMAT",
    "HEAD_FORMATS",
    "KINDS",
    "LOG_FORMAT",
    "MAGIC",
    "PAUSED",
    "PREFIX",
    "RECORD_FORMAT",
    "RUNNING",
    "SOURCE",
    "LogView",
    "Record",
    "Typed",
    "_Index",
    "describe",
    "encode_frame",
    "encode_frames",
    "encode_header",
    "encode_record",
    "frames_of",
    "gen_of",
    "head_of",
    "log_name",
    "new_head",
    "new_record",
    "parse_record",
    "record_header",
    "scan",
    "thread_session_id",
    "visible",
    "with_state",
]
