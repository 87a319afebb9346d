"""A JSON copy of a value: ``json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False))``
(what the Agents SDK's ``SQLiteSession`` stores of an item), made by orjson where that copy is
provably the same, by the standard library everywhere else.

The same means: the value is a tree of exactly ``dict`` (its keys exactly ``str``), ``list``,
``tuple``, ``str``, ``int``, ``bool``, ``None`` and finite ``float`` — no subclass (an
``IntEnum``, a ``namedtuple``, a dict overriding ``items``), no other type (orjson writes an
``Enum``, a ``UUID``, a ``datetime`` or a dataclass the standard library refuses), no key the
standard library would turn into a string, no NaN or infinity (orjson writes null), nested less
deep than orjson's limit (a circular value ends there too). On such a tree both write the same
JSON values and read them back alike (a tuple as a list, a float to the same bits). A string
with a lone surrogate or an integer past 64 bits, which orjson refuses, goes to the standard
library; so does anything that is not such a tree — its error, or its copy, is the standard
library's own. ``tests/test_jsoncopy.py`` pins this against the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from math import isfinite
from typing import Any, TypeVar

import orjson

from ._errors import InvalidState

_T = TypeVar("_T")

# nesting past this goes to the standard library (orjson refuses to write past 254 levels)
_DEPTH = 200


def _plain(v: Any, depth: int) -> bool:
    """Is ``v`` a tree orjson copies exactly as the standard library does (module doc)?"""
    t = type(v)
    if t is dict:
        if depth > _DEPTH:
            return False
        for k, x in v.items():
            if type(k) is not str or (type(x) is not str and not _plain(x, depth + 1)):
                return False
        return True
    if t is list or t is tuple:
        if depth > _DEPTH:
            return False
        for x in v:  # noqa: SIM110 - a loop: all() of a generator costs more per call
            if type(x) is not str and not _plain(x, depth + 1):
                return False
        return True
    if t is str or t is int or t is bool or v is None:
        return True
    return t is float and isfinite(v)


def json_copy(value: Any) -> Any:
    """``json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False))`` (module doc):
    TypeError or ValueError (or RecursionError, too deep) as that raises them."""
    if _plain(value, 0):
        try:
            return orjson.loads(orjson.dumps(value))
        except (TypeError, ValueError):  # a lone surrogate, an integer past 64 bits
            pass
    return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False))


def json_bytes(value: Any) -> tuple[bytes, bool]:
    """The JSON text ``json_copy`` reads back, as UTF-8 bytes, and whether the standard
    library wrote it: orjson's where that is the same (module doc), else the standard
    library's (ASCII, lone surrogates escaped). Text the standard library wrote must be read
    by it (``json_loads(data, stdlib=True)``): orjson reads an integer past 64 bits as a
    float, without an error."""
    if _plain(value, 0):
        try:
            return orjson.dumps(value), False
        except (TypeError, ValueError):
            pass
    return json.dumps(value, ensure_ascii=True, allow_nan=False).encode("ascii"), True


def json_loads(data: bytes, *, stdlib: bool) -> Any:
    """Read what ``json_bytes`` wrote, with the library that wrote it."""
    return json.loads(data) if stdlib else orjson.loads(data)


def typed(fn: Callable[[Any], _T], value: Any, what: str, session_id: str | None = None) -> _T:
    """``fn(value)`` (``json_copy``, ``json_bytes``) with its refusals as InvalidState:
    ``not_json`` (the standard library's TypeError or ValueError: not JSON) or ``too_deep``
    (nested deeper than Python can walk) — a bad value is a typed error, never a crash.
    ``what``: what the value is, for the message."""
    try:
        return fn(value)
    except (TypeError, ValueError) as e:
        raise InvalidState(f"{what} is not JSON: {e}", session_id=session_id,
                           reason="not_json") from e
    except RecursionError as e:
        raise InvalidState(f"{what} is nested too deep to store", session_id=session_id,
                           reason="too_deep") from e


__all__ = ["json_bytes", "json_copy", "json_loads", "typed"]
