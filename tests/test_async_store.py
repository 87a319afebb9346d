"""AsyncStore: every twin off the loop, a cancellable route-lock wait, whole commits under
cancellation, real two-process contention, awatch."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest

import fsdurable
from fsdurable import AsyncStore, LockTimeout, Store, _fsio

from .conftest import PYTHON, subprocess_env


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


@contextmanager
def held_by_thread(store: Store, key: str, seconds: float) -> Iterator[threading.Event]:
    """Hold ``key`` in another thread for ``seconds`` (yields once it is held)."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.lock(key, timeout=5):
            taken.set()
            release.wait(seconds)

    t = threading.Thread(target=hold)
    t.start()
    assert taken.wait(5)
    try:
        yield release
    finally:
        release.set()
        t.join()


class Heartbeat:
    """A 1 ms ticker: the longest gap between two ticks is the loop's worst stall."""

    def __init__(self) -> None:
        self.max_gap = 0.0
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.max_gap = max(self.max_gap, now - last)
            self.ticks += 1
            last = now

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.create_task(self._beat())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        await asyncio.sleep(0.01)  # one more tick: a stall up to now is measured
        self._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self._task


def lock_is_free(store: Store, key: str) -> bool:
    try:
        with store.lock(key, timeout=0):
            return True
    except LockTimeout:
        return False


# ---------------------------------------------------------------------------------- the twins


def test_every_twin_works_and_runs_off_the_loop(root: Path) -> None:
    async def main() -> None:
        a = await AsyncStore.open(root)
        loop_thread = threading.get_ident()
        emitted_in: set[int] = set()
        a.subscribe(lambda e: emitted_in.add(threading.get_ident()))
        s = await a.create("chat", source="desktop")
        assert s.version == 1 and await a.exists("chat") and await a.sessions() == ["chat"]
        s = await a.begin_turn("chat", "hi")
        assert [m.session_id for m in await a.interrupted()] == ["chat"]
        assert (await a.read_marker("chat")) is not None
        s = await a.checkpoint(s, phase="model_reply")
        s = await a.end_turn(s, "hello")
        assert not (await a.load("chat")).in_progress and await a.interrupted() == []
        s = await a.patch("chat", lambda cur: attrs.evolve(cur, metadata={"pinned": True}))
        s = await a.save(s)
        s = await a.commit(s, s.version)
        assert (await a.load("chat")).metadata == {"pinned": True}
        with pytest.raises(fsdurable.ConflictError):
            await a.save(attrs.evolve(s, version=1))
        await a.begin_turn("chat", "again")
        assert not (await a.cancel("chat")).in_progress
        await a.delete("chat")
        assert not await a.exists("chat")
        codes = [e.code for e in await a.events("chat")]
        assert codes[:2] == ["turn_started", "turn_completed"] and codes[-1] == "session_deleted"
        assert emitted_in and loop_thread not in emitted_in, "a twin ran on the loop's thread"

    run(main())


# what is not an awaitable twin, and why (everything else on Store must have one)
NOT_TWINS = {
    "log": "the in-memory event log object; its disk reads are events()",
    "commit_lock": "a thread-bound re-entrant lock for sync read-modify-write; use patch()",
    "watch": "awatch()",
}


def test_every_public_store_operation_has_a_twin() -> None:
    public = [n for n in vars(Store) if not n.startswith("_")]
    missing = [n for n in public if n not in NOT_TWINS and not hasattr(AsyncStore, n)]
    assert missing == []
    import inspect

    for n in public:
        if n in NOT_TWINS or isinstance(inspect.getattr_static(Store, n), property):
            continue
        assert inspect.iscoroutinefunction(getattr(AsyncStore, n)) or n in ("lock",
                                                                             "subscribe"), n
        # the same arguments, by the same names (Store.read_marker's ``sid`` is ``session_id``)
        names = [{"sid": "session_id"}.get(x, x) for x in inspect.signature(getattr(Store, n))
                 .parameters]
        assert names == list(inspect.signature(getattr(AsyncStore, n)).parameters), n


# ---------------------------------------------------------------------------------- the lock


