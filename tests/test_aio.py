"""run_sync: off the loop, and a cancelled caller never stops a mutation half-way."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import warnings

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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_gets_workers_of_its_own() -> None:
    """The parent's pool has an idle worker; the child inherits its bookkeeping but not its
    threads: a call there must still run (not wait for a worker that does not exist)."""
    assert asyncio.run(run_sync(lambda: 1)) == 1  # the parent's pool, one idle worker

    async def child() -> int:
        return await run_sync(lambda: 7)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a process with threads
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if asyncio.run(child()) == 7 else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while (got := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child's call never ran")
        time.sleep(0.02)
    assert os.waitstatus_to_exitcode(got[1]) == 0


def test_an_error_of_any_kind_reaches_the_caller_and_the_loop_is_free() -> None:
    class Stop(BaseException):
        pass

    def stop() -> None:
        raise Stop

    async def main() -> None:
        with pytest.raises(Stop):
            await run_sync(stop)
        assert await run_sync(lambda: 3) == 3

    asyncio.run(main())


_NESTED = """
import asyncio, os
from fsdurable._aio import run_sync

def outer(i):  # a sync function called through run_sync that runs an event loop of its own
    return asyncio.run(run_sync(lambda: i * 2))

async def main():
    n = (os.cpu_count() or 1) + 8  # more than the pool has workers
    got = await asyncio.gather(*(run_sync(outer, i) for i in range(n)))
    assert got == [i * 2 for i in range(n)], got
    print("ok")

asyncio.run(main())
"""


def test_a_loop_run_inside_a_worker_never_waits_for_the_busy_pool() -> None:
    """Every worker of the pool runs a sync function that runs ``asyncio.run`` of a
    ``run_sync``: the inner calls must not wait for a worker of that same, busy pool."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _NESTED], capture_output=True, text=True,
                         timeout=60, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
