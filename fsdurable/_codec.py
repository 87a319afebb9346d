"""Pure encode/parse functions for every on-disk format, versioned, with migrations.

The session codec lives here: strict (cattrs turns ``1`` into ``"1"`` by default; the converter
below does not), with cattrs and orjson imported on first use. The format tags, the migration
registry, strict JSON and the codecs of the small records (marker, event, manifest) are stdlib-only
and live in ``_recordcodec`` (the startup path imports that, never this); they are re-exported here.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import attrs

from ._errors import InvalidState, UnreadableState
from ._model import Message, Session
from ._recordcodec import (
    CURRENT,
    EVENT_FORMAT,
    MANIFEST_FORMAT,
    MARKER_FORMAT,
    MIGRATIONS,
    SESSION_FORMAT,
    check_id,
    dumps_small,
    encode_event,
    encode_manifest,
    encode_marker,
    loads_strict,
    migration,
    parse_event,
    parse_manifest,
    parse_marker,
    split_format,
    upgrade,
)


@migration("session", 1)
def _session_1_to_2(d: dict[str, Any]) -> dict[str, Any]:
    """Session v1 had ``created``/``updated``, ``turn.attempts``, ``messages[].text`` and no
    ``route_key``."""
    d = dict(d)
    d["created_at"] = d.pop("created", 0.0)
    d["updated_at"] = d.pop("updated", 0.0)
    d.setdefault("route_key", f"session:{d.get('id')}")
    turn = d.get("turn")
    if isinstance(turn, dict):
        turn = dict(turn)
        turn["resume_attempts"] = turn.pop("attempts", 0)
        d["turn"] = turn
    msgs = d.get("messages")
    if isinstance(msgs, list):
        d["messages"] = [
            {**{k: v for k, v in m.items() if k != "text"}, "content": m.get("text", "")}
            if isinstance(m, dict) else m
            for m in msgs
        ]
    d["format"] = "fsdurable.session/2"
    return d


@migration("session", 2)
def _session_2_to_3(d: dict[str, Any]) -> dict[str, Any]:
    """Session v2 had no ``commit_id`` (""), no ``turn.node_id`` (None: the commit that rewrites
    it takes the owner from the marker) and no ``turn.route_key`` (the session's route, the one
    its marker names)."""
    d = dict(d)
    d.setdefault("commit_id", "")
    turn = d.get("turn")
    if isinstance(turn, dict):
        turn = dict(turn)
        turn.setdefault("node_id", None)
        turn.setdefault("route_key", d.get("route_key", ""))
        d["turn"] = turn
    d["format"] = "fsdurable.session/3"
    return d


# ---------------------------------------------------------------- session (cattrs + orjson)

_converter: Any = None


def _conv() -> Any:
    """The strict cattrs converter, built on first use (keeps cattrs off the startup path)."""
    global _converter
    if _converter is not None:
        return _converter
    import cattrs

    c = cattrs.Converter(forbid_extra_keys=False, detailed_validation=False)

    def strict(typ: Any, accept: tuple[type, ...]) -> Callable[[Any, Any], Any]:
        def hook(v: Any, _: Any) -> Any:
            if isinstance(v, bool) and bool not in accept:
                raise TypeError(f"expected {typ.__name__}, got bool")
            if not isinstance(v, accept):
                raise TypeError(f"expected {typ.__name__}, got {type(v).__name__}")
            if isinstance(v, float) and not math.isfinite(v):
                raise TypeError("non-finite number")
            out: Any = v
            return float(out) if typ is float else out

        return hook

    c.register_structure_hook(str, strict(str, (str,)))
    c.register_structure_hook(int, strict(int, (int,)))
    c.register_structure_hook(float, strict(float, (int, float)))
    c.register_structure_hook(bool, strict(bool, (bool,)))

    def json_object(v: Any, _: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise TypeError(f"expected an object, got {type(v).__name__}")
        return v

    c.register_structure_hook_func(lambda t: t == dict[str, Any], json_object)

    def seq_factory(t: Any) -> Callable[[Any, Any], Any]:
        inner = c.get_structure_hook(t.__args__[0])
        elem = t.__args__[0]

        def hook(v: Any, _: Any) -> tuple[Any, ...]:
            if not isinstance(v, list):
                raise TypeError(f"expected a list, got {type(v).__name__}")
            return tuple(inner(x, elem) for x in v)

        return hook

    def is_homogeneous_tuple(t: Any) -> bool:
        args: tuple[Any, ...] = getattr(t, "__args__", ())
        return getattr(t, "__origin__", None) is tuple and len(args) == 2 and args[-1] is Ellipsis

    c.register_structure_hook_factory(is_homogeneous_tuple, seq_factory)
    _converter = c
    return c


def _check_finite(obj: Any, sid: str, where: str) -> None:
    """InvalidState if a free-form JSON value holds a NaN or an infinity: orjson would write it
    as ``null`` and the value would change on the way to disk. Iterative: any depth."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, float) and not math.isfinite(v):
            raise InvalidState(f"session {sid}: {where} holds {v!r}, which JSON cannot hold "
                               "(it would be stored as null)", session_id=sid,
                               reason="not_json")


