"""Pure encode/parse functions for every on-disk format, versioned, with migrations.

The session codec lives here: strict (cattrs turns ``1`` into ``"1"`` by default; the converter
below does not), with cattrs and orjson imported on first use. The format tags, the migration
registry, strict JSON and the codecs of the small records (marker, event, manifest) are stdlib-only
and live in ``_recordcodec`` (the startup path imports that, never this); they are re-exported here.
"""

from __future__ import annotations

import collections.abc
import math
import os
from collections.abc import Callable
from typing import Any

import attrs

from ._errors import InvalidSessionId, InvalidState, UnreadableState
from ._history import DEFAULT_MAX_BYTES, LANE_RE, Chain, History, HistoryRef, ref_from_dict
from ._layout import HISTORY, SESSIONS, validate_session_id
from ._model import LedgerEntry, Session, Turn
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


@migration("session", 3)
def _session_3_to_4(d: dict[str, Any]) -> dict[str, Any]:
    """Session v3 held its messages inline; v4 keeps them in write-once segments (storage.md).
    The messages stay inline in the migrated dict: parse_session reads them into memory and the
    commit that writes the file in format 4 (the repair gate's migration, or any commit) writes
    them as the first segment."""
    d = dict(d)
    d["format"] = "fsdurable.session/4"
    return d


@migration("session", 4)
def _session_4_to_5(d: dict[str, Any]) -> dict[str, Any]:
    """Session v5 may name lanes (an adapter's values in segments, storage.md). A v4 document
    names none, and is a v5 document as it is; the bump exists for the other direction: a
    fsdurable that knows no lanes meets a v5 file as "needs a newer fsdurable" and never writes
    it — else its next commit would write the document without its lanes, and drop them."""
    d = dict(d)
    d["format"] = "fsdurable.session/5"
    return d


@migration("session", 5)
def _session_5_to_6(d: dict[str, Any]) -> dict[str, Any]:
    """Session v6 may keep a chain's newest values inline in the document (``inline``, after
    the chain's head, storage.md). A v5 document keeps none, and is a v6 document as it is; the
    bump is for the other direction: a fsdurable that knows no inline tail would read a v6
    document as a shorter history, and its next commit would drop the tail — it meets v6 as
    "needs a newer fsdurable" and never writes it."""
    d = dict(d)
    d["format"] = "fsdurable.session/6"
    return d


@migration("session", 6)
def _session_6_to_7(d: dict[str, Any]) -> dict[str, Any]:
    """Session v7 may say that the oldest values of its history's archive were removed by the
    retention rule (``kept``: the chain is stored from that index; storage.md, "Compaction and
    its archive"). A v6 document says none were, and is a v7 document as it is; the bump is for
    the other direction: a fsdurable that knows no ``kept`` would take the removed archive for
    segments not arrived yet (and its next commit would drop the field) — it meets v7 as "needs
    a newer fsdurable" and never writes it."""
    d = dict(d)
    d["format"] = "fsdurable.session/7"
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
    # Session.messages (a Sequence: a History when read from disk) is structured as a tuple
    c.register_structure_hook_factory(
        lambda t: getattr(t, "__origin__", None) is collections.abc.Sequence, seq_factory)
    _converter = c
    return c


