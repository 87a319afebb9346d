"""The conformance suite's LangGraph driver through ``ainvoke`` and ``arecover`` (the same graph
as ``langgraph``, on an event loop)."""

from __future__ import annotations

from typing import Any

from ..harness import Scenario
from . import langgraph as _lg

DRIVER = _lg.DRIVER


def live(root: str, sid: str, sc: Scenario, *, attended: bool, approve: bool) -> dict[str, Any]:
    _lg.ASYNC = True
    return _lg.live(root, sid, sc, attended=attended, approve=approve)


def recover(root: str, sc: Scenario, *, fail: bool) -> list[dict[str, Any]]:
    _lg.ASYNC = True
    return _lg.recover(root, sc, fail=fail)


def proceed(root: str, sid: str, sc: Scenario) -> dict[str, Any]:
    _lg.ASYNC = True
    return _lg.proceed(root, sid, sc)