def session_to_dict(s: Session) -> dict[str, Any]:
    d: dict[str, Any] = {"format": SESSION_FORMAT}
    d.update(_conv().unstructure(s))
    return d


def encode_session(s: Session) -> bytes:
    """The session file's bytes; the same bytes as ``orjson.dumps(session_to_dict(s))``.

    The transcript is spliced in from ``_MessageCache`` so a checkpoint of a long session costs
    the encoding of its new messages, not of all of them (bench/growth.py)."""
    import orjson

    _check_finite(s.metadata, s.id, "metadata")
    if s.turn is not None and s.turn.ledger:
        _check_finite([e.arguments for e in s.turn.ledger], s.id, "the ledger's arguments")
    try:
        d: dict[str, Any] = {"format": SESSION_FORMAT}
        if not s.messages:
            d.update(_conv().unstructure(s))
            return orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE)
        # the fields before and after the transcript, encoded on their own and spliced around
        # it: {"format":...,"turn":...,"messages":[...],"summary":...,"metadata":...}\n
        d.update(_conv().unstructure(attrs.evolve(s, messages=())))
        keys = list(d)
        at = keys.index("messages")
        head = orjson.dumps({k: d[k] for k in keys[:at]})
        tail = orjson.dumps({k: d[k] for k in keys[at + 1:]})
        opening = head[:-1] + b',"messages":'
        closing = b"]" + (b"," + tail[1:] if len(tail) > 2 else b"}") + b"\n"
        return _message_cache.encode(s.id, s.messages, opening, closing)
    except TypeError as e:  # orjson: not serialisable, over 64 bits, nested over 255 levels
        raise InvalidState(f"session {s.id} is not JSON-serialisable: {e}", session_id=s.id,
                           reason="not_json") from e
    except RecursionError as e:  # nested deeper than Python can walk (cattrs, attrs)
        raise InvalidState(f"session {s.id} is nested too deep to store", session_id=s.id,
                           reason="too_deep") from e


