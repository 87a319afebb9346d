"""The data model: immutable attrs classes. Change a value with ``attrs.evolve``.

A ``Session`` is the whole truth about one conversation; its ``turn`` is present iff
``in_progress``. A ``Marker`` is the small index record of one interrupted turn: it holds enough to
gate the turn (age, attempts, owner node) without reading the session. ``Marker``, ``Event`` and
``Manifest`` are on the startup path, so they are plain stdlib records (``_records``; change one
with ``.replace``), re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from ._records import DRIVERS, Event, Manifest, Marker, driver_of

Effect = Literal["none", "idempotent", "external"]
EFFECTS: tuple[str, ...] = ("none", "idempotent", "external")
LedgerStatus = Literal["intent", "done", "failed", "refused"]
LEDGER_STATUSES: tuple[str, ...] = ("intent", "done", "failed", "refused")
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


def _roles(inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {value!r}")


def _finite(inst: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    # orjson writes NaN and infinities as null: such a session could be saved but never read back
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{attribute.name} must be a finite number, got {value!r}")


def _time() -> Any:
    return attrs.field(validator=_finite)


@attrs.frozen
class ToolCall:
    """A tool call the model asked for."""

    id: str
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Message:
    """One transcript entry. ``tool_call_id`` links a ``tool`` result to its call."""

    role: str = attrs.field(validator=_roles)
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@attrs.frozen
class LedgerEntry:
    """The side-effect ledger's record of one effectful tool call.

    ``intent`` is committed before the tool runs, ``done``/``failed`` after. An entry still at
    ``intent`` on resume is *in doubt*: the effect may or may not have happened.
    """

    tool_call_id: str
    name: str
    effect: str
    idempotency_key: str
    status: str
    intent_at: float = _time()
    outcome_at: float | None = attrs.field(default=None, validator=_finite)
    result: str | None = None
    # the call's arguments, committed with its intent: a call parked for review shows a human
    # what it was asked to do (a driver whose transcript is not fsdurable's has no other record)
    arguments: dict[str, Any] | None = None


@attrs.frozen
class Turn:
    """The turn in progress: when it started, its last checkpoint and its resume attempts.

    ``node_id``: the node that owns the turn (the commit function writes it, the same node as in
    the marker, so a rebuilt marker keeps its owner). ``route_key``: the route lock the turn
    started under (set by ``begin_turn``, never changed while the turn lives, whatever the
    session's ``route_key`` says later; "" is filled from the session by the commit function).
    ``driver``: which driver owns the turn (``loop``, ``langgraph``, ``openai-agents``,
    ``pydantic-ai``, ``claude``; "" in a turn begun before it was recorded: ``driver_of``) —
    recovery hands the turn to that driver alone; ``source`` never decides it. ``run_id``: the
    run's identity, kept across every resume; ``attempt_id``: new for each attempt (the live run,
    then each resume).
    """

    id: str
    started_at: float = _time()
    checkpoint_at: float = _time()
    phase: str = "started"
    resume_attempts: int = 0
    ledger: tuple[LedgerEntry, ...] = ()
    node_id: str | None = None
    route_key: str = ""
    driver: str = ""
    run_id: str = ""
    attempt_id: str = ""

    def entry(self, tool_call_id: str) -> LedgerEntry | None:
        for e in self.ledger:
            if e.tool_call_id == tool_call_id:
                return e
        return None


@attrs.frozen
class Session:
    """One session file. ``version`` is the commit counter (+1 on every commit); ``commit_id``
    is unique to each commit (the commit function writes a fresh one), so two nodes' commits of
    the same version number are told apart."""

    id: str
    version: int = 0
    commit_id: str = ""
    created_at: float = attrs.field(default=0.0, validator=_finite)
    updated_at: float = attrs.field(default=0.0, validator=_finite)
    source: str = "api"  # provenance only: it never grants anything (a resumed turn is unattended)
    route_key: str = ""
    in_progress: bool = False
    turn: Turn | None = None
    # a tuple, or (a session read from disk) a ``History``: the same sequence, read from the
    # session's write-once segments on first use (docs/storage.md). Add to it with
    # ``extended(s.messages, ...)`` (or ``+ tuple``), which keeps what is stored.
    messages: Sequence[Message] = ()
    summary: str | None = None
    metadata: dict[str, Any] = attrs.field(factory=dict)
    # an adapter's own append-only values, by lane name (``[a-z][a-z0-9_]{0,31}``): a tuple, or
    # (read from disk) a ``History`` over the lane's write-once segments, as ``messages``
    # (docs/storage.md, "Lanes"). A lane that is absent or empty holds nothing.
    lanes: Mapping[str, Sequence[Any]] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.in_progress != (self.turn is not None):
            raise ValueError("a session has a turn if and only if it is in progress")


def extended(msgs: Sequence[Message], *more: Message) -> Sequence[Message]:
    """``msgs`` followed by ``more``. A session's stored ``History`` stays one (nothing is read
    and the next commit writes only ``more``); a tuple stays a tuple."""
    add = getattr(msgs, "extended", None)
    if add is not None:
        out: Sequence[Message] = add(more)
        return out
    return (*msgs, *more)


def adapter_ns(s: Session | None, key: str) -> dict[str, Any]:
    """A copy of the metadata an adapter keeps under ``key`` (empty if none, or not a dict)."""
    raw = s.metadata.get(key) if s is not None else None
    return dict(raw) if isinstance(raw, dict) else {}


def with_adapter_ns(s: Session, key: str, **changes: Any) -> Session:
    """``s`` with the metadata under ``key`` updated: each change set, or removed where None.
    The one shape every adapter's metadata takes (Agents SDK, Pydantic AI, ADK, Claude)."""
    ns = adapter_ns(s, key)
    for k, v in changes.items():
        if v is None:
            ns.pop(k, None)
        else:
            ns[k] = v
    return attrs.evolve(s, metadata={**s.metadata, key: ns})


