"""Pure encode/parse functions for every on-disk format, versioned, with migrations.

Each file carries ``"format": "fsdurable.<kind>/<n>"``. Parsing is strict: a wrong type is an error,
never a coercion (cattrs turns ``1`` into ``"1"`` by default; the converter below does not).
Unknown keys are ignored (a newer writer may add some); an unknown version or kind raises
``UnreadableState`` so the caller can quarantine the file. Older versions are migrated on parse.

Markers and events are parsed by hand with the stdlib ``json`` (tiny files on the startup path: no
cattrs, no orjson import); sessions use cattrs and orjson, imported on first use.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable
from typing import Any

import attrs

from ._errors import InvalidState, UnreadableState
from ._model import Event, Manifest, Marker, Message, Session

SESSION_FORMAT = "fsdurable.session/3"
MARKER_FORMAT = "fsdurable.marker/1"
EVENT_FORMAT = "fsdurable.event/1"
MANIFEST_FORMAT = "fsdurable/1"
CURRENT = {"session": 3, "marker": 1, "event": 1}

# (kind, from_version) -> function turning that version's dict into the next version's dict.
MIGRATIONS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}


def migration(kind: str, from_version: int) -> Callable[
    [Callable[[dict[str, Any]], dict[str, Any]]], Callable[[dict[str, Any]], dict[str, Any]]
]:
    def register(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[
        [dict[str, Any]], dict[str, Any]
    ]:
        MIGRATIONS[(kind, from_version)] = fn
        return fn

    return register


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


# ---------------------------------------------------------------- generic helpers


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {dup!r}")
    return d


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):  # 1e400 overflows to inf: as invalid as a NaN literal
        raise ValueError(f"number {text} is out of range")
    return v


# json.loads(text, **hooks) builds this same decoder on every call; build it once (the startup
# path parses every marker with it)
_STRICT_JSON = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_reject_constant,
                                parse_float=_finite_float)


def loads_strict(data: bytes, *, path: str | None = None) -> dict[str, Any]:
    """Parse a small JSON object strictly: UTF-8 without BOM, no NaN, no duplicate keys."""
    try:
        text = data.decode("utf-8")
        if text.startswith("\ufeff"):
            raise ValueError("byte order mark")
        obj = _STRICT_JSON.decode(text)
    except (ValueError, RecursionError) as e:
        raise UnreadableState(f"not valid JSON: {e}", path=path, reason="invalid_json") from e
    if not isinstance(obj, dict):
        raise UnreadableState("not a JSON object", path=path, reason="invalid_json")
    return obj


def split_format(d: dict[str, Any], *, path: str | None = None) -> tuple[str, int]:
    """``"fsdurable.<kind>/<n>"`` -> (kind, n); UnreadableState if missing or malformed."""
    fmt = d.get("format")
    if not isinstance(fmt, str) or not fmt.startswith("fsdurable.") or "/" not in fmt:
        raise UnreadableState(f"no fsdurable format tag: {fmt!r}", path=path, reason="no_format")
    kind, _, ver = fmt[len("fsdurable."):].partition("/")
    if not (ver.isascii() and ver.isdigit()):  # "²".isdigit() is True, int("²") fails
        raise UnreadableState(f"bad format tag {fmt!r}", path=path, reason="no_format")
    return kind, int(ver)


def upgrade(
    d: dict[str, Any], kind: str, *, path: str | None = None
) -> tuple[dict[str, Any], bool]:
    """Migrate ``d`` to the current version of ``kind``; returns (dict, migrated?)."""
    got, ver = split_format(d, path=path)
    if got != kind:
        raise UnreadableState(f"expected a {kind} file, got {got!r}", path=path,
                              reason="wrong_kind")
    current = CURRENT[kind]
    if ver > current:
        raise UnreadableState(
            f"{kind} format version {ver} is newer than this fsdurable ({current})",
            path=path, reason="unknown_version",
        )
    migrated = False
    while ver < current:
        step = MIGRATIONS.get((kind, ver))
        if step is None:
            raise UnreadableState(
                f"no migration for {kind} version {ver}", path=path, reason="unknown_version"
            )
        d = step(d)
        ver += 1
        migrated = True
    return d, migrated


_MISSING: Any = object()


def _field(d: dict[str, Any], key: str, typ: type | tuple[type, ...], path: str | None,
           *, optional: bool = False) -> Any:
    v = d.get(key, _MISSING)
    if v.__class__ is typ and typ is not float:  # exactly str or int: no bool, no NaN to check
        return v
    if v is _MISSING:
        if optional:
            return None
        raise UnreadableState(f"missing field {key!r}", path=path, reason="missing_field")
    if v is None and optional:
        return None
    ok = isinstance(v, typ) and not (isinstance(v, bool) and bool not in _tuple(typ))
    if ok and isinstance(v, float) and not math.isfinite(v):
        ok = False
    if not ok:
        raise UnreadableState(
            f"field {key!r} has the wrong type ({type(v).__name__})", path=path, reason="wrong_type"
        )
    return float(v) if float in _tuple(typ) else v


def _tuple(typ: type | tuple[type, ...]) -> tuple[type, ...]:
    return typ if isinstance(typ, tuple) else (typ,)


_NUM = (int, float)


def dumps_small(d: dict[str, Any]) -> bytes:
    return (json.dumps(d, ensure_ascii=False, indent=1, allow_nan=False) + "\n").encode()


# ---------------------------------------------------------------- marker


# Discovery reads no marker larger than this (a huge marker would slow every start); the commit
# refuses to write one (encode_marker), so every marker a commit writes is discoverable.
MAX_MARKER_BYTES = 1 << 20


def encode_marker(m: Marker) -> bytes:
    """The marker's bytes; InvalidState (nothing written) if discovery could not read them back:
    over ``MAX_MARKER_BYTES`` (a huge ``source``, ``route_key`` or turn id) or not encodable."""
    try:
        data = _encode_marker(m)
    except (ValueError, UnicodeEncodeError) as e:
        raise InvalidState(f"marker of session {m.session_id} is not JSON: {e}",
                           session_id=m.session_id, reason="not_json") from e
    if len(data) > MAX_MARKER_BYTES:
        raise InvalidState(
            f"marker of session {m.session_id} would be {len(data)} bytes, over the "
            f"{MAX_MARKER_BYTES} discovery reads (source {len(m.source)}, route_key "
            f"{len(m.route_key)}, turn id {len(m.turn_id)} characters)",
            session_id=m.session_id, reason="too_large")
    return data


def _encode_marker(m: Marker) -> bytes:
    return dumps_small({
        "format": MARKER_FORMAT,
        "session_id": m.session_id,
        "turn_id": m.turn_id,
        "session_version": m.session_version,
        "node_id": m.node_id,
        "route_key": m.route_key,
        "source": m.source,
        "started_at": m.started_at,
        "checkpoint_at": m.checkpoint_at,
        "resume_attempts": m.resume_attempts,
    })


def _check_id(got: str, want: str | None, path: str | None) -> None:
    """A file found under ``<want>.json`` must be about session ``want``."""
    if want is not None and got != want:
        raise UnreadableState(f"{path or 'file'} is about session {got!r}, not {want!r}",
                              path=path, session_id=want, reason="wrong_id")


def parse_marker(data: bytes, *, path: str | None = None,
                 session_id: str | None = None) -> Marker:
    """Parse a marker; ``session_id``: the id its file name says (``wrong_id`` if it differs)."""
    d = loads_strict(data, path=path)
    if d.get("format") != MARKER_FORMAT:
        d, _ = upgrade(d, "marker", path=path)
    m = _marker_fast(d)
    if m is None:
        m = _marker_checked(d, path)
    if m.resume_attempts < 0 or m.session_version < 0:
        raise UnreadableState("negative counter in marker", path=path, reason="wrong_value")
    _check_id(m.session_id, session_id, path)
    return m


def _marker_fast(d: dict[str, Any]) -> Marker | None:
    """The marker if every field has exactly its type (what fsdurable writes), else None: the
    startup path reads every marker, so the common case skips the field-by-field checks below
    (which accept the same values, and explain a refusal)."""
    g = d.get
    sid, tid, node, route, source = (g("session_id"), g("turn_id"), g("node_id"),
                                      g("route_key"), g("source"))
    version, attempts = g("session_version"), g("resume_attempts")
    started, checkpoint = g("started_at"), g("checkpoint_at")
    if (sid.__class__ is str and tid.__class__ is str and node.__class__ is str
            and route.__class__ is str and source.__class__ is str
            and version.__class__ is int and attempts.__class__ is int
            and started.__class__ is float and checkpoint.__class__ is float
            and math.isfinite(started) and math.isfinite(checkpoint)):
        return Marker(session_id=sid, turn_id=tid, session_version=version, node_id=node,
                      route_key=route, source=source, started_at=started,
                      checkpoint_at=checkpoint, resume_attempts=attempts)
    return None


def _marker_checked(d: dict[str, Any], path: str | None) -> Marker:
    f = _field
    return Marker(
        session_id=f(d, "session_id", str, path),
        turn_id=f(d, "turn_id", str, path),
        session_version=f(d, "session_version", int, path),
        node_id=f(d, "node_id", str, path),
        route_key=f(d, "route_key", str, path),
        source=f(d, "source", str, path),
        started_at=f(d, "started_at", _NUM, path),
        checkpoint_at=f(d, "checkpoint_at", _NUM, path),
        resume_attempts=f(d, "resume_attempts", int, path),
    )


# ---------------------------------------------------------------- event


def encode_event(e: Event) -> bytes:
    d = {"format": EVENT_FORMAT, "at": e.at, "code": e.code, "session_id": e.session_id,
         "turn_id": e.turn_id, "node_id": e.node_id, "reason": e.reason, "detail": e.detail}
    try:
        return (json.dumps(d, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                           default=str) + "\n").encode()
    except ValueError as exc:
        raise InvalidState(f"event is not JSON: {exc}", reason="not_json") from exc


def parse_event(line: bytes, *, path: str | None = None) -> Event:
    d, _ = upgrade(loads_strict(line, path=path), "event", path=path)
    detail = d.get("detail", {})
    if not isinstance(detail, dict):
        raise UnreadableState("event detail is not an object", path=path, reason="wrong_type")
    return Event(
        at=_field(d, "at", _NUM, path),
        code=_field(d, "code", str, path),
        session_id=_field(d, "session_id", str, path, optional=True),
        turn_id=_field(d, "turn_id", str, path, optional=True),
        node_id=_field(d, "node_id", str, path, optional=True),
        reason=_field(d, "reason", str, path, optional=True),
        detail=detail,
    )


# ---------------------------------------------------------------- manifest


def encode_manifest(m: Manifest) -> bytes:
    return dumps_small({"format": MANIFEST_FORMAT, "store_id": m.store_id,
                        "created_at": m.created_at})


def parse_manifest(data: bytes, *, path: str | None = None) -> Manifest:
    d = loads_strict(data, path=path)
    if d.get("format") != MANIFEST_FORMAT:
        raise UnreadableState(f"unknown store format {d.get('format')!r}", path=path,
                              reason="unknown_version")
    return Manifest(store_id=_field(d, "store_id", str, path),
                    created_at=_field(d, "created_at", _NUM, path))


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
    except TypeError as e:
        raise InvalidState(f"session {s.id} is not JSON-serialisable: {e}", session_id=s.id,
                           reason="not_json") from e


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
    except Exception as e:  # cattrs raises several types; all mean "wrong shape"
        raise UnreadableState(f"session does not match the format: {e!r}", path=path,
                              reason="wrong_type") from e
    if (not 1 <= s.version < _INT63
            or (s.turn is not None and not 0 <= s.turn.resume_attempts < _INT63)):
        raise UnreadableState("session version or attempts out of range", path=path,
                              reason="wrong_value")
    _check_id(s.id, session_id, path)
    return s, migrated
