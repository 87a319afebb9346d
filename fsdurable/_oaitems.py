"""The Agents SDK adapter's storage (``fsdurable.openai_agents``): how a session holds the SDK's
items and the adapter's run record. Small functions — how a session stores its items may change;
nothing else knows the layout: the items in the session's lane ``openai_agents``, the run record
under ``metadata["openai_agents"]["run"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._commit import evolve
from ._errors import InvalidState
from ._jsoncopy import json_copy
from ._model import Session, adapter_ns, with_adapter_ns

KEY = "openai_agents"  # the session metadata key (and lane) this adapter owns

Item = Any  # agents.items.TResponseInputItem: a JSON object


def _ns(s: Session | None) -> dict[str, Any]:
    return adapter_ns(s, KEY)


def items(s: Session | None) -> Sequence[Item]:
    """The session's items: a lazy sequence (read from the lane's segments as used)."""
    return s.lanes.get(KEY, ()) if s is not None else ()


def with_items(s: Session, new: Sequence[Item]) -> Session:
    """``s`` holding ``new`` as its items: ``items(s) + tuple(more)`` or ``prefix(items(s), n)``
    keep what is stored (the commit writes only the new items); empty: the lane is removed."""
    return evolve(s, lanes={**s.lanes, KEY: new})  # attrs.evolve, its fields looked up once


def prefix(got: Sequence[Item], n: int) -> Sequence[Item]:
    """The first ``n`` items, cutting a stored lane in its document (nothing rewritten)."""
    from ._history import History

    return got.prefix(n) if isinstance(got, History) else tuple(got)[: max(0, n)]


def record(s: Session | None) -> dict[str, Any]:
    rec = _ns(s).get("run")
    return dict(rec) if isinstance(rec, dict) else {}


def with_record(s: Session, **changes: Any) -> Session:
    """``s`` with this adapter's metadata updated (a key set to None is removed; ``items_at``
    and ``state``/``answers`` go into the run record; ``items``: ``with_items``)."""
    if "items" in changes:
        s = with_items(s, changes.pop("items"))
    run_keys: dict[str, Any] = {k: changes.pop(k) for k in ("state", "items_at", "answers")
                                if k in changes}
    if run_keys:  # an explicit run= given with them is applied after them, as before
        merged: dict[str, Any] = {**record(s), **run_keys}
        changes.setdefault("run", merged)
    return with_adapter_ns(s, KEY, **changes)


def trimmed(s: Session) -> Session:
    """``s`` with the items its run record accounts for (what a dead run added after its last
    checkpoint goes: the resumed run adds it again)."""
    at = record(s).get("items_at")
    if not isinstance(at, int):
        return s
    return with_items(s, prefix(items(s), at))


def _json(value: Any, what: str, sid: str) -> Any:
    """A JSON copy of ``value`` (what SQLiteSession stores: ``_jsoncopy``, the standard
    library's copy, by orjson where that is the same); InvalidState if it is not JSON."""
    try:
        return json_copy(value)
    except (TypeError, ValueError) as e:
        raise InvalidState(f"{what} of session {sid!r} is not JSON: {e}", session_id=sid,
                           reason="not_json") from e


__all__ = ["KEY", "Item", "items", "prefix", "record", "trimmed", "with_items", "with_record"]