class _MessageCache:
    """The encoded JSON of the transcripts last committed, per session id, bounded.

    Messages are frozen, so a message that is the *same object* as one encoded before encodes to
    the same bytes — unless it has tool calls, whose ``arguments`` are mutable dicts: for those
    a deep copy of the arguments is kept and compared (``==``) on every reuse, and any change
    means a fresh encoding. Reuse is decided by
    identity (``is``) of the transcript's prefix, never by equality, and the cache holds the
    message objects it remembers, so an id cannot be recycled under it. A transcript that was
    appended to costs the encoding of its new messages (plus two copies of the bytes); anything
    else is encoded afresh. At most ``MAX_SESSIONS`` transcripts and ``MAX_BYTES`` of encoded
    messages are kept, oldest dropped first.
    """

    MAX_SESSIONS = 8
    MAX_BYTES = 64 * 1024 * 1024

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        # session id -> (messages, "[" + encoded messages joined by ",",
        #                [(index, copy of its tool calls' arguments)] to re-check on reuse)
        self._entries: dict[str, tuple[tuple[Message, ...], bytearray,
                                       list[tuple[int, list[Any]]]]] = {}
        self._bytes = 0

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def discard(self, sid: str) -> None:
        """Forget one session's transcript (its next encoding starts from scratch)."""
        with self._lock:
            entry = self._entries.pop(sid, None)
            if entry is not None:
                self._bytes -= len(entry[1])

    @staticmethod
    def _arguments(m: Message) -> list[Any]:
        return [c.arguments for c in m.tool_calls]

    def encode(self, sid: str, msgs: tuple[Message, ...], opening: bytes = b"",
               closing: bytes = b"]") -> bytes:
        """``opening + orjson.dumps([unstructured message, ...])[:-1] + closing``, reusing the
        encodings it has of ``msgs`` (one copy of the bytes, made while no other thread can
        touch the cached buffer)."""
        import copy

        import orjson

        with self._lock:  # taken out while in use: two threads never share an entry
            entry = self._entries.pop(sid, None)
            if entry is not None:
                self._bytes -= len(entry[1])
        start = 0
        if entry is not None:
            old, buf, checks = entry
            k = len(old)
            if (k <= len(msgs) and all(map(operator.is_, old, msgs[:k]))
                    and all([c.arguments for c in msgs[i].tool_calls] == a for i, a in checks)):
                start = k
        if start == 0:
            buf, checks = bytearray(b"["), []
        unstructure = _conv().unstructure
        for i in range(start, len(msgs)):
            m = msgs[i]
            if i:
                buf += b","
            if m.tool_calls:
                _check_finite(self._arguments(m), sid, f"message {i}'s tool call arguments")
            buf += orjson.dumps(unstructure(m))
            if m.tool_calls:
                checks.append((i, copy.deepcopy(self._arguments(m))))
        out = b"".join((opening, buf, closing))
        with self._lock:
            if len(buf) <= self.MAX_BYTES:
                raced = self._entries.pop(sid, None)  # another thread encoded it meanwhile
                if raced is not None:
                    self._bytes -= len(raced[1])
                self._entries[sid] = (msgs, buf, checks)
                self._bytes += len(buf)
            while self._entries and (len(self._entries) > self.MAX_SESSIONS
                                     or self._bytes > self.MAX_BYTES):
                oldest = next(iter(self._entries))
                self._bytes -= len(self._entries.pop(oldest)[1])
        return out


_message_cache = _MessageCache()


_INT63 = 1 << 63  # counters stay below it: the next commit can always write version + 1


def parse_session(data: bytes, *, path: str | None = None,
                  session_id: str | None = None) -> tuple[Session, bool]:
    """Parse a session file; returns (session, migrated?). ``session_id``: the id its file name
    says (``wrong_id`` if the file holds another session)."""
    import orjson

    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise UnreadableState(f"not valid JSON: {e}", path=path, reason="invalid_json") from e
    if not isinstance(d, dict):
        raise UnreadableState("not a JSON object", path=path, reason="invalid_json")
    if orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE) != data:
        # not byte for byte what the encoder writes (another writer, a hand edit, a duplicate
        # key, an integer orjson read as a float): parse it again strictly and exactly —
        # duplicate keys are refused as in a marker, integers of any size stay integers
        d = loads_strict(data, path=path)
    d, migrated = upgrade(d, "session", path=path)
    if "version" not in d:  # a default of 0 would read as "absent" to the commit's CAS
        raise UnreadableState("missing field 'version'", path=path, reason="missing_field")
    try:
        s = _conv().structure(d, Session)
    except (TypeError, ValueError, KeyError) as e:  # the hooks' and validators' findings
        raise UnreadableState(f"session does not match the format: {e!r}", path=path,
                              reason="wrong_type") from e
    # anything else (AttributeError from a cattrs older than the declared floor, a missing
    # structure handler) is a bug of the environment, not of the file: it propagates, and the
    # valid session is never quarantined for it
    if (not 1 <= s.version < _INT63
            or (s.turn is not None and not 0 <= s.turn.resume_attempts < _INT63)):
        raise UnreadableState("session version or attempts out of range", path=path,
                              reason="wrong_value")
    check_id(s.id, session_id, path)
    return s, migrated


# the stdlib formats are re-exported: every on-disk format can be named from here
__all__ = [
    "CURRENT",
    "EVENT_FORMAT",
    "MANIFEST_FORMAT",
    "MARKER_FORMAT",
    "MIGRATIONS",
    "SESSION_FORMAT",
    "check_id",
    "dumps_small",
    "encode_event",
    "encode_manifest",
    "encode_marker",
    "encode_session",
    "loads_strict",
    "migration",
    "parse_event",
    "parse_manifest",
    "parse_marker",
    "parse_session",
    "session_to_dict",
    "split_format",
    "upgrade",
]
