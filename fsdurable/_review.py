"""The review queue: tool calls that may or may not have run, parked for a human.

A call is parked when recovery meets an in-doubt call it cannot safely repeat, or when a turn is
cancelled while an effectful tool runs. The facts live in the session's
``metadata["review_required"]`` (``turn_id``, ``at``, ``reason``, ``calls``: tool, effect,
arguments, idempotency key, intent time), written by the one commit function, with an event.

A human answers per call: it **ran** (nothing more to do) or it **did not run**. Each answer is
committed to the session (``metadata["review_answers"]``) and is an event (``review_answered``);
a session leaves the queue when every call has an answer. Only a call answered "did not run" may
be run again, and only on an explicit request (``rerun_call``): attended (a human asked for it now),
with the call's original idempotency key, once; its result is committed and is an event
(``review_rerun``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import _events as ev
from ._errors import FsDurableError, InvalidState, TurnStateError
from ._model import REVIEW, review_record

if TYPE_CHECKING:
    from ._model import Session
    from ._store import Store

ANSWERS = "review_answers"
RAN, DID_NOT_RUN = "ran", "did_not_run"


def _arguments(s: Session, call: Mapping[str, Any]) -> dict[str, Any] | None:
    """A parked call's arguments: from the transcript (the reference loop's), else from its
    ledger entry, committed with its intent (a driver whose transcript lives in its framework:
    Agents SDK, LangGraph). None if neither has them (a record older than both)."""
    cid = call.get("tool_call_id")
    for m in reversed(s.messages):
        for c in m.tool_calls:
            if c.id == cid:
                return dict(c.arguments)
    got = call.get("arguments")
    return dict(got) if isinstance(got, dict) else None


def _calls(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    rr = meta.get(REVIEW)
    calls = rr.get("calls") if isinstance(rr, dict) else None
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _answers(meta: Mapping[str, Any]) -> dict[str, Any]:
    a = meta.get(ANSWERS)
    return dict(a) if isinstance(a, dict) else {}


def parked(s: Session) -> list[dict[str, Any]]:
    """Every parked call of one session, each with its arguments (the transcript's, else its
    ledger entry's), the reason it was parked and the human's answer so far (None: not answered)."""
    rr = s.metadata.get(REVIEW)
    extra = ({"turn_id": rr.get("turn_id"), "parked_at": rr.get("at"),
              "reason": rr.get("reason") or "in_doubt"} if isinstance(rr, dict) else {})
    answers = _answers(s.metadata)
    out = []
    for c in _calls(s.metadata):
        cid = str(c.get("tool_call_id"))
        out.append({"session_id": s.id, **extra, **c, "arguments": _arguments(s, c),
                    "answer": answers.get(cid)})
    return out


def review_queue(store: Store) -> list[dict[str, Any]]:
    """Every call still waiting for a human's answer, in every session (reads every session)."""
    out: list[dict[str, Any]] = []
    for sid in store.sessions():
        try:
            s = store.load(sid)
        except FsDurableError:
            continue  # deleted since the listing, or unreadable (doctor reports it)
        out += [c for c in parked(s) if c["answer"] is None]
    return out


def answer_review(store: Store, session_id: str, *, ran: bool,
                  tool_call_id: str | None = None, note: str | None = None
                  ) -> list[dict[str, Any]]:
    """Record a human's answer for one parked call (or every unanswered one when the session has
    a single call, or ``tool_call_id`` is None and all share the answer). Returns the calls
    answered. A call answered once keeps its answer: answering it again is refused."""
    value = RAN if ran else DID_NOT_RUN
    done: list[dict[str, Any]] = []

    def record(s: Session) -> Session:
        import attrs

        done.clear()
        calls = parked(s)
        if not calls:
            raise InvalidState(f"session {s.id!r} has no calls parked for review",
                               session_id=s.id, reason="nothing_to_review")
        if tool_call_id is not None:
            chosen = [c for c in calls if c["tool_call_id"] == tool_call_id]
            if not chosen:
                ids = ", ".join(str(c["tool_call_id"]) for c in calls)
                raise InvalidState(f"no parked call {tool_call_id!r} in {s.id!r} (parked: {ids})",
                                   session_id=s.id, reason="unknown_call")
        else:
            chosen = [c for c in calls if c["answer"] is None]
        for c in chosen:
            if c["answer"] is not None:
                raise InvalidState(f"call {c['tool_call_id']!r} was already answered "
                                   f"({c['answer']['answer']})", session_id=s.id,
                                   reason="already_answered")
        answers = _answers(s.metadata)
        at = store.clock()
        for c in chosen:
            answers[str(c["tool_call_id"])] = {"answer": value, "at": at, "note": note}
            done.append({**c, "answer": answers[str(c["tool_call_id"])]})
        meta = {**s.metadata, ANSWERS: answers}
        if all(str(c["tool_call_id"]) in answers for c in calls):
            meta.pop(REVIEW)  # every call answered: out of the queue (answers stay on record)
            meta[ANSWERS] = answers
            meta["review_closed"] = {**s.metadata[REVIEW], "closed_at": at}
        return attrs.evolve(s, metadata=meta)

    store.patch(session_id, record)
    for c in done:
        store.emit(ev.REVIEW_ANSWERED, session_id=session_id, turn_id=c.get("turn_id"),
                   reason=value, tool_call_id=c["tool_call_id"], tool=c.get("tool"),
                   idempotency_key=c.get("idempotency_key"), note=note)
    return done


def rerun_call(store: Store, loop: Any, session_id: str, tool_call_id: str) -> str:
    """Run a call again that a human answered "did not run": attended, with its original
    idempotency key, once. The result is committed (``metadata["review_answers"]``) and is an
    event. Anything else — no answer, "ran", already re-run — is refused."""
    import inspect

    s = store.load(session_id)
    answers = _answers(s.metadata)
    a = answers.get(tool_call_id)
    if not isinstance(a, dict) or a.get("answer") != DID_NOT_RUN:
        raise TurnStateError(f"call {tool_call_id!r} of {session_id!r} may only run again once "
                             "a human answered that it did not run (fsdurable review "
                             f"{session_id} --did-not-run)", session_id=session_id,
                             reason="not_answered_did_not_run")
    if "rerun_at" in a:
        raise TurnStateError(f"call {tool_call_id!r} was already run again", reason="rerun_done",
                             session_id=session_id)
    call = next((c for c in _closed_or_open_calls(s) if c.get("tool_call_id") == tool_call_id),
                None)
    tools = getattr(loop, "tools", {})
    if call is None or call.get("tool") not in tools:
        raise InvalidState(f"the host has no tool {call and call.get('tool')!r} to run the call "
                           "with", session_id=session_id, reason="unknown_tool")
    from ._tools import ToolContext

    turn_id = str(call.get("turn_id") or "")
    key = str(call["idempotency_key"])
    ctx = ToolContext(session_id=s.id, turn_id=turn_id, tool_call_id=tool_call_id,
                      idempotency_key=key, attended=True, resumed=False,
                      is_cancelled=lambda: False)
    result = tools[call["tool"]].fn(ctx, **(_arguments(s, call) or {}))
    if inspect.isawaitable(result):
        import asyncio

        async def wait() -> Any:
            return await result

        result = asyncio.run(wait())
    text = str(result)

    def record(cur: Session) -> Session:
        import attrs

        got = _answers(cur.metadata)
        got[tool_call_id] = {**got.get(tool_call_id, a), "rerun_at": store.clock(),
                             "rerun_result": text}
        return attrs.evolve(cur, metadata={**cur.metadata, ANSWERS: got})

    store.patch(session_id, record)
    store.emit(ev.REVIEW_RERUN, session_id=session_id, turn_id=turn_id,
               tool_call_id=tool_call_id, tool=call["tool"], idempotency_key=key,
               attended=True, result=text[:1000])
    return text


def _closed_or_open_calls(s: Session) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in (REVIEW, "review_closed"):
        rr = s.metadata.get(k)
        if isinstance(rr, dict) and isinstance(rr.get("calls"), list):
            out += [{"turn_id": rr.get("turn_id"), **c} for c in rr["calls"]
                    if isinstance(c, dict)]
    return out


__all__ = ["answer_review", "parked", "rerun_call", "review_queue", "review_record"]
