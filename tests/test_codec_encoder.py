"""The session encoder written out by hand (``_codec._document``) writes the strict converter's
bytes: for every session the strategies draw, and for values outside plain JSON (which go
through the converter, as before) the same bytes or the same refusal."""

from __future__ import annotations

import collections
import datetime
import enum
from collections.abc import Callable
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdurable import _codec
from fsdurable._codec import encode_session, session_to_dict
from fsdurable._errors import InvalidState
from fsdurable._history import HistoryRef
from fsdurable._model import LedgerEntry, Message, Session, Turn

from .codec_strategies import (
    COUNTS,
    EFFECTS,
    JSON_OBJECTS,
    LEDGER_STATUSES,
    OPT_TEXT,
    TEXT,
    TIMES,
    sessions,
)

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

ledger = st.builds(LedgerEntry, tool_call_id=TEXT, name=TEXT, effect=st.sampled_from(EFFECTS),
                   idempotency_key=TEXT, status=st.sampled_from(LEDGER_STATUSES),
                   intent_at=TIMES, outcome_at=st.none() | TIMES, result=OPT_TEXT,
                   arguments=st.none() | JSON_OBJECTS)
turns = st.builds(Turn, id=TEXT, started_at=TIMES, checkpoint_at=TIMES, phase=TEXT,
                  resume_attempts=COUNTS, ledger=st.lists(ledger, max_size=3).map(tuple),
                  node_id=OPT_TEXT, route_key=TEXT, driver=TEXT, run_id=TEXT, attempt_id=TEXT)
SHA = "0123456789abcdef" * 4
refs = st.none() | st.builds(
    HistoryRef, count=st.integers(0, 50), head=st.none() | st.just("000000000000-0123.json"),
    sha256=st.none() | st.just(SHA), start=st.integers(0, 5),
    inline=st.lists(st.sampled_from([b'{"role":"user","content":"x"}', b"1", b'"s"']),
                    max_size=3).map(tuple))
lanes = st.dictionaries(st.sampled_from(["tools", "agents_sdk", "x1"]),
                        refs.filter(lambda r: r is not None), max_size=2)


def converter(s: Session, ref: HistoryRef | None, lane: dict[str, HistoryRef]) -> bytes:
    """What the strict converter writes: the bytes before the encoder was written by hand."""
    return orjson.dumps(session_to_dict(s, ref, lane, fragments=True),
                        option=orjson.OPT_APPEND_NEWLINE)


@SETTINGS
@given(sessions(), st.none() | turns, refs, lanes)
def test_the_hand_written_encoder_writes_the_converters_bytes(
        s: Session, turn: Turn | None, ref: HistoryRef | None,
        lane: dict[str, HistoryRef]) -> None:
    s = attrs.evolve(s, messages=(), turn=turn, in_progress=turn is not None)
    assert _codec._check_finite(s.metadata, s.id, "metadata")  # plain: written by hand
    assert encode_session(s, ref, lane) == converter(s, ref, lane)


def test_every_field_of_the_model_is_written() -> None:
    """A field added to Session, Turn or LedgerEntry must be added to ``_document`` too: the
    converter writes every field, and the bytes are compared above; here the names."""
    e = LedgerEntry("c", "n", "none", "k", "done", 1.0, arguments={"a": [1]})
    s = Session(id="s", version=1, in_progress=True, turn=Turn("t", 1.0, 2.0, ledger=(e,)),
                metadata={"m": 1})
    d = orjson.loads(encode_session(s, None))
    names = {f.name for f in attrs.fields(Session)} - {"messages", "lanes"}
    assert names | {"format", "history"} == set(d)
    assert {f.name for f in attrs.fields(Turn)} == set(d["turn"])
    assert {f.name for f in attrs.fields(LedgerEntry)} == set(d["turn"]["ledger"][0])


class Colour(enum.Enum):
    RED = "red"


class Key(str):
    pass


def nested(depth: int) -> Any:
    v: Any = []
    for _ in range(depth):
        v = [v]
    return v


ODD = [
    pytest.param((1, (2, 3)), id="tuples"),
    pytest.param({"t": (1, {"u": ()})}, id="nested-tuples"),
    pytest.param(Colour.RED, id="enum"),
    pytest.param(Message("user", "hi"), id="attrs-instance"),
    pytest.param(collections.OrderedDict(a=1), id="dict-subclass"),
    pytest.param({Key("k"): 1}, id="str-subclass-key"),
    pytest.param({1: "x"}, id="int-key"),
    pytest.param({"s": {1, 2}}, id="set"),
    pytest.param(2**70, id="int-over-64-bits"),
    pytest.param(datetime.datetime(2020, 1, 2, 3, 4, 5), id="datetime"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param(True, id="bool"),
    pytest.param(nested(199), id="deep-199"),
    pytest.param(nested(240), id="deep-240"),
    pytest.param(nested(300), id="deep-300"),
    pytest.param(nested(5000), id="deep-5000"),
]


def outcome(fn: Callable[[], bytes]) -> bytes | str:
    """The bytes, or the reason of the refusal (as encode_session words it)."""
    try:
        return fn()
    except InvalidState as e:
        return f"InvalidState:{e.reason}"
    except TypeError:
        return "InvalidState:not_json"
    except RecursionError:
        return "InvalidState:too_deep"


@pytest.mark.parametrize("value", ODD)
def test_values_outside_plain_json_are_written_or_refused_as_before(value: Any) -> None:
    entry = LedgerEntry("c", "n", "none", "k", "intent", 1.0)
    in_metadata = Session(id="s", version=2, in_progress=True,
                          turn=Turn("t", 1.0, 2.0, ledger=(entry,)), metadata={"v": value})
    in_arguments = attrs.evolve(in_metadata, metadata={}, turn=Turn(
        "t", 1.0, 2.0, ledger=(attrs.evolve(entry, arguments={"v": value}),)))
    for s in (in_metadata, in_arguments):
        assert outcome(lambda: encode_session(s, None)) == outcome(  # noqa: B023
            lambda: converter(s, None, {}))  # noqa: B023


def test_a_plain_session_never_builds_the_converter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the hand-written encoder: a fresh process's first commit built the
    converter's unstructure functions (milliseconds)."""
    def refuse() -> Any:
        raise AssertionError("the converter was used")

    monkeypatch.setattr(_codec, "_conv", refuse)
    s = Session(id="s", version=1, metadata={"a": [1, {"b": None}]})
    assert encode_session(s, None).startswith(b'{"format":"fsdurable.session/7","id":"s",')
