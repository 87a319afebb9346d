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
    """A parked call's arguments: those its intent was committed with (its ledger entry: exact
    for its turn, whatever the driver), else the transcript's (a record older than that; the
    latest call of that id). None if neither has them."""
    got = call.get("arguments")
    if isinstance(got, dict):
        return dict(got)
    cid = call.get("tool_call_id")
    for m in reversed(s.messages):
        for c in m.tool_calls:
            if c.id == cid:
                return dict(c.arguments)
    return None


def _calls(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    rr = meta.get(REVIEW)
    calls = rr.get("calls") if isinstance(rr, dict) else None
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _key(c: Mapping[str, Any]) -> str:
    """An answer's key: the call's turn and its id (a driver may number its calls per turn:
    turn 2's ``call_0`` is not turn 1's)."""
    return f"{c.get('turn_id')}:{c.get('tool_call_id')}"


def _answers(s: Session) -> dict[str, Any]:
    """The session's answers, each keyed by its call's turn and id and naming both
    (``turn_id``, ``tool_call_id``). An answer an older fsdurable keyed by the call id alone
    belongs to the one call of that id parked before it was given (``_owners``), and is read —
    and rewritten at the next answer — under that call's key; one that cannot be told apart
    stays under its old key, carried by no call (doctor reports it: ``ambiguous_answers``)."""
    raw = s.metadata.get(ANSWERS)
    out = dict(raw) if isinstance(raw, dict) else {}
    calls = _closed_or_open_calls(s)
    for k, a in list(out.items()):
        if not isinstance(a, dict) or "turn_id" in a:
            continue
        owners = _owners(a, k, calls)
        if len(owners) == 1:
            c = owners[0]
            del out[k]
            out[_key(c)] = {**_about(c), **a}
    return out


def _owners(a: Mapping[str, Any], cid: str, calls: list[dict[str, Any]]
            ) -> list[dict[str, Any]]:
    """The calls (one per turn) an older answer for ``cid`` may be about: those of that id whose
    intent is older than the answer (a call parked after it was never answered by it)."""
    at = a.get("at")
    seen: dict[str, dict[str, Any]] = {}
    for c in calls:
        t = c.get("intent_at")
        if c.get("tool_call_id") == cid and not (isinstance(at, (int, float))
                                                 and isinstance(t, (int, float)) and t > at):
            seen.setdefault(_key(c), c)
    return list(seen.values())


def _about(c: Mapping[str, Any]) -> dict[str, Any]:
    """What an answer keeps of its call, so a re-run needs no other record."""
    return {k: c.get(k) for k in ("turn_id", "tool_call_id", "tool", "idempotency_key",
                                  "arguments")}


def answer_of(s: Session, turn_id: str, tool_call_id: str) -> dict[str, Any] | None:
    """The human's answer to one turn's parked call (``answer``: ran / did_not_run, ``at``,
    ``note``, ``rerun_at``, ``rerun_result``), None if not answered. A driver continuing a
    parked run reads answers here, never ``metadata["review_answers"]`` by call id: a call id
    names a call within its turn only."""
    a = _answers(s).get(_key({"turn_id": turn_id, "tool_call_id": tool_call_id}))
    return a if isinstance(a, dict) and "turn_id" in a else None


def with_answer(s: Session, turn_id: str | None, tool_call_id: str, **fields: Any) -> Session:
    """``s`` with the answer to one turn's call updated by ``fields`` (e.g. a driver that runs a
    "did not run" call again records ``rerun_at``/``rerun_result``); older answers are
    rewritten under their calls' keys in the same change."""
    import attrs

    got = _answers(s)
    k = _key({"turn_id": turn_id, "tool_call_id": tool_call_id})
    got[k] = {**got.get(k, {}), **fields, "turn_id": turn_id, "tool_call_id": tool_call_id}
    return attrs.evolve(s, metadata={**s.metadata, ANSWERS: got})


def ambiguous_answers(s: Session) -> list[str]:
    """Call ids of answers an older fsdurable recorded that several turns' calls share: no call
    carries them (each waits for its own answer; ``--call`` takes its idempotency key)."""
    return [k for k, a in _answers(s).items() if isinstance(a, dict) and "turn_id" not in a
            and len(_owners(a, k, _closed_or_open_calls(s))) > 1]


def _pick(calls: list[dict[str, Any]], which: str, sid: str) -> list[dict[str, Any]]:
    """The calls ``which`` names: a tool call id, or an idempotency key (one turn's call)."""
    got = [c for c in calls if which in (c.get("tool_call_id"), c.get("idempotency_key"))]
    if len({_key(c) for c in got}) > 1:
        keys = ", ".join(str(c.get("idempotency_key")) for c in got)
        raise InvalidState(f"several turns of {sid!r} have a call {which!r}: say which one by "
                           f"its idempotency key (--call KEY: {keys})", session_id=sid,
                           reason="call_required")
    return got[:1]


def parked(s: Session) -> list[dict[str, Any]]:
    """Every parked call of one session, each with its arguments (its ledger entry's, else the
    transcript's), the reason it was parked and the human's answer so far (None: not answered)."""
    rr = s.metadata.get(REVIEW)
    extra = ({"turn_id": rr.get("turn_id"), "parked_at": rr.get("at"),
              "reason": rr.get("reason") or "in_doubt"} if isinstance(rr, dict) else {})
    answers = _answers(s)
    out = []
    for c in _calls(s.metadata):
        c = {"session_id": s.id, **extra, **c, "arguments": _arguments(s, c)}
        a = answers.get(_key(c))
        out.append({**c, "answer": a if isinstance(a, dict) and "turn_id" in a else None})
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
    """Record a human's answer for one parked call: ``tool_call_id`` (or the call's idempotency
    key, when several turns have a call of that id), or None for the one call of the session
    still waiting (with several waiting, None is refused: ``call_required`` — an answer is a
    human's word about one call). Returns the calls answered. A call answered once keeps its
    answer: answering it again is refused."""
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
            chosen = _pick(calls, tool_call_id, s.id)
            if not chosen:
                ids = ", ".join(str(c["tool_call_id"]) for c in calls)
                raise InvalidState(f"no parked call {tool_call_id!r} in {s.id!r} (parked: {ids})",
                                   session_id=s.id, reason="unknown_call")
        else:
            chosen = [c for c in calls if c["answer"] is None]
            if len(chosen) > 1:  # one answer for calls nobody checked one by one: refused
                ids = ", ".join(str(c["tool_call_id"]) for c in chosen)
                raise InvalidState(f"{len(chosen)} calls of {s.id!r} wait for an answer ({ids}):"
                                   " say which one (--call TOOL_CALL_ID)", session_id=s.id,
                                   reason="call_required")
        for c in chosen:
            if c["answer"] is not None:
                raise InvalidState(f"call {c['tool_call_id']!r} was already answered "
                                   f"({c['answer']['answer']})", session_id=s.id,
                                   reason="already_answered")
        answers = _answers(s)  # an older file's answers rewritten under their calls' keys
        at = store.clock()
        for c in chosen:
            answers[_key(c)] = {**_about(c), "answer": value, "at": at, "note": note}
            done.append({**c, "answer": answers[_key(c)]})
        meta = {**s.metadata, ANSWERS: answers}
        if all(_key(c) in answers for c in calls):
            meta.pop(REVIEW)  # every call answered: out of the queue (answers stay on record)
            meta["review_closed"] = {**s.metadata[REVIEW], "closed_at": at}
        return attrs.evolve(s, metadata=meta)

    store.patch(session_id, record)
    for c in done:
        store.emit(ev.REVIEW_ANSWERED, session_id=session_id, turn_id=c.get("turn_id"),
                   reason=value, tool_call_id=c["tool_call_id"], tool=c.get("tool"),
                   idempotency_key=c.get("idempotency_key"), note=note)
    return done


def rerunnable(s: Session, *, rerun: bool = False) -> list[dict[str, Any]]:
    """The answers a re-run may follow: "did not run", not re-run yet (each names its call).
    ``rerun``: instead those already re-run (or started again), which a re-run refuses."""
    return [a for a in _answers(s).values() if isinstance(a, dict) and "turn_id" in a
            and a.get("answer") == DID_NOT_RUN
            and ("rerun_at" in a or "rerun_started_at" in a) is rerun]


def rerun_call(store: Store, loop: Any, session_id: str, tool_call_id: str) -> str:
    """Run a call again that a human answered "did not run": attended, with its original
    idempotency key, once. The result is committed (``metadata["review_answers"]``) and is an
    event. Anything else — no answer, "ran", already re-run (or a re-run in flight, or one that
    died before its result was committed: it may have run) — is refused.

    Check, run and record happen under the session's route lock (the lock a live turn holds),
    and the re-run's start is committed before the tool runs: a second ``rerun_call``, in this
    process or another, waits and is then refused — never two runs of one call."""
    s = store.load(session_id)
    with store.lock(s.route_key):
        return _rerun_locked(store, loop, store.load(session_id), tool_call_id)


def _rerun_locked(store: Store, loop: Any, s: Session, tool_call_id: str) -> str:
    import inspect

    session_id = s.id
    answers = _answers(s)
    got = _pick([a for a in answers.values() if isinstance(a, dict) and "turn_id" in a],
                tool_call_id, session_id)
    a = got[0] if got else None
    if a is None or a.get("answer") != DID_NOT_RUN:
        raise TurnStateError(f"call {tool_call_id!r} of {session_id!r} may only run again once "
                             "a human answered that it did not run (fsdurable review "
                             f"{session_id} --did-not-run)", session_id=session_id,
                             reason="not_answered_did_not_run")
    if "rerun_at" in a:
        raise TurnStateError(f"call {tool_call_id!r} was already run again", reason="rerun_done",
                             session_id=session_id)
    if "rerun_started_at" in a:
        raise TurnStateError(f"call {tool_call_id!r} was already started again and its result "
                             "never recorded: it may have run (check before anything else)",
                             reason="rerun_in_doubt", session_id=session_id)
    call = next((c for c in _closed_or_open_calls(s) if _key(c) == _key(a)), a)
    tools = getattr(loop, "tools", {})
    if call.get("tool") not in tools:
        raise InvalidState(f"the host has no tool {call.get('tool')!r} to run the call "
                           "with", session_id=session_id, reason="unknown_tool")
    from ._tools import ToolContext

    tid = a.get("turn_id")
    turn_id = str(tid or "")
    key = str(call.get("idempotency_key") or a.get("idempotency_key"))
    cid = str(a.get("tool_call_id"))

    def note(**fields: Any) -> None:
        store.patch(session_id, lambda cur: with_answer(cur, tid, cid, **fields))

    note(rerun_started_at=store.clock())  # durable BEFORE the call, like a ledger intent
    ctx = ToolContext(session_id=s.id, turn_id=turn_id, tool_call_id=cid,
                      idempotency_key=key, attended=True, resumed=False,
                      is_cancelled=lambda: False)
    result = tools[call["tool"]].fn(ctx, **(_arguments(s, call) or {}))
    if inspect.isawaitable(result):
        import asyncio

        async def wait() -> Any:
            return await result

        result = asyncio.run(wait())
    text = str(result)
    note(rerun_at=store.clock(), rerun_result=text)
    store.emit(ev.REVIEW_RERUN, session_id=session_id, turn_id=turn_id,
               tool_call_id=cid, tool=call["tool"], idempotency_key=key,
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


__all__ = ["ambiguous_answers", "answer_of", "answer_review", "parked", "rerun_call",
           "rerunnable", "review_queue", "review_record", "with_answer"]