def test_a_lock_wait_never_stalls_the_loop(store: Store) -> None:
    """Held elsewhere for 0.8 s: the 1 ms heartbeat keeps beating while the coroutine waits.
    The same wait through the sync ``Store.lock`` from the loop stalls it for the whole hold."""

    async def waits(use_async: bool) -> tuple[float, int]:
        a = AsyncStore(store)
        with held_by_thread(store, "route:x", 0.8):
            async with Heartbeat() as hb:
                if use_async:
                    async with a.lock("route:x", timeout=10):
                        pass
                else:
                    with store.lock("route:x", timeout=10):
                        pass
        return hb.max_gap, hb.ticks

    gap, ticks = run(waits(True))
    assert gap < 0.4, f"the loop stalled {gap:.3f}s while waiting for the lock"
    assert ticks > 20
    sync_gap, _ = run(waits(False))
    assert sync_gap > 0.5  # the test can see a stall: the sync API from the loop has one


def test_a_lock_wait_times_out_with_lock_timeout(store: Store) -> None:
    async def main() -> None:
        with held_by_thread(store, "route:t", 5):
            t0 = time.monotonic()
            with pytest.raises(LockTimeout) as ei:
                async with AsyncStore(store).lock("route:t", timeout=0.2):
                    pass
            assert 0.2 <= time.monotonic() - t0 < 3
            assert isinstance(ei.value, TimeoutError) and ei.value.reason == "timeout"
            assert ei.value.path is not None

    run(main())


def test_a_cancelled_wait_leaves_the_lock_free(store: Store) -> None:
    async def main() -> None:
        a = AsyncStore(store)
        with held_by_thread(store, "route:c", 5) as release:
            task = asyncio.create_task(a.lock("route:c", timeout=30).__aenter__())
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()
        assert lock_is_free(store, "route:c")

    run(main())


def test_a_try_that_wins_while_its_task_is_cancelled_releases_the_lock(store: Store) -> None:
    """The race the brief names: the worker's try takes the lock while the task is being
    cancelled. The lock must not stay held by nobody."""
    inside, go_on = threading.Event(), threading.Event()
    real_lock = Store.lock

    class Slow(Store):
        @contextmanager
        def lock(self, route_key: str, *, timeout: float | None = None) -> Iterator[None]:
            with real_lock(self, route_key, timeout=timeout):
                inside.set()
                go_on.wait(5)  # taken, and the try has not returned yet
                yield

    slow = Slow(store.root)

    async def main() -> None:
        task = asyncio.create_task(AsyncStore(slow).lock("route:r", timeout=5).__aenter__())
        while not inside.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.sleep(0.05)
        go_on.set()
        with pytest.raises(asyncio.CancelledError) as ei:
            await task
        # checked while the cancellation (and its frames) is alive: the release is explicit,
        # never left to the garbage collector
        assert lock_is_free(store, "route:r"), "a cancelled waiter kept the lock"
        del ei

    run(main())
    assert lock_is_free(store, "route:r")


def test_coroutines_of_one_loop_exclude_each_other(store: Store) -> None:
    inside: list[int] = []
    overlap: list[int] = []

    async def worker(n: int) -> None:
        async with AsyncStore(store).lock("route:m", timeout=10):
            if inside:
                overlap.append(n)
            inside.append(n)
            await asyncio.sleep(0.02)
            inside.remove(n)

    async def main() -> None:
        await asyncio.gather(*(worker(i) for i in range(5)))

    run(main())
    assert overlap == []
    assert lock_is_free(store, "route:m")


HOLDER = """
import sys, time, pathlib
import fsdurable
store = fsdurable.Store(sys.argv[1])
with store.lock("route:p", timeout=10):
    pathlib.Path(sys.argv[2]).write_text("held")
    time.sleep(float(sys.argv[3]))
"""

PROBE = """
import sys
import fsdurable
try:
    with fsdurable.Store(sys.argv[1]).lock("route:p", timeout=0):
        print("free")
except fsdurable.LockTimeout:
    print("busy")
"""


def test_two_processes_contend_for_a_route_lock(store: Store, root: Path, tmp_path: Path) -> None:
    flag = tmp_path / "held"
    child = subprocess.Popen([PYTHON, "-c", HOLDER, str(root), str(flag), "1.0"],
                             env=subprocess_env())
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)

        async def main() -> tuple[float, float, str]:
            a = AsyncStore(store)
            t0 = time.monotonic()
            async with Heartbeat() as hb, a.lock("route:p", timeout=30):
                waited = time.monotonic() - t0
                # while we hold it, another process cannot take it
                probe = await asyncio.create_subprocess_exec(
                    PYTHON, "-c", PROBE, str(root), env=subprocess_env(),
                    stdout=asyncio.subprocess.PIPE)
                out, _ = await probe.communicate()
            return waited, hb.max_gap, out.decode().strip()

        waited, gap, probed = run(main())
        assert child.wait(30) == 0
        assert waited > 0.3, "the lock was taken while the other process held it"
        assert gap < 0.4, f"the loop stalled {gap:.3f}s"
        assert probed == "busy"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert lock_is_free(store, "route:p")


