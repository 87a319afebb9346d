"""Google ADK (``google-adk``) on fsdurable: a session service and durable runs.

- ``FileSessionService(store)``: ADK's ``BaseSessionService`` on fsdurable session files. An
  ADK session ``(app_name, user_id, session_id)`` is the fsdurable session ``session_id`` (ids
  are validated: ``[A-Za-z0-9_-]{1,128}``); its events and its session-scoped state live under
  ``metadata["adk"]``; ``app:``/``user:`` state lives in one small session per app and per
  (app, user). Every write is a read-modify-write through the store's one commit function, under
  the session's commit lock, off the event loop. A read of a corrupt file raises
  ``UnreadableState`` and moves nothing.
- ``DurableRunner(agent, app_name=..., store=...)``: ``run_async`` is ADK's ``Runner.run_async``
  as one turn of the turn protocol (``_adkrun``; driver ``adk``, recorded in the turn): the
  route lock held for the whole run, in progress with its marker before the first model call,
  the ADK events checkpointed as they are appended (debounced), every tool through the ledger
  (a plugin: intent with arguments before an effectful call, outcome after; the unattended
  deny-list and approvals decided at execution time). A tool reads its idempotency key from
  ``tool_context()``.
- ``recover(runner)``: resumes this driver's interrupted runs through fsdurable's gates,
  UNATTENDED, as ADK resumable invocations (the same invocation id: ADK re-executes the calls
  the crash cut short, and the ledger decides each one — answered, re-run with its key, or the
  turn parked for review — instead of ADK's "at least once").
"""

from __future__ import annotations

import contextvars
import json
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import attrs
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session as AdkSession
from google.adk.sessions.state import State

from ._aio import run_sync
from ._async import StoreLike, as_store
from ._errors import InvalidState, SessionNotFound, UnreadableState
from ._layout import validate_session_id
from ._model import Session, adapter_ns, with_adapter_ns
from ._tools import ToolContext

if TYPE_CHECKING:
    from ._adkrun import Driver
    from ._recovery import RecoveryPolicy, RecoveryReport
    from ._turns import Approver

KEY = "adk"  # the session metadata key this adapter owns
STATE_KEY = "adk_state"  # the metadata key of an app's or a user's state session
DRIVER = "adk"  # the turn's driver: recovery hands the run to this adapter alone
SOURCE = DRIVER  # the source of a session this adapter creates: provenance only
EFFECTS = ("none", "idempotent", "external")

CURRENT: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "fsdurable_adk_call", default=None)


def tool_context() -> ToolContext | None:
    """Inside a tool of a durable run: fsdurable's ``ToolContext`` of the call (its
    ``idempotency_key``, ``attended``, ``resumed``); None elsewhere."""
    return CURRENT.get()


# ---------------------------------------------------------------------------------- storage
# (small functions: how a session stores its events may change; nothing else knows the layout)


def _ns(s: Session | None) -> dict[str, Any]:
    return adapter_ns(s, KEY)


def events_of(s: Session | None) -> list[dict[str, Any]]:
    got = _ns(s).get("events")
    return [e for e in got if isinstance(e, dict)] if isinstance(got, list) else []


def record(s: Session | None) -> dict[str, Any]:
    rec = _ns(s).get("run")
    return dict(rec) if isinstance(rec, dict) else {}


def with_ns(s: Session, **changes: Any) -> Session:
    """``s`` with this adapter's metadata updated (a key set to None is removed)."""
    return with_adapter_ns(s, KEY, **changes)


def event_json(event: Event) -> dict[str, Any]:
    """An ADK event as the JSON the session file keeps (pydantic's own JSON: it reads back)."""
    out: dict[str, Any] = json.loads(event.model_dump_json(exclude_none=True))
    return out


def appended(doc: dict[str, Any], delta: Mapping[str, Any]) -> Callable[[Session], Session]:
    """The change that appends one event (and its session-scoped state delta) to a session."""

    def add(s: Session) -> Session:
        ns = _ns(s)
        state = dict(ns.get("state") or {})
        state.update(delta)
        return with_ns(s, events=[*events_of(s), doc], state=state,
                       updated=doc.get("timestamp") or ns.get("updated"))

    return add