def _check_finite(obj: Any, sid: str, where: str) -> bool:
    """InvalidState if a free-form JSON value holds a NaN or an infinity: orjson would write it
    as ``null`` and the value would change on the way to disk. Iterative: any depth.

    Returns whether the value is plain JSON — exact ``dict`` (``str`` keys), ``list``,
    ``tuple``, ``str``, ``int``, ``float``, ``bool``, None, at most ``_PLAIN_DEPTH`` deep —
    which ``orjson`` writes exactly as it writes the converter's unstructured copy of it
    (``_document`` passes such a value as it is; anything else goes through the converter)."""
    if not obj and type(obj) is dict:  # no metadata (most sessions): nothing to walk
        return True
    plain = True
    stack = [(obj, 1)]
    while stack:
        v, depth = stack.pop()
        t = type(v)
        if t in _SCALARS:
            if t is float and not math.isfinite(v):
                _not_finite(v, sid, where)
            continue
        # anything but the exact JSON types (a subclass, an enum, an attrs instance, ...) is
        # the converter's to write: not plain; its values are checked all the same
        if t is not dict and t is not list and t is not tuple:
            plain = False
            if not isinstance(v, (dict, list, tuple)):
                if isinstance(v, float) and not math.isfinite(v):
                    _not_finite(v, sid, where)
                continue
        if depth > _PLAIN_DEPTH:
            plain = False
        if isinstance(v, dict):
            if plain and not all(type(k) is str for k in v):
                plain = False
            stack.extend((x, depth + 1) for x in v.values())
        else:
            stack.extend((x, depth + 1) for x in v)
    return plain


# orjson refuses nesting past 255 levels (TypeError: not_json); the converter may hit Python's
# recursion limit first on a deeper value (too_deep): past this depth the converter decides
_PLAIN_DEPTH = 200


_SCALARS = frozenset({str, int, float, bool, type(None)})  # exact types orjson writes as is


def _not_finite(v: float, sid: str, where: str) -> None:
    raise InvalidState(f"session {sid}: {where} holds {v!r}, which JSON cannot hold "
                       "(it would be stored as null)", session_id=sid, reason="not_json")


def _document(s: Session, ref: HistoryRef | None, lanes: dict[str, HistoryRef]
              ) -> dict[str, Any]:
    """``session_to_dict(s, ref, lanes, fragments=True)`` written out by hand for a session of
    the model's own classes whose free-form values are plain JSON (the caller checked them:
    ``_check_finite``): the same keys in the same order, the same values for ``orjson`` — with
    no converter to build (its unstructure functions are generated on first use: milliseconds
    of the first commit of a process, bench/README.md "first_commit_vs_warm") and no copy.
    tests/test_codec.py checks it writes the converter's bytes."""
    t = s.turn
    turn: dict[str, Any] | None = None
    if t is not None:
        turn = {"id": t.id, "started_at": t.started_at, "checkpoint_at": t.checkpoint_at,
                "phase": t.phase, "resume_attempts": t.resume_attempts,
                "ledger": [{"tool_call_id": e.tool_call_id, "name": e.name, "effect": e.effect,
                            "idempotency_key": e.idempotency_key, "status": e.status,
                            "intent_at": e.intent_at, "outcome_at": e.outcome_at,
                            "result": e.result, "arguments": e.arguments} for e in t.ledger],
                "node_id": t.node_id, "route_key": t.route_key, "driver": t.driver,
                "run_id": t.run_id, "attempt_id": t.attempt_id}
    d: dict[str, Any] = {
        "format": SESSION_FORMAT, "id": s.id, "version": s.version, "commit_id": s.commit_id,
        "created_at": s.created_at, "updated_at": s.updated_at, "source": s.source,
        "route_key": s.route_key, "in_progress": s.in_progress, "turn": turn,
        "history": ref.to_dict(True) if ref is not None else None}
    if lanes:
        d["lanes"] = {k: lanes[k].to_dict(True) for k in sorted(lanes)}
    d["summary"], d["metadata"] = s.summary, s.metadata
    return d


def history_ref(s: Session) -> HistoryRef | None:
    """The stored history ``s`` names (None: no messages); InvalidState if some of its messages
    are not stored yet (only the commit function writes them: ``_commit``)."""
    msgs = s.messages
    if isinstance(msgs, History) and not msgs.tail and msgs.chain is not None:
        if msgs.chain.sid != s.id:
            raise InvalidState(f"session {s.id} holds another session's history",
                               session_id=s.id, reason="history_not_stored")
        return msgs.chain.ref
    if not msgs:
        return None
    raise InvalidState(f"session {s.id} has messages that are not stored yet: commit it",
                       session_id=s.id, reason="history_not_stored")


