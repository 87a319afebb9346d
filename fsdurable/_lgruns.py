"""LangGraph graph runs as turns: ``fsdurable.langgraph``'s translator into the turn protocol.

The saver (``FsDurableSaver``) sees checkpoints and writes; this module turns them into
``TurnRun`` calls and re-implements none of the protocol's rules:

- the first put of a run that leaves a node to run (or a ``__resume__`` write, or a node's
  writes past a breakpoint) BEGINS the run's turn in the process that runs the graph —
  ``TurnRun.begin(driver="langgraph")``: the route lock taken and held until the run ends,
  the session in progress with its marker, ``turn_started``; a run a crash left in progress is
  continued by the next live run of its thread (``resume=True``: same ledger, new attempt id);
- every later put/put_writes of the run commits the thread's head THROUGH it
  (``TurnRun.commit``); the run's end, pause (an interrupt or a breakpoint: waiting for a human)
  and failure (an ``__error__`` write of a live run) are ``end``/``pause``/``fail``, which
  release the lock. A resumed run's error is not the run's end: the resume failed, and
  recovery counts the attempt (the marker stays until the cap);
- ``tool_node(tools, effects=...)`` is a LangGraph ``ToolNode`` whose calls go through the
  ledger (``before_tool``/``after_tool``): intent with arguments committed before an effectful
  call, its outcome after, answered from the ledger if it has one, refused when unattended and
  deny-listed or needing approval. The tool reads its idempotency key from ``tool_context()``;
- ``recover(graph, saver, config=..., context=...)``: recovery's host for LangGraph, in
  ``_lgrecover``.

Attendance is decided at execution time: a live run is attended only inside
``with attended():`` in the caller's code; a resumed run never is. ``fsdurable_unattended`` in a
resumed run's config is information for the graph's nodes — nothing here reads it.
"""

from __future__ import annotations

import contextvars
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs

from . import _lgstore as lg
from ._aio import run_sync
from ._errors import TurnStateError
from ._model import Session
from ._store import Store
from ._tools import ToolContext
from ._turns import Approver, ToolDecision, ToolRequest, TurnRun, rerun_safe

if TYPE_CHECKING:
    from .langgraph import FsDurableSaver

DRIVER = "langgraph"
UNATTENDED = "fsdurable_unattended"  # set in a resumed run's config, for its nodes to see

_ATTENDED: contextvars.ContextVar[bool] = contextvars.ContextVar("fsdurable_lg_attended",
                                                                 default=False)
_TOOL: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar("fsdurable_lg_tool",
                                                                           default=None)


class Runs:
    """The graph runs of one saver open in this process, by thread session id (one begin per
    thread at a time)."""

    def __init__(self) -> None:
        self._open: dict[str, TurnRun] = {}
        self._begin: dict[str, threading.Lock] = {}
        self._mu = threading.Lock()

    def get(self, sid: str) -> TurnRun | None:
        run = self._open.get(sid)
        return run if run is not None and run.open else None

    def add(self, run: TurnRun) -> None:
        with self._mu:
            self._open[run.session_id] = run

    def forget(self, run: TurnRun) -> None:
        with self._mu:
            if self._open.get(run.session_id) is run:
                del self._open[run.session_id]

    def begin_lock(self, sid: str) -> threading.Lock:
        with self._mu:
            return self._begin.setdefault(sid, threading.Lock())

    def release(self, which: Callable[[TurnRun], bool]) -> None:
        """Let go of the route locks of the live runs ``which`` takes (they stay interrupted)."""
        with self._mu:
            gone = [r for r in self._open.values() if not r.resumed and which(r)]
            for r in gone:
                del self._open[r.session_id]
        for r in gone:
            r.release()


# the live runs begun inside the innermost ``attended()`` block (released at its end)
_SCOPE: contextvars.ContextVar[list[tuple[Runs, TurnRun]] | None] = contextvars.ContextVar(
    "fsdurable_lg_scope", default=None)


class ExitDurabilityWarning(UserWarning):
    """``durability="exit"``: LangGraph saves nothing until the run ends, so a run killed
    before then leaves nothing to recover (warned once per process)."""


_warned_exit = False


def check_durability(config: Mapping[str, Any]) -> None:
    """Warn (once per process) about a graph run with ``durability="exit"``."""
    global _warned_exit
    if _warned_exit or config.get("configurable", {}).get("__pregel_durability") != "exit":
        return
    _warned_exit = True
    warnings.warn(ExitDurabilityWarning(
        'durability="exit": LangGraph saves this run only when it ends, so a crash before '
        "then leaves nothing for fsdurable.langgraph.recover; use the default (\"async\") or "
        '"sync" for durable runs'), stacklevel=4)


