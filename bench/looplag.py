"""Event-loop lag: what an asyncio host's other tasks feel while fsdurable works.

Command: ``python -m bench.looplag`` (or ``--quick``). Writes ``looplag.json``.
Workload (issue 10 §1), run twice side by side, alternating, in one process:

- a heartbeat task sleeps 1 ms at a time and records how late each wake-up is (the lag);
- 8 sessions, each holding ~64 KB of transcript, run one turn each concurrently: 4 model steps
  with a tool call each, ``checkpoint_debounce=0`` so every boundary commits the 64 KB session
  (fsync'd, the store's default durability);
- one coroutine waits for a route lock that another thread holds for the first 100 ms.

``async``: ``await loop.arun(...)`` and ``AsyncStore.lock`` (commits and lock waits off the loop).
``sync``: the same work through the sync API called from coroutines (``loop.run``, ``store.lock``)
— what a host does today without the async surface. ``idle``: the heartbeat alone (the machine's
noise floor). Target: p99 lag ≤ 5 ms for ``async``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from ._harness import environment, log, script_main, stats, write_result

SESSIONS = 8
PAYLOAD = 64 * 1024
HOLD = 0.1  # seconds the other thread holds the route lock
IDLE = 0.2  # seconds of an idle round (the heartbeat alone: the noise floor of the machine)


def _prepare(root: str) -> Any:
    import attrs

    import fsdurable

    cfg = fsdurable.Config(checkpoint_debounce=0.0)
    store = fsdurable.Store(root, config=cfg)
    filler = "x" * (PAYLOAD // 8 - 64)
    for i in range(SESSIONS):
        s = store.create(f"s{i}")
        msgs = tuple(fsdurable.Message("user" if k % 2 == 0 else "assistant", filler)
                     for k in range(8))
        store.save(attrs.evolve(s, messages=msgs))
    return store


def _loop(store: Any) -> Any:
    from fsdurable import AgentLoop, Reply, ScriptedModel, Tool
    from fsdurable._tools import call

    steps = [Reply(f"step {k}", [call("look", f"l{k}", n=k)]) for k in range(4)]

    async def look(ctx: Any, n: int) -> str:
        return f"looked {n}"

    def sync_look(ctx: Any, n: int) -> str:
        return f"looked {n}"

    async_loop = AgentLoop(store, ScriptedModel(steps, final="done"), [Tool("look", look)])
    sync_loop = AgentLoop(store, ScriptedModel(steps, final="done"), [Tool("look", sync_look)])
    return async_loop, sync_loop


async def _round(store: Any, loops: Any, mode: str, rnd: int) -> list[float]:
    from fsdurable._async import AsyncStore

    async_loop, sync_loop = loops
    lags: list[float] = []
    stop = asyncio.Event()

    async def heartbeat() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(max(0.0, time.perf_counter() - t0 - 0.001))

    held = threading.Event()

    def holder() -> None:
        with store.lock("bench:held"):
            held.set()
            time.sleep(HOLD)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)

    async def waiter() -> None:
        if mode == "async":
            async with AsyncStore(store).lock("bench:held", timeout=30):
                pass
        else:
            with store.lock("bench:held", timeout=30):
                pass

    async def turn(i: int) -> None:
        if mode == "async":
            await async_loop.arun(f"s{i}", f"round {rnd}")
        else:
            sync_loop.run(f"s{i}", f"round {rnd}")

    hb = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.01)
    if mode == "idle":  # the machine's own noise: the heartbeat alone, as long as a round
        await asyncio.sleep(IDLE)
        await asyncio.to_thread(held.wait, 10)
    else:
        await asyncio.gather(waiter(), *(turn(i) for i in range(SESSIONS)))
    stop.set()
    await hb
    await asyncio.to_thread(t.join, 10)
    return lags


def run(quick: bool, out: str) -> dict[str, Any]:
    rounds = 2 if quick else 10
    base = tempfile.mkdtemp(prefix="fsdurable-looplag-")
    try:
        env = environment(base)
        store = _prepare(os.path.join(base, "store"))
        loops = _loop(store)
        modes = ("idle", "async", "sync")
        lags: dict[str, list[float]] = {m: [] for m in modes}
        walls: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                t0 = time.perf_counter()
                lags[mode] += asyncio.run(_round(store, loops, mode, r))
                walls[mode].append(time.perf_counter() - t0)
        res = {m: {"lag": stats(lags[m]), "round_wall": stats(walls[m])} for m in lags}
        p99 = res["async"]["lag"]["p99"]
        body = {
            "workload": {"sessions": SESSIONS, "session_bytes": PAYLOAD, "model_steps": 4,
                         "checkpoint_debounce": 0.0, "lock_held_s": HOLD, "rounds": rounds,
                         "heartbeat_s": 0.001},
            "results": res,
            "ratio_p99_sync_over_async": (res["sync"]["lag"]["p99"] / p99) if p99 else None,
            "targets": {"async_p99_lag": {"target": "p99 heartbeat lag <= 5 ms", "value": p99,
                                         "met": p99 <= 0.005}},
        }
        for m in modes:
            lag = res[m]["lag"]
            log(f"{m:5}: lag median {lag['median'] * 1e3:.2f} ms, p99 {lag['p99'] * 1e3:.2f} ms,"
                f" max {max(lags[m]) * 1e3:.1f} ms (n={lag['n']}); round "
                f"{res[m]['round_wall']['median'] * 1e3:.0f} ms")
        write_result(out, "looplag", env, body, quick=quick)
        return body
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