def lane_refs(s: Session) -> dict[str, HistoryRef]:
    """The stored chain each non-empty lane of ``s`` names; InvalidState if a lane has values
    not stored yet (only the commit function writes them) or a name out of shape."""
    out: dict[str, HistoryRef] = {}
    for name in sorted(s.lanes):
        values = s.lanes[name]
        if LANE_RE.fullmatch(name) is None:
            raise InvalidState(f"session {s.id}: lane name {name!r} is not [a-z][a-z0-9_]{{0,31}}",
                               session_id=s.id, reason="bad_lane")
        if isinstance(values, History) and not values.tail and values.chain is not None \
                and values.chain.sid == s.id and values.chain.lane == name:
            out[name] = values.chain.ref
        elif len(values):
            raise InvalidState(f"session {s.id}'s lane {name} has values that are not stored "
                               "yet: commit it", session_id=s.id, reason="history_not_stored")
    return out


def session_to_dict(s: Session, ref: HistoryRef | bool | None = True,
                    lanes: dict[str, HistoryRef] | None = None, *,
                    fragments: bool = False) -> dict[str, Any]:
    """The document's fields (format 6); ``ref``: the history it names (default: ``s``'s);
    ``lanes``: the lanes' chains it names (default: ``s``'s; the key left out when none);
    ``fragments``: the inline tails as their bytes (``orjson.Fragment``: the encoder's), else
    as parsed JSON values."""
    if ref is True:
        ref = history_ref(s)
    if lanes is None:
        lanes = lane_refs(s)
    d: dict[str, Any] = {"format": SESSION_FORMAT}
    d.update(_conv().unstructure(attrs.evolve(s, messages=(), lanes={})))
    del d["messages"], d["lanes"]
    summary, metadata = d.pop("summary"), d.pop("metadata")
    d["history"] = ref.to_dict(fragments) if isinstance(ref, HistoryRef) else None
    if lanes:
        d["lanes"] = {k: lanes[k].to_dict(fragments) for k in sorted(lanes)}
    d["summary"], d["metadata"] = summary, metadata
    return d


def encode_session(s: Session, ref: HistoryRef | bool | None = True,
                   lanes: dict[str, HistoryRef] | None = None) -> bytes:
    """The session document's bytes (format 6): every field but the messages, which live in
    the segments ``ref`` names and its bounded inline tail (default: the stored history ``s``
    carries). Small whatever the length of the conversation: a commit rewrites this, not the
    transcript."""
    import orjson

    plain = _check_finite(s.metadata, s.id, "metadata") and type(s) is Session
    turn = s.turn
    if turn is not None:
        plain = plain and type(turn) is Turn
        if turn.ledger:
            plain = (_check_finite([e.arguments for e in turn.ledger], s.id,
                                   "the ledger's arguments")
                     and plain and all(type(e) is LedgerEntry for e in turn.ledger))
    try:
        if plain:
            if ref is True:
                ref = history_ref(s)
            doc = _document(s, ref if isinstance(ref, HistoryRef) else None,
                            lane_refs(s) if lanes is None else lanes)
        else:
            doc = session_to_dict(s, ref, lanes, fragments=True)
        return orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError as e:  # orjson: not serialisable, over 64 bits, nested over 255 levels
        raise InvalidState(f"session {s.id} is not JSON-serialisable: {e}", session_id=s.id,
                           reason="not_json") from e
    except RecursionError as e:  # nested deeper than Python can walk (cattrs, attrs)
        raise InvalidState(f"session {s.id} is nested too deep to store", session_id=s.id,
                           reason="too_deep") from e


def _upgraded(d: dict[str, Any], path: str | None) -> tuple[dict[str, Any], bool, bool]:
    """``upgrade`` of a session dict, and whether its format held the messages inline (3 and
    older: a later format's are a hand edit, ignored)."""
    _kind, ver = split_format(d, path=path)
    got, migrated = upgrade(d, "session", path=path)
    return got, migrated, ver <= 3

