"""Where a turn's steps run: the two drivers of ``AgentLoop``'s one step logic.

``AgentLoop._steps`` is a coroutine that awaits ``io.disk(fn, ...)`` for every read, commit and
lock-free check, ``io.model(...)`` for the model and ``io.tool(...)`` for a tool.

- ``SyncIO`` (``run``): everything in the caller's thread. Its awaits never suspend, so
  ``complete`` runs the coroutine to its end without an event loop. An async model or tool is
  run on a fresh loop — or, inside a running one, is the host's error (``HostError``).
- ``AsyncIO`` (``arun``): async models and tools are awaited on the caller's event loop; the
  disk work and sync models and tools run in worker threads through ``_aio.run_sync`` (shielded:
  a cancelled ``arun`` never stops a commit half-way).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from ._model import Message
from ._tools import Model, Reply, Tool, ToolContext, as_reply, call_model, is_async, settle

T = TypeVar("T")


class SyncIO:
    """``run``: every step in the caller's thread. Its awaits never suspend (``complete``)."""

    cancel_error: tuple[type[BaseException], ...] = ()

    async def disk(self, fn: Callable[..., T], /, *args: Any, **kw: Any) -> T:
        return fn(*args, **kw)

    async def model(self, model: Model, transcript: Sequence[Message],
                    specs: Sequence[Mapping[str, Any]]) -> Reply:
        return call_model(model, transcript, specs)

    async def tool(self, t: Tool, ctx: ToolContext, args: Mapping[str, Any]) -> Any:
        return settle(t.fn(ctx, **args), f"tool {t.name!r}")


class AsyncIO:
    """``arun``: async models and tools are awaited on the caller's loop; the disk, the lock
    waits and sync models and tools run off it (``_aio.run_sync``: shielded, so a cancelled
    ``arun`` never stops a commit half-way)."""

    def __init__(self) -> None:
        import asyncio

        self.cancel_error: tuple[type[BaseException], ...] = (asyncio.CancelledError,)

    async def disk(self, fn: Callable[..., T], /, *args: Any, **kw: Any) -> T:
        from ._aio import run_sync

        return await run_sync(fn, *args, **kw)

    async def _call(self, fn: Callable[..., Any], /, *args: Any, **kw: Any) -> Any:
        out = fn(*args, **kw) if is_async(fn) else await self.disk(fn, *args, **kw)
        return await out if inspect.isawaitable(out) else out

    async def model(self, model: Model, transcript: Sequence[Message],
                    specs: Sequence[Mapping[str, Any]]) -> Reply:
        return as_reply(await self._call(model, transcript, specs))

    async def tool(self, t: Tool, ctx: ToolContext, args: Mapping[str, Any]) -> Any:
        return await self._call(t.fn, ctx, **args)


IO = SyncIO | AsyncIO
SYNC = SyncIO()


def complete(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the step logic under ``SyncIO``) to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("a sync step suspended")  # SyncIO awaits nothing that can


__all__ = ["IO", "SYNC", "AsyncIO", "SyncIO", "complete"]
