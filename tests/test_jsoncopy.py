"""``_jsoncopy.json_copy`` is ``json.loads(json.dumps(v, ensure_ascii=False, allow_nan=False))``
exactly — the same copy (the same JSON type at every level, a float to the same bits) or the
same error — whatever ``v`` holds: what orjson writes otherwise (an Enum, a UUID, a datetime,
a NaN as null, a subclass by its own rules) or refuses (a lone surrogate, an integer past 64
bits, deep nesting) goes to the standard library."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import json
import math
import struct
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdurable import _jsoncopy
from fsdurable._jsoncopy import json_copy


def stdlib(v: Any) -> Any:
    return json.loads(json.dumps(v, ensure_ascii=False, allow_nan=False))


def outcome(fn: Any, v: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(v)
    except (TypeError, ValueError, RecursionError) as e:
        return type(e).__name__, str(e)


def same(a: Any, b: Any) -> bool:
    """Equal, of the same type at every level, each float of the same bits (a loop: deep
    values stay within the recursion limit)."""
    todo = [(a, b)]
    while todo:
        x, y = todo.pop()
        if type(x) is not type(y):
            return False
        if type(x) is float:
            if struct.pack("<d", x) != struct.pack("<d", y):
                return False
        elif type(x) is dict:
            if list(x) != list(y):
                return False
            todo.extend((x[k], y[k]) for k in x)
        elif type(x) is list:
            if len(x) != len(y):
                return False
            todo.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


def check(v: Any) -> None:
    got, want = outcome(json_copy, v), outcome(stdlib, v)
    assert got[0] == want[0], (got, want)
    if got[0] == "ok":
        assert same(got[1], want[1]), (got, want)
    else:
        assert got[1] == want[1]


class Color(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    LOW = 1


class Mode(str, enum.Enum):
    FAST = "fast"


class Label(str, enum.Enum):  # its str is not its value: stdlib writes the str
    A = "v"

    def __new__(cls, value: str) -> Label:
        obj = str.__new__(cls, "label-" + value)
        obj._value_ = value
        return obj


class Text(str):
    def __str__(self) -> str:
        return "other"


class Num(int):
    def __repr__(self) -> str:
        return "99"


class Real(float):
    def __repr__(self) -> str:
        return "9.5"


class Items(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        return [("swapped", 1)]


class Seq(list):  # type: ignore[type-arg]
    pass


Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Point:
    x: int = 1


def nested(depth: int, leaf: Any = 1) -> Any:
    v = leaf
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


ODD = [Color.RED, Level.LOW, Mode.FAST, Label.A, uuid.UUID(int=7), datetime.datetime(2026, 1, 1),
       datetime.date(2026, 1, 1), datetime.time(1, 2), decimal.Decimal("1.5"), Point(),
       Text("a"), Num(5), Real(1.5), Items(a=2), Seq([1]), Pair(1, 2), orjson.Fragment(b"1"),
       b"bytes", bytearray(b"x"), {1, 2}, frozenset(), object(), float("nan"), float("inf"),
       -float("inf"), 2**63, 2**64, 2**64 - 1, -(2**63), -(2**63) - 1, 2**200, "\ud800",
       "a\udfffb", -0.0, 5e-324, 1.7976931348623157e308, 0.1 + 0.2, (), [], {}, True, None]


@pytest.mark.parametrize("v", ODD, ids=[type(v).__name__ + str(i) for i, v in enumerate(ODD)])
def test_each_odd_value_alone_in_a_dict_in_a_list_and_as_a_key(v: Any) -> None:
    check(v)
    check([{"x": v, "y": "w" * 50}])
    check([(1, v)])
    try:
        hash(v)
    except TypeError:
        return
    check({v: 1})
    check([{"a": 1, v: 2}])


def test_keys_the_standard_library_turns_into_strings() -> None:
    for d in ({1: "a"}, {1.5: 0}, {True: 1, None: 2}, {1: "a", "1": "b"}, {"1": "b", 1: "a"},
              {Level.LOW: 1}, {Text("k"): 1}, {(1, 2): 3}):
        check(d)
        check([d])


def test_nesting_at_orjson_s_limit_and_past_the_standard_library_s() -> None:
    for depth in (1, 199, 200, 201, 202, 253, 254, 255, 256, 400, 5000):
        check(nested(depth))
        check(nested(depth, float("nan")))
    loop: list[Any] = []
    loop.append({"x": loop})
    check(loop)


def test_a_value_shared_twice_is_copied_twice() -> None:
    x = {"a": [1, 2]}
    got = json_copy([x, x])
    assert got == [x, x] and got[0] is not got[1] and got[0] is not x


def test_the_copy_shares_nothing_with_the_value() -> None:
    v = [{"a": [1, {"b": "c"}], "t": (1, 2)}]
    got = json_copy(v)
    v[0]["a"][1]["b"] = "changed"  # type: ignore[index]
    assert got == [{"a": [1, {"b": "c"}], "t": [1, 2]}]


def test_a_plain_item_is_copied_by_orjson_anything_else_by_the_standard_library(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The line between the two (so the tests above exercise both sides of it)."""
    item = {"type": "message", "role": "user", "id": "m1", "status": "completed",
            "content": [{"type": "input_text", "text": "w" * 900, "annotations": []}],
            "n": 3, "f": -0.5, "ok": True, "none": None, "t": (1, "2")}
    used: list[Any] = []
    real = json.dumps

    def counting(v: Any, **kw: Any) -> str:
        used.append(v)
        return real(v, **kw)

    monkeypatch.setattr(_jsoncopy.json, "dumps", counting)
    assert same(json_copy([item]), stdlib([item])) and used == [[item]]  # stdlib() counted
    used.clear()
    for v in ([item, Level.LOW], [item, {1: 2}], [item, float("nan")], [item, 2**64],
              [item, "\ud800"], [item, Text("a")], nested(300)):
        outcome(json_copy, v)
        assert used == [v]
        used.clear()


