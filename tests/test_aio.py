"""run_sync: off the loop, and a cancelled caller never stops a mutation half-way."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fsdurable._aio import run_sync


def test_runs_in_a_worker_thread_and_returns() -> None:
    async def main() -> tuple[int, bool]:
        here = threading.get_ident()
        return await run_sync(lambda a, b: a + b, 2, b=3), \
            await run_sync(lambda: threading.get_ident() != here)

    assert asyncio.run(main()) == (5, True)


def test_errors_propagate() -> None:
    def boom() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        asyncio.run(run_sync(boom))


def test_cancel_waits_for_the_call_to_finish() -> None:
    done = threading.Event()
    started = threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.2)
        done.set()

    async def main() -> None:
        t = asyncio.create_task(run_sync(slow))
        while not started.is_set():
            await asyncio.sleep(0.005)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert done.is_set(), "the cancelled task returned before the mutation ended"

    asyncio.run(main())


def test_loop_keeps_running_while_the_call_blocks() -> None:
    async def main() -> int:
        ticks = 0

        async def beat() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        hb = asyncio.create_task(beat())
        await run_sync(time.sleep, 0.1)
        hb.cancel()
        return ticks

    assert asyncio.run(main()) > 10
