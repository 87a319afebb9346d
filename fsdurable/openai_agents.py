"""OpenAI Agents SDK (``openai-agents``, module ``agents``) on fsdurable: sessions and durable runs.

- ``FileSession(session_id, store)``: the SDK's ``Session`` protocol (``get_items``,
  ``add_items``, ``pop_item``, ``clear_session``) on one fsdurable session file. Every mutation is
  a read-modify-write through the store's one commit function, run off the event loop and
  shielded (a cancelled mutation happened whole or not at all); two tasks or two processes
  adding at once are serialised by the session's commit lock. This module imports no ``agents``:
  the protocol is structural.
- ``run(agent, input, session=...)``: a durable ``Runner.run``. The session is committed in
  progress (with its marker) BEFORE the first model call and stays so until the run ends; the
  run's ``RunState`` is checkpointed before each model call (that is: after each tool batch;
  debounced by ``Config.checkpoint_debounce``, never when a tool with an effect ran since the
  last one); an effectful tool's intent is committed before it runs.
- ``recover(agent, store)``: at startup, resumes interrupted runs through fsdurable's gates
  (enabled, own node, staleness, attempt cap committed before the resume), always UNATTENDED:
  a tool that needs approval is rejected, never approved. A tool that may have run when the
  process died (its intent committed, its output not) is re-run only if declared
  ``idempotent`` or ``none``; otherwise the run is parked for review. A run paused for a human's
  approval (an attended run that returned ``interruptions``) is not interrupted: its turn is
  over and its ``RunState`` is kept (``paused_state``).

The session file holds the items under ``metadata["openai_agents"]["items"]`` and the run record
under ``metadata["openai_agents"]["run"]``: both change in the same atomic commit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from . import _events as ev
from ._aio import run_sync
from ._async import AsyncStore, StoreLike, as_store
from ._errors import InvalidState, SessionNotFound, TurnStateError, UnreadableState
from ._layout import new_id, validate_session_id
from ._model import LedgerEntry, Session

if TYPE_CHECKING:
    from ._recovery import RecoveryPolicy, RecoveryReport

KEY = "openai_agents"  # the session metadata key this adapter owns
SOURCE = "openai-agents"  # the session's source: recovery selects its markers by it
EFFECTS = ("none", "idempotent", "external")

Item = Any  # agents.items.TResponseInputItem: a JSON object


def _ns(s: Session | None) -> dict[str, Any]:
    raw = s.metadata.get(KEY) if s is not None else None
    return dict(raw) if isinstance(raw, dict) else {}


def _items(s: Session | None) -> list[Item]:
    items = _ns(s).get("items")
    return list(items) if isinstance(items, list) else []


def _with(s: Session, **changes: Any) -> Session:
    """``s`` with this adapter's metadata updated (a key set to None is removed)."""
    ns = _ns(s)
    for k, v in changes.items():
        if v is None:
            ns.pop(k, None)
        else:
            ns[k] = v
    return attrs.evolve(s, metadata={**s.metadata, KEY: ns})


def _json(value: Any, what: str, sid: str) -> Any:
    """A JSON copy of ``value`` (what SQLiteSession stores); InvalidState if it is not JSON."""
    try:
        return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidState(f"{what} of session {sid!r} is not JSON: {e}", session_id=sid,
                           reason="not_json") from e


