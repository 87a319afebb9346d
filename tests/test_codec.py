"""The codec: round-trips of every file kind, strict decoding, and the migration registry."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fsdurable
from fsdurable import _codec, _repair
from fsdurable._codec import (
    encode_event,
    encode_manifest,
    encode_marker,
    encode_session,
    parse_event,
    parse_manifest,
    parse_marker,
    parse_session,
)
from fsdurable._errors import FsDurableError, InvalidState, UnreadableState
from fsdurable._history import HistoryRef, encode_segment
from fsdurable._model import (
    Event,
    LedgerEntry,
    Manifest,
    Marker,
    Message,
    Session,
    ToolCall,
    Turn,
)

from .codec_strategies import events, json_values, manifests, markers, sessions
from .conftest import DATA

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- a rich sample of each kind

LEDGER = (
    LedgerEntry("call_1", "send_email", "external", "s1:t1:call_1", "done", 10.5, 11.0, "sent"),
    LedgerEntry("call_2", "charge_card", "external", "s1:t1:call_2", "intent", 12.0),
)
SESSION = Session(
    id="s1", version=3, created_at=1.5, updated_at=12.25, source="cli", route_key="chat:42",
    in_progress=True,
    turn=Turn(id="t1", started_at=10.0, checkpoint_at=12.0, phase="tools", resume_attempts=1,
              ledger=LEDGER),
    messages=(
        Message("user", "send it"),
        Message("assistant", "", (ToolCall("call_1", "send_email", {"to": ["a@b"], "n": 1}),
                                  ToolCall("call_2", "charge_card", {}))),
        Message("tool", "sent", tool_call_id="call_1"),
    ),
    summary="earlier: greetings",
    metadata={"title": "x", "nested": {"list": [1, 2.5, None, True, "s"]}},
)
MARKER = Marker("s1", "t1", 3, "node-a", "chat:42", "cli", 10.0, 12.0, 1)
EVENT = Event(at=12.5, code="turn_started", session_id="s1", turn_id="t1", node_id="node-a",
              reason=None, detail={"k": [1, {"x": None}]})
MANIFEST = Manifest(store_id="abc123", created_at=1.0)


# the samples' history segments, in a store layout (ROOT/history/<id>/) that parse() reads
_ROOT = Path(tempfile.mkdtemp(prefix="fsd-codec-"))
atexit.register(shutil.rmtree, _ROOT, True)


def encode(s: Session) -> bytes:
    """The document of ``s``, its messages written beside it as one segment (what the commit
    function's first step does)."""
    ref = None
    if s.messages:
        name, sha, data = encode_segment(s.id, 0, None, "node-a", tuple(s.messages))
        where = _ROOT / "history" / s.id
        where.mkdir(parents=True, exist_ok=True)
        (where / name).write_bytes(data)
        ref = HistoryRef(count=len(s.messages), head=name, sha256=sha)
    return encode_session(s, ref)


def parse_doc(data: bytes) -> tuple[Session, bool]:
    """parse_session of a document in the samples' store (its history read from there)."""
    return parse_session(data, path=str(_ROOT / "sessions" / "any.json"))


def session_dict() -> dict[str, Any]:
    d: dict[str, Any] = orjson.loads(encode(SESSION))
    return d


def v3_dict() -> dict[str, Any]:
    """SESSION as format 3 wrote it: the messages inline."""
    d = session_dict()
    del d["history"]
    d["format"] = "fsdurable.session/3"
    d["messages"] = [_codec._conv().unstructure(m) for m in SESSION.messages]
    return d


def small_dict(data: bytes) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(data)
    return d


def dumps(d: Any) -> bytes:
    return json.dumps(d).encode()


def expect_unreadable(parse: Callable[..., Any], data: bytes, reason: str) -> UnreadableState:
    with pytest.raises(UnreadableState) as info:
        parse(data, path="/some/file.json")
    err = info.value
    assert err.reason == reason, (err.reason, err)
    assert err.path == "/some/file.json"
    assert isinstance(err, FsDurableError) and str(err)
    return err


# ---------------------------------------------------------------- (1) round trips


def test_rich_samples_round_trip() -> None:
    assert parse_doc(encode(SESSION)) == (SESSION, False)
    assert parse_marker(encode_marker(MARKER)) == MARKER
    assert parse_event(encode_event(EVENT)) == EVENT
    assert parse_manifest(encode_manifest(MANIFEST)) == MANIFEST


@SETTINGS
@given(sessions())
def test_session_round_trip(s: Session) -> None:
    data = encode(s)
    back, migrated = parse_doc(data)
    assert back == s and not migrated
    assert encode_session(back) == data  # canonical: a re-save changes nothing


@SETTINGS
@given(markers)
def test_marker_round_trip(m: Marker) -> None:
    data = encode_marker(m)
    assert parse_marker(data) == m
    assert encode_marker(parse_marker(data)) == data


@SETTINGS
@given(events)
def test_event_round_trip(e: Event) -> None:
    line = encode_event(e)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one line of the jsonl log
    assert parse_event(line) == e


@SETTINGS
@given(manifests)
def test_manifest_round_trip(m: Manifest) -> None:
    assert parse_manifest(encode_manifest(m)) == m


def test_floats_stay_floats_and_ints_stay_ints() -> None:
    s = attrs.evolve(SESSION, metadata={"i": 1, "f": 1.0, "neg0": -0.0, "big": 2**63 - 1})
    back, _ = parse_doc(encode(s))
    assert type(back.metadata["i"]) is int and type(back.metadata["f"]) is float
    assert back.metadata["big"] == 2**63 - 1
    # a time written as an integer by another writer reads as a float
    d = session_dict()
    d["created_at"] = 5
    back, _ = parse_session(dumps(d))
    assert back.created_at == 5.0 and type(back.created_at) is float


def test_unserialisable_session_is_refused_on_encode() -> None:
    for bad in ({"x": object()}, {"x": 2**70}, {1: "int key"}):
        with pytest.raises(InvalidState) as info:
            encode(attrs.evolve(SESSION, metadata=bad))
        assert info.value.reason == "not_json"
    with pytest.raises(InvalidState):
        encode_event(EVENT.replace(detail={"x": float("inf")}))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_times_never_reach_the_disk(bad: float) -> None:
    # orjson would write them as null, and the file could then never be read back
    turn = SESSION.turn
    assert turn is not None
    for build in (lambda: attrs.evolve(SESSION, created_at=bad),
                  lambda: attrs.evolve(SESSION, updated_at=bad),
                  lambda: attrs.evolve(turn, started_at=bad),
                  lambda: attrs.evolve(turn, checkpoint_at=bad),
                  lambda: attrs.evolve(LEDGER[0], intent_at=bad),
                  lambda: attrs.evolve(LEDGER[0], outcome_at=bad),
                  lambda: MARKER.replace(checkpoint_at=bad)):
        with pytest.raises(ValueError, match="finite"):
            build()
    with pytest.raises(InvalidState):
        encode_event(EVENT.replace(at=bad))


# ---------------------------------------------------------------- (2) strictness: sessions


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation setting ``value`` at a dotted path (numbers index lists); ``...`` deletes."""

    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = d
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        key: Any = int(last) if last.isdigit() else last
        if value is ...:
            del node[key]
        else:
            node[key] = value

    return mutate


SESSION_MUTATIONS = [
    ("version", "3", "wrong_type"),
    ("version", True, "wrong_type"),
    ("version", 1.0, "wrong_type"),
    ("version", None, "wrong_type"),
    ("version", ..., "missing_field"),
    ("version", 0, "wrong_value"),
    ("version", -4, "wrong_value"),
    ("version", 2**64, "wrong_value"),  # read exactly (not as orjson's float), out of range
    ("id", 7, "wrong_type"),
    ("id", ..., "wrong_type"),
    ("created_at", True, "wrong_type"),
    ("created_at", "1.5", "wrong_type"),
    ("updated_at", None, "wrong_type"),
    ("source", ["cli"], "wrong_type"),
    ("route_key", 1, "wrong_type"),
    ("in_progress", 1, "wrong_type"),
    ("in_progress", "true", "wrong_type"),
    ("in_progress", False, "wrong_type"),  # a turn without in_progress
    ("turn", None, "wrong_type"),  # in_progress without a turn
    ("turn", [], "wrong_type"),
    ("turn.id", ..., "wrong_type"),
    ("turn.started_at", False, "wrong_type"),
    ("turn.resume_attempts", "1", "wrong_type"),
    ("turn.resume_attempts", 1.0, "wrong_type"),
    ("turn.resume_attempts", -1, "wrong_value"),
    ("turn.ledger", {}, "wrong_type"),
    ("turn.ledger", "call_1", "wrong_type"),
    ("turn.ledger.0", "call_1", "wrong_type"),
    ("turn.ledger.0.intent_at", "10", "wrong_type"),
    ("turn.ledger.0.outcome_at", True, "wrong_type"),
    ("turn.ledger.0.result", 3, "wrong_type"),
    ("turn.ledger.1.status", ..., "wrong_type"),
    ("history", {}, "wrong_value"),
    ("history", [], "wrong_type"),
    ("history", "000000000000-0000000000000000.json", "wrong_type"),
    ("history.count", 0, "wrong_value"),
    ("history.count", "3", "wrong_value"),
    ("history.start", -1, "wrong_value"),
    ("history.head", "../x.json", "wrong_value"),
    ("history.sha256", "0" * 63, "wrong_value"),
    ("history.kept", -1, "wrong_value"),
    ("history.kept", True, "wrong_value"),
    ("history.kept", "3", "wrong_value"),
    ("history.kept", 1 << 63, "wrong_value"),
    # (a start past the chain, a head whose name is not its digest, a kept past the start:
    # judged when the history is read, test_history.py, test_archive_retention.py)
    ("summary", 3, "wrong_type"),
    ("metadata", [], "wrong_type"),
    ("metadata", None, "wrong_type"),
    ("metadata", "x", "wrong_type"),
    ("format", "fsdurable.session/8", "unknown_version"),
    ("format", "fsdurable.session/99", "unknown_version"),
    ("format", "fsdurable.session/0", "unknown_version"),  # older than any migration
    ("format", "fsdurable.marker/1", "wrong_kind"),
    ("format", "fsdurable.event/1", "wrong_kind"),
    ("format", "fsdurable.session/2.0", "no_format"),
    ("format", "fsdurable.session/\u00b2", "no_format"),
    ("format", "fsdurable.session", "no_format"),
    ("format", "other.session/2", "no_format"),
    ("format", 2, "no_format"),
    ("format", ..., "no_format"),
]


@pytest.mark.parametrize(("path", "value", "reason"), SESSION_MUTATIONS,
                         ids=[f"{p}={v!r}" for p, v, _ in SESSION_MUTATIONS])
def test_session_wrong_shapes_are_refused(path: str, value: Any, reason: str) -> None:
    d = session_dict()
    _set(path, value)(d)
    expect_unreadable(parse_session, dumps(d), reason)


# format 3 held the messages inline: the same converter reads them (and a segment's)
MESSAGE_MUTATIONS = [
    ("messages", {}, "wrong_type"),  # messages as an object
    ("messages", {"0": {"role": "user"}}, "wrong_type"),
    ("messages", "send it", "wrong_type"),  # a string where a list is
    ("messages", None, "wrong_type"),
    ("messages.0", "send it", "wrong_type"),
    ("messages.0.role", "wizard", "wrong_type"),
    ("messages.0.role", 1, "wrong_type"),
    ("messages.0.content", None, "wrong_type"),
    ("messages.0.content", ["send", "it"], "wrong_type"),
    ("messages.1.tool_calls", {}, "wrong_type"),
    ("messages.1.tool_calls.0.arguments", [], "wrong_type"),
    ("messages.1.tool_calls.0.arguments", '{"to": 1}', "wrong_type"),
    ("messages.1.tool_calls.0.name", ..., "wrong_type"),
    ("messages.2.tool_call_id", 5, "wrong_type"),
]


@pytest.mark.parametrize(("path", "value", "reason"), MESSAGE_MUTATIONS,
                         ids=[f"{p}={v!r}" for p, v, _ in MESSAGE_MUTATIONS])
def test_inline_messages_of_format_3_of_a_wrong_shape_are_refused(path: str, value: Any,
                                                                   reason: str) -> None:
    d = v3_dict()
    _set(path, value)(d)
    expect_unreadable(parse_session, dumps(d), reason)


GOOD = orjson.dumps(v3_dict()) + b"\n"
SESSION_BYTES = [
    ("bom", b"\xef\xbb\xbf" + GOOD),
    ("invalid_utf8", GOOD.replace(b'"send it"', b'"send \xff it"')),
    ("overlong_utf8", GOOD.replace(b'"send it"', b'"send \xc0\xaf it"')),
    ("lone_surrogate", GOOD.replace(b'"send it"', b'"\\ud800"')),
    ("nan", GOOD.replace(b"2.5", b"NaN")),
    ("infinity", GOOD.replace(b"2.5", b"Infinity")),
    ("minus_infinity", GOOD.replace(b"2.5", b"-Infinity")),
    ("overflow", GOOD.replace(b"2.5", b"1e400")),
    ("truncated", GOOD[: len(GOOD) // 2]),
    ("empty", b""),
    ("nul", b"\x00" * 64),
    ("array", b"[" + GOOD + b"]"),
    ("string", b'"fsdurable.session/2"'),
    ("trailing_garbage", GOOD + b"}"),
    ("deep", b'{"format":"fsdurable.session/2","id":"s","version":1,"metadata":'
     + b"[" * 100_000 + b"]" * 100_000 + b"}"),
]


@pytest.mark.parametrize(("name", "data"), SESSION_BYTES, ids=[n for n, _ in SESSION_BYTES])
def test_session_bad_bytes_are_refused(name: str, data: bytes) -> None:
    expect_unreadable(parse_session, data, "invalid_json")


def test_unknown_keys_are_ignored_everywhere() -> None:
    d = session_dict()
    d["added_by_a_newer_writer"] = {"x": [1]}
    d["turn"]["future"] = 1
    d["turn"]["ledger"][0]["future"] = None
    d["history"]["future"] = 2
    assert parse_doc(dumps(d)) == (SESSION, False)
    d = v3_dict()
    d["messages"][1]["future"] = "x"
    d["messages"][1]["tool_calls"][0]["future"] = []
    assert parse_session(dumps(d)) == (SESSION, True)
    for parse, enc, obj in ((parse_marker, encode_marker, MARKER),
                            (parse_event, encode_event, EVENT),
                            (parse_manifest, encode_manifest, MANIFEST)):
        dd = small_dict(enc(obj))  # type: ignore[operator]
        dd["added_by_a_newer_writer"] = [1, 2]
        assert parse(dumps(dd)) == obj  # type: ignore[operator]


def test_optional_session_keys_take_their_defaults() -> None:
    s, _ = parse_session(b'{"format":"fsdurable.session/2","id":"minimal","version":2}')
    assert s == Session(id="minimal", version=2)


# ---------------------------------------------------------------- (2) strictness: small files

MARKER_MUTATIONS = [
    ("session_version", "3", "wrong_type"),
    ("session_version", True, "wrong_type"),
    ("session_version", 3.0, "wrong_type"),
    ("session_version", -1, "wrong_value"),
    ("resume_attempts", -1, "wrong_value"),
    ("resume_attempts", False, "wrong_type"),
    ("resume_attempts", ..., "missing_field"),
    ("started_at", True, "wrong_type"),
    ("checkpoint_at", "12", "wrong_type"),
    ("checkpoint_at", None, "wrong_type"),
    ("node_id", None, "wrong_type"),
    ("route_key", ["chat:42"], "wrong_type"),
    ("session_id", ..., "missing_field"),
    ("turn_id", {}, "wrong_type"),
    ("format", "fsdurable.marker/2", "unknown_version"),
    ("format", "fsdurable.session/2", "wrong_kind"),
    ("format", None, "no_format"),
]


@pytest.mark.parametrize(("path", "value", "reason"), MARKER_MUTATIONS,
                         ids=[f"{p}={v!r}" for p, v, _ in MARKER_MUTATIONS])
def test_marker_wrong_shapes_are_refused(path: str, value: Any, reason: str) -> None:
    d = small_dict(encode_marker(MARKER))
    _set(path, value)(d)
    expect_unreadable(parse_marker, dumps(d), reason)


EVENT_MUTATIONS = [
    ("at", "12.5", "wrong_type"),
    ("at", True, "wrong_type"),
    ("at", ..., "missing_field"),
    ("code", 1, "wrong_type"),
    ("session_id", 5, "wrong_type"),
    ("reason", ["stale"], "wrong_type"),
    ("detail", [], "wrong_type"),
    ("detail", None, "wrong_type"),
    ("format", "fsdurable.event/2", "unknown_version"),
    ("format", "fsdurable.marker/1", "wrong_kind"),
]


@pytest.mark.parametrize(("path", "value", "reason"), EVENT_MUTATIONS,
                         ids=[f"{p}={v!r}" for p, v, _ in EVENT_MUTATIONS])
def test_event_wrong_shapes_are_refused(path: str, value: Any, reason: str) -> None:
    d = small_dict(encode_event(EVENT))
    _set(path, value)(d)
    expect_unreadable(parse_event, dumps(d), reason)


MANIFEST_MUTATIONS = [
    ("format", "fsdurable/2", "unknown_version"),
    ("format", "fsdurable.session/2", "unknown_version"),
    ("store_id", 5, "wrong_type"),
    ("created_at", True, "wrong_type"),
    ("created_at", ..., "missing_field"),
]


@pytest.mark.parametrize(("path", "value", "reason"), MANIFEST_MUTATIONS,
                         ids=[f"{p}={v!r}" for p, v, _ in MANIFEST_MUTATIONS])
def test_manifest_wrong_shapes_are_refused(path: str, value: Any, reason: str) -> None:
    d = small_dict(encode_manifest(MANIFEST))
    _set(path, value)(d)
    expect_unreadable(parse_manifest, dumps(d), reason)


def _small_bad_bytes(good: bytes, number: bytes) -> list[tuple[str, bytes]]:
    key = good.split(b'"')[1]  # the first key, "format"
    return [
        ("duplicate_key", good.replace(b"{", b'{"%s": "x", ' % key, 1)),
        ("bom", b"\xef\xbb\xbf" + good),
        ("invalid_utf8", good.replace(b"{", b'{"\xff": 1, ', 1)),
        ("lone_surrogate_bytes", good.replace(b"{", b'{"\xed\xa0\x80": 1, ', 1)),
        ("nan", good.replace(number, b"NaN", 1)),
        ("infinity", good.replace(number, b"-Infinity", 1)),
        ("overflow", good.replace(number, b"1e400", 1)),
        ("truncated", good[: len(good) // 2]),
        ("empty", b""),
        ("array", b"[" + good + b"]"),
        ("deep", b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ]


SMALL_BYTES = [
    (kind, name, data)
    for kind, good, number in (("marker", encode_marker(MARKER), b"12.0"),
                               ("event", encode_event(EVENT), b"12.5"),
                               ("manifest", encode_manifest(MANIFEST), b"1.0"))
    for name, data in _small_bad_bytes(good, number)
]
SMALL_PARSERS: dict[str, Callable[..., Any]] = {
    "marker": parse_marker, "event": parse_event, "manifest": parse_manifest}


@pytest.mark.parametrize(("kind", "name", "data"), SMALL_BYTES,
                         ids=[f"{k}-{n}" for k, n, _ in SMALL_BYTES])
def test_small_file_bad_bytes_are_refused(kind: str, name: str, data: bytes) -> None:
    expect_unreadable(SMALL_PARSERS[kind], data, "invalid_json")


def test_duplicate_keys_in_a_marker_are_refused_even_when_equal() -> None:
    good = encode_marker(MARKER)
    twice = good.replace(b'"turn_id": "t1"', b'"turn_id": "t1", "turn_id": "t1"')
    assert twice != good
    err = expect_unreadable(parse_marker, twice, "invalid_json")
    assert "turn_id" in str(err)
    nested = encode_event(EVENT).replace(b'"k":', b'"k":1,"k":')
    expect_unreadable(parse_event, nested, "invalid_json")


def test_event_detail_may_not_hold_non_finite_numbers() -> None:
    line = encode_event(EVENT).replace(b'"x":null', b'"x":1e999')
    expect_unreadable(parse_event, line, "invalid_json")


# ---------------------------------------------------------------- (2) properties of strictness

# JSON types each session field accepts; a value of any other JSON type must be refused.
SESSION_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,), "version": (int,), "created_at": (int, float), "updated_at": (int, float),
    "source": (str,), "route_key": (str,), "in_progress": (bool,), "history": (dict, type(None)),
    "summary": (str, type(None)), "metadata": (dict,),
}


def _json_type_ok(v: Any, types: tuple[type, ...]) -> bool:
    if isinstance(v, bool):
        return bool in types
    return isinstance(v, types)


@SETTINGS
@given(st.sampled_from(sorted(SESSION_FIELD_TYPES)), json_values())
def test_any_value_of_a_wrong_type_is_refused_never_coerced(field: str, value: Any) -> None:
    d = session_dict()
    d["in_progress"], d["turn"] = False, None
    d[field] = value
    data = orjson.dumps(d)
    if _json_type_ok(value, SESSION_FIELD_TYPES[field]):
        return  # right type (range checks aside): covered by the round trips
    with pytest.raises(UnreadableState) as info:
        parse_session(data)
    assert info.value.reason == "wrong_type"


FIELD_NAMES = sorted({
    "id", "version", "created_at", "updated_at", "source", "route_key", "in_progress", "turn",
    "messages", "history", "summary", "metadata", "session_id", "turn_id", "session_version",
    "node_id", "started_at", "checkpoint_at", "resume_attempts", "at", "code", "reason", "detail",
    "store_id", "created", "updated", "commit_id"})
TAGS = ["fsdurable.session/1", "fsdurable.session/2", "fsdurable.session/3",
        "fsdurable.session/4", "fsdurable.session/5", "fsdurable.session/6", "fsdurable.session/7",
        "fsdurable.segment/1",
        "fsdurable.marker/1", "fsdurable.event/1",
        "fsdurable/1"]
NEAR_FILES = st.fixed_dictionaries(
    {"format": st.sampled_from(TAGS)},
    optional={name: json_values() for name in FIELD_NAMES},
).map(lambda d: json.dumps(d).encode())


@SETTINGS
@given(st.binary(max_size=300) | json_values().map(lambda v: json.dumps(v).encode())
       | NEAR_FILES)
def test_garbage_only_ever_raises_unreadable_state(data: bytes) -> None:
    for parse in (parse_session, parse_marker, parse_event, parse_manifest):
        try:
            parse(data)
        except UnreadableState as e:  # anything else (ValueError, KeyError, ...) fails the test
            assert e.reason


@SETTINGS
@given(st.sampled_from(["session", "marker", "event"]), st.integers(min_value=1, max_value=10**6))
def test_every_future_version_is_unknown(kind: str, ahead: int) -> None:
    current = _codec.CURRENT[kind]
    data = dumps({"format": f"fsdurable.{kind}/{current + ahead}", "id": "x", "version": 1})
    parse = {"session": parse_session, "marker": parse_marker, "event": parse_event}[kind]
    expect_unreadable(parse, data, "unknown_version")


# ---------------------------------------------------------------- (3) the migration registry

V1_ID = "legacy-chat_01"


def v1_fixture() -> dict[str, Any]:
    d: dict[str, Any] = json.loads((DATA / "session_v1.json").read_text(encoding="utf-8"))
    return d


EXPECTED_V1_MESSAGES = (
    Message("system", "You are a careful assistant."),
    Message("user", "Book the 9:40 train and tell Ana."),
    Message("assistant", "", (ToolCall("call_1", "book_train", {"time": "09:40", "seats": 1}),
                              ToolCall("call_2", "send_message", {"to": "Ana", "urgent": True}))),
    Message("tool", "booked: seat 42", tool_call_id="call_1"),
    Message("tool", "sent", tool_call_id="call_2"),
    Message("assistant", "Done \u2014 seat 42, and Ana knows. \U0001f686"),
)


def test_the_registry_holds_a_step_for_every_older_version() -> None:
    for kind, current in _codec.CURRENT.items():
        for ver in range(1, current):
            assert (kind, ver) in _codec.MIGRATIONS, (kind, ver)
    assert ("session", 1) in _codec.MIGRATIONS


def test_v1_fixture_parses_into_the_current_model() -> None:
    s, migrated = parse_session((DATA / "session_v1.json").read_bytes())
    assert migrated
    assert s == Session(
        id=V1_ID, version=7, created_at=1764400000.25, updated_at=1764403600.5,
        source="telegram", route_key=f"session:{V1_ID}", in_progress=False, turn=None,
        messages=EXPECTED_V1_MESSAGES, summary=None,
        metadata={"title": "Train", "tags": ["travel", "work"], "rating": 4.5,
                  "extra": {"n": None, "ok": False}},
    )


def _fixed_store(root: Path, now: float = 1764500000.0) -> fsdurable.Store:
    return fsdurable.Store(root, clock=lambda: now)


def test_v1_session_loads_through_the_store_and_is_rewritten(root: Path) -> None:
    store = _fixed_store(root)
    path = root / "sessions" / f"{V1_ID}.json"
    shutil.copyfile(DATA / "session_v1.json", path)
    seen: list[Event] = []
    store.subscribe(seen.append)

    old = store.load(V1_ID)  # a read migrates in memory only: the file stays as it was
    assert old.version == 7 and path.read_bytes() == (DATA / "session_v1.json").read_bytes()
    assert _repair.repair_session(store, V1_ID).action == "migrated"  # the repair gate
    s = store.load(V1_ID)

    assert s.version == 8  # the rewrite is a commit: 7 -> 8, through the commit function
    assert s.updated_at == 1764500000.0
    assert s.created_at == 1764400000.25 and s.source == "telegram"
    assert s.route_key == f"session:{V1_ID}" and not s.in_progress and s.turn is None
    assert s.messages == EXPECTED_V1_MESSAGES
    assert s.metadata["tags"] == ["travel", "work"]
    raw = json.loads(path.read_bytes())
    assert raw["format"] == "fsdurable.session/7"
    assert "created" not in raw and "updated" not in raw and "messages" not in raw
    # the messages went to the document's inline tail (format 6: within the bound, no segment)
    assert not (root / "history" / V1_ID).exists()
    assert raw["history"]["head"] is None and raw["history"]["count"] == 6
    assert all("text" not in m and "content" in m for m in raw["history"]["inline"])
    assert parse_session(path.read_bytes(), path=str(path)) == (s, False)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert not (root / "markers" / f"{V1_ID}.json").exists()
    migrated = [e for e in store.events(V1_ID) if e.code == "session_migrated"]
    assert len(migrated) == 1 and migrated[0].detail == {"version": 8}
    assert [e.code for e in seen] == ["session_migrated"]

    # migrated once: a second store reading the file sees the current format, no new event
    again = _fixed_store(root).load(V1_ID)
    assert again == s
    assert [e.code for e in store.events(V1_ID)] == ["session_migrated"]


def test_v1_session_in_progress_migrates_attempts_and_gets_its_marker(root: Path) -> None:
    store = _fixed_store(root)
    d = v1_fixture()
    d["in_progress"] = True
    d["turn"] = {"id": "turn-9", "started_at": 1764403000.0, "checkpoint_at": 1764403500.0,
                 "phase": "tools", "attempts": 2,
                 "ledger": [{"tool_call_id": "call_1", "name": "book_train",
                             "effect": "external", "idempotency_key": f"{V1_ID}:turn-9:call_1",
                             "status": "intent", "intent_at": 1764403400.0}]}
    (root / "sessions" / f"{V1_ID}.json").write_bytes(dumps(d))

    assert _repair.repair_session(store, V1_ID).action == "migrated"
    s = store.load(V1_ID)

    assert s.in_progress and s.turn is not None
    assert s.turn.resume_attempts == 2 and s.turn.phase == "tools"
    assert s.turn.ledger[0].status == "intent" and s.turn.ledger[0].outcome_at is None
    # the rewrite went through the commit function: in progress => marker written first
    [m] = store.interrupted()
    assert (m.session_id, m.turn_id, m.resume_attempts, m.session_version) == (
        V1_ID, "turn-9", 2, 8)
    assert m.route_key == f"session:{V1_ID}" and m.node_id == "node-test"


V2_ID = "legacy-turn_02"


def test_v2_fixture_migrates_to_3_with_empty_commit_id_and_the_sessions_route() -> None:
    raw = (DATA / "session_v2.json").read_bytes()
    s, migrated = parse_session(raw)
    assert migrated and s.commit_id == "" and s.route_key == "chat:42"
    assert s.turn is not None and s.turn.id == "turn-7" and s.turn.resume_attempts == 1
    assert s.turn.node_id is None  # unknown in format 2: the rewrite takes the marker's owner
    assert s.turn.route_key == "chat:42"
    assert s.turn.ledger[0].idempotency_key == "k-1"


def raw_format(root: Path, sid: str) -> str:
    return str(json.loads((root / "sessions" / f"{sid}.json").read_bytes())["format"])


def test_v2_in_progress_session_loads_and_keeps_its_owner_node_and_route(root: Path) -> None:
    store = _fixed_store(root)
    shutil.copyfile(DATA / "session_v2.json", root / "sessions" / f"{V2_ID}.json")
    # the marker format 1 wrote for it: another node owns the turn
    marker = Marker(session_id=V2_ID, turn_id="turn-7", session_version=4, node_id="node-b",
                    route_key="chat:42", source="telegram", started_at=1764403500.0,
                    checkpoint_at=1764403600.5, resume_attempts=1)
    (root / "markers" / f"{V2_ID}.json").write_bytes(encode_marker(marker))

    s = store.load(V2_ID)  # a read migrates in memory only
    assert s.version == 4 and raw_format(root, V2_ID) == "fsdurable.session/2"
    # node-b's turn: this node never rewrites it (the repair gate), node-b migrates it
    assert _repair.repair_session(store, V2_ID).action == "waiting_for_sync"
    assert raw_format(root, V2_ID) == "fsdurable.session/2"
    b = fsdurable.Store(root, node_id="node-b", clock=store.clock)
    assert _repair.repair_session(b, V2_ID).action == "migrated"
    s = b.load(V2_ID)

    assert s.version == 5 and len(s.commit_id) == 16
    assert s.turn is not None and s.turn.node_id == "node-b" and s.turn.route_key == "chat:42"
    raw = json.loads((root / "sessions" / f"{V2_ID}.json").read_bytes())
    assert raw["format"] == "fsdurable.session/7" and raw["commit_id"] == s.commit_id
    assert raw["turn"]["node_id"] == "node-b" and raw["turn"]["route_key"] == "chat:42"
    [m] = store.interrupted()
    assert m.node_id == "node-b" and m.route_key == "chat:42"  # never moved to this node


def test_every_commit_writes_a_fresh_commit_id_and_the_turns_owner(root: Path) -> None:
    store = _fixed_store(root)
    a = store.create("c1", route_key="chat:1")
    b = store.save(a)
    assert len(a.commit_id) == 16 and len(b.commit_id) == 16 and a.commit_id != b.commit_id
    t = store.begin_turn("c1", "hi")
    assert t.turn is not None and t.turn.node_id == "node-test"
    assert t.turn.route_key == "chat:1"
    # the session's route moves on; the live turn keeps the route it started under
    t2 = store.patch("c1", lambda s: attrs.evolve(s, route_key="chat:2"))
    assert t2.turn is not None and t2.turn.route_key == "chat:1"
    [m] = store.interrupted()
    assert m.route_key == "chat:1" and m.node_id == "node-test"
    done = store.end_turn(t2, "ok")
    assert done.turn is None and store.load("c1").commit_id == done.commit_id
    again = store.begin_turn("c1", "next")
    assert again.turn is not None and again.turn.route_key == "chat:2"


def test_an_older_version_without_a_migration_step_is_unknown() -> None:
    # version 0 of a session never existed: no step, so it is refused rather than guessed at
    d = v1_fixture()
    d["format"] = "fsdurable.session/0"
    expect_unreadable(parse_session, dumps(d), "unknown_version")


def test_a_broken_v1_file_is_quarantined_not_half_migrated(root: Path) -> None:
    store = _fixed_store(root)
    d = v1_fixture()
    d["messages"] = [{"role": "user", "text": 42}]
    path = root / "sessions" / f"{V1_ID}.json"
    path.write_bytes(dumps(d))
    with pytest.raises(UnreadableState) as info:
        store.load(V1_ID)
    assert info.value.reason == "wrong_type"
    assert path.exists()  # a read never moves it; the repair gate does
    assert _repair.repair_session(store, V1_ID).action == "quarantined"
    assert not path.exists()
    [moved] = list((root / "quarantine").iterdir())
    assert json.loads(moved.read_bytes()) == d  # moved aside untouched, never deleted
    assert [e.code for e in store.events(V1_ID)] == ["session_quarantined"]


@pytest.mark.parametrize("fmt", ["fsdurable.session/8", "fsdurable.marker/1"])
def test_store_quarantines_unknown_version_and_wrong_kind(root: Path, fmt: str) -> None:
    store = _fixed_store(root)
    d = session_dict()
    d["id"], d["format"] = "s9", fmt
    (root / "sessions" / "s9.json").write_bytes(dumps(d))
    with pytest.raises(UnreadableState) as info:
        store.load("s9")
    assert info.value.reason == ("unknown_version" if "/8" in fmt else "wrong_kind")
    act = _repair.repair_session(store, "s9")
    if "/8" in fmt:  # a newer fsdurable's file: never moved, reported
        assert act.action == "needs_newer" and store.events("s9") == []
        return
    [ev] = store.events("s9")
    assert ev.code == "session_quarantined" and ev.reason == info.value.reason
