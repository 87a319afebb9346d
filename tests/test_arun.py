"""The async loop (issue 10 §1): ``await loop.arun(...)`` and ``await fsdurable.arecover(...)``."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fsdurable
from fsdurable import AgentLoop, Reply, ScriptedModel, Store, Tool, arecover
from fsdurable._tools import call


def test_arun_awaits_the_model_and_async_tools_on_the_callers_loop(store: Store) -> None:
    store.create("s")
    seen: dict[str, Any] = {}
    main = threading.get_ident()

    async def model(transcript: Any, specs: Any) -> Reply:
        seen.setdefault("model", []).append((asyncio.get_running_loop(), threading.get_ident()))
        n = ScriptedModel.step_index(transcript)
        if n == 0:
            return Reply("", [call("fetch", "f1"), call("compute", "c1")])
        return Reply("all done")

    async def fetch(ctx: Any) -> str:
        seen["fetch"] = (asyncio.get_running_loop(), threading.get_ident())
        await asyncio.sleep(0.01)
        return "fetched"

    def compute(ctx: Any) -> str:
        seen["compute"] = threading.get_ident()
        return "computed"

    loop = AgentLoop(store, model, [Tool("fetch", fetch, effect="idempotent"),
                                    Tool("compute", compute)])

    async def main_() -> Any:
        seen["loop"] = asyncio.get_running_loop()
        return await loop.arun("s", "go", attended=True)

    r = asyncio.run(main_())
    assert r.status == "completed" and r.reply == "all done"
    assert seen["model"] == [(seen["loop"], main)] * 2  # on the caller's loop, in its thread
    assert seen["fetch"] == (seen["loop"], main)
    assert seen["compute"] != main  # a sync tool runs in a worker thread
    s = store.load("s")
    assert not s.in_progress and store.read_marker("s") is None
    assert [m.content for m in s.messages if m.role == "tool"] == ["fetched", "computed"]
    assert [e.code for e in store.events("s")] == ["turn_started", "turn_completed"]


def test_arun_never_blocks_the_loop_on_a_sync_tool_or_a_held_route_lock(store: Store) -> None:
    """A heartbeat keeps ticking while a sync tool sleeps and while the route lock is waited
    for (held by another thread)."""
    store.create("s")
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with store.lock("session:s"):
            held.set()
            release.wait(10)

    def slow(ctx: Any) -> str:
        time.sleep(0.3)
        return "slept"

    loop = AgentLoop(store, ScriptedModel([Reply("", [call("slow", "x1")])]),
                     [Tool("slow", slow)])

    async def main_() -> tuple[Any, float]:
        ticks: list[float] = []

        async def beat() -> None:
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.001)

        hb = asyncio.create_task(beat())
        t = threading.Thread(target=holder)
        t.start()
        await asyncio.to_thread(held.wait, 10)
        asyncio.get_running_loop().call_later(0.3, release.set)
        r = await loop.arun("s", "go")
        hb.cancel()
        t.join(10)
        gaps = [b - a for a, b in itertools.pairwise(ticks)]
        return r, max(gaps)

    r, worst = asyncio.run(main_())
    assert r.status == "completed"
    assert worst < 0.2  # the loop was never stalled for the tool's 0.3 s or the lock's 0.3 s


def test_a_cancelled_arun_cancels_the_turn_and_leaves_no_half_state(root: Path) -> None:
    store = Store(root)
    store.create("s")

    async def main_() -> None:
        waiting = asyncio.Event()

        async def hang(ctx: Any) -> str:
            waiting.set()
            await asyncio.sleep(3600)
            return "never"

        model = ScriptedModel([Reply("", [call("quick", "q1"), call("hang", "h1")])])
        loop = AgentLoop(store, model, [Tool("quick", lambda ctx: "quick done"),
                                        Tool("hang", hang)])
        task = asyncio.create_task(loop.arun("s", "go"))
        await waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main_())
    s = store.load("s")
    assert not s.in_progress and store.read_marker("s") is None
    # the pending checkpoint (quick's result, inside the debounce window) was flushed first
    assert "quick done" in [m.content for m in s.messages]
    assert [e.code for e in store.events("s")] == ["turn_started", "turn_cancelled"]
    # the route lock was released: a new turn starts at once
    assert AgentLoop(store, ScriptedModel([], final="again")).run("s", "x").reply == "again"


def test_a_cancelled_route_lock_wait_starts_nothing(store: Store) -> None:
    store.create("s")
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with store.lock("session:s"):
            held.set()
            release.wait(10)

    async def main_() -> None:
        t = threading.Thread(target=holder)
        t.start()
        await asyncio.to_thread(held.wait, 10)
        task = asyncio.create_task(AgentLoop(store, ScriptedModel([])).arun("s", "go"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await asyncio.to_thread(t.join, 10)

    asyncio.run(main_())
    s = store.load("s")
    assert not s.in_progress and s.messages == () and store.events("s") == []


def test_a_bad_model_reply_under_arun_fails_the_turn(store: Store) -> None:
    store.create("s")

    async def model(transcript: Any, specs: Any) -> Any:
        return "not a Reply"

    async def main_() -> BaseException | None:
        try:
            await AgentLoop(store, model).arun("s", "go")
        except fsdurable.HostError as e:
            return e
        return None

    err = asyncio.run(main_())
    assert err is not None and err.reason == "bad_model_reply"
    assert not store.load("s").in_progress
    assert [e.code for e in store.events("s")] == ["turn_started", "turn_failed"]


def _interrupt(store: Store, sid: str) -> None:
    store.create(sid)
    store.begin_turn(sid, "interrupted request")


def test_arecover_resumes_with_an_async_model_unattended(store: Store) -> None:
    _interrupt(store, "s")
    attended: list[bool] = []

    async def model(transcript: Any, specs: Any) -> Reply:
        n = ScriptedModel.step_index(transcript)
        return Reply("", [call("look", "l1")]) if n == 0 else Reply("recovered")

    async def look(ctx: Any) -> str:
        attended.append(ctx.attended)
        return "looked"

    loop = AgentLoop(store, model, [Tool("look", look)])
    rep = asyncio.run(arecover(store, loop))
    assert [(o.outcome, o.status) for o in rep.outcomes] == [("resumed", "completed")]
    assert attended == [False]
    s = store.load("s")
    assert not s.in_progress and s.messages[-1].content == "recovered"
    assert s.turn is None and store.interrupted() == []


def test_arecover_awaits_a_hosts_async_resume_claimed_and_applies_the_gates(root: Path) -> None:
    clock = [1_000_000.0]
    store = Store(root, clock=lambda: clock[0])
    _interrupt(store, "fresh")
    _interrupt(store, "old")
    resumed: list[str] = []

    class Host:
        def tool_effect(self, name: str) -> str | None:
            return None

        async def resume_claimed(self, session: fsdurable.Session) -> Any:
            await asyncio.sleep(0)
            resumed.append(session.id)
            return None

    clock[0] += 1.0
    rep = asyncio.run(arecover(store, Host(), select=lambda m: m.session_id == "fresh"))
    assert [(o.session_id, o.outcome) for o in rep.outcomes] == [("fresh", "resumed")]
    assert resumed == ["fresh"]
    clock[0] += 5 * 3600  # the other one is stale now
    rep = asyncio.run(arecover(store, Host()))
    assert [(o.session_id, o.outcome, o.reason) for o in rep.outcomes] == [
        ("fresh", "abandoned", "stale"), ("old", "abandoned", "stale")]


def test_arun_cancelled_during_a_commit_finishes_it_then_cancels(root: Path) -> None:
    """The task is cancelled while the intent commit of an effectful tool is in flight in its
    worker thread: the commit completes whole (shielded), the tool never runs, then the turn is
    cancelled."""
    store = Store(root)
    store.create("s")
    in_commit, release = threading.Event(), threading.Event()
    real = store.checkpoint

    def slow_checkpoint(session: fsdurable.Session, *, phase: str | None = None
                        ) -> fsdurable.Session:
        if phase == "tool_intent":
            in_commit.set()
            release.wait(10)
        return real(session, phase=phase)

    store.checkpoint = slow_checkpoint  # type: ignore[method-assign]
    ran: list[str] = []
    model = ScriptedModel([Reply("", [call("pay", "p1")])])
    loop = AgentLoop(store, model, [Tool("pay", lambda ctx: ran.append("pay") or "paid",
                                         effect="external")])

    async def main_() -> bool:
        task = asyncio.create_task(loop.arun("s", "go"))
        await asyncio.to_thread(in_commit.wait, 10)
        task.cancel()
        await asyncio.sleep(0.1)
        still_running = not task.done()  # the shielded commit holds the cancellation back
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return still_running

    assert asyncio.run(main_())
    assert ran == []
    s = store.load("s")
    assert not s.in_progress and store.read_marker("s") is None
    # create, begin, the intent commit (whole), the intent withdrawn (its tool never started:
    # nothing is in doubt, so no review record), the cancel
    assert s.version == 5 and "review_required" not in s.metadata
    assert [e.code for e in store.events("s")] == ["turn_started", "turn_cancelled"]