class FileSession:
    """An Agents SDK ``Session`` stored in an fsdurable store (``store``: a ``Store``, an
    ``AsyncStore`` or a root path; default ``$FSDURABLE_ROOT``)."""

    def __init__(self, session_id: str, store: StoreLike = None, *,
                 session_settings: Any = None) -> None:
        self.session_id = validate_session_id(session_id)
        self.session_settings = session_settings
        self.astore = store if isinstance(store, AsyncStore) else AsyncStore(as_store(store))
        self.store = self.astore.store

    def __repr__(self) -> str:
        return f"FileSession({self.session_id!r}, {self.store.root!r})"

    # ------------------------------------------------------------------ the Session protocol

    async def get_items(self, limit: int | None = None) -> list[Item]:
        """The latest ``limit`` items in chronological order (None: the session settings'
        limit, else all; 0: none; negative: all, as ``SQLiteSession``)."""
        if limit is None:
            limit = getattr(self.session_settings, "limit", None)
        if limit == 0:
            return []
        items = await run_sync(self._read)
        return items if limit is None or limit < 0 else items[-limit:]

    async def add_items(self, items: list[Item]) -> None:
        if not items:
            return
        new = _json(list(items), "an item", self.session_id)
        await run_sync(self._mutate, lambda cur: (cur + new, None))

    async def pop_item(self) -> Item | None:
        def pop(cur: list[Item]) -> tuple[list[Item], Item | None]:
            return (cur[:-1], cur[-1]) if cur else (cur, None)

        out: Item | None = await run_sync(self._mutate, pop)
        return out

    async def clear_session(self) -> None:
        await run_sync(self._mutate, lambda cur: ([], None))

    # ------------------------------------------------------------------ disk (worker thread)

    def _load(self, *, repair: bool = False) -> Session | None:
        """The session, or None if missing or unreadable. A read leaves a bad file where it is;
        a write (``repair=True``) first has the repair gate quarantine it (an event) — unless
        it is in a newer format or another node's turn: then the write fails, nothing lost."""
        try:
            return self.store.load(self.session_id)
        except SessionNotFound:
            return None
        except UnreadableState:
            if repair:
                from ._repair import repair_session

                repair_session(self.store, self.session_id)
            return None

    def _read(self) -> list[Item]:
        return _items(self._load())

    def _mutate(self, fn: Callable[[list[Item]], tuple[list[Item], Any]]) -> Any:
        sid = self.session_id
        with self.store.commit_lock(sid):
            s = self._load(repair=True)
            cur = _items(s)
            new, out = fn(cur)
            if s is None:
                if new:
                    self.store.create(sid, source=SOURCE, metadata={KEY: {"items": new}})
            elif new != cur:
                self.store.commit(_with(s, items=new), s.version)
            return out


# ---------------------------------------------------------------------------------- durable runs


@attrs.frozen
class RunOutcome:
    """How a recovered run ended (what ``fsdurable.recover`` reports as ``status``)."""

    status: str  # "completed" | "paused"
    result: Any = None


class _Run:
    """One durable run of one session: its commits, all through the store's commit function."""

    def __init__(self, fs: FileSession, effects: Mapping[str, str], debounce: float) -> None:
        self.fs, self.store, self.sid = fs, fs.store, fs.session_id
        self.effects = effects
        self.debounce = debounce
        self.turn_id = ""
        self.last = time.monotonic()
        self.pending: str | None = None  # a checkpoint held back by the debounce
        self.effects_since = False  # an effectful tool ran since the last checkpoint
        self.result: Any = None

    def effect(self, name: str) -> str:
        return self.effects.get(name, "external")  # undeclared: assume the worst

    # -- worker-thread commits

    def _current(self) -> Session:
        s = self.store.load(self.sid)
        if not s.in_progress or s.turn is None or s.turn.id != self.turn_id:
            raise TurnStateError(f"the run's turn of {self.sid!r} was cancelled or superseded",
                                 session_id=self.sid, reason="superseded")
        return s

    def begin(self, agent_name: str, input_json: Any, state: str | None) -> None:
        sid, store = self.sid, self.store
        with store.commit_lock(sid):
            s = self.fs._load()
            if s is None:
                s = store.create(sid, source=SOURCE)
            if s.in_progress:
                raise TurnStateError(f"session {sid!r} already has a turn in progress",
                                     session_id=sid, reason="in_progress")
            record = {"agent": agent_name, "input": input_json, "state": state,
                      "items_at": len(_items(s)), "started_at": store.clock()}
            store.commit(_with(s, run=record, paused=None), s.version)
            self.turn_id = new_id()
            store.begin_turn(sid, turn_id=self.turn_id)

    def checkpoint(self, state: str | None, *, intent: LedgerEntry | None = None,
                   clear_ledger: bool = False, phase: str = "model_call") -> None:
        with self.store.commit_lock(self.sid):
            s = self._current()
            assert s.turn is not None
            rec = dict(_ns(s).get("run") or {})
            if state is not None:
                rec.update(state=state, items_at=len(_items(s)))
            ledger = () if clear_ledger else s.turn.ledger
            if intent is not None:
                ledger = (*ledger, intent)
            s = _with(attrs.evolve(s, turn=attrs.evolve(s.turn, ledger=ledger)), run=rec)
            self.store.checkpoint(s, phase=phase)

    def prepare_resume(self) -> dict[str, Any]:
        """One commit before a resumed run: the items the dead run added after its last
        checkpoint go (the resume writes them again), the ledger is settled (recovery parked
        the run if a call in doubt could not be repeated). Returns the run record."""
        with self.store.commit_lock(self.sid):
            s = self._current()
            assert s.turn is not None
            rec = dict(_ns(s).get("run") or {})
            at = rec.get("items_at")
            items = _items(s)[:at] if isinstance(at, int) else _items(s)
            s = _with(attrs.evolve(s, turn=attrs.evolve(s.turn, ledger=())), items=items)
            self.store.checkpoint(s, phase="resumed")
            return rec

    def end(self, paused: str | None) -> None:
        with self.store.commit_lock(self.sid):
            s = _with(self._current(), run=None, paused=paused)
            self.store.end_turn(s)

    # -- on the loop

    async def before_model_call(self) -> None:
        """A phase boundary: every earlier tool output is in the state now."""
        state = self.result.to_state().to_string()
        due = self.effects_since or time.monotonic() - self.last >= self.debounce
        if not due:
            self.pending = state
            return
        await run_sync(self.checkpoint, state, clear_ledger=True)
        self.pending, self.effects_since, self.last = None, False, time.monotonic()

    async def before_tool(self, context: Any, tool: Any) -> None:
        name = getattr(tool, "name", type(tool).__name__)
        effect = self.effect(name)
        if effect == "none":
            return
        call_id = getattr(context, "tool_call_id", None) or new_id()
        intent = LedgerEntry(tool_call_id=call_id, name=name, effect=effect,
                             idempotency_key=f"{self.sid}:{self.turn_id}:{call_id}",
                             status="intent", intent_at=self.store.clock())
        # the held-back checkpoint goes first, in the same commit as the intent
        await run_sync(self.checkpoint, self.pending, intent=intent, phase="tool")
        self.pending, self.effects_since, self.last = None, True, time.monotonic()


