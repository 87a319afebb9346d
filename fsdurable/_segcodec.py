"""The pure encode/parse of a chain's on-disk pieces (docs/storage.md): segment names, the
document's ``history`` / ``lanes`` entries (``HistoryRef``, with format 6's inline tail), the
segment file (``fsdurable.segment/1``) and the values a segment or an inline tail holds.

No disk I/O and no state: ``_history`` reads and verifies chains with these, ``_commit`` writes
what they encode, and ``_codec`` parses the document's entries through ``ref_from_dict``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ._errors import HistoryUnavailable, InvalidState, UnreadableState
from ._model import Message
from ._recordcodec import SEGMENT_FORMAT, upgrade

# [<lane>-]<first>-<first 16 hex of the file's SHA-256>.json: lowercase, digits,
# case-insensitive safe. Groups: lane (None: the messages), first, digest.
LANE = r"[a-z][a-z0-9_]{0,31}"
LANE_RE = re.compile(LANE)
NAME_RE = re.compile(rf"(?:({LANE})-)?([0-9]{{12}})-([0-9a-f]{{16}})\.json")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_INT63 = 1 << 63


@attrs.frozen
class HistoryRef:
    """What a session document says of its history: ``count`` messages in the chain, the newest
    ``len(inline)`` of them in the document itself (``inline``: each one's JSON bytes, format 6)
    and the ones before in the segments whose newest is ``head`` (SHA-256 ``sha256``; both None
    when there is none yet). The session's messages are ``start .. count - 1`` (a compaction
    summary replaces the ``start`` before them: its archive); ``kept``: the chain is stored from
    that index (format 7: the archive before it was removed by the retention rule)."""

    count: int
    head: str | None
    sha256: str | None
    start: int = 0
    inline: tuple[bytes, ...] = ()
    kept: int = 0

    @property
    def segmented(self) -> int:
        """How many values of the chain are in segments (the rest is inline)."""
        return self.count - len(self.inline)

    def to_dict(self, fragments: bool = False) -> dict[str, Any]:
        """The document's entry; ``fragments``: the inline values as ``orjson.Fragment`` (the
        encoder's: their bytes as they are, the array as one), else as parsed JSON values."""
        import orjson

        d: dict[str, Any] = {"count": self.count, "start": self.start, "head": self.head,
                             "sha256": self.sha256}
        if self.inline:  # fragments: the whole array as one (every commit encodes it)
            d["inline"] = (orjson.Fragment(b"[" + b",".join(self.inline) + b"]") if fragments
                           else [orjson.loads(b) for b in self.inline])
        if self.kept:
            d["kept"] = self.kept
        return d


def inline_size(inline: Sequence[bytes]) -> int:
    """The bytes an inline tail takes in its document (the values and the commas between)."""
    return sum(map(len, inline)) + max(0, len(inline) - 1) + 2


def segment_name(first: int, sha: str, lane: str | None = None) -> str:
    return f"{lane + '-' if lane else ''}{first:012d}-{sha[:16]}.json"


def lane_of(name: str) -> str | None:
    """The lane a segment name belongs to (None: the messages, or not a segment name)."""
    m = NAME_RE.fullmatch(name)
    return m.group(1) if m is not None else None