_INT63 = 1 << 63  # counters stay below it: the next commit can always write version + 1


def _history_dir(path: str | None, sid: str) -> str | None:
    """``ROOT/history/<id>`` for a document at ``ROOT/sessions/<id>.json`` (None elsewhere: a
    quarantined copy, bytes without a file)."""
    if path is None or os.path.basename(os.path.dirname(path)) != SESSIONS:
        return None
    try:
        validate_session_id(sid)
    except InvalidSessionId:
        return None
    return os.path.join(os.path.dirname(os.path.dirname(path)), HISTORY, sid)


def parse_session(data: bytes, *, path: str | None = None, session_id: str | None = None,
                  history_dir: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES
                  ) -> tuple[Session, bool]:
    """Parse a session document; returns (session, migrated?). ``session_id``: the id its file
    name says (``wrong_id`` if the file holds another session). No history is read: the
    session's ``messages`` is a ``History`` over the segments in ``history_dir`` (default: the
    store's ``history/<id>`` beside ``path``), read when used, each read bounded by
    ``max_bytes``. A file of format 3 or older holds its messages inline: they are parsed here
    (``migrated`` is True) and stored as a segment by the commit that writes it again."""
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
    d, migrated, inline_ok = _upgraded(d, path)
    if "version" not in d:  # a default of 0 would read as "absent" to the commit's CAS
        raise UnreadableState("missing field 'version'", path=path, reason="missing_field")
    # format 3 and older: the messages inline (structured below); format 4: none inline (a
    # hand edit's are ignored), the history named
    inline = inline_ok and "messages" in d
    ref = ref_from_dict(d.pop("history", None), path=path)
    lanes_d = d.pop("lanes", None)
    if lanes_d is not None and not isinstance(lanes_d, dict):
        raise UnreadableState("lanes must be an object", path=path, reason="wrong_type")
    lane_ref = {}
    for name, v in (lanes_d or {}).items():
        if LANE_RE.fullmatch(name) is None:
            raise UnreadableState(f"lane name {name!r} out of shape"[:200], path=path,
                                  reason="wrong_value")
        got = ref_from_dict(v, path=path, lane=name)
        if got is not None:
            lane_ref[name] = got
    if not inline:
        d.pop("messages", None)
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
    where = history_dir if history_dir is not None else _history_dir(path, s.id)
    if ref is not None and not inline:
        s = attrs.evolve(s, messages=History(Chain(s.id, where, ref, max_bytes)))
    lanes: dict[str, Any] = {k: History(Chain(s.id, where, r, max_bytes, lane=k))
                             for k, r in lane_ref.items()}
    meta = s.metadata
    for key, field in INLINE_LANES.items():  # an older adapter session: its values inline
        ns = meta.get(key)
        if isinstance(ns, dict) and isinstance(ns.get(field), list) and key not in lanes:
            lanes[key] = History(None, tuple(ns[field]))
            meta = {**meta, key: {k: v for k, v in ns.items() if k != field}}
            migrated = True
    if lanes or meta is not s.metadata:
        s = attrs.evolve(s, lanes=lanes, metadata=meta)
    return s, migrated


# lanes older adapter sessions held inline: metadata[key][field], a list (storage.md, "Older
# adapter sessions"); read into the lane ``key`` in memory, stored by the next commit
INLINE_LANES = {"openai_agents": "items", "pydantic_ai_run": "messages"}


def inline_lanes(s: Session) -> bool:
    """Does ``s`` (as read) hold lane values an older fsdurable kept inline, not stored in
    segments yet? The repair gate migrates such a session (``session_migrated``)."""
    return any(isinstance(v, History) and v.chain is None for v in s.lanes.values())


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
    "history_ref",
    "inline_lanes",
    "lane_refs",
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
