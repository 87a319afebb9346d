"""The stdlib half of the on-disk formats: strict JSON, format tags and migrations, and the codecs
of the startup path's records (marker, event, manifest).

Each file carries ``"format": "fsdurable.<kind>/<n>"``. Parsing is strict: a wrong type is an error,
never a coercion. Unknown keys are ignored (a newer writer may add some); an unknown version or kind
raises ``UnreadableState`` so the caller can quarantine the file. Older versions are migrated on
parse. Markers and events are parsed by hand with the stdlib ``json``: these are tiny files on the
startup path, which imports no attrs, cattrs or orjson (``_codec`` has the session codec).
"""

from __future__ import annotations

import json

from ._errors import InvalidState, UnreadableState
from ._records import INF, Event, Manifest, Marker, checked_marker

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

SESSION_FORMAT = "fsdurable.session/7"
SEGMENT_FORMAT = "fsdurable.segment/1"
MARKER_FORMAT = "fsdurable.marker/1"
EVENT_FORMAT = "fsdurable.event/1"
MANIFEST_FORMAT = "fsdurable/1"
CURRENT = {"session": 7, "segment": 1, "marker": 1, "event": 1}

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
    if not -INF < v < INF:  # 1e400 overflows to inf: as invalid as a NaN literal
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


def newer_format(d: object, current: str) -> bool:
    """Does ``d`` carry the format tag of ``current``'s kind (``fsdurable.<kind>/<n>``) at a
    higher version: a newer fsdurable's file, to be left in place (``needs_newer``), never
    moved or written over? An adapter's entry files use it as the store's files do."""
    if not isinstance(d, dict):
        return False
    try:
        kind, ver = split_format(d)
        want, cur = split_format({"format": current})
    except UnreadableState:
        return False
    return kind == want and ver > cur


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
    if ok and isinstance(v, float) and not -INF < v < INF:
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


def encode_marker(m: Marker) -> bytes:
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
        "driver": m.driver,
    })


def check_id(got: str, want: str | None, path: str | None) -> None:
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
    check_id(m.session_id, session_id, path)
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
    driver = g("driver", "")
    if (sid.__class__ is str and tid.__class__ is str and node.__class__ is str
            and route.__class__ is str and source.__class__ is str and driver.__class__ is str
            and version.__class__ is int and attempts.__class__ is int
            and started.__class__ is float and checkpoint.__class__ is float
            and -INF < started < INF and -INF < checkpoint < INF):
        return checked_marker(sid, tid, version, node, route, source, started, checkpoint,
                              attempts, driver)
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
        driver=f(d, "driver", str, path) if "driver" in d else "",
    )


# ---------------------------------------------------------------- event


def encode_event(e: Event) -> bytes:
    d = {"format": EVENT_FORMAT, "at": e.at, "code": e.code, "session_id": e.session_id,
         "turn_id": e.turn_id, "node_id": e.node_id, "reason": e.reason, "detail": e.detail}
    try:
        return (json.dumps(d, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                           default=str) + "\n").encode()
    except (ValueError, RecursionError) as exc:  # NaN; or nested deeper than json can walk
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