_HOOKS: Any = None


def _hooks_class() -> Any:
    global _HOOKS
    if _HOOKS is None:
        from agents import RunHooks

        class DurableHooks(RunHooks[Any]):
            def __init__(self, run: _Run) -> None:
                self.run = run

            async def on_llm_start(self, context: Any, agent: Any, system_prompt: Any,
                                   input_items: Any) -> None:
                await self.run.before_model_call()

            async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
                await self.run.before_tool(context, tool)

        _HOOKS = DurableHooks
    return _HOOKS


async def _drive(run: _Run, agent: Any, start: Any, *, attended: bool,
                 runner_kwargs: dict[str, Any]) -> RunOutcome:
    """Run to the end: stream (so the hooks can take the state), reject approvals when
    unattended, end the turn (completed, or paused for a human when attended)."""
    from agents import Runner

    hooks = _hooks_class()(run)
    while True:
        result = Runner.run_streamed(agent, start, session=run.fs, hooks=hooks, **runner_kwargs)
        run.result = result
        async for _ in result.stream_events():
            pass
        if not result.interruptions:
            await run_sync(run.end, None)
            return RunOutcome("completed", result)
        state = result.to_state()
        if attended:  # a human decides later: the turn is over, the state is kept
            await run_sync(run.end, state.to_string())
            return RunOutcome("paused", result)
        for item in result.interruptions:  # nobody is present: never auto-approved
            state.reject(item)
            name = getattr(item, "tool_name", None) or getattr(item, "name", None)
            await run_sync(run.store.emit, ev.TOOL_REFUSED, session_id=run.sid,
                           turn_id=run.turn_id, tool=name, reason="approval_unattended",
                           attended=False)
        start = state


def _check(runner_kwargs: dict[str, Any]) -> None:
    for k in ("session", "hooks"):
        if k in runner_kwargs:
            raise TypeError(f"fsdurable.openai_agents.run sets {k!r} itself")


