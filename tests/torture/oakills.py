"""Kill torture for Agents SDK runs: worker processes run durable ``fsdurable.openai_agents``
runs (the SDK's real ``Runner`` with its offline ``ScriptedModel``) on one store and are
SIGKILLed at random, mid-run, and restarted; each restart begins with ``oa.recover``.

The driver (``run``; it forks) imports ``agents`` and fsdurable once, so a restarted worker
starts at once. A worker loops at random over its own sessions: a run (attended or not; an
attended run that stops for approval is approved and continued half of the time), a cancel of
a session's turn, recovery again. The model's script per turn: ``lookup`` (no effect) + ``send``
(idempotent: the provider dedupes by the key, an ``O_EXCL`` file), then ``charge`` (external,
no key) + ``approve_me`` (needs approval), then ``shell`` (on the unattended deny-list), then
the final reply. Every tool logs what fsdurable's call context told it (``oa.current_call()``).

After every kill the invariants of ``kills.check_live`` hold (every session and marker parses;
in progress => a marker of the same turn; attempts never above the cap). At the end: recovery
twice, ``doctor --repair``, no marker left, and the world: no external call run twice, no
idempotent effect applied twice, no approval granted and no deny-listed tool run in a resumed
(unattended) run, a resumed run never attended, every key ``<session>:<turn>:<call>``; and each
conversation (the SDK's items) holds every tool call and every tool output at most once.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from typing import Any

from .kills import CAP, _append, _config, _die_with_parent, _read_jsonl, _terminate, check_live

SESSIONS = 3  # per worker
STEPS = ((("lookup", {"q": "a"}), ("send", {"to": "b"})),
         (("charge", {"amount": 1}), ("approve_me", {})),
         (("shell", {"cmd": "rm -rf ~/build"}),))
EFFECTS = {"lookup": "none", "send": "idempotent", "charge": "external", "approve_me": "none",
           "shell": "external"}


def _agent(world: str, wid: int) -> tuple[Any, Any]:
    """The workers' agent and its model's one step (it answers from the conversation)."""
    from agents import Agent, FunctionTool, ModelSettings
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from fsdurable import openai_agents as oa

    log = os.path.join(world, f"tools-{wid}.jsonl")

    def body(name: str) -> Any:
        async def invoke(ctx: Any, raw: str) -> str:
            call = oa.current_call()
            assert call is not None
            rec = {"tool": name, "sid": call.session_id, "tid": call.turn_id,
                   "cid": call.tool_call_id, "key": call.idempotency_key,
                   "attended": call.attended, "resumed": call.resumed}
            time.sleep(random.uniform(0, 0.003))
            if name == "send":
                path = os.path.join(world, "idem", call.idempotency_key.replace(":", "_"))
                try:
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                except FileExistsError:
                    _append(log, {**rec, "kind": "dedupe"})
                    return "already sent"
                _append(log, {**rec, "kind": "apply"})
                return "sent"
            _append(log, {**rec, "kind": name})
            return f"{name} ok"

        return body_tool(name, invoke)

    def body_tool(name: str, invoke: Any) -> Any:
        return FunctionTool(name=name, description=name, on_invoke_tool=invoke,
                            params_json_schema={"type": "object", "properties": {},
                                                "additionalProperties": True},
                            strict_json_schema=False, needs_approval=name == "approve_me")

    def respond(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else []
        users = sum(1 for i in items if isinstance(i, dict) and i.get("role") == "user")
        outputs = 0
        for i in items:
            if isinstance(i, dict) and i.get("role") == "user":
                outputs = 0
            elif isinstance(i, dict) and i.get("type") == "function_call_output":
                outputs += 1
        n = seen = 0
        while n < len(STEPS) and seen + len(STEPS[n]) <= outputs:
            seen += len(STEPS[n])
            n += 1
        time.sleep(random.uniform(0, 0.003))
        if n >= len(STEPS):
            return [assistant_message("done")]
        return [function_call(name, dict(args), call_id=f"u{users}-c{n}-{k}")
                for k, (name, args) in enumerate(STEPS[n])]

    step = ModelStep.respond(respond)
    return Agent(name="torture", model=ScriptedModel([step] * 64),
                 tools=[body(n) for n in EFFECTS],
                 model_settings=ModelSettings(parallel_tool_calls=False)), step


async def _worker(root: str, world: str, wid: int, seed: int) -> None:
    from fsdurable import openai_agents as oa
    from fsdurable._errors import FsDurableError
    from fsdurable._store import Store

    random.seed(seed)
    errors = os.path.join(world, f"errors-{wid}.jsonl")
    st = Store(root, config=_config())
    agent, step = _agent(world, wid)
    model = agent.model
    sids = [f"oa-w{wid}-{k}" for k in range(SESSIONS)]

    async def guarded(coro: Any) -> Any:
        try:
            return await coro
        except FsDurableError:
            return None  # a busy lock, a turn in progress: normal under contention
        except Exception as e:
            _append(errors, {"error": f"{type(e).__name__}: {e}"})
            return None

    await guarded(oa.recover(agent, st, effects=EFFECTS))
    while True:
        if model.remaining_steps < 16:  # the script stays long enough for the next runs
            model.extend([step] * 64)
        r = random.random()
        fs = oa.FileSession(random.choice(sids), st)
        if r < 0.8:
            attended = random.random() < 0.5
            res = await guarded(oa.run(agent, "go", session=fs, attended=attended,
                                       effects=EFFECTS))
            if res is not None and res.interruptions and random.random() < 0.5:
                state = await guarded(oa.paused_state(agent, fs))
                if state is not None:
                    for item in state.get_interruptions():
                        state.approve(item)
                    await guarded(oa.run(agent, state, session=fs, attended=True,
                                         effects=EFFECTS))
        elif r < 0.9:
            with contextlib.suppress(FsDurableError):
                st.cancel(fs.session_id)
        else:
            await guarded(oa.recover(agent, st, effects=EFFECTS))


def worker(root: str, world: str, wid: int, seed: int) -> None:
    import asyncio

    asyncio.run(_worker(root, world, wid, seed))


def check_final(store: Any, world: str) -> tuple[list[str], dict[str, int]]:
    from fsdurable._errors import FsDurableError
    from fsdurable._oaitems import Items

    out: list[str] = []
    stats: Counter[str] = Counter()
    files = os.listdir(world)
    tools = [r for f in files if f.startswith("tools-") for r in _read_jsonl(f"{world}/{f}")]
    for f in files:
        if f.startswith("errors-"):
            out += [f"worker error: {r['error']}" for r in _read_jsonl(f"{world}/{f}")]
    per: Counter[tuple[str, str]] = Counter()
    for r in tools:
        stats[f"tool_{r['kind']}"] += 1
        if r["key"] != f"{r['sid']}:{r['tid']}:{r['cid']}":
            out.append(f"idempotency key {r['key']} is not <session>:<turn>:<call>")
        if r["resumed"] and r["attended"]:
            out.append(f"a resumed run ran attended: {r}")
        if r["kind"] == "approve_me" and r["resumed"]:
            out.append(f"an approval was honoured in a resumed (unattended) run: {r}")
        if r["kind"] == "shell" and not r["attended"]:
            out.append(f"a deny-listed tool ran unattended: {r}")
        if r["kind"] in ("apply", "charge"):
            per[(r["kind"], r["key"])] += 1
        if r["resumed"]:
            stats["tool_calls_in_resumed_runs"] += 1
    out += [f"{'idempotent effect applied' if k == 'apply' else 'external call run'} {n} "
            f"times: {key}" for (k, key), n in per.items() if n > 1]
    for sid in store.sessions():
        try:
            got = Items(store, sid).read(store.load(sid), 0)
        except FsDurableError as e:
            out.append(f"session {sid} unreadable: {e}")
            continue
        calls = Counter(i.get("call_id") for i in got if i.get("type") == "function_call")
        outs = Counter(i.get("call_id") for i in got if i.get("type") == "function_call_output")
        out += [f"{sid}: tool call {c} {n} times in the conversation" for c, n in calls.items()
                if n > 1]
        out += [f"{sid}: tool output {c} {n} times in the conversation" for c, n in outs.items()
                if n > 1]
    for event in store.events():
        stats[f"event_{event.code}"] += 1
        if event.code == "tool_refused":
            stats[f"refused_{event.reason}"] += 1
        if event.code == "interrupted_turn_resuming" and int(event.detail.get("attempt", 0)) > CAP:
            out.append(f"resume attempt {event.detail.get('attempt')} above the cap {CAP}")
    return out, dict(stats)


def run(base: str, *, kills: int = 30, workers: int = 2, seed: int = 1,
        max_delay: float = 1.2, progress: bool = False) -> dict[str, Any]:
    """Fork ``workers`` children, SIGKILL one at random ``kills`` times (restarting it), check
    after every kill and at the end. Returns the figures and the violations."""
    import agents.testing  # noqa: F401  (imported once, before the forks)

    import fsdurable._codec as codec
    import fsdurable._doctor
    import fsdurable._oarun
    import fsdurable._recovery
    import fsdurable.openai_agents  # noqa: F401
    from fsdurable._store import Store

    codec._conv()
    rnd = random.Random(seed)
    root, world = os.path.join(base, "store"), os.path.join(base, "world")
    os.makedirs(os.path.join(world, "idem"), exist_ok=True)
    _warm(os.path.join(base, "warm"))
    Store(root, config=_config())
    t0 = time.monotonic()
    pids: dict[int, int] = {}

    def spawn(wid: int) -> None:
        child_seed = rnd.randrange(1 << 30)
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _die_with_parent()
                worker(root, world, wid, child_seed)
            finally:
                os._exit(1)
        pids[wid] = pid

    violations: list[str] = []
    checker = Store(root, config=_config())
    seen: dict[str, Any] = {}
    previous = signal.signal(signal.SIGTERM, _terminate)
    done = 0
    try:
        for wid in range(workers):
            spawn(wid)
        while done < kills and len(violations) <= 20:
            time.sleep(rnd.uniform(0.2, max_delay))  # a worker's start costs ~0.1 s
            wid = rnd.randrange(workers)
            os.kill(pids[wid], signal.SIGKILL)
            os.waitpid(pids[wid], 0)
            done += 1
            violations += check_live(checker, seen)
            spawn(wid)
            if progress and done % 100 == 0:
                print(f"  {done} Agents SDK kills, {time.monotonic() - t0:.0f}s",
                      file=sys.stderr, flush=True)
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ChildProcessError, ProcessLookupError):
                pass
        signal.signal(signal.SIGTERM, previous)
    violations += check_live(checker)
    violations += _final_startup(root, world)
    st = Store(root, config=_config())
    violations += check_live(st)
    violations += [f"marker {m.session_id} left after recovery" for m in st.interrupted()]
    final, stats = check_final(st, world)
    return {"kills": done, "workers": workers, "seconds": round(time.monotonic() - t0, 1),
            "violations": violations + final, "stats": stats, "sessions": len(st.sessions())}


def _warm(base: str) -> None:
    """One durable run before the forks: what the SDK imports and builds at its first run is
    then in every worker (a worker restarted after a kill runs at once)."""
    import asyncio

    from fsdurable import openai_agents as oa
    from fsdurable._store import Store

    os.makedirs(os.path.join(base, "idem"), exist_ok=True)
    fs = oa.FileSession("warm", Store(os.path.join(base, "store"), config=_config()))
    asyncio.run(oa.run(_agent(base, 0)[0], "go", session=fs, effects=EFFECTS))


def _final_startup(root: str, world: str) -> list[str]:
    """The last start: recovery and ``doctor --repair``, twice."""
    import asyncio

    from fsdurable import openai_agents as oa
    from fsdurable._doctor import doctor, problems
    from fsdurable._store import Store

    out: list[str] = []
    for _ in range(2):
        st = Store(root, config=_config())
        asyncio.run(oa.recover(_agent(world, 99)[0], st, effects=EFFECTS))
        left = [f for f in problems(doctor(st, repair=True)) if f.code != "review_required"]
        out += [f"doctor --repair left {f.code} {f.path}" for f in left]
    return out


def main(argv: list[str]) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(prog="python -m tests.torture.oakills")
    p.add_argument("--kills", type=int, default=30)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dir", default=None)
    a = p.parse_args(argv)
    os.environ.setdefault("FSDURABLE_NODE", "node-torture")
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="fsd-oakill-") as base:
        os.environ.setdefault("FSDURABLE_STATE_DIR", os.path.join(base, "state"))
        res = run(base, kills=a.kills, workers=a.workers, seed=a.seed, progress=True)
    print(json.dumps(res, indent=1, sort_keys=True))
    return 1 if res["violations"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
