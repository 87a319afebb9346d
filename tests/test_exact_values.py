"""Issue 9 item 16: values never change on the way to disk. A session round-trips exactly, or
the write is refused with InvalidState and nothing is written; a session file with duplicate keys
is unreadable, as a marker is. (These tests failed on 64a9dda: NaN and infinities were stored as
null, an integer beyond 64 bits came back as a float, duplicate keys were accepted, last wins.)"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fsdurable
from fsdurable import InvalidState, UnreadableState
from fsdurable._codec import encode_session, parse_session
from fsdurable._model import Message, Session, ToolCall

from .codec_strategies import TEXT

NON_FINITE = [float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_non_finite_metadata_is_refused_and_nothing_is_written(root: Path, bad: float) -> None:
    store = fsdurable.Store(root)
    s = store.create("m")
    before = (root / "sessions" / "m.json").read_bytes()
    for meta in ({"x": bad}, {"deep": [1, {"y": (2, bad)}]}):
        with pytest.raises(InvalidState) as info:
            store.save(attrs.evolve(s, metadata=meta))
        assert info.value.reason == "not_json" and info.value.session_id == "m"
    with pytest.raises(InvalidState):
        store.create("m2", metadata={"x": bad})
    assert (root / "sessions" / "m.json").read_bytes() == before
    assert not (root / "sessions" / "m2.json").exists()
    assert store.load("m") == s


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_non_finite_tool_arguments_are_refused(root: Path, bad: float) -> None:
    store = fsdurable.Store(root)
    s = store.create("t")
    call = Message("assistant", tool_calls=(ToolCall("c1", "f", {"amount": bad}),))
    with pytest.raises(InvalidState):
        store.save(attrs.evolve(s, messages=(call,)))
    assert store.load("t").messages == ()


def test_a_deeply_nested_nan_is_found_without_recursion() -> None:
    v: Any = float("nan")
    for _ in range(100_000):
        v = [v]
    with pytest.raises(InvalidState):
        encode_session(Session(id="d", version=1, metadata={"v": v}))


def test_integers_beyond_64_bits_are_read_exactly_and_refused_on_write(root: Path) -> None:
    store = fsdurable.Store(root)
    store.create("big")
    path = root / "sessions" / "big.json"
    d = json.loads(path.read_bytes())
    d["metadata"] = {"n": 2**64, "neg": -(2**63) - 1, "fits": 2**64 - 1}
    path.write_text(json.dumps(d))  # another writer (Python's json) wrote them
    s = store.load("big")
    assert s.metadata == {"n": 2**64, "neg": -(2**63) - 1, "fits": 2**64 - 1}
    assert type(s.metadata["n"]) is int  # never a rounded float
    with pytest.raises(InvalidState):  # orjson cannot write it: refused, nothing changes
        store.save(s)
    ok = store.save(attrs.evolve(s, metadata={"fits": 2**64 - 1}))
    assert store.load("big").metadata == {"fits": 2**64 - 1} and ok.version == 2


@pytest.mark.parametrize("dup", [
    b'{"format":"fsdurable.session/3","id":"dup","version":1,"version":7}',
    b'{"format":"fsdurable.session/3","id":"dup","version":1,"metadata":{"a":1,"a":2}}',
    b'{"format":"fsdurable.session/3","id":"dup","version":1,"messages":'
    b'[{"role":"user","role":"system"}]}',
], ids=["top_level", "metadata", "message"])
def test_duplicate_keys_make_a_session_unreadable(root: Path, dup: bytes) -> None:
    with pytest.raises(UnreadableState) as info:
        parse_session(dup)
    assert info.value.reason == "invalid_json" and "duplicate key" in info.value.message
    store = fsdurable.Store(root)
    (root / "sessions" / "dup.json").write_bytes(dup)
    with pytest.raises(UnreadableState):
        store.load("dup")
    assert (root / "sessions" / "dup.json").exists()  # a read never moves it (issue 9.18)
    from fsdurable import _repair

    assert _repair.repair_session(store, "dup").action == "quarantined"  # the repair gate
    assert not (root / "sessions" / "dup.json").exists()  # quarantined, not deleted
    assert any(p.read_bytes() == dup for p in (root / "quarantine").iterdir())


def test_another_writers_formatting_still_reads(root: Path) -> None:
    s = Session(id="p", version=4, metadata={"caf\u00e9": [1.5, None, True]})
    pretty = json.dumps(json.loads(encode_session(s)), indent=2, ensure_ascii=True).encode()
    assert parse_session(pretty) == (s, False)


ANY_FLOAT = st.floats()  # NaN and infinities included
ANY_INT = st.integers()  # any size
WILD_JSON = st.recursive(
    st.none() | st.booleans() | ANY_INT | ANY_FLOAT | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(TEXT, WILD_JSON, max_size=5))
def test_every_metadata_round_trips_exactly_or_is_refused(meta: dict[str, Any]) -> None:
    s = Session(id="h", version=1, metadata=meta)
    try:
        data = encode_session(s)
    except InvalidState:
        return
    back, _ = parse_session(data)
    assert _same(back.metadata, meta)


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same JSON type at every level (1 is not 1.0, -0.0 keeps its sign)."""
    if isinstance(b, float):
        return type(a) is float and (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(b, dict):
        return (type(a) is dict and list(a) == list(b)
                and all(_same(a[k], b[k]) for k in b))
    if isinstance(b, list):
        return type(a) is list and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_non_finite_lane_values_are_refused_and_nothing_is_written(root: Path, bad: float
                                                                   ) -> None:
    """A lane's values are encoded first and walked only where the bytes hold a ``null``
    (``_segcodec.encode_values``): every NaN or infinity is still found — with real nulls
    beside it, inside a dict or a list, after a value orjson refuses."""
    store = fsdurable.Store(root)
    s = store.create("l", lanes={"x": [{"a": None}]})
    before = (root / "sessions" / "l.json").read_bytes()
    for values in ([{"a": bad}], [{"ok": 1}, [1, {"b": (2, bad)}]], [{"n": None, "v": [bad]}],
                   ["null", {"x": bad}], [{"x": bad}, {"y": object()}],
                   [{"y": object()}, {"x": bad}]):
        with pytest.raises(InvalidState) as info:
            store.save(attrs.evolve(s, lanes={"x": (*s.lanes["x"], *values)}))
        assert info.value.reason == "not_json" and info.value.session_id == "l"
    assert (root / "sessions" / "l.json").read_bytes() == before
    assert list(store.load("l").lanes["x"]) == [{"a": None}]


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(WILD_JSON, min_size=1, max_size=4))
def test_every_lane_value_round_trips_exactly_or_is_refused(values: list[Any]) -> None:
    from fsdurable._history import decode_values, encode_values

    try:
        data = encode_values("h", 0, values, "x")
    except InvalidState:
        assert any(_non_finite(v) for v in values) or any(_big(v) for v in values)
        return
    back = decode_values(data, sid="h", lane="x", first=0)
    assert len(back) == len(values) and all(map(_same, back, values))


def _non_finite(v: Any) -> bool:
    if isinstance(v, float):
        return not math.isfinite(v)
    items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
    return any(map(_non_finite, items))


def _big(v: Any) -> bool:
    if isinstance(v, int) and not isinstance(v, bool):
        return not -(2**63) <= v < 2**64
    items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
    return any(map(_big, items))
