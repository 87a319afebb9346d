"""Where a durable Pydantic AI run keeps its conversation: small functions over one session.

The session ``<id>`` (source ``pydantic-ai``) holds the conversation's message history as
Pydantic AI serialises it (``ModelMessagesTypeAdapter``, JSON mode, one value a message) in its
lane ``pydantic_ai_run`` — write-once segments the document names (docs/storage.md, "Lanes"), so
a checkpoint writes the messages added since the last one and the small document, not the whole
conversation — as of the last checkpoint while a run is in progress, the whole conversation
once it is over. Under ``metadata["pydantic_ai_run"]``:

- ``run``: the run in progress — its prompt and whether the history already holds this run's
  first request (``started``: a resume then sends no prompt);
- ``paused``: the tool calls a run paused on (``DeferredToolRequests``: approvals and deferred
  calls, each ``tool_call_id``, ``tool_name``, ``args``) until a human answers them.

Every function here returns a pure ``Session -> Session`` change for the turn protocol (applied
in a read-modify-write commit, maybe more than once); each message is encoded once. Only this
module knows the layout, so a change of how conversations are stored is made here. A session of
an older fsdurable (the history inline, ``metadata["pydantic_ai_run"]["messages"]``) reads as
before and is migrated by the repair gate before a run writes to it (``migrate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ToolReturnPart,
)

from ._errors import InvalidState, UnreadableState
from ._history import extend
from ._model import REVIEW, Session, adapter_ns, with_adapter_ns
from ._pydantic_ledger import call_key
from ._turns import Change

KEY = "pydantic_ai_run"


def _ns(s: Session) -> dict[str, Any]:
    return adapter_ns(s, KEY)


def _set(**changes: Any) -> Change:
    """A change that sets (None: removes) keys of this driver's metadata."""
    return lambda s: with_adapter_ns(s, KEY, **changes)


def encode(messages: Sequence[ModelMessage]) -> list[Any]:
    return list(ModelMessagesTypeAdapter.dump_python(list(messages), mode="json"))


def _stored(history: Sequence[ModelMessage]) -> Change:
    """A change that stores ``history`` in the lane: the messages after the ones stored
    (appended: the commit writes only them), or — the stored ones not its prefix (checked by
    the last one stored: one segment read) — the whole of it as a new chain."""
    done: dict[int, Any] = {}

    def enc(i: int) -> Any:
        if i not in done:
            done[i] = encode([history[i]])[0]
        return done[i]

    def change(s: Session) -> Session:
        lane = s.lanes.get(KEY, ())
        n, m = len(lane), len(history)
        if n <= m and (n == 0 or lane[n - 1] == enc(n - 1)):
            new = extend(lane, tuple(enc(i) for i in range(n, m)))
        else:
            new = tuple(enc(i) for i in range(m))
        return attrs.evolve(s, lanes={**s.lanes, KEY: new})

    return change


def migrate(store: Any, session_id: str) -> None:
    """An older session (its history inline) migrated by the repair gate (an event) before a
    run writes to it; nothing for any other."""
    from ._codec import inline_lanes
    from ._errors import SessionNotFound
    from ._repair import repair_session

    try:
        s = store.load(session_id)
    except (SessionNotFound, UnreadableState):
        return  # none yet (the run creates it), or a bad file: the begin reports it
    if inline_lanes(s):
        repair_session(store, session_id)


def messages(s: Session) -> list[ModelMessage]:
    """The session's stored history ([] for a new conversation); reads the whole lane."""
    raw = s.lanes.get(KEY)
    if not raw:
        return []
    try:
        return list(ModelMessagesTypeAdapter.validate_python(list(raw)))
    except ValueError as e:
        raise UnreadableState(f"session {s.id!r} holds no valid Pydantic AI history: {e}",
                              session_id=s.id, reason="bad_history") from e


def record(s: Session) -> dict[str, Any]:
    """The run record of the run in progress ({} if none)."""
    raw = _ns(s).get("run")
    return dict(raw) if isinstance(raw, dict) else {}