# ---------------------------------------------------------------------------------- cancellation


def _stall_write(monkeypatch: pytest.MonkeyPatch, nth: int) -> threading.Event:
    """Make the ``nth`` write_atomic of the next commit pause (inside the commit)."""
    inside = threading.Event()
    real = _fsio.write_atomic
    calls = [0]

    def slow(*a: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth:
            inside.set()
            time.sleep(0.2)
        return real(*a, **kw)

    monkeypatch.setattr(_fsio, "write_atomic", slow)
    return inside


def _invariant(store: Store) -> None:
    for sid in store.sessions():
        if store.load(sid).in_progress:
            assert store.read_marker(sid) is not None, f"{sid} in progress without its marker"


@pytest.mark.parametrize("nth", [1, 2])  # 1: the marker write, 2: the session write
def test_a_commit_cancelled_midway_is_whole(store: Store, monkeypatch: pytest.MonkeyPatch,
                                            nth: int) -> None:
    base = store.create("c")

    async def main() -> None:
        inside = _stall_write(monkeypatch, nth)
        task = asyncio.create_task(AsyncStore(store).begin_turn("c", "hello"))
        while not inside.is_set():
            await asyncio.sleep(0.002)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    monkeypatch.undo()
    fresh = Store(store.root)
    s = fresh.load("c")
    # shielded: the commit that had started is finished, never left half-way
    assert s.version == base.version + 1 and s.in_progress
    assert [m.session_id for m in fresh.interrupted()] == ["c"]
    _invariant(fresh)


def test_an_end_turn_cancelled_midway_is_whole(store: Store,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store.create("e")
    s = store.begin_turn("e", "hello")

    async def main() -> None:
        inside = _stall_write(monkeypatch, 1)  # the session write; the marker goes after it
        task = asyncio.create_task(AsyncStore(store).end_turn(s, "bye"))
        while not inside.is_set():
            await asyncio.sleep(0.002)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    monkeypatch.undo()
    fresh = Store(store.root)
    assert not fresh.load("e").in_progress and fresh.interrupted() == []
    assert fresh.load("e").messages[-1].content == "bye"
    _invariant(fresh)


# ---------------------------------------------------------------------------------- awatch


def test_awatch_reports_a_turn_starting_and_ending(store: Store) -> None:
    store.create("w")

    async def main() -> list[tuple[str, str]]:
        a = AsyncStore(store)
        stop = asyncio.Event()
        seen: list[tuple[str, str]] = []

        async def consume() -> None:
            async for c in a.awatch(stop_event=stop, debounce=0.01):
                if c.kind == "marker":
                    seen.append((c.action, c.session_id))
                    if c.action == "removed":
                        stop.set()

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)  # the watcher is running (a gap is rescanned anyway)
        s = await a.begin_turn("w", "hi")
        await asyncio.sleep(0.3)
        await a.end_turn(s, "ok")
        await asyncio.wait_for(task, 30)
        return seen

    assert run(main()) == [("added", "w"), ("removed", "w")]


def test_awatch_initial_lists_what_is_there(store: Store) -> None:
    store.create("i")
    store.begin_turn("i", "hi")

    async def main() -> list[Any]:
        stop = asyncio.Event()
        got = []
        async for c in AsyncStore(store).awatch(initial=True, stop_event=stop):
            got.append(c)
            if len(got) == 2:
                break
        return got

    kinds = sorted((c.kind, c.action, c.session_id) for c in run(main()))
    assert kinds == [("marker", "added", "i"), ("session", "added", "i")]


def test_import_fsdurable_and_async_store_are_separate() -> None:
    out = subprocess.run(
        [PYTHON, "-c", "import sys, fsdurable; print('asyncio' in sys.modules); "
         "fsdurable.AsyncStore; print('asyncio' in sys.modules)"],
        env=subprocess_env(), capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "True"]

