"""LangGraph recovery: ``recover(graph, saver, config=..., context=...)`` (and ``arecover``)
resumes the interrupted graph runs of a store, through the store's gates (``fsdurable.recover``).

``GraphHost`` is recovery's host for a LangGraph graph: it continues a claimed run with
``invoke(None)`` (``ainvoke`` on the caller's loop for ``arecover``) UNATTENDED, the run's puts
committing through the claimed ``TurnRun`` (``_lgruns``); ``RunResult`` says what the resumed run
came to. A run killed before its first checkpoint has nothing to continue: it is abandoned
(``nothing_saved``), never "completed".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from . import _lgstore as lg
from ._aio import run_sync
from ._gates import RecoveryPolicy
from ._lgruns import DRIVER, UNATTENDED, ToolLedger, final_reply, through
from ._model import Marker, Session
from ._recovery import RecoveryReport
from ._recovery import recover as _recover
from ._resume import read_history
from ._turns import TurnRun

if TYPE_CHECKING:
    from .langgraph import FsDurableSaver


@attrs.frozen
class RunResult:
    """What one resumed run came to: ``completed``, ``paused`` (an interrupt or breakpoint,
    waiting for a human), ``finished`` (nothing was left to run) or ``abandoned`` (``reason``
    ``nothing_saved``: the run died before its first checkpoint, so nothing of it can be
    continued)."""

    status: str
    thread_id: str
    reason: str | None = None


def _todo(graph: Any, state: Any) -> str | None:
    """Why a thread's run needs nothing run (None: it does). A task with writes saved (the
    checkpoint after it was not) still has its writes to apply: the run goes on."""
    if not state.next and not state.tasks:
        return "finished"
    if state.interrupts or set(state.next) & set(getattr(graph, "interrupt_before_nodes", ())
                                                 or ()):
        return "paused"
    return None


class GraphHost:
    """Recovery's host for a LangGraph graph: continue a claimed run with ``invoke(None)``."""

    driver = DRIVER

    def __init__(self, graph: Any, saver: FsDurableSaver, config: Mapping[str, Any] | None,
                 context: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.graph, self.saver, self.loop = graph, saver, loop
        self.config = dict(config or {})
        self.kw = {} if context is None else {"context": context}

    def _ledgers(self) -> Iterator[tuple[Any, ToolLedger]]:
        for node in (getattr(self.graph, "nodes", None) or {}).values():
            bound = getattr(node, "bound", None)
            w = getattr(bound, "_wrap_tool_call", None)
            if isinstance(w, ToolLedger):
                yield bound, w

    def tool_effect(self, name: str) -> str | None:
        for bound, ledger in self._ledgers():
            if name in getattr(bound, "tools_by_name", {}):
                return ledger.effect(name)
        return None

    def rerun_safe(self, name: str) -> bool:
        for bound, ledger in self._ledgers():
            if name in getattr(bound, "tools_by_name", {}):
                return ledger.rerun_safe(name, self.saver.store)
        return False

    def history_ready(self, session: Session) -> None:
        """What resuming the run reads, read before its attempt is spent: the thread's log up
        to its head (``UnreadableState`` reason ``log_short`` while a sync tool has not
        delivered it: the resume waits, ``waiting_for_sync``), and the session's history."""
        read_history(session)
        self.saver.threads.head(session)

    def _cfg(self, tid: str) -> Any:
        return {**self.config, "configurable": {**self.config.get("configurable", {}),
                                                "thread_id": tid, UNATTENDED: True}}

    def resume_claimed(self, session: Session) -> RunResult:
        head = self.saver.threads.head(session)  # the log's, with the document's run state
        tid = head["thread_id"]
        run = TurnRun.claimed(self.saver.store, session)
        # the graph's own saver sees the run's puts (the caller's may be another instance)
        saver = getattr(self.graph, "checkpointer", None)
        registry = (saver if isinstance(saver, type(self.saver)) else self.saver).runs
        registry.add(run)
        try:
            cfg = self._cfg(tid)
            if self.loop is None:
                why = _todo(self.graph, self.graph.get_state(cfg))
                if why == "finished" and not _saved(head, session):
                    # killed between its begin commit and its first checkpoint: the input
                    # never became durable; nothing to continue — never "completed"
                    run.abandon("nothing_saved", thread_id=tid)
                    return RunResult("abandoned", tid, "nothing_saved")
                if why is None:
                    self.graph.invoke(None, cfg, **self.kw)
                    why = _ran(_todo(self.graph, self.graph.get_state(cfg)))
            else:
                why = asyncio.run_coroutine_threadsafe(self._arun(cfg, _saved(head, session)),
                                                       self.loop).result()
                if why == "abandoned":
                    run.abandon("nothing_saved", thread_id=tid)
                    return RunResult("abandoned", tid, "nothing_saved")
            if run.open:  # no put of the run closed it (nothing was left to run, ...)
                state = lg.PAUSED if why == "paused" else lg.ENDED
                # the run's final reply (its last checkpoint was saved, the end commit was not)
                reply = final_reply(self.graph.get_state(cfg).values) \
                    if state == lg.ENDED else None
                self.saver.threads.mutate(tid, lambda s, head, _n: ([], head, state),
                                          through(registry, run, reply=reply))
        finally:
            registry.forget(run)
        return RunResult(why, tid)

    async def _arun(self, cfg: Any, saved: bool) -> str:
        why = _todo(self.graph, await self.graph.aget_state(cfg))
        if why == "finished" and not saved:
            return "abandoned"
        if why is not None:
            return why
        await self.graph.ainvoke(None, cfg, **self.kw)
        return _ran(_todo(self.graph, await self.graph.aget_state(cfg)))


def _saved(head: dict[str, Any], s: Session) -> bool:
    """Did the interrupted run of ``s``'s turn save a checkpoint of its own (its thread's root
    checkpoint moved on from the one its turn began at)? A head written before this was recorded
    says yes (the older behaviour: a thread with nothing to run ends the turn)."""
    began = head["run"].get("from")
    if not isinstance(began, dict) or s.turn is None or began.get("turn") != s.turn.id:
        return True
    return bool(head["ns"].get("", {}).get("id") != began.get("root"))


def _ran(why: str | None) -> str:
    """A resumed run's status once ``invoke(None)`` returned."""
    return "completed" if why == "finished" else why or "paused"


def _select(select: Callable[[Marker], bool] | None) -> Callable[[Marker], bool]:
    def ours(m: Marker) -> bool:  # recovery itself takes only the langgraph driver's turns
        return select is None or select(m)

    return ours


def recover(graph: Any, saver: FsDurableSaver, policy: RecoveryPolicy | None = None, *,
            config: Mapping[str, Any] | None = None, context: Any = None,
            dry_run: bool = False, select: Callable[[Marker], bool] | None = None
            ) -> RecoveryReport:
    """Resume every interrupted run of ``graph`` on ``saver``'s store (call it at startup).

    One listing of ``markers/`` finds the turns of the ``langgraph`` driver; each goes through
    the store's gates (``fsdurable.recover``: enabled, this node's, staleness window, attempt
    cap — the attempt committed before the resume; an in-doubt ``tool_node`` call that is not
    safe to repeat parks the run for review) and, if it passes, is continued with
    ``graph.invoke(None, config, context=context)`` UNATTENDED. ``config``: what the graph needs
    besides the thread id (``recursion_limit``, ``configurable`` keys); ``context``: the run
    context of a graph with a ``context_schema``. A resume that raises costs one attempt and
    keeps the run for the next start, until the cap. ``select(marker)`` limits it to some
    threads (e.g. one graph's, when several graphs share a store). Never raises because of one
    thread: see the report and the events.
    """
    return _recover(saver.store, GraphHost(graph, saver, config, context), policy,
                    dry_run=dry_run, select=_select(select))


async def arecover(graph: Any, saver: FsDurableSaver, policy: RecoveryPolicy | None = None, *,
                   config: Mapping[str, Any] | None = None, context: Any = None,
                   dry_run: bool = False, select: Callable[[Marker], bool] | None = None
                   ) -> RecoveryReport:
    """``recover`` for asyncio: the gates and commits run off the event loop, each resumed run
    is ``await graph.ainvoke(None, config, context=context)`` on the caller's loop."""
    host = GraphHost(graph, saver, config, context, asyncio.get_running_loop())
    return await run_sync(_recover, saver.store, host, policy, dry_run=dry_run,
                          select=_select(select))


__all__ = ["GraphHost", "RunResult", "arecover", "recover"]