def ref_from_dict(d: object, *, path: str | None, lane: str | None = None) -> HistoryRef | None:
    """The document's ``history`` (or lane ``lane``'s entry of its ``lanes``; None: empty);
    UnreadableState if out of shape."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise UnreadableState("history must be an object or null", path=path,
                              reason="wrong_type")
    count, start, head, sha = d.get("count"), d.get("start", 0), d.get("head"), d.get("sha256")
    # each field's type and range (what the schema says); how they relate — start within the
    # chain, the head's name carrying its digest — is judged when the history is read
    # (HistoryUnavailable), never by a read of the document alone
    # (format 6) the inline tail: a list of values, at most count of them; head and sha256
    # both null when every value is inline (a null head with fewer values inline than count is
    # a chain that ends short: history_short when read); (format 7) ``kept``, where the
    # stored chain begins (the archive before it removed by retention): at most ``start``,
    # judged when the archive or the whole chain is read
    raw, kept = d.get("inline"), d.get("kept", 0)
    if (not isinstance(kept, int) or isinstance(kept, bool) or not 0 <= kept < _INT63
            or not isinstance(count, int) or isinstance(count, bool) or not 0 < count < _INT63
            or not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < _INT63
            or not isinstance(raw, (list, type(None))) or len(raw or ()) > count
            or (head is None) != (sha is None)
            or (head is not None and (
                not isinstance(head, str) or NAME_RE.fullmatch(head) is None
                or lane_of(head) != lane or not isinstance(sha, str)
                or _SHA_RE.fullmatch(sha) is None))):
        raise UnreadableState(f"history out of shape: {d!r}"[:300], path=path,
                              reason="wrong_value")
    inline: tuple[bytes, ...] = ()
    if raw:
        import orjson

        try:
            inline = tuple(orjson.dumps(v) for v in raw)
        except TypeError as e:  # an integer past 64 bits (a strict re-read keeps it)
            raise UnreadableState(f"history's inline values out of range: {e}"[:300],
                                  path=path, reason="wrong_value") from e
    return HistoryRef(count=count, head=head, sha256=sha, start=start, inline=inline, kept=kept)


def encode_values(sid: str, first: int, values: Sequence[Any], lane: str | None = None
                  ) -> tuple[bytes, ...]:
    """Each value's JSON bytes, as a segment or an inline tail holds it: a ``Message`` (lane
    None) unstructured, a lane's JSON value as it is; InvalidState if one holds a NaN or an
    infinity (it would come back as null) or is not JSON. ``first``: the index of the first
    (for the message of a finding)."""
    import orjson

    check = _CHECK[0] if _CHECK else _check_finite()
    if lane is None:
        from ._codec import _conv

        unstructure = _conv().unstructure
        for i, m in enumerate(values):
            if m.tool_calls:
                check([c.arguments for c in m.tool_calls], sid,
                      f"message {first + i}'s tool call arguments")
        raw: Sequence[Any] = [unstructure(m) for m in values]
    else:
        raw = values
    # a lane's values are encoded before they are walked: orjson writes a NaN or an infinity
    # as null, so bytes without "null" hold none and the walk is needed only for those with
    # one (or when orjson refuses a value: the walk's finding comes first, as it did before)
    try:
        out = tuple(map(orjson.dumps, raw))
    except TypeError as e:
        if lane is not None:
            check(list(values), sid, f"lane {lane}'s items")
        raise InvalidState(f"session {sid}'s messages are not JSON-serialisable: {e}",
                           session_id=sid, reason="not_json") from e
    if lane is not None and any(b"null" in b for b in out):
        check(list(values), sid, f"lane {lane}'s items")
    return out


_CHECK: list[Callable[[Any, str, str], bool]] = []


def _check_finite() -> Callable[[Any, str, str], bool]:
    """``_codec._check_finite``, imported once (``_codec`` imports this module; a relative import
    in a function costs ~2 us per call)."""
    from ._codec import _check_finite

    _CHECK.append(_check_finite)
    return _check_finite


def encode_segment(sid: str, first: int, prev: HistoryRef | None, node: str,
                   messages: Sequence[Any], lane: str | None = None, *,
                   encoded: Sequence[bytes] | None = None) -> tuple[str, str, bytes]:
    """(name, SHA-256, bytes) of the segment holding ``messages`` (lane ``lane``: JSON values;
    or ``encoded``, their bytes from ``encode_values``) as indexes ``first`` .. of session
    ``sid``'s chain, after the segment ``prev`` names (None, or a ref without a head: the
    first segment)."""
    import orjson

    if encoded is None:
        encoded = encode_values(sid, first, messages, lane)

    body: dict[str, Any] = {"format": SEGMENT_FORMAT, "session_id": sid}
    if lane is not None:
        body["lane"] = lane
    head = prev.head if prev is not None else None
    body.update({"first": first, "node_id": node, "prev": head,
                 "prev_sha256": prev.sha256 if prev is not None and head is not None else None,
                 "items" if lane is not None else "messages":
                     [orjson.Fragment(b) for b in encoded]})
    data = orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)
    sha = hashlib.sha256(data).hexdigest()
    return segment_name(first, sha, lane), sha, data


def parse_segment(data: bytes, *, path: str, sid: str, sha: str, lane: str | None = None
                  ) -> tuple[int, str | None, str | None, tuple[Any, ...]]:
    """(first, prev name, prev SHA-256, messages) of a segment that must hash to ``sha``
    (lane ``lane``: its items, JSON values, as they are)."""
    import orjson

    from ._codec import _conv

    if hashlib.sha256(data).hexdigest() != sha:
        raise HistoryUnavailable(f"{path}: its bytes do not match the digest that names it",
                                 path=path, session_id=sid, reason="history_corrupt")
    try:
        d = orjson.loads(data)
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        d, _ = upgrade(d, "segment", path=path)
        first, prev, prev_sha = d["first"], d["prev"], d["prev_sha256"]
        msgs = d["items" if lane is not None else "messages"]
        if (d.get("session_id") != sid or d.get("lane") != lane
                or (lane is not None and LANE_RE.fullmatch(lane) is None)
                or not isinstance(d.get("node_id"), (str, type(None)))
                or not isinstance(first, int) or isinstance(first, bool)
                or not 0 <= first < _INT63 or not isinstance(msgs, list) or not msgs
                or (prev is None) != (prev_sha is None) or (prev is None) != (first == 0)
                or (prev is not None and not (isinstance(prev, str) and NAME_RE.fullmatch(prev)
                                               and isinstance(prev_sha, str)
                                               and _SHA_RE.fullmatch(prev_sha)
                                               # a lane's: a lane's (reading it checks
                                               # which: Chain._read_one)
                                               and (lane_of(prev) is None) == (lane is None)))):
            raise ValueError("fields out of shape")
        if lane is None:
            conv = _conv()
            out: tuple[Any, ...] = tuple(conv.structure(x, Message) for x in msgs)
        else:
            out = tuple(msgs)
    except UnreadableState as e:
        if e.reason == "unknown_version":
            raise HistoryUnavailable(f"{path}: {e.message}", path=path, session_id=sid,
                                     reason="needs_newer") from e
        raise HistoryUnavailable(f"{path}: {e.message}", path=path, session_id=sid,
                                 reason="history_corrupt") from e
    except (ValueError, TypeError, KeyError) as e:  # orjson's JSONDecodeError is a ValueError
        raise HistoryUnavailable(f"{path}: not a segment of session {sid}: {e!r}"[:400],
                                 path=path, session_id=sid, reason="history_corrupt") from e
    return first, prev, prev_sha, out


def decode_values(encoded: Sequence[bytes], *, sid: str, lane: str | None, first: int
                  ) -> tuple[Any, ...]:
    """The values of an inline tail (each one's JSON bytes): a message structured (lane None),
    a lane's value as it is; HistoryUnavailable (``history_corrupt``) if one is out of shape."""
    import orjson

    from ._codec import _conv

    try:
        raw = [orjson.loads(b) for b in encoded]
        if lane is not None:
            return tuple(raw)
        conv = _conv()
        return tuple(conv.structure(x, Message) for x in raw)
    except (ValueError, TypeError, KeyError) as e:
        raise HistoryUnavailable(f"session {sid}: the inline values from {first} are not its "
                                 f"chain's: {e!r}"[:400], session_id=sid,
                                 reason="history_corrupt") from e


__all__ = ["LANE", "LANE_RE", "NAME_RE", "HistoryRef", "decode_values", "encode_segment",
           "encode_values", "inline_size", "lane_of", "parse_segment", "ref_from_dict",
           "segment_name"]
