"""Hypothesis strategies for every on-disk file kind (shared by test_codec and test_schemas)."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import strategies as st

from fsdurable._codec import encode_session
from fsdurable._history import HistoryRef, encode_segment
from fsdurable._model import (
    EFFECTS,
    LEDGER_STATUSES,
    ROLES,
    Event,
    LedgerEntry,
    Manifest,
    Marker,
    Message,
    Session,
    ToolCall,
    Turn,
)

# orjson writes integers of at most 64 bits; the readers keep anything in this range exact.
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
COUNTS = st.integers(min_value=0, max_value=2**63 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
TIMES = st.one_of(FLOATS, st.floats(min_value=0, max_value=4e9))
TEXT = st.text(max_size=30)  # default alphabet: any code point except surrogates
IDS = st.text(alphabet="abcXYZ019_-", min_size=1, max_size=12) | st.just("a" * 128)
OPT_TEXT = st.none() | TEXT


def json_values(floats: st.SearchStrategy[float] = FLOATS) -> st.SearchStrategy[Any]:
    """Arbitrary JSON: null, bools, 64-bit ints, finite floats, strings, arrays, objects."""
    scalars = st.none() | st.booleans() | INT64 | floats | TEXT
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
        max_leaves=12,
    )


JSON_OBJECTS = st.dictionaries(TEXT, json_values(), max_size=5)

tool_calls = st.builds(ToolCall, id=TEXT, name=TEXT, arguments=JSON_OBJECTS)
messages = st.builds(
    Message,
    role=st.sampled_from(ROLES),
    content=TEXT,
    tool_calls=st.lists(tool_calls, max_size=3).map(tuple),
    tool_call_id=OPT_TEXT,
)
ledger_entries = st.builds(
    LedgerEntry,
    tool_call_id=TEXT,
    name=TEXT,
    effect=st.sampled_from(EFFECTS),
    idempotency_key=TEXT,
    status=st.sampled_from(LEDGER_STATUSES),
    intent_at=TIMES,
    outcome_at=st.none() | TIMES,
    result=OPT_TEXT,
)
turns = st.builds(
    Turn,
    id=TEXT,
    started_at=TIMES,
    checkpoint_at=TIMES,
    phase=TEXT,
    resume_attempts=COUNTS,
    ledger=st.lists(ledger_entries, max_size=3).map(tuple),
    node_id=OPT_TEXT,
    route_key=TEXT,
)


@st.composite
def sessions(draw: st.DrawFn) -> Session:
    """Any session the store could write: version >= 1, a turn iff in progress."""
    turn = draw(st.none() | turns)
    return Session(
        id=draw(IDS),
        version=draw(st.integers(min_value=1, max_value=2**63 - 1)),
        commit_id=draw(TEXT),
        created_at=draw(TIMES),
        updated_at=draw(TIMES),
        source=draw(TEXT),
        route_key=draw(TEXT),
        in_progress=turn is not None,
        turn=turn,
        messages=tuple(draw(st.lists(messages, max_size=4))),
        summary=draw(OPT_TEXT),
        metadata=draw(JSON_OBJECTS),
    )


markers = st.builds(
    Marker,
    session_id=IDS,
    turn_id=TEXT,
    session_version=COUNTS,
    node_id=TEXT,
    route_key=TEXT,
    source=TEXT,
    started_at=TIMES,
    checkpoint_at=TIMES,
    resume_attempts=COUNTS,
)
events = st.builds(
    Event,
    at=TIMES,
    code=TEXT,
    session_id=OPT_TEXT,
    turn_id=OPT_TEXT,
    node_id=OPT_TEXT,
    reason=OPT_TEXT,
    detail=JSON_OBJECTS,
)
manifests = st.builds(Manifest, store_id=TEXT, created_at=TIMES)


def segment_of(s: Session, first: int = 0) -> tuple[HistoryRef, bytes]:
    """The segment holding ``s``'s messages as the first of its chain (not written) and the
    history a document names it by."""
    name, sha, data = encode_segment(s.id, first, None if first == 0 else PREV, "node-a",
                                     tuple(s.messages))
    return HistoryRef(count=first + len(s.messages), head=name, sha256=sha), data


# a stand-in for the segment before one that does not start the chain
PREV = HistoryRef(count=1, head="000000000000-0123456789abcdef.json",
                  sha256="0123456789abcdef" * 4)


def document(s: Session, lanes: dict[str, HistoryRef] | None = None) -> bytes:
    """The document bytes of ``s`` (format 4), its messages named as one segment (see
    ``segment_of``; the segment is not written), naming ``lanes``."""
    return encode_session(s, segment_of(s)[0] if s.messages else None, lanes or {})


LANE_NAMES = st.sampled_from(["openai_agents", "pydantic_ai_run", "x", "a" * 32])


def lane_segment_of(sid: str, lane: str, values: tuple[Any, ...], first: int = 0
                    ) -> tuple[HistoryRef, bytes]:
    """The segment holding ``values`` in lane ``lane`` (not written) and the ref naming it."""
    prev = None if first == 0 else HistoryRef(
        count=1, head=f"{lane}-000000000000-0123456789abcdef.json",
        sha256="0123456789abcdef" * 4)
    name, sha, data = encode_segment(sid, first, prev, "node-a", values, lane)
    return HistoryRef(count=first + len(values), head=name, sha256=sha), data


@st.composite
def lane_maps(draw: st.DrawFn) -> dict[str, HistoryRef]:
    """The ``lanes`` a document may name (each its newest segment, not written)."""
    out = {}
    for lane in draw(st.lists(LANE_NAMES, max_size=2, unique=True)):
        values = tuple(draw(st.lists(json_values(), min_size=1, max_size=3)))
        out[lane] = lane_segment_of("s", lane, values, draw(st.sampled_from([0, 3])))[0]
    return out


@st.composite
def segments(draw: st.DrawFn) -> bytes:
    """Any segment the store could write: one message or more, first or later in its chain,
    or one value or more of a lane."""
    s = draw(sessions())
    first = draw(st.sampled_from([0, 1, 7, 2**40]))
    if draw(st.booleans()):
        values = tuple(draw(st.lists(json_values(), min_size=1, max_size=3)))
        return lane_segment_of(s.id, draw(LANE_NAMES), values, first)[1]
    msgs = (*s.messages, draw(messages))
    return segment_of(attrs.evolve(s, messages=msgs), first)[1]
