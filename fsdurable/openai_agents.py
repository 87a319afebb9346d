"""OpenAI Agents SDK (``openai-agents``, module ``agents``) on fsdurable: sessions and durable runs.

- ``FileSession(session_id, store)``: the SDK's ``Session`` protocol (``get_items``,
  ``add_items``, ``pop_item``, ``clear_session``) on one fsdurable session. Every mutation is
  one frame appended to the session's item log and one fdatasync, under the session's commit
  lock, run off the event loop (a cancelled mutation happened whole or not at all). A read of a
  corrupt file raises ``UnreadableState`` and moves nothing; a write first has the repair gate
  quarantine it (an event). This module imports no ``agents``: the protocol is structural.
- ``run`` / ``run_streamed``: a durable ``Runner.run`` / ``Runner.run_streamed``, the SDK's
  events translated into the one turn protocol (``_oarun``; driver ``openai-agents``, recorded
  in the turn): the route lock held for the whole run; in progress with its marker before the
  first model call; the ``RunState`` checkpointed at each model call (debounced); every
  FunctionTool through the protocol (the unattended deny-list, approvals, the ledger).
- ``recover(agent, store)``: resumes this driver's interrupted runs through fsdurable's gates,
  UNATTENDED; ``continue_run`` goes on with a run parked for review once a human answered.

The items live in the session's item log (the storage: ``_oaitems``; docs/storage.md, "Item
logs"): ``history/<id>/items-<n>.log``, checksummed frames, each an add, a pop or a clear, so
``add_items`` appends the new items (the session document is not rewritten), ``get_items(limit)``
parses the frames that hold the last ``limit``, and ``pop_item`` appends a cut. The run record
lives under ``metadata["openai_agents"]["run"]`` (a paused run's state under ``["paused"]``). A
session of an older fsdurable (its items in the lane ``openai_agents``, or inline in the
metadata) is migrated at its first write here (``session_migrated``).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ._aio import run_sync
from ._async import AsyncStore, StoreLike, as_store
from ._errors import InvalidState, SessionNotFound, StorageError, UnreadableState
from ._layout import validate_session_id
from ._model import Session
from ._oaitems import (
    SOURCE,
    Item,
    Items,
    Op,
    _json,
    _ns,
    add,
    clear,
    cut_to,
    pop,
    record,
    with_record,
)
from ._tools import ToolContext

if TYPE_CHECKING:
    from ._oarun import Driver
    from ._recovery import RecoveryPolicy, RecoveryReport
    from ._store import Store
    from ._turns import TurnRun

DRIVER = "openai-agents"  # the turn's driver: recovery hands the run to this adapter alone
EFFECTS = ("none", "idempotent", "external")
RAN_TEXT = "the call ran (a human confirmed it after a crash); its output was not recorded"

_REREADS = 3  # a lock-free read meeting that many rewrites in a row gives up (contended)

CURRENT: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "fsdurable_openai_agents_call", default=None)


def current_call() -> ToolContext | None:
    """Inside a tool of a durable run: fsdurable's ``ToolContext`` of the call (its
    ``idempotency_key``, ``attended``, ``resumed``); None elsewhere."""
    return CURRENT.get()


class FileSession:
    """An Agents SDK ``Session`` stored in an fsdurable store (``store``: a ``Store``, an
    ``AsyncStore`` or a root path; default ``$FSDURABLE_ROOT``)."""

    def __init__(self, session_id: str, store: StoreLike = None, *,
                 session_settings: Any = None) -> None:
        self.session_id = validate_session_id(session_id)
        self.session_settings = session_settings
        self.astore = store if isinstance(store, AsyncStore) else AsyncStore(as_store(store))
        self.store = self.astore.store
        self._items = Items(self.store, self.session_id)
        # the document this session last read or committed under the commit lock: while the
        # file on disk is still that commit (Store._load_known, by its stat), it is not parsed
        self._doc: Session | None = None
        self._mu = threading.Lock()  # the item log's view: one thread parses it at a time

    def __repr__(self) -> str:
        return f"FileSession({self.session_id!r}, {self.store.root!r})"

    async def get_items(self, limit: int | None = None) -> list[Item]:
        """The latest ``limit`` items in chronological order (None: the session settings'
        limit, else all; 0: none; negative: all, as ``SQLiteSession``). ``UnreadableState`` if
        the file is corrupt (left where it is: ``fsdurable doctor`` reports it), or if its item
        log is short (reason ``log_short``: lost, or not delivered by a sync tool yet)."""
        if limit is None:
            limit = getattr(self.session_settings, "limit", None)
        if limit == 0:
            return []
        out: list[Item] = await run_sync(self._read, limit)
        return out

    async def add_items(self, new: list[Item]) -> None:
        if not new:
            return
        await run_sync(self._mutate, add(list(new)))

    async def pop_item(self) -> Item | None:
        out: Item | None = await run_sync(self._mutate, pop)
        return out

    async def clear_session(self) -> None:
        await run_sync(self._mutate, clear)

    def _read(self, limit: int | None) -> list[Item]:
        """The last ``limit`` items (None or negative: all), reading only the frames that
        hold them; each read parses them afresh (the caller may change what it gets). A read
        takes no lock: a log another writer's rewrite removed meanwhile is read again from
        the document naming its successor (a log that is short for good still raises)."""
        s = self._load()
        for _ in range(_REREADS):
            try:
                with self._mu:
                    return self._items.read(s, 0, last=None if limit is None or limit < 0
                                            else limit)
            except UnreadableState as e:
                again = self._load() if e.reason == "log_short" else s
                if again is None or _ns(again).get("items_log") == _ns(s).get("items_log"):
                    raise
                s = again
        raise UnreadableState(f"session {self.session_id!r}: its item log was rewritten "
                              f"{_REREADS} times while it was read", session_id=self.session_id,
                              reason="contended")

    def _mark(self) -> tuple[int, dict[str, Any] | None]:
        """How many items the session holds, and the log reference that says so (a durable
        run's checkpoint records both: ``_oaitems.with_record``). Under the commit lock: every
        frame it counts is durable (a writer holds the lock until its fdatasync returned)."""
        with self.store._commit_lock(self.session_id):
            return self._mark_of(self._load(held=True))

    def _mark_of(self, s: Session | None) -> tuple[int, dict[str, Any] | None]:
        """``_mark`` of the document ``s`` (a turn's begin change, under the commit lock)."""
        with self._mu:
            return self._items.mark(s)

    def _load(self, *, held: bool = False) -> Session | None:
        """The session (None if missing); a bad file raises and stays where it is. ``held``:
        the document last committed here while the file is that commit (to count, never to
        hand values out: the caller may change them)."""
        try:
            return self.store._load_known(self.session_id, self._doc if held else None)
        except SessionNotFound:
            return None

    def _mutate(self, op: Op) -> Any:
        """``op`` applied to the items under the session's commit lock (``_oaitems.Items``:
        one frame appended to the item log and one fdatasync). A write: a bad file is
        quarantined and an older session migrated by the repair gate first (each an event)."""
        sid = self.session_id  # validated once, by __init__
        with self.store._commit_lock(sid):
            s = self._current(sid, self._doc)
            self._doc = None  # set again only once this mutation succeeded
            with self._mu:
                doc, out = self._items.change(s, op)
            self._doc = doc
            return out

    def _current(self, sid: str, known: Session | None) -> Session | None:
        """The session on disk (``known`` while the file is still that commit; None if
        missing); a write's: a bad file is quarantined, an older session's inline items
        migrated (the repair gate)."""
        try:
            s = self.store._load_known(sid, known)
        except SessionNotFound:
            return None
        except UnreadableState:
            from ._repair import repair_session

            repair_session(self.store, sid)  # a bad file is moved aside (an event) ...
            if self.store._disk_version(sid):  # ... one it must leave (a newer fsdurable's,
                raise  # another node's turn) is never written over, nor is the log it names
            return None
        if s is known:
            return s  # read or committed here before: checked then
        from ._codec import inline_lanes

        if inline_lanes(s):  # an older session: its items inline
            from ._repair import repair_session

            repair_session(self.store, sid)
            return self._load()
        return s


# ---------------------------------------------------------------------------------- durable runs


@attrs.frozen
class RunOutcome:
    """How a recovered run ended (what ``fsdurable.recover`` reports as ``status``)."""

    status: str  # "completed" | "cancelled" | ...
    result: Any = None


def _effects(effects: Mapping[str, str] | None) -> dict[str, str]:
    eff = dict(effects or {})
    for name, e in eff.items():
        if e not in EFFECTS:
            raise InvalidState(f"tool {name!r}: effect must be one of {EFFECTS}, got {e!r}",
                               reason="bad_effect")
    return eff


def _check(runner_kwargs: dict[str, Any]) -> None:
    if "session" in runner_kwargs:
        raise TypeError("fsdurable.openai_agents sets 'session' itself (pass session=)")


class DurableStream:
    """A durable ``Runner.run_streamed``: iterate it (``async for event in stream`` or
    ``stream.stream_events()``) for the SDK's stream events as they come; the turn begins at
    the first iteration and ends with the stream. Afterwards the SDK's ``RunResultStreaming``
    is ``.result`` (its ``final_output``, ``interruptions``, ... are readable here too).
    Leaving the loop early cancels the run (``turn_cancelled``)."""

    def __init__(self, begin: Callable[[], Any], agent: Any, hooks: Any,
                 kwargs: dict[str, Any]) -> None:
        self._begin, self._agent, self._hooks, self._kwargs = begin, agent, hooks, kwargs
        self._started = False
        self.driver: Driver | None = None
        self.result: Any = None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self.stream_events()

    async def stream_events(self) -> AsyncIterator[Any]:
        if self._started:
            raise RuntimeError("a durable stream is iterated once")
        self._started = True
        d, start = await self._begin()
        self.driver = d
        try:
            async for e in d.stream(self._agent, start, self._hooks, self._kwargs):
                self.result = d.result
                yield e
        finally:
            self.result = d.result

    @property
    def status(self) -> str | None:
        """How the turn ended: completed, paused, failed, cancelled (None: not yet)."""
        return self.driver.status if self.driver is not None else None

    def __getattr__(self, name: str) -> Any:
        result = self.__dict__.get("result")
        if result is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(result, name)


def run_streamed(agent: Any, input: Any, *, session: FileSession, attended: bool = False,
                 effects: Mapping[str, str] | None = None, debounce: float | None = None,
                 lock_timeout: float | None = None, hooks: Any = None,
                 **runner_kwargs: Any) -> DurableStream:
    """A durable ``Runner.run_streamed(agent, input, session=session, ...)`` (see ``run``)."""
    _check(runner_kwargs)
    eff = _effects(effects)
    if hasattr(input, "to_string") and hasattr(input, "approve"):  # a RunState
        run: dict[str, Any] = {"input": None, "state": input.to_string()}
    else:
        run = {"input": _json(input, "the run's input", session.session_id), "state": None}

    def change(s: Session) -> Session:
        assert s.turn is not None
        n, seen = session._mark_of(s)
        rec = {**run, "agent": getattr(agent, "name", ""), "turn_id": s.turn.id, "items_at": n}
        return with_record(s, run=rec, paused=None, seen=seen)

    async def begin() -> tuple[Driver, Any]:
        from ._turns import TurnRun

        t = await TurnRun.abegin(session.store, session.session_id,
                                 input if isinstance(input, str) else None, driver=DRIVER,
                                 attended=attended, change=change, create=True, source=SOURCE,
                                 lock_timeout=lock_timeout)
        return _driver(t, session, eff, debounce), input

    return DurableStream(begin, agent, hooks, runner_kwargs)


async def run(agent: Any, input: Any, *, session: FileSession, attended: bool = False,
              effects: Mapping[str, str] | None = None, debounce: float | None = None,
              lock_timeout: float | None = None, hooks: Any = None,
              **runner_kwargs: Any) -> Any:
    """A durable ``Runner.run(agent, input, session=session, ...)``; returns its result.

    ``input``: a string, a list of input items, or a ``RunState`` (a paused run after a human
    approved or rejected its interruptions). ``attended``: a human is present NOW and can answer
    approvals (a run that needs one then ends paused, with ``interruptions``); unattended, the
    deny-list (``Config.unattended_deny``) is refused and every approval rejected, each with a
    ``tool_refused`` event. ``effects``: tool name -> ``none`` | ``idempotent`` | ``external``
    (undeclared: ``external``). ``hooks``: your ``RunHooks``, called after fsdurable's. Holds
    the session's route lock for the whole run (``LockTimeout`` after ``lock_timeout``)."""
    stream = run_streamed(agent, input, session=session, attended=attended, effects=effects,
                          debounce=debounce, lock_timeout=lock_timeout, hooks=hooks,
                          **runner_kwargs)
    async for _ in stream:
        pass
    return stream.result


def _driver(t: TurnRun, fs: FileSession, effects: Mapping[str, str], debounce: float | None,
            answers: list[dict[str, Any]] | None = None) -> Driver:
    import sys

    from ._oarun import Driver

    t.debounce = debounce
    return Driver(t, fs, sys.modules[__name__], effects, answers)


async def paused_state(agent: Any, session: FileSession) -> Any:
    """The ``RunState`` of the session's run paused for approval (None if none): approve or
    reject its ``get_interruptions()``, then ``await run(agent, state, session=...)``."""
    from agents import RunState

    raw = _ns(await run_sync(session._load)).get("paused")
    return await RunState.from_string(agent, raw) if isinstance(raw, str) else None


async def continue_run(agent: Any, *, session: FileSession, attended: bool = False,
                       effects: Mapping[str, str] | None = None, debounce: float | None = None,
                       lock_timeout: float | None = None, hooks: Any = None,
                       **runner_kwargs: Any) -> Any:
    """Go on with a run that recovery parked for review, once a human answered every parked
    call (``fsdurable review ID --ran`` / ``--did-not-run``): a new turn from the run's last
    checkpoint; a call answered "ran" is answered with that (never run again), one answered
    "did not run" runs through the protocol (``fsdurable review --rerun`` is then refused for
    it). ``TurnStateError``: a call still waits for its answer (``review_pending``), or there
    is no parked run to continue (``nothing_to_continue``)."""
    from ._oarun import continuation

    _check(runner_kwargs)
    eff = _effects(effects)
    got: list[Any] = []

    def change(s: Session) -> Session:
        new, answers = continuation(s, at=session.store.clock())
        got[:] = [answers]
        return new

    from ._turns import TurnRun

    t = await TurnRun.abegin(session.store, session.session_id, driver=DRIVER,
                             attended=attended, change=change, lock_timeout=lock_timeout)
    rec = record(t.session)
    if isinstance(rec.get("items_at"), int):  # the items back to the run's last checkpoint
        await run_sync(session._mutate, cut_to(rec["items_at"]))
    d = _driver(t, session, eff, debounce, got[0])
    from ._oarun import start_of

    start = await start_of(d, agent, rec)
    async for _ in d.stream(agent, start, hooks, runner_kwargs):
        pass
    return d.result


class _Host:
    """fsdurable's recovery host for Agents SDK runs (``fsdurable.arecover`` claims the turns
    this driver owns and awaits each resume here, on the caller's loop). It touches neither the
    agent nor ``agents`` until a turn is claimed (or an in-doubt call must be judged): a start
    with nothing to resume stays cheap."""

    driver = DRIVER

    def __init__(self, agent: Any, astore: AsyncStore, effects: dict[str, str],
                 debounce: float | None, hooks: Any, kwargs: dict[str, Any]) -> None:
        self.agent, self.astore, self.effects = agent, astore, effects
        self.debounce, self.hooks, self.kwargs = debounce, hooks, kwargs

    def tool_effect(self, name: str) -> str | None:
        return self.effects.get(name)

    def rerun_safe(self, name: str) -> bool:
        """An in-doubt call is re-run only if a repeat is a no-op and the resume would run it
        (``_turns.rerun_safe``); a tool this host cannot see (an agent factory) may need
        approval for all it knows: not safe."""
        from ._turns import rerun_safe

        tool = next((t for t in getattr(self.agent, "tools", None) or () if
                     getattr(t, "name", None) == name), None)
        needs = tool is None or tool.needs_approval is not False
        deny = self.astore.store.config.unattended_deny
        return rerun_safe(self.effects.get(name), needs, name in deny)

    def resume_claimed(self, s: Session) -> Any:
        return self.aresume_claimed(s)  # arecover awaits it on the caller's loop

    async def aresume_claimed(self, s: Session) -> RunOutcome:
        from agents import Agent

        from ._oarun import start_of
        from ._turns import TurnRun

        agent = self.agent if isinstance(self.agent, Agent) else self.agent(s.id)
        fs = FileSession(s.id, self.astore)
        t = TurnRun.claimed(fs.store, s)
        rec = record(s)
        if not rec:
            raise InvalidState(f"session {s.id!r}: the interrupted run has no run record",
                               session_id=s.id, reason="no_run_record")
        at = rec.get("items_at")
        if isinstance(at, int):  # what the dead run added after its last checkpoint goes
            await run_sync(fs._mutate, cut_to(at))
        await run_sync(t.commit, None, phase="resumed")
        d = _driver(t, fs, self.effects, self.debounce, rec.get("answers"))
        start = await start_of(d, agent, rec)
        async for _ in d.stream(agent, start, self.hooks, self.kwargs):
            pass
        return RunOutcome(d.status or "completed", d.result)


async def recover(agent: Any, store: StoreLike = None,
                  *, effects: Mapping[str, str] | None = None,
                  policy: RecoveryPolicy | None = None, debounce: float | None = None,
                  select: Callable[[Any], bool] | None = None, hooks: Any = None,
                  **runner_kwargs: Any) -> RecoveryReport:
    """Resume this node's interrupted Agents SDK runs (call at startup, on the loop that will
    run them): every run whose turn records the ``openai-agents`` driver, whatever the
    session's source. ``agent``: the starting agent, or ``fn(session_id) -> agent``. Every
    gate and decision is fsdurable's (``fsdurable.arecover``), every decision an event; the
    resumed runs are unattended. Returns the ``RecoveryReport``."""
    from ._recovery import arecover

    _check(runner_kwargs)
    astore = store if isinstance(store, AsyncStore) else AsyncStore(as_store(store))
    host = _Host(agent, astore, _effects(effects), debounce, hooks, runner_kwargs)
    return await arecover(astore.store, host, policy, select=select)

def describe(store: Store, s: Session) -> dict[str, Any]:
    """What ``fsdurable show`` says of an Agents SDK session (no framework import): how many
    items it holds (its item log's frame headers; ``unreadable`` if the log is short or bad),
    and its run record's state if a run is recorded."""
    out: dict[str, Any] = {"kind": "openai-agents session", "run": record(s).get("state")}
    try:
        out["items"] = Items(store, s.id).count(s)
    except (UnreadableState, StorageError) as e:
        out["unreadable"] = f"{e.reason}: {e.message}"
    return out


__all__ = ["DurableStream", "FileSession", "RunOutcome", "continue_run", "current_call",
           "describe", "paused_state", "recover", "run", "run_streamed"]