def paused(s: Session) -> dict[str, Any] | None:
    """The tool calls the session's last run paused on (None if it did not pause)."""
    raw = _ns(s).get("paused")
    return dict(raw) if isinstance(raw, dict) else None


def settled(s: Session, history: Sequence[ModelMessage]) -> list[ModelMessage]:
    """The history a new run starts from. A last model response whose tool calls have no
    returns belongs to a turn that ended without finishing them (parked for review, cancelled,
    abandoned): each call gets an answer the model can read — the human's review answer, "in
    doubt" for a call still parked, else "no result" — so the new run never runs them again by
    itself and the conversation stays valid."""
    out = list(history)
    if not out or not isinstance(out[-1], ModelResponse) or not out[-1].tool_calls:
        return out
    n = sum(1 for m in out if isinstance(m, ModelResponse))
    from ._review import answer_of

    turns: set[str] = set()  # the turns whose calls were parked (open or closed reviews)
    for k in (REVIEW, "review_closed"):
        got = s.metadata.get(k)
        if isinstance(got, dict):
            turns |= {str(c.get("turn_id") or got.get("turn_id")) for c in got.get("calls") or []
                      if isinstance(c, dict)}
    rr = s.metadata.get(REVIEW)
    parked = {c.get("tool_call_id") for c in (rr.get("calls") or [])
              if isinstance(c, dict)} if isinstance(rr, dict) else set()
    waiting = {c.get("tool_call_id") for k in ("approvals", "calls")
               for c in (paused(s) or {}).get(k) or [] if isinstance(c, dict)}
    parts = []
    for c in out[-1].tool_calls:
        key = call_key(c.tool_call_id, n)
        a = next((x for t in sorted(turns) if (x := answer_of(s, t, key)) is not None), None)
        if isinstance(a, dict) and a.get("answer") == "ran":
            text = "ran: a human confirmed this call ran (its result was not recorded)"
        elif isinstance(a, dict):
            text = "not run: a human confirmed this call did not run"
        elif c.tool_call_id in waiting:
            text = "not run: it waited for a human's answer and the conversation went on"
        elif key in parked:
            text = ("outcome unknown: the process died during this call; it was not repeated "
                    "and waits for a human's review")
        else:
            text = "no result: the turn ended before this call's result was recorded"
        parts.append(ToolReturnPart(c.tool_name, text, tool_call_id=c.tool_call_id))
    return [*out, ModelRequest(parts=parts)]


def begin_record(prompt: Any) -> Change:
    """The run record committed with the turn's begin (before any model request)."""
    if prompt is not None and not isinstance(prompt, str):
        raise InvalidState("a durable Pydantic AI run's prompt is a string (or None to go on "
                           "from the history)", reason="bad_prompt")
    return _set(run={"prompt": prompt, "started": False})  # paused: kept until the run ends


def checkpoint_record(history: Sequence[ModelMessage]) -> Change:
    """A node boundary: the history as a resume must see it."""
    store = _stored(history)

    def change(s: Session) -> Session:
        rec = {**record(s), "started": True}
        return _set(run=rec)(store(s))

    return change


def end_record(history: Sequence[ModelMessage]) -> Change:
    """The run is over: the whole conversation kept, the run record gone."""
    store, clear = _stored(history), _set(run=None, paused=None)
    return lambda s: clear(store(s))


def paused_record(history: Sequence[ModelMessage], requests: DeferredToolRequests) -> Change:
    """The run waits for a human: the history and what it waits on."""
    def calls(parts: Sequence[Any]) -> list[dict[str, Any]]:
        return [{"tool_call_id": p.tool_call_id, "tool_name": p.tool_name,
                 "args": p.args_as_dict()} for p in parts]

    store = _stored(history)
    rest = _set(run=None, paused={"approvals": calls(requests.approvals),
                                  "calls": calls(requests.calls)})
    return lambda s: rest(store(s))


__all__ = ["KEY", "begin_record", "checkpoint_record", "encode", "end_record", "messages",
           "migrate", "paused", "paused_record", "record", "settled"]