@contextmanager
def attended() -> Iterator[None]:
    """``with attended(): graph.invoke(...)``: a human is present NOW for the graph runs this
    code starts (approvals of ``tool_node`` tools are asked, the deny-list does not apply). On
    exit, a run begun inside that is still open (its graph raised something LangGraph records
    no error for) lets go of its route lock and stays interrupted."""
    begun: list[tuple[Runs, TurnRun]] = []
    token, scope = _ATTENDED.set(True), _SCOPE.set(begun)
    try:
        yield
    finally:
        _ATTENDED.reset(token)
        _SCOPE.reset(scope)
        for registry, run in begun:
            registry.release(lambda r, run=run: r is run)  # type: ignore[misc]


def tool_context() -> ToolContext | None:
    """Inside a ``tool_node`` tool: this call's ``ToolContext`` (``idempotency_key``,
    ``attended``, ``resumed``); None outside one."""
    return _TOOL.get()


@contextmanager
def turn(saver: FsDurableSaver, tid: str,
         want: Callable[[Session | None, dict[str, Any]], str | None], *,
         reply: str | None = None, error: BaseException | None = None
         ) -> Iterator[lg.Through | None]:
    """``with turn(saver, tid, want) as through: threads.mutate(tid, build, through)``: the
    run of thread ``tid`` open in this process — begun now if ``want(session, head)`` (the run
    state the call leaves, computed only when no run is open) starts one or ends the turn a dead
    run left in progress — and the commit through it (None: the call runs no graph run). With
    no open run, the call holds the thread's begin lock while it commits, so a write saved in
    the background never commits beside a run another thread is beginning; with one, the run's
    mutex (before the commit lock: LangGraph calls the saver and the tools from many threads)."""
    sid = saver.threads.sid(tid)
    run = saver.runs.get(sid)
    if run is None:
        with saver.runs.begin_lock(sid):
            run = saver.runs.get(sid) or _begin(saver, tid, want)
            if run is None:
                yield None
                return
    with run.mutex:  # before the thread's commit lock, as every commit of the run takes them
        yield through(saver.runs, run, reply=reply, error=error)


def _begin(saver: FsDurableSaver, tid: str,
           want: Callable[[Session | None, dict[str, Any]], str | None]) -> TurnRun | None:
    store, sid = saver.store, saver.threads.sid(tid)
    s = saver.threads.session(sid)
    state = want(s, saver.threads.head(s) if s is not None else lg.new_head(tid))
    if state is None or (state != lg.RUNNING and (s is None or not s.in_progress)):
        return None
    saver.threads.ensure(tid)

    def running(cur: Session) -> Session:
        head = lg.with_state(lg.head_of(cur), lg.RUNNING)
        tid_now = cur.turn.id if cur.turn is not None else None
        if (head["run"].get("from") or {}).get("turn") != tid_now:  # a new turn, not continued
            # the root checkpoint it starts from (the log's head: the document's lags between
            # a run's ends): recovery tells "nothing of this run saved"
            root = saver.threads.head(cur)["ns"].get("", {}).get("id")
            head = {**head, "run": {**head["run"], "from": {"turn": tid_now, "root": root}}}
        return attrs.evolve(cur, metadata={**cur.metadata, "langgraph": head})

    run = TurnRun.begin(store, sid, driver=DRIVER, attended=_ATTENDED.get(), resume=True,
                        change=running)
    saver.runs.add(run)
    scope = _SCOPE.get()
    if scope is not None:
        scope.append((saver.runs, run))
    return run


def through(registry: Runs, first: TurnRun, *, reply: str | None = None,
            error: BaseException | None = None) -> lg.Through:
    """The commit of a thread's new head for the run ``first`` (see the module doc)."""

    def commit(s: Session, head: dict[str, Any], state: str | None,
               logged: bool = False) -> Session:
        # under the thread's commit lock: the run open NOW (LangGraph saves writes in the
        # background, so another thread's write may have ended the run this call began in)
        run = first if first.open else registry.get(s.id)
        if state == lg.FAILED and run is not None and run.resumed:
            state = None  # a failed resume: recovery counts it, the marker stays
        new = lg.with_state(head, state)
        same = logged and new["run"] == lg.head_of(s)["run"]  # the log holds what changed

        def put(cur: Session) -> Session:
            return attrs.evolve(cur, metadata={**cur.metadata, "langgraph": new})

        if run is None or not run.open:  # the run ended meanwhile: the head alone
            return s if same else first.store.commit(put(s), s.version)
        if state in (None, lg.RUNNING):
            if same:  # a step of the run: the turn's checkpoint time, debounced
                run.boundary("langgraph")
                return s
            return run.commit(put, phase="langgraph")
        registry.forget(run)
        if state == lg.ENDED:
            return run.end(put, reply=reply)
        if state == lg.PAUSED:
            return run.pause(put, why=new["run"].get("why") or "interrupt")
        got = run.fail(error if isinstance(error, BaseException)
                       else RuntimeError("the graph run failed"), put)
        return got if got is not None else s

    return commit


def final_reply(values: Mapping[str, Any]) -> str | None:
    """A MessagesState graph's final reply (its last message, an AI message calling no tool):
    the session keeps it as the turn's reply, so ``fsdurable show`` has the run's answer."""
    msgs = values.get("messages")
    last = msgs[-1] if isinstance(msgs, list) and msgs else None
    content = getattr(last, "content", None)
    if getattr(last, "type", None) == "ai" and not getattr(last, "tool_calls", None) \
            and isinstance(content, str) and content:
        return content
    return None