def _split(delta: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A state delta as (app, user, session) parts (temp: keys dropped: never persisted)."""
    app, user, sess = {}, {}, {}
    for k, v in delta.items():
        if k.startswith(State.APP_PREFIX):
            app[k[len(State.APP_PREFIX):]] = v
        elif k.startswith(State.USER_PREFIX):
            user[k[len(State.USER_PREFIX):]] = v
        elif not k.startswith(State.TEMP_PREFIX):
            sess[k] = v
    return app, user, sess


def _scope_id(kind: str, *parts: str) -> str:
    import hashlib

    h = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:40]
    return f"adk-{kind}-{h}"


class FileSessionService(BaseSessionService):
    """ADK sessions in an fsdurable store (``store``: a ``Store``, an ``AsyncStore`` or a root
    path; default ``$FSDURABLE_ROOT``)."""

    def __init__(self, store: StoreLike = None) -> None:
        self.store = as_store(store)
        self._runs: dict[str, Driver] = {}  # session id -> the durable run appending to it

    def __repr__(self) -> str:
        return f"FileSessionService({self.store.root!r})"

    # ------------------------------------------------------------------ the ADK interface

    async def create_session(self, *, app_name: str, user_id: str,
                             state: dict[str, Any] | None = None,
                             session_id: str | None = None) -> AdkSession:
        sid = validate_session_id(session_id.strip() if session_id else uuid.uuid4().hex)
        return await run_sync(self._create, app_name, user_id, dict(state or {}), sid)

    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: GetSessionConfig | None = None) -> AdkSession | None:
        s = await run_sync(self._load, validate_session_id(session_id.strip()))
        if not self._mine(s, app_name, user_id):
            return None
        assert s is not None
        evs = events_of(s)
        if config is not None:
            if config.num_recent_events is not None:
                evs = evs[-config.num_recent_events:] if config.num_recent_events else []
            if config.after_timestamp is not None:
                evs = [e for e in evs if float(e.get("timestamp") or 0)
                       >= config.after_timestamp]
        events = [Event.model_validate_json(json.dumps(e)) for e in evs]
        return await run_sync(self._adk, s, events)

    async def list_sessions(self, *, app_name: str,
                            user_id: str | None = None) -> ListSessionsResponse:
        return await run_sync(self._list, app_name, user_id)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        await run_sync(self._delete, app_name, user_id, validate_session_id(session_id.strip()))

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await run_sync(self._scoped, _scope_id("user", app_name, user_id))

    async def append_event(self, session: AdkSession, event: Event) -> Event:
        if event.partial:
            return event
        d = self._runs.get(session.id)
        event = await super().append_event(session=session, event=event)  # in memory
        session.last_update_time = event.timestamp
        delta = dict(event.actions.state_delta) if event.actions else {}
        app, user, sess = _split(delta)
        if app or user:
            await run_sync(self._scope_write, session.app_name, session.user_id, app, user)
        if d is not None:  # a durable run: a checkpoint of its turn (debounced)
            await d.appended(event_json(event), sess)
        else:
            await run_sync(self._append, session, event_json(event), sess)
        return event

    # ------------------------------------------------------------------ worker thread

    def _load(self, sid: str) -> Session | None:
        try:
            return self.store.load(sid)
        except SessionNotFound:
            return None

    @staticmethod
    def _mine(s: Session | None, app_name: str, user_id: str) -> bool:
        ns = _ns(s)
        return bool(ns) and ns.get("app_name") == app_name and ns.get("user_id") == user_id

    def _adk(self, s: Session, events: list[Event]) -> AdkSession:
        ns = _ns(s)
        app_name, user_id = str(ns["app_name"]), str(ns["user_id"])
        state = dict(ns.get("state") or {})
        for k, v in self._scoped(_scope_id("app", app_name)).items():
            state[State.APP_PREFIX + k] = v
        for k, v in self._scoped(_scope_id("user", app_name, user_id)).items():
            state[State.USER_PREFIX + k] = v
        return AdkSession(id=s.id, app_name=app_name, user_id=user_id, state=state,
                          events=events, last_update_time=float(ns.get("updated") or 0.0))

    def _create(self, app_name: str, user_id: str, state: dict[str, Any],
                sid: str) -> AdkSession:
        from ._errors import ConflictError

        app, user, sess = _split(state)
        ns = {"app_name": app_name, "user_id": user_id, "state": sess, "events": [],
              "updated": self.store.clock()}
        try:
            self.store.create(sid, source=SOURCE, metadata={KEY: ns})
        except ConflictError:
            raise AlreadyExistsError(f"Session with id {sid} already exists.") from None
        if app or user:
            self._scope_write(app_name, user_id, app, user)
        s = self.store.load(sid)
        return self._adk(s, [])

    def _list(self, app_name: str, user_id: str | None) -> ListSessionsResponse:
        out = []
        for sid in self.store.sessions():
            try:
                s = self._load(sid)
            except UnreadableState:
                continue  # a bad file (left in place): a listing never stops on one
            ns = _ns(s)
            if s is None or ns.get("app_name") != app_name or "events" not in ns:
                continue
            if user_id is not None and ns.get("user_id") != user_id:
                continue
            out.append(self._adk(s, []))
        out.sort(key=lambda x: (x.last_update_time, x.user_id, x.id))
        return ListSessionsResponse(sessions=out)

    def _delete(self, app_name: str, user_id: str, sid: str) -> None:
        with self.store.commit_lock(sid):
            s = self._load(sid)
            if s is not None and self._mine(s, app_name, user_id):
                self.store.delete(sid, base_version=s.version)

    def _append(self, session: AdkSession, doc: dict[str, Any],
                delta: dict[str, Any]) -> None:
        sid = validate_session_id(session.id)
        with self.store.commit_lock(sid):
            s = self._load(sid)
            if s is None or not self._mine(s, session.app_name, session.user_id):
                raise SessionNotFound(f"no ADK session {sid!r} of app "
                                      f"{session.app_name!r}, user {session.user_id!r}",
                                      session_id=sid, reason="no_session")
            self.store.commit(appended(doc, delta)(s), s.version)

    def _scoped(self, sid: str) -> dict[str, Any]:
        got = self._load(sid)
        raw = got.metadata.get(STATE_KEY) if got is not None else None
        return dict(raw) if isinstance(raw, dict) else {}

    def _scope_write(self, app_name: str, user_id: str, app: dict[str, Any],
                     user: dict[str, Any]) -> None:
        for sid, delta in ((_scope_id("app", app_name), app),
                           (_scope_id("user", app_name, user_id), user)):
            if not delta:
                continue
            with self.store.commit_lock(sid):
                s = self._load(sid)
                if s is None:
                    self.store.create(sid, source=SOURCE, metadata={STATE_KEY: delta})
                else:
                    cur = {**self._scoped(sid), **delta}
                    self.store.commit(attrs.evolve(s, metadata={**s.metadata,
                                                                STATE_KEY: cur}), s.version)


# ---------------------------------------------------------------------------------- durable runs


@attrs.frozen
class RunOutcome:
    """How a durable run ended: ``status`` (completed, paused, cancelled, superseded),
    the final ``reply`` text (None if none) and the ``events`` it yielded."""

    status: str
    reply: str | None = None
    events: tuple[Any, ...] = ()


def _effects(effects: Mapping[str, str] | None) -> dict[str, str]:
    eff = dict(effects or {})
    for name, e in eff.items():
        if e not in EFFECTS:
            raise InvalidState(f"tool {name!r}: effect must be one of {EFFECTS}, got {e!r}",
                               reason="bad_effect")
    return eff


class DurableRunner:
    """ADK runs as durable turns of fsdurable sessions.

    ``agent``: the root agent (an ADK ``BaseAgent``); ``app_name``: the ADK app name;
    ``plugins``: your ADK plugins (run after fsdurable's); ``effects``: tool name -> ``none`` |
    ``idempotent`` | ``external`` (undeclared: ``external``, the worst); ``approvals``: names of
    tools that need a human's approval besides those ADK already asks a confirmation for
    (``FunctionTool(..., require_confirmation=...)``). ``session_service``: the
    ``FileSessionService`` the runs write through (``store`` is its store). ``services``:
    ADK's other services for its ``Runner`` (``artifact_service``, ``memory_service``,
    ``credential_service``): theirs, not fsdurable's."""

    def __init__(self, agent: Any, *, app_name: str, store: StoreLike = None,
                 plugins: list[Any] | None = None, effects: Mapping[str, str] | None = None,
                 approvals: frozenset[str] | set[str] = frozenset(),
                 debounce: float | None = None, **services: Any) -> None:
        unknown = set(services) - {"artifact_service", "memory_service", "credential_service"}
        if unknown:
            raise TypeError(f"DurableRunner() got an unexpected keyword argument "
                            f"{sorted(unknown)[0]!r}")
        self.services = services
        self.agent, self.app_name = agent, app_name
        self.session_service = FileSessionService(store)
        self.store = self.session_service.store
        self.plugins = list(plugins or [])
        self.effects = _effects(effects)
        self.approvals = frozenset(approvals)
        self.debounce = debounce

    def __repr__(self) -> str:
        return f"DurableRunner({self.app_name!r}, {self.store.root!r})"

    def effect(self, name: str) -> str:
        return self.effects.get(name, "external")

    async def run_async(self, *, user_id: str, session_id: str, new_message: Any,
                        attended: bool = False, approve: Approver | None = None,
                        run_config: Any = None,
                        lock_timeout: float | None = None) -> AsyncGenerator[Any, None]:
        """ADK's ``Runner.run_async`` as a durable turn: yields ADK's events as they come.

        ``new_message``: the user's message (a string or a ``types.Content``; a message of
        function responses answers a paused run's confirmation request). ``attended``: a human
        is present NOW; then ``approve(ctx, request)`` (the live caller's answer) decides each
        approval in the run, or, without it, ADK asks for a confirmation and the turn ends
        ``paused``. Unattended, the deny-list (``Config.unattended_deny``) is refused and every
        approval rejected, each with a ``tool_refused`` event. Holds the session's route lock
        for the whole run (``LockTimeout`` after ``lock_timeout``). A missing session is
        created (``app_name``, ``user_id``)."""
        from . import _adkrun

        async with aclosing(_adkrun.live(self, user_id, session_id, new_message, attended,
                                         approve, run_config, lock_timeout)) as events:
            async for e in events:  # left early: the inner runs are closed now, not at GC
                yield e

    async def run(self, *, user_id: str, session_id: str, new_message: Any,
                  attended: bool = False, approve: Approver | None = None,
                  run_config: Any = None, lock_timeout: float | None = None) -> RunOutcome:
        """``run_async`` drained: the ``RunOutcome``."""
        from . import _adkrun

        holder: list[Any] = []
        async with aclosing(_adkrun.live(self, user_id, session_id, new_message, attended,
                                         approve, run_config, lock_timeout, holder)) as events:
            async for _ in events:
                pass
        return _adkrun.outcome(holder[0])

    async def recover(self, *, policy: RecoveryPolicy | None = None,
                      select: Callable[[Any], bool] | None = None,
                      run_config: Any = None) -> RecoveryReport:
        """``recover(self, ...)``."""
        return await recover(self, policy=policy, select=select, run_config=run_config)


async def recover(runner: DurableRunner, *, policy: RecoveryPolicy | None = None,
                  select: Callable[[Any], bool] | None = None,
                  run_config: Any = None) -> RecoveryReport:
    """Resume this node's interrupted ADK runs (call at startup, on the loop that will run
    them): every run whose turn records the ``adk`` driver, whatever the session's source.
    Every gate and decision is fsdurable's (``fsdurable.arecover``), every decision an event;
    the resumed runs are unattended. Returns the ``RecoveryReport``."""
    from ._adkrun import Host
    from ._recovery import arecover

    return await arecover(runner.store, Host(runner, run_config), policy, select=select)


def describe(s: Session) -> dict[str, Any]:
    """What ``fsdurable show`` says of an ADK session (its metadata only): its app, user and
    event count, and the invocation of its run in progress, if any."""
    ns = _ns(s)
    return {"kind": "adk session", "app_name": ns.get("app_name"),
            "user_id": ns.get("user_id"), "events": len(events_of(s)),
            "run": record(s).get("invocation_id")}


__all__ = ["DurableRunner", "FileSessionService", "RunOutcome", "describe", "recover",
           "tool_context"]
