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
import contextvars
import functools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def run_sync(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread; cancellation waits for it to finish.

    If the awaiting task is cancelled while ``fn`` runs, ``fn`` still runs to its end (its result
    or error is dropped) and ``CancelledError`` is raised once it has: the caller can rely on "the
    mutation happened or it did not", never on "it was stopped half-way".
    """
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    fut: asyncio.Future[T] = loop.run_in_executor(None, call)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        while not fut.done():  # cancelled while fn runs: let it end, then re-raise
            try:
                await asyncio.shield(fut)
            except asyncio.CancelledError:
                continue
            except Exception:  # fn's own error is dropped: the cancellation is what counts
                break
        if not fut.cancelled():
            fut.exception()  # mark it retrieved
        raise


__all__ = ["run_sync"]