# ---------------------------------------------------------------------- tools


class ToolLedger:
    """A ``ToolNode`` tool-call wrapper (``wrap_tool_call``) putting every call through the
    turn protocol's ledger: ``effects`` by tool name (undeclared: ``default``, the worst,
    ``external``), ``approval``: the tools that need a human's approval (``approve(ctx, req)``
    is asked in an attended run; an unattended one refuses them), ``deny``: the unattended
    deny-list (default ``Config.unattended_deny``)."""

    def __init__(self, effects: Mapping[str, str] | None = None, *, default: str = "external",
                 approval: Iterable[str] = (), approve: Approver | None = None,
                 deny: frozenset[str] | None = None) -> None:
        self.effects = dict(effects or {})
        self.default = default
        self.approval = frozenset(approval)
        self.approve = approve
        self.deny = deny

    def effect(self, name: str) -> str:
        return self.effects.get(name, self.default)

    def rerun_safe(self, name: str, store: Store) -> bool:
        deny = store.config.unattended_deny if self.deny is None else self.deny
        return rerun_safe(self.effect(name), name in self.approval, name in deny)

    def _decide(self, request: Any) -> tuple[TurnRun, ToolDecision]:
        from .langgraph import FsDurableSaver

        call = request.tool_call
        conf = (getattr(request.runtime, "config", None) or {}).get("configurable", {})
        saver, tid = conf.get("__pregel_checkpointer"), conf.get("thread_id")
        run = None
        if isinstance(saver, FsDurableSaver) and tid is not None:
            sid = saver.threads.sid(tid)
            run = saver.runs.get(sid)
            if run is None:  # durability="async": the run's first put may still be on its way
                with saver.runs.begin_lock(sid):
                    run = saver.runs.get(sid) or _begin(saver, str(tid),
                                                        lambda _s, _h: lg.RUNNING)
        if run is None:
            raise TurnStateError(f"tool call {call.get('id')!r} ({call.get('name')}) outside a "
                                 "durable graph run: compile the graph with an FsDurableSaver",
                                 reason="no_run")
        name = str(call["name"])
        req = ToolRequest(str(call["id"]), name, dict(call.get("args") or {}), self.effect(name),
                          name in self.approval)
        return run, run.before_tool(req, approve=self.approve, deny=self.deny)

    def __call__(self, request: Any, execute: Callable[[Any], Any]) -> Any:
        run, d = self._decide(request)
        if d.action != "run":
            return _message(request, d)
        token = _TOOL.set(d.context)
        try:
            out = execute(request)
        except Exception as e:
            run.after_tool(d, ok=False, result=f"error: {type(e).__name__}: {e}")
            raise
        finally:
            _TOOL.reset(token)
        run.after_tool(d, ok=_ok(out), result=_text(out))
        return out

    async def acall(self, request: Any, execute: Callable[[Any], Any]) -> Any:
        """``awrap_tool_call``: the same, the ledger's commits off the event loop."""
        run, d = await run_sync(self._decide, request)
        if d.action != "run":
            return _message(request, d)
        token = _TOOL.set(d.context)
        try:
            out = await execute(request)
        except Exception as e:
            failed = f"error: {type(e).__name__}: {e}"
            await run_sync(lambda: run.after_tool(d, ok=False, result=failed))
            raise
        finally:
            _TOOL.reset(token)
        await run_sync(lambda: run.after_tool(d, ok=_ok(out), result=_text(out)))
        return out


def _message(request: Any, d: ToolDecision) -> Any:
    from langchain_core.messages import ToolMessage

    return ToolMessage(content=d.text or "", tool_call_id=d.request.call_id,
                       name=d.request.name, status="error" if d.action == "refused" else "success")


def _ok(out: Any) -> bool:
    return getattr(out, "status", "success") != "error"


def _text(out: Any) -> str:
    content = getattr(out, "content", out)
    return content if isinstance(content, str) else repr(content)


def tool_node(tools: Any, *, effects: Mapping[str, str] | None = None,
              default: str = "external", approval: Iterable[str] = (),
              approve: Approver | None = None, deny: frozenset[str] | None = None,
              **kwargs: Any) -> Any:
    """A LangGraph ``ToolNode(tools, **kwargs)`` whose calls go through the ledger
    (``ToolLedger``): ``g.add_node("tools", tool_node([send_email], effects={"send_email":
    "external"}))``."""
    from langgraph.prebuilt import ToolNode

    ledger = ToolLedger(effects, default=default, approval=approval, approve=approve, deny=deny)
    return ToolNode(tools, wrap_tool_call=ledger, awrap_tool_call=ledger.acall, **kwargs)


__all__ = ["DRIVER", "UNATTENDED", "ExitDurabilityWarning", "Runs", "ToolLedger", "attended",
           "check_durability", "final_reply", "through", "tool_context", "tool_node", "turn"]