FLOATS = st.floats()  # NaN and infinities included, subnormals, -0.0
KEYS = st.text(max_size=4) | st.integers(-3, 3) | st.booleans() | st.none() | st.floats(
    allow_nan=False, allow_infinity=False)
SURROGATES = st.sampled_from(["\ud800", "x\udc00", "\udbff\udfff"])
LEAVES = (st.none() | st.booleans() | st.integers() | FLOATS | st.text(max_size=8) | SURROGATES
          | st.sampled_from(ODD))
VALUES = st.recursive(
    LEAVES,
    lambda inner: (st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
                   | st.dictionaries(st.text(max_size=6), inner, max_size=4)
                   | st.dictionaries(KEYS, inner, max_size=3)),
    max_leaves=16)
PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: (st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple)
                   | st.dictionaries(st.text(), inner, max_size=4)),
    max_leaves=24)


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES)
def test_any_value_copies_or_fails_as_the_standard_library(v: Any) -> None:
    check(v)
    check([v])


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(PLAIN)
def test_any_plain_value_copies_as_the_standard_library(v: Any) -> None:
    check(v)


@settings(deadline=None, max_examples=1000)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_keeps_its_bits(x: float) -> None:
    got = json_copy([x, {"x": x}])
    assert same(got, stdlib([x, {"x": x}]))
    assert struct.pack("<d", got[0]) == struct.pack("<d", x) and not math.isnan(got[0])


def test_file_session_stores_the_standard_library_s_copy_and_refuses_what_it_refuses(
        tmp_path: Any) -> None:
    """``FileSession.add_items`` stores what ``SQLiteSession`` would (its items through
    ``json.dumps``/``json.loads``), not what orjson would make of them."""
    import asyncio

    import fsdurable
    from fsdurable.openai_agents import FileSession

    s = FileSession("c", fsdurable.Store(tmp_path / "store"))
    item: dict[Any, Any] = {"t": (1, "2"), 1: "a", "lvl": Level.LOW, "m": Mode.FAST,
                            "txt": "w" * 100, "f": 0.1}
    asyncio.run(s.add_items([item]))
    item["txt"] = "changed"  # the caller's object is not what was stored
    got = asyncio.run(s.get_items())
    assert same(got, stdlib([{"t": (1, "2"), 1: "a", "lvl": Level.LOW, "m": Mode.FAST,
                                "txt": "w" * 100, "f": 0.1}]))
    for bad in (Color.RED, uuid.UUID(int=1), datetime.date(2026, 1, 1), Point(),
                orjson.Fragment(b"1"), float("nan")):
        with pytest.raises(fsdurable.InvalidState) as info:
            asyncio.run(s.add_items([{"ok": 1}, {"x": bad}]))
        assert info.value.reason == "not_json"
    assert len(asyncio.run(s.get_items())) == 1
