"""The reference agent loop: durable turns, debounced checkpoints, a side-effect ledger, cancel.

A turn is committed in progress (marker first) BEFORE the first model call; then model call ->
tool batch -> ... -> final reply; it ends with a commit that clears in-progress (and the marker).
Every write goes through the store's one commit function.

Checkpoints happen at phase boundaries (model reply received, tool batch finished, compaction
summary written) and are debounced (``Config.checkpoint_debounce``, on the loop's injectable
clock). A pending checkpoint is flushed — never skipped — before any ``idempotent``/``external``
tool (the ledger's intent commit carries it), before every model call of a resumed turn, at turn
end and on cancel. The ledger commits an effectful tool's intent before the call and its outcome
after, so a crash in between leaves the call *in doubt* for recovery to judge.

Attendance is decided here, at execution time: ``run(..., attended=)`` is the live caller's word;
``resume_claimed`` (the recovery path) is unattended, always — nothing read from disk changes it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from . import _events as ev
from . import _fsio
from ._config import Config
from ._errors import ConflictError, SessionNotFound, TurnStateError
from ._model import LedgerEntry, Message, Session, ToolCall
from ._store import Store
from ._tools import Model, Tool, ToolContext, call_model

Approver = Callable[[ToolContext, ToolCall], bool]
Compactor = Callable[[Sequence[Message]], "tuple[str, Sequence[Message]]"]


@attrs.frozen
class TurnResult:
    """How a turn ended: ``completed``, ``cancelled`` (by a cancel, here or in another process),
    ``superseded`` (another turn took the session) or ``step_limit``."""

    session_id: str
    turn_id: str
    status: str
    reply: str | None = None
    session: Session | None = None
    resumed: bool = False
    refused: tuple[str, ...] = ()


class _Stop(Exception):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


class _Run:
    """One turn being driven: in-memory session (``version`` = last committed), pending flag."""

    def __init__(self, session: Session, *, attended: bool, resumed: bool, now: float) -> None:
        assert session.turn is not None
        self.session = session
        self.turn_id = session.turn.id
        self.attended = attended
        self.resumed = resumed
        self.committed_at = now
        self.pending = False
        self.phase = session.turn.phase
        self.cancelled = threading.Event()
        self.mu = threading.RLock()
        self.refused: list[str] = []


def _text(out: Any) -> str:
    return out if isinstance(out, str) else repr(out) if out is not None else ""


def _with_entry(s: Session, entry: LedgerEntry) -> Session:
    assert s.turn is not None
    rest = tuple(e for e in s.turn.ledger if e.tool_call_id != entry.tool_call_id)
    return attrs.evolve(s, turn=attrs.evolve(s.turn, ledger=(*rest, entry)))


def unanswered_calls(s: Session) -> tuple[ToolCall, ...]:
    """Tool calls of the last assistant message that have no tool result yet."""
    for i in range(len(s.messages) - 1, -1, -1):
        m = s.messages[i]
        if m.role == "assistant":
            done = {x.tool_call_id for x in s.messages[i + 1:] if x.role == "tool"}
            return tuple(c for c in m.tool_calls if c.id not in done)
        if m.role == "user":
            return ()
    return ()


def in_doubt(s: Session) -> tuple[LedgerEntry, ...]:
    """Ledger entries with an intent and no outcome: the effect may or may not have happened."""
    return tuple(e for e in s.turn.ledger if e.status == "intent") if s.turn else ()


class AgentLoop:
    """Runs durable turns on a store: ``AgentLoop(store, model, tools, config)``.

    ``approve(ctx, call) -> bool`` answers approval requests of an attended run (without it every
    request is denied); an unattended run denies them all without asking. ``clock`` drives the
    checkpoint debounce (default: the store's clock). Thread-safe for distinct sessions.
    """

    def __init__(self, store: Store, model: Model, tools: Iterable[Tool] = (),
                 config: Config | None = None, *, clock: Callable[[], float] | None = None,
                 approve: Approver | None = None, max_steps: int = 32,
                 compactor: Compactor | None = None, compact_after: int = 200) -> None:
        self.store = store
        self.model = model
        self.tools = {t.name: t for t in tools}
        self.config = config if config is not None else store.config
        self.clock = clock if clock is not None else store.clock
        self.approve = approve
        self.max_steps = max_steps
        self.compactor = compactor
        self.compact_after = compact_after
        self._runs: dict[str, _Run] = {}
        self._mu = threading.Lock()

    # ------------------------------------------------------------------ host protocol

    def tool_specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self.tools.values()]

    def tool_effect(self, name: str) -> str | None:
        """The declared effect of a tool (None: unknown here — recovery treats it as external)."""
        t = self.tools.get(name)
        return t.effect if t is not None else None

    def resume_claimed(self, session: Session) -> TurnResult:
        """Continue a turn that recovery claimed (it holds the route lock and has committed the
        attempt). Always unattended: this path has no way to say otherwise."""
        if not session.in_progress:
            raise TurnStateError(f"session {session.id!r} has no turn to resume",
                                 session_id=session.id, reason="not_in_progress")
        for e in in_doubt(session):
            if self.tool_effect(e.name) != "idempotent":
                raise TurnStateError(f"tool call {e.tool_call_id!r} ({e.name}) is in doubt and "
                                     "cannot be re-run safely", session_id=session.id,
                                     reason="in_doubt")
        return self._drive(session, attended=False, resumed=True)

    # ------------------------------------------------------------------ live turns

    def run(self, session_id: str, content: str | None, *, attended: bool = False) -> TurnResult:
        """Run a live turn under the session's route lock. ``attended``: a human is present now
        (the caller knows; nothing stored decides it). The turn is committed in progress before
        the model is called."""
        route = self.store.load(session_id).route_key
        while True:
            with self.store.lock(route):
                current = self.store.load(session_id).route_key
                if current == route:  # else it changed before we held it: take the right one
                    s = self.store.begin_turn(session_id, content)
                    return self._drive(s, attended=attended, resumed=False)
            route = current

    def cancel(self, session_id: str) -> Session:
        """Cancel the session's turn: flush its pending checkpoint, commit it not in progress
        (marker removed, ``turn_cancelled``); the running loop stops at its next boundary."""
        with self._mu:
            run = self._runs.get(session_id)
        if run is None:
            return self.store.cancel(session_id)
        with run.mu:
            if run.pending and not run.cancelled.is_set():
                with contextlib.suppress(_Stop, ConflictError):
                    self._commit(run, run.phase)
            run.cancelled.set()
            return self.store.cancel(session_id)

    # ------------------------------------------------------------------ the turn

    def _drive(self, s: Session, *, attended: bool, resumed: bool) -> TurnResult:
        run = _Run(s, attended=attended, resumed=resumed, now=self.clock())
        with self._mu:
            self._runs[s.id] = run
        try:
            try:
                return self._steps(run)
            except _Stop as stop:
                return self._result(run, stop.status, None)
        finally:
            with self._mu:
                if self._runs.get(s.id) is run:
                    del self._runs[s.id]

    def _steps(self, run: _Run) -> TurnResult:
        if run.resumed:
            last = run.session.messages[-1] if run.session.messages else None
            if last is not None and last.role == "assistant" and not last.tool_calls:
                return self._end(run)  # the final reply was written; only the end is missing
            self._batch(run, unanswered_calls(run.session))
        steps = 0
        while True:
            self._check(run)
            if steps >= self.max_steps:
                return self._end(run, status="step_limit")
            self._maybe_compact(run)
            if run.resumed:
                self._commit(run, "before_model", only_if_pending=True)
            reply = call_model(self.model, self._transcript(run.session), self.tool_specs())
            steps += 1
            with run.mu:
                self._check(run)
                calls = _unique_calls(run.session, reply.tool_calls)
                msg = Message("assistant", reply.content, calls)
                run.session = attrs.evolve(run.session, messages=(*run.session.messages, msg))
                if not reply.tool_calls:
                    return self._end(run)
                self._boundary(run, "model_reply")
            self._batch(run, calls)
            self._boundary(run, "tool_batch")

    def _transcript(self, s: Session) -> tuple[Message, ...]:
        if s.summary:
            return (Message("system", f"Summary of the earlier conversation: {s.summary}"),
                    *s.messages)
        return s.messages

    def _maybe_compact(self, run: _Run) -> None:
        if self.compactor is None or len(run.session.messages) <= self.compact_after:
            return
        summary, kept = self.compactor(run.session.messages)
        with run.mu:
            run.session = attrs.evolve(run.session, summary=summary, messages=tuple(kept))
            # the summary was expensive: losing it means paying for it twice, so it is not
            # left pending behind the debounce
            self._commit(run, "compaction")

    def _batch(self, run: _Run, calls: Sequence[ToolCall]) -> None:
        for c in calls:
            self._check(run)
            self._one(run, c)

    def _one(self, run: _Run, c: ToolCall) -> None:
        sid, tid = run.session.id, run.turn_id
        key = f"{sid}:{tid}:{c.id}"
        ctx = ToolContext(session_id=sid, turn_id=tid, tool_call_id=c.id, idempotency_key=key,
                          attended=run.attended, resumed=run.resumed,
                          is_cancelled=lambda: self._is_cancelled(run))
        t = self.tools.get(c.name)
        assert run.session.turn is not None
        known = run.session.turn.entry(c.id)
        if known is not None and known.status != "intent":  # outcome recorded: never re-run
            self._answer(run, c, known.result or "", None)
            return
        if t is None:
            self._answer(run, c, f"error: unknown tool {c.name!r}", None)
            return
        refusal = self._refusal(run, t, ctx, c)
        if refusal is not None:
            reason, text = refusal
            run.refused.append(t.name)
            self.store.emit(ev.TOOL_REFUSED, session_id=sid, turn_id=tid, reason=reason,
                            tool=t.name, tool_call_id=c.id, attended=run.attended)
            entry = None
            if t.effect != "none":
                now = self.clock()
                entry = LedgerEntry(c.id, t.name, t.effect, key, "refused", now, now, text)
            self._answer(run, c, text, entry)
            return
        entry = None
        if t.effect != "none":
            entry = LedgerEntry(c.id, t.name, t.effect, key, "intent", self.clock())
            with run.mu:  # intent is durable before the call; carries any pending checkpoint
                run.session = _with_entry(run.session, entry)
                self._commit(run, "tool_intent")
        status = "done"
        try:
            text = _text(t.fn(ctx, **c.arguments))
        except Exception as e:  # a tool's failure is the model's business, not the loop's
            status, text = "failed", f"error: {type(e).__name__}: {e}"
        if entry is not None:
            entry = attrs.evolve(entry, status=status, outcome_at=self.clock(), result=text)
        self._answer(run, c, text, entry)

    def _answer(self, run: _Run, c: ToolCall, text: str, entry: LedgerEntry | None) -> None:
        with run.mu:
            self._check(run)
            s = run.session
            if entry is not None:
                s = _with_entry(s, entry)
            run.session = attrs.evolve(s, messages=(*s.messages,
                                                    Message("tool", text, tool_call_id=c.id)))
            if entry is not None:
                self._commit(run, "tool_outcome")
            else:
                run.pending = True

    def _refusal(self, run: _Run, t: Tool, ctx: ToolContext,
                 c: ToolCall) -> tuple[str, str] | None:
        if not run.attended and t.name in self.config.unattended_deny:
            return ("unattended_deny",
                    f"refused: {t.name} is not allowed in an unattended run (nobody is present)")
        if t.needs_approval:
            if not run.attended:
                return ("approval_denied",
                        f"denied: {t.name} needs approval and no human is present")
            if self.approve is None or not self.approve(ctx, c):
                return ("not_approved", f"denied: {t.name} was not approved")
        return None

    # ------------------------------------------------------------------ checkpoints

    def _boundary(self, run: _Run, phase: str) -> None:
        with run.mu:
            run.pending = True
            run.phase = phase
            if self.clock() - run.committed_at >= self.config.checkpoint_debounce:
                self._commit(run, phase)

    def _commit(self, run: _Run, phase: str, *, only_if_pending: bool = False) -> None:
        with run.mu:
            if only_if_pending and not run.pending:
                return
            self._check(run)
            for tries in range(_REBASES, -1, -1):
                try:
                    s = self.store.checkpoint(run.session, phase=phase)
                    break
                except ConflictError:
                    self._rebase(run, give_up=tries == 0)
            run.session = s
            run.committed_at = self.clock()
            run.pending = False
            run.phase = phase

    def _end(self, run: _Run, *, status: str = "completed") -> TurnResult:
        with run.mu:
            self._check(run)
            for tries in range(_REBASES, -1, -1):
                try:
                    s = self.store.end_turn(run.session)
                    break
                except ConflictError:
                    self._rebase(run, give_up=tries == 0)
            run.pending = False
        return self._result(run, status, s)

    def _result(self, run: _Run, status: str, s: Session | None) -> TurnResult:
        reply = next((m.content for m in reversed(run.session.messages)
                      if m.role == "assistant"), None)
        return TurnResult(run.session.id, run.turn_id, status, reply, s, run.resumed,
                          tuple(run.refused))

    # ------------------------------------------------------------------ cancellation

    def _is_cancelled(self, run: _Run) -> bool:
        try:
            self._check(run)
        except _Stop:
            return True
        return False

    def _check(self, run: _Run) -> None:
        """Stop at this boundary if the turn was cancelled here or in another process."""
        if run.cancelled.is_set():
            raise _Stop("cancelled")
        if _fsio.lstat(self.store.layout.marker(run.session.id)) is None:
            self._stopped_elsewhere(run)  # no marker: cancelled or finished elsewhere?

    def _stopped_elsewhere(self, run: _Run) -> Session:
        """Stop if the turn was cancelled or replaced elsewhere; else the session on disk."""
        try:
            disk = self.store.load(run.session.id)
        except SessionNotFound:
            raise _Stop("cancelled") from None
        if not disk.in_progress or disk.turn is None:
            raise _Stop("cancelled")
        if disk.turn.id != run.turn_id:
            raise _Stop("superseded")
        return disk

    def _rebase(self, run: _Run, *, give_up: bool) -> None:
        """A commit met a newer version. Cancelled or superseded: stop. Still this turn (a
        host's patch, a marker repair, a migration): keep what the other writer committed and
        put back what this run owns — the turn, its transcript and summary — then retry. The
        route lock this run holds means no other loop or recovery wrote the turn itself."""
        disk = self._stopped_elsewhere(run)
        if give_up:
            raise ConflictError(f"session {disk.id!r} keeps changing under the running turn",
                                session_id=disk.id, reason="contended")
        mine = run.session
        run.session = attrs.evolve(disk, turn=mine.turn, messages=mine.messages,
                                   summary=mine.summary)


_REBASES = 3  # a session patched this often during one commit is contended, not merely touched


def _unique_calls(s: Session, calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
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


__all__ = ["AgentLoop", "TurnResult", "in_doubt", "unanswered_calls"]