def with_entry(s: Session, entry: LedgerEntry) -> Session:
    """``s`` with ``entry`` as its turn's ledger record of that tool call (replacing one)."""
    assert s.turn is not None
    rest = tuple(e for e in s.turn.ledger if e.tool_call_id != entry.tool_call_id)
    return attrs.evolve(s, turn=attrs.evolve(s.turn, ledger=(*rest, entry)))


def unique_calls(s: Session, calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """Tool calls with ids unique in the session: a model that numbers calls per reply
    ("call_0" every time) would otherwise have a new call answered from an old call's ledger
    entry, and share its idempotency key. A repeated id gets a ``~n`` suffix."""
    taken = {c.id for m in s.messages for c in m.tool_calls}
    taken |= {m.tool_call_id for m in s.messages if m.tool_call_id}
    out = []
    for c in calls:
        cid, n = c.id, 1
        while cid in taken:
            n += 1
            cid = f"{c.id}~{n}"
        taken.add(cid)
        out.append(c if cid == c.id else attrs.evolve(c, id=cid))
    return tuple(out)


def unanswered_calls(s: Session) -> tuple[ToolCall, ...]:
    """Tool calls of the last assistant message that have no tool result yet."""
    msgs, n = s.messages, len(s.messages)
    for i in range(n - 1, -1, -1):  # by index from the end: a History reads only what it needs
        m = msgs[i]
        if m.role == "assistant":
            done = {msgs[j].tool_call_id for j in range(i + 1, n) if msgs[j].role == "tool"}
            return tuple(c for c in m.tool_calls if c.id not in done)
        if m.role == "user":
            return ()
    return ()


def in_doubt(s: Session) -> tuple[LedgerEntry, ...]:
    """Ledger entries with an intent and no outcome: the effect may or may not have happened."""
    return tuple(e for e in s.turn.ledger if e.status == "intent") if s.turn else ()


# metadata key of the review queue: in-doubt calls parked for a human (fsdurable review)
REVIEW = "review_required"


def review_record(turn_id: str, entries: Iterable[LedgerEntry], *, at: float, reason: str,
                  previous: object = None) -> dict[str, Any]:
    """``metadata["review_required"]`` for in-doubt ledger entries (one shape for every park);
    calls still parked from an earlier turn (``previous``) stay in it. Each call carries the
    arguments its intent was committed with (None in an entry written before they were)."""
    calls = [{"tool_call_id": e.tool_call_id, "tool": e.name, "effect": e.effect,
              "idempotency_key": e.idempotency_key, "intent_at": e.intent_at,
              "turn_id": turn_id, "reason": reason, "arguments": e.arguments}
             for e in entries]
    if isinstance(previous, dict) and isinstance(previous.get("calls"), list):
        calls = [{"turn_id": previous.get("turn_id"), "reason": previous.get("reason"), **c}
                 for c in previous["calls"] if isinstance(c, dict)] + calls
    return {"turn_id": turn_id, "calls": calls, "at": at, "reason": reason}


def closed_turn(s: Session, *, at: float, reason: str) -> tuple[Session, list[dict[str, Any]]]:
    """``s`` with its turn ended — and its in-doubt calls (an intent, no outcome: they may have
    run) put in the review queue, never dropped — and the calls so parked. The one shape of
    every end of a turn but a plain completion with nothing in doubt: store.cancel,
    abandon_turn, and TurnRun's end/pause/fail (``reason``: why it ended)."""
    import attrs as _attrs

    assert s.turn is not None
    meta = s.metadata
    intents = [e for e in s.turn.ledger if e.status == "intent"]
    calls: list[dict[str, Any]] = []
    if intents:
        rr = review_record(s.turn.id, intents, at=at, reason=reason, previous=meta.get(REVIEW))
        calls = rr["calls"][-len(intents):]
        meta = {**meta, REVIEW: rr}
    return _attrs.evolve(s, in_progress=False, turn=None, metadata=meta), calls


def turn_driver(s: Session) -> str:
    """The driver that owns ``s``'s turn (``driver_of`` its recorded driver and source)."""
    return driver_of(s.turn.driver if s.turn is not None else "", s.source)


__all__ = ["DRIVERS", "EFFECTS", "LEDGER_STATUSES", "REVIEW", "ROLES", "Effect", "Event",
           "LedgerEntry", "LedgerStatus", "Manifest", "Marker", "Message", "Session", "ToolCall",
           "Turn", "adapter_ns", "closed_turn", "driver_of", "extended",
           "in_doubt", "review_record", "turn_driver",
           "unanswered_calls", "unique_calls", "with_adapter_ns", "with_entry"]