async def run(agent: Any, input: Any, *, session: FileSession, attended: bool = False,
              effects: Mapping[str, str] | None = None, debounce: float | None = None,
              lock_timeout: float | None = None, **runner_kwargs: Any) -> Any:
    """A durable ``Runner.run(agent, input, session=session, ...)``; returns its result.

    ``input``: a string, a list of input items, or a ``RunState`` (resuming a paused run after
    a human approved or rejected its interruptions). ``attended``: a human is present NOW and
    can answer approvals (then a run that needs one ends paused, with ``interruptions``);
    unattended, every approval is rejected. ``effects``: tool name -> ``none`` | ``idempotent``
    | ``external`` (undeclared tools count as ``external``). Holds the session's route lock for
    the whole run (``LockTimeout`` after ``lock_timeout``)."""
    _check(runner_kwargs)
    eff = dict(effects or {})
    for name, e in eff.items():
        if e not in EFFECTS:
            raise InvalidState(f"tool {name!r}: effect must be one of {EFFECTS}, got {e!r}",
                               reason="bad_effect")
    cfg = session.store.config
    r = _Run(session, eff, cfg.checkpoint_debounce if debounce is None else debounce)
    if hasattr(input, "to_string") and hasattr(input, "approve"):  # a RunState
        record: tuple[Any, str | None] = (None, input.to_string())
    else:
        record = (_json(input, "the run's input", session.session_id), None)
    s = await run_sync(session._load)
    route = s.route_key if s is not None else f"session:{session.session_id}"
    async with session.astore.lock(route, timeout=lock_timeout):
        await run_sync(r.begin, getattr(agent, "name", ""), *record)
        out = await _drive(r, agent, input, attended=attended, runner_kwargs=runner_kwargs)
    return out.result


async def paused_state(agent: Any, session: FileSession) -> Any:
    """The ``RunState`` of the session's run paused for approval (None if none): approve or
    reject its ``get_interruptions()``, then ``await run(agent, state, session=...)``."""
    from agents import RunState

    s = await run_sync(session._load)
    raw = _ns(s).get("paused")
    if not isinstance(raw, str):
        return None
    return await RunState.from_string(agent, raw)


class _Host:
    """fsdurable's recovery ``Host`` for Agents SDK runs: ``fsdurable.arecover`` runs the gates
    and the claim off the loop and awaits each claimed run here, on the caller's loop."""

    driver = SOURCE

    def __init__(self, agent: Any, astore: AsyncStore, effects: Mapping[str, str],
                 debounce: float | None, runner_kwargs: dict[str, Any]) -> None:
        self.agent, self.astore = agent, astore
        self.effects = dict(effects)
        self.debounce = debounce
        self.runner_kwargs = runner_kwargs

    def tool_effect(self, name: str) -> str | None:
        return self.effects.get(name)

    async def resume_claimed(self, session: Session) -> RunOutcome:
        return await self._resume(session)

    async def _resume(self, s: Session) -> RunOutcome:
        from agents import RunState

        assert s.turn is not None
        from agents import Agent

        agent = self.agent if isinstance(self.agent, Agent) else self.agent(s.id)
        fs = FileSession(s.id, self.astore)
        cfg = self.astore.store.config
        r = _Run(fs, self.effects, cfg.checkpoint_debounce if self.debounce is None
                 else self.debounce)
        r.turn_id = s.turn.id
        rec = await run_sync(r.prepare_resume)
        start: Any
        if isinstance(rec.get("state"), str):
            start = await RunState.from_string(agent, rec["state"])
        elif "input" in rec:
            start = rec["input"]
        else:
            raise InvalidState(f"session {s.id!r}: interrupted run has no run record",
                               session_id=s.id, reason="no_run_record")
        return await _drive(r, agent, start, attended=False, runner_kwargs=self.runner_kwargs)


async def recover(agent: Any, store: StoreLike = None,
                  *, effects: Mapping[str, str] | None = None,
                  policy: RecoveryPolicy | None = None, debounce: float | None = None,
                  select: Callable[[Any], bool] | None = None,
                  **runner_kwargs: Any) -> RecoveryReport:
    """Resume this node's interrupted Agents SDK runs (call at startup, on the loop that will
    run them). ``agent``: the starting agent, or ``fn(session_id) -> agent``. Every gate and
    decision is fsdurable's (``fsdurable.arecover``), every decision an event; the resumed runs
    are unattended. Returns the ``RecoveryReport``."""
    from ._recovery import arecover

    _check(runner_kwargs)
    astore = store if isinstance(store, AsyncStore) else AsyncStore(as_store(store))
    host = _Host(agent, astore, effects or {}, debounce, runner_kwargs)

    def mine(m: Any) -> bool:
        return bool(m.source == SOURCE and (select is None or select(m)))

    return await arecover(astore.store, host, policy, select=mine)


def describe(s: Session) -> dict[str, Any]:
    """What ``fsdurable show`` says of an Agents SDK session (its metadata only; no framework
    import): how many items it holds, and its run record's state if a run is recorded."""
    run = _ns(s).get("run")
    return {"kind": "openai-agents session", "items": len(_items(s)),
            "run": run.get("state") if isinstance(run, dict) else None}


__all__ = ["FileSession", "RunOutcome", "describe", "paused_state", "recover", "run"]
