"""Blocking disk and lock work, run off the event loop.

Every awaitable twin in fsdurable (the async store, the adapters, ``AgentLoop.arun``) reaches the
disk through ``run_sync``: the call runs in a worker thread, so a commit's fsyncs never stall the
caller's event loop, and it is **shielded** — a task cancelled while a commit runs waits for the
commit to end and then sees ``CancelledError``. The commit therefore either happened (whole) or
did not; it is never abandoned half-way by a cancellation (as the OpenAI Agents SDK's
``SQLiteSession`` and LangGraph's ``AsyncSqliteSaver`` do with their thread-bound connections).

This module imports ``asyncio``: it is never on the startup path (discovery, the CLI's listings).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


# the workers run_sync hands its calls to: one pool per process (a pool inherited through fork
# has no threads in the child, and its bookkeeping says it has idle ones: a call would wait for
# ever), made on first use, as large as the event loop's default pool
_POOL: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None
_POOL_MU = threading.Lock()
_WORKER = threading.local()  # ``on`` in the pool's threads


def _mark_worker() -> None:
    _WORKER.on = True


def _pool() -> concurrent.futures.ThreadPoolExecutor | None:
    """The pool; None in one of its own threads — an event loop run there (a sync function
    called through run_sync that runs ``asyncio.run``) uses its loop's own executor, as before:
    calls waiting on calls in one bounded pool could wait for each other for ever."""
    if getattr(_WORKER, "on", False):
        return None
    global _POOL
    pool, pid = _POOL, os.getpid()
    if pool is None or pool[0] != pid:
        with _POOL_MU:
            pool = _POOL
            if pool is None or pool[0] != pid:
                pool = _POOL = (pid, concurrent.futures.ThreadPoolExecutor(
                    thread_name_prefix="fsdurable", initializer=_mark_worker))
    return pool[1]


async def run_sync(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread; cancellation waits for it to finish.

    If the awaiting task is cancelled while ``fn`` runs, ``fn`` still runs to its end (its result
    or error is dropped) and ``CancelledError`` is raised once it has: the caller can rely on "the
    mutation happened or it did not", never on "it was stopped half-way".

    The worker hands its outcome to a future of this call's own (``settle``), and a
    cancellation reaches only that future: no executor future wrapped into an asyncio one, no
    ``asyncio.shield`` around it (~30 us less per awaited commit on a 2-core VM).
    """
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    outcome: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not outcome.done():  # else: cancelled meanwhile, the outcome is dropped
            if ok:
                outcome.set_result(value)
            else:
                outcome.set_exception(value)

    def call() -> None:
        value: Any
        try:
            value, ok = ctx.run(fn, *args, **kwargs), True
        except BaseException as e:  # handed to the caller, whatever it is
            value, ok = e, False
        # settled on the loop's next turn, not this one: the timers of other tasks that fell
        # due while the loop slept run before the caller resumes (and does its next step), as
        # they did behind asyncio.shield's extra turn (bench.looplag: resuming on the first
        # turn raised the async p99 heartbeat lag from ~4.7 ms to ~7 ms on a 2-core VM)
        with contextlib.suppress(RuntimeError):  # the loop was closed: nobody awaits it
            loop.call_soon_threadsafe(loop.call_soon, settle, ok, value)

    pool = _pool()  # the future of the call itself ends when it has (call never raises)
    ran = pool.submit(call) if pool is not None else loop.run_in_executor(None, call)
    try:
        return await outcome
    except asyncio.CancelledError:
        if outcome.cancelled():  # this task was cancelled (not fn's own CancelledError)
            waited = asyncio.wrap_future(ran, loop=loop)  # an asyncio future: itself
            while not waited.done():  # let the call end, then re-raise
                try:
                    await asyncio.shield(waited)
                except asyncio.CancelledError:
                    continue
        raise


__all__ = ["run_sync"]
