"""An adapter's item log: a session's items as checksummed frames, one fdatasync per change.

Framework-free; ``fsdurable._oaitems`` (the Agents SDK's ``FileSession``) writes it. On disk
(docs/storage.md, "Item logs")::

    history/<id>/items-<n:06d>.log     log number n of the session's items (a new n when the
                                       log is rewritten: the live items copied into it whole)

The file starts with one JSON line (``schemas/itemlog.schema.json``: format, session id, the
node that wrote it, ``n``), then frames::

    frame := MAGIC (4 bytes) | length of body (u32, big-endian) | crc32 of body (u32) | body
    body  := header (one JSON line, ``schemas/itemframe.schema.json``: at, n) | JSON array

A frame says: the items are cut to the first ``at``, then the ``n`` items of its array are
appended (an add: ``at`` = the count; a pop: ``at`` = count - 1, no item; a clear: 0). Frames
are valid from the start of the file up to the first one that is torn or wrong (bad magic,
length past the end, crc, header, an ``at`` past the count): the rest is a TORN TAIL, ignored
by every reader and cut by the next writer (``_fsio.append_at``). The session document names
its log and the end of the frames it has seen, ``{"n": n, "at": offset}`` under the key
``items_log`` of an adapter's metadata namespace: a log whose valid frames end before ``at``
is short (lost, or not delivered by a sync tool yet), never read as fewer items.

Parsing is incremental (an ``ItemView`` remembers where it stopped, keyed by the file's
identity) and reads frame headers only; the items of a frame are parsed when asked for.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Iterator
from typing import Any, Protocol

import attrs

from . import _fsio
from ._errors import UnreadableState

LOG_FORMAT = "fsdurable.itemlog/1"
FRAME_FORMAT = "fsdurable.itemframe/1"
MAGIC = b"\x1eITM"
REF = "items_log"  # the key of an adapter namespace's log reference: {"n": int, "at": int}
_ENV = struct.Struct(">4sII")  # magic, body length, crc32(body)
ENVELOPE = _ENV.size  # a frame's bytes before its body
LOG_RE = re.compile(r"items-(\d{6})\.log")


def log_name(n: int) -> str:
    return f"items-{n:06d}.log"


def encode_header(session_id: str, node_id: str | None, n: int, gen: str) -> bytes:
    """The header line. ``gen``: this log's own random token, which the document's reference
    names too — a log that is not the one a document named (a number reused after the session
    was started over, then the old document restored from quarantine) is never read as it."""
    import orjson

    return orjson.dumps({"format": LOG_FORMAT, "session_id": session_id, "node_id": node_id,
                         "n": n, "gen": gen}) + b"\n"


def encode_frame(at: int, items: bytes, n: int, *, stdlib: bool = False) -> bytes:
    """A frame: cut to ``at``, then append ``n`` items (``items``: their JSON array bytes;
    ``stdlib``: written by the standard library, which must read them: ``_jsoncopy``)."""
    import orjson

    hdr: dict[str, Any] = {"format": FRAME_FORMAT, "at": at, "n": n}
    if stdlib:
        hdr["stdlib"] = True
    body = orjson.dumps(hdr) + b"\n" + items
    return _ENV.pack(MAGIC, len(body), zlib.crc32(body)) + body


def refs(s: Any) -> dict[str, dict[str, Any]]:
    """The item logs a parsed session document names, by metadata namespace; UnreadableState
    (``corrupt``) if one reference is malformed (the repair gate then keeps every file)."""
    return {key: ref_of(s, key) for key, ns in (getattr(s, "metadata", None) or {}).items()
            if isinstance(ns, dict) and REF in ns}


def ref_of(s: Any, key: str) -> dict[str, Any]:
    """The log reference under ``metadata[key]`` (``n``, ``at``, and ``gen`` where the log has
    one); UnreadableState (``corrupt``) if malformed."""
    ns = s.metadata.get(key)
    ref = ns.get(REF) if isinstance(ns, dict) else None
    if not (isinstance(ref, dict) and type(ref.get("n")) is int and type(ref.get("at")) is int
            and 0 <= ref["n"] < 10**6 and ref["at"] >= 0
            and isinstance(ref.get("gen", ""), str)):
        raise UnreadableState(f"session {s.id!r} names no valid item log ({ref!r})",
                              session_id=s.id, reason="corrupt")
    out: dict[str, Any] = {"n": ref["n"], "at": ref["at"]}
    if "gen" in ref:
        out["gen"] = ref["gen"]
    return out


@attrs.define
class ItemView:
    """What the valid frames of one log file say, parsed up to ``end``. ``frames`` holds the
    live ones: ``[first item index, offset of the items array, its length, live items, the
    frame's bytes, 1 if the standard library wrote the array]``."""

    key: tuple[int, int]  # (st_dev, st_ino) of the file parsed
    base: int  # end of the file's header line
    n: int  # the log number its header names
    gen: str | None  # the log's token (its header's): a view is reused for that log alone
    end: int = 0  # end of the last valid frame
    count: int = 0  # items after the last valid frame
    frames: list[list[int]] = attrs.Factory(list)
    live: int = 0  # bytes of the live frames, whole (the rest of the file is dead: a rewrite)
    torn: bool = False  # parsing stopped on bytes that are no valid frame

    def apply(self, at: int, offset: int, length: int, n: int, size: int,
              stdlib: bool = False) -> None:
        """Take one frame (valid: ``at`` <= ``count``; ``size``: its bytes, envelope and
        header included; ``stdlib``: its array is the standard library's): cut, then append."""
        frames = self.frames
        while frames and frames[-1][0] >= at:
            self.live -= frames.pop()[4]
        if frames and frames[-1][0] + frames[-1][3] > at:
            frames[-1][3] = at - frames[-1][0]
        if n:
            frames.append([at, offset, length, n, size, int(stdlib)])
            self.live += size
        self.count = at + n

    def feed(self, data: bytes, at: int, max_frame: int, size: int | None = None) -> int:
        """Parse the frames of ``data`` (the file's bytes from offset ``at`` = ``self.end``);
        returns how many bytes were consumed. Stops at a torn or wrong frame (``torn``), or at
        a frame cut by the end of ``data`` when the file (``size`` bytes) holds more of it."""
        import orjson

        i = 0
        whole = size is None or at + len(data) >= size
        while True:
            if i + _ENV.size > len(data):
                self.torn = self.torn or (whole and i < len(data))
                break
            magic, n, crc = _ENV.unpack_from(data, i)
            if magic != MAGIC or n > max_frame:
                self.torn = True
                break
            if i + _ENV.size + n > len(data):
                self.torn = whole
                break
            start = i + _ENV.size
            body = bytes(memoryview(data)[start:start + n])
            nl = body.find(b"\n")
            hdr: Any = None
            if zlib.crc32(body) == crc and nl >= 0:
                try:
                    hdr = orjson.loads(body[:nl])
                except orjson.JSONDecodeError:
                    hdr = None
            if not (isinstance(hdr, dict) and hdr.get("format") == FRAME_FORMAT
                    and type(hdr.get("at")) is int and type(hdr.get("n")) is int
                    and 0 <= hdr["at"] <= self.count and hdr["n"] >= 0
                    and (hdr["n"] == 0) == (nl == len(body) - 1)
                    and hdr.get("stdlib", False) in (True, False)):
                self.torn = True
                break
            self.apply(hdr["at"], at + start + nl + 1, n - nl - 1, hdr["n"], _ENV.size + n,
                       hdr.get("stdlib", False))
            i = start + n
            self.end = at + i
        return i

    def wrote(self, at: int, frame: bytes, cut: int, n: int, stdlib: bool = False) -> None:
        """Take the frame this process just appended at ``at`` as ``feed`` would parse it,
        without reading it back (tests/test_item_log.py checks that a reader parses the same)."""
        nl = frame.index(b"\n", _ENV.size)
        self.apply(cut, at + nl + 1, len(frame) - nl - 1, n, len(frame), stdlib)
        self.end = at + len(frame)

    def spans(self, lo: int, hi: int) -> Iterator[tuple[int, int, int, int, bool]]:
        """The live frames holding items ``lo`` .. ``hi - 1``: (offset, length, skip, take,
        stdlib) — parse the frame's array, then take ``take`` items from ``skip``."""
        for first, off, length, live, _size, stdlib in self.frames:
            if first + live <= lo or first >= hi:
                continue
            skip = max(lo - first, 0)
            yield off, length, skip, min(hi, first + live) - first - skip, bool(stdlib)


def scan(path: str, view: ItemView | None, max_frame: int) -> ItemView | None:
    """The view of the log at ``path`` brought up to date (``view``: what was parsed before,
    reused if it is of the same file and the file did not shrink); None if there is no file.
    UnreadableState (``corrupt``) if its header is not a log's (a torn header included: a log
    is always written whole before any document names it)."""
    st = _fsio.lstat(path)
    if st is None:
        return None
    key = (st.st_dev, st.st_ino)
    if view is None or view.key != key or st.st_size < view.end:
        hdr, base, st = header_line(path)
        gen = hdr.get("gen")
        view = ItemView(key=(st.st_dev, st.st_ino), base=base, n=hdr["n"],
                        gen=gen if isinstance(gen, str) else None, end=base)
    catch_up(path, view, st.st_size, max_frame)
    return view


class _Feeds(Protocol):
    end: int
    torn: bool

    def feed(self, data: bytes, at: int, max_frame: int, size: int | None = None) -> int: ...


def catch_up(path: str, view: _Feeds, size: int, max_frame: int) -> None:
    """Parse the frames a log file (``size`` bytes when last seen) holds past ``view.end``,
    a frame at a time at most (``max_frame`` + the envelope): the one loop of every log's
    incremental reader (this module's and ``_lglog``'s, whose envelope is the same size)."""
    if view.torn and size >= view.end:
        view.torn = False  # look again: a writer may have cut the tail and appended since
    at = view.end
    while at < size and not view.torn:
        data, st = _read_span(path, at, max_frame + _ENV.size)
        size = st.st_size
        used = view.feed(data, at, max_frame, size)
        if used == 0:
            break
        at += used


def _read_span(path: str, offset: int, size: int) -> tuple[bytes, Any]:
    """``_fsio.read_span``; a log removed meanwhile (a rewrite by another writer, after its
    document named the next log) is UnreadableState ``log_short``: its reader reads the
    document again."""
    try:
        return _fsio.read_span(path, offset, size)
    except FileNotFoundError as e:
        raise UnreadableState(f"item log {path} is gone", path=path,
                              reason="log_short") from e


def header_line(path: str) -> tuple[dict[str, Any], int, Any]:
    """The log's header line, where it ends, and the file's stat."""
    import orjson

    data, st = _read_span(path, 0, 4096)
    nl = data.find(b"\n")
    try:
        hdr = orjson.loads(data[:nl]) if nl >= 0 else None
    except orjson.JSONDecodeError:
        hdr = None
    if not (isinstance(hdr, dict) and hdr.get("format") == LOG_FORMAT
            and type(hdr.get("n")) is int):
        raise UnreadableState(f"item log {path} has no valid header", path=path,
                              reason="corrupt")
    return hdr, nl + 1, st


def read_items(path: str, view: ItemView, lo: int, hi: int, max_frame: int) -> list[Any]:
    """Items ``lo`` .. ``hi - 1`` of the log, parsed afresh from the frames that hold them."""
    from ._jsoncopy import json_loads

    out: list[Any] = []
    for off, length, skip, take, stdlib in view.spans(lo, hi):
        data, _ = _read_span(path, off, min(length, max_frame))
        try:
            arr = json_loads(data, stdlib=stdlib) if len(data) == length else None
        except ValueError:
            arr = None
        if not isinstance(arr, list) or len(arr) < skip + take:
            raise UnreadableState(f"item log {path}: the frame at {off} does not read",
                                  path=path, reason="corrupt")
        out.extend(arr[skip:skip + take])
    return out


def same_log(view: ItemView | None, ref: dict[str, Any]) -> bool:
    """Is ``view`` of the log ``ref`` names (its number and generation), however long?"""
    return (view is not None and view.n == ref["n"]
            and ("gen" not in ref or view.gen == ref["gen"]))


def named(view: ItemView | None, ref: dict[str, Any]) -> bool:
    """Is ``view`` the log ``ref`` names, holding at least what its document has seen?"""
    return same_log(view, ref) and view is not None and view.end >= ref["at"]


def check(path: str, ref: dict[str, Any], max_frame: int) -> ItemView:
    """The log's view, confirmed to be the one ``ref`` names and to hold what its document has
    seen: ``log_short`` (UnreadableState) if it is missing, another log under that name, or
    its valid frames end before ``ref["at"]``."""
    view = scan(path, None, max_frame)
    if not named(view, ref):
        raise short(path, view, ref)
    assert view is not None
    return view


def short(path: str, view: ItemView | None, ref: dict[str, Any]) -> UnreadableState:
    """The error of a log that is not (yet) what its document names."""
    if view is None:
        got = "missing"
    elif not same_log(view, ref):
        got = "another log under its name"
    else:
        got = f"valid to byte {view.end}"
    return UnreadableState(f"item log {path} is short ({got}; its document has seen byte "
                           f"{ref['at']}): lost, or not delivered by a sync tool yet",
                           path=path, reason="log_short")


def logs_ready(history_dir: str, s: Any, max_frame: int) -> None:
    """Every item log the document ``s`` names reaches what it has seen (``check``);
    UnreadableState (``log_short``, ``corrupt``) for the first that does not."""
    for ref in refs(s).values():
        _fsio.own_dirs(os.path.dirname(history_dir), history_dir)
        check(f"{history_dir}/{log_name(ref['n'])}", ref, max_frame)


__all__ = [
    "ENVELOPE",
    "FRAME_FORMAT",
    "LOG_FORMAT",
    "LOG_RE",
    "MAGIC",
    "REF",
    "ItemView",
    "catch_up",
    "check",
    "encode_frame",
    "encode_header",
    "header_line",
    "log_name",
    "logs_ready",
    "named",
    "read_items",
    "ref_of",
    "refs",
    "same_log",
    "scan",
    "short",
]
