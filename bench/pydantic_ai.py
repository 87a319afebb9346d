"""Pydantic AI: a durable run through fsdurable (``FsDurableAgent``) against the same run through
DBOS (``DBOSDurability`` on SQLite, the system database DBOS runs on without a server), side by
side in one run.

Command: ``python -m bench.pydantic_ai`` (full) or ``--quick``. Writes ``pydantic_ai.json``.
Needs ``dbos`` (``pip install -e '.[test]'``); without it the part fails — it never reports a
comparison it did not make.

The agent: an offline ``FunctionModel`` that calls one tool 20 times (20 steps: 21 model
requests, 20 tool calls), then answers. Figures:

  steps     one 20-step run per repetition, interleaved round by round, per step:
              plain             ``agent.run`` — no durability (the floor)
              fsdurable         ``FsDurableAgent.run`` as it comes (checkpoints debounced,
                                ``Config.checkpoint_debounce`` 2 s: a 20-step offline run commits
                                its begin and its end; the tool declared effect-free)
              fsdurable_every   checkpoint debounce 0: the history committed at every node
                                boundary (as DBOS journals every model request)
              fsdurable_ledger  as ``fsdurable_every``, the tool declared ``external``: its
                                intent and its outcome committed too (2 more commits a step)
              dbos              ``agent.run`` inside a ``@DBOS.workflow``, the agent carrying
                                ``DBOSDurability``: every model request a DBOS step
  startup   N finished runs and K runs SIGKILLed at step 10 (a real crash, K at once); a fresh
            process finds and resumes them: the time from before the store (fsdurable) / DBOS is
            opened, imports included, to the end of the last resumed run, and how many tool
            calls before the crash ran again (fsdurable as it comes: the tool is effect-free and
            the checkpoints debounced, so it may; ``fsdurable_ledger``: declared ``idempotent``,
            so every call before the crash is answered from the ledger and only the one cut short
            runs again, with its key — an ``external`` one would be parked for review instead;
            DBOS: a function tool is not a DBOS step, so each runs again on recovery).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from typing import Any

from ._harness import REPO, cache_dir, environment, log, measure, script_main, write_result

FULL: dict[str, Any] = {
    "min_reps": 10, "max_reps": 40, "budget": 30.0, "finished": 10_000, "interrupted": 10,
    "startup_reps": 3}
QUICK: dict[str, Any] = {
    "min_reps": 1, "max_reps": 1, "budget": 1.0, "finished": 10, "interrupted": 2,
    "startup_reps": 1}


def _steps(work: str, p: dict[str, Any]) -> dict[str, Any]:
    from dbos import DBOS
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    import fsdurable
    from fsdurable.pydantic_ai import FsDurableAgent

    from . import _pai_child as child

    loop = asyncio.new_event_loop()
    DBOS(config=child.dbos_config(os.path.join(work, "steps-dbos.sqlite")))
    dagent = child.make_agent([DBOSDurability()])

    @DBOS.workflow()
    async def dbos_run(prompt: str) -> str:
        return (await dagent.run(prompt)).output

    DBOS.launch()
    plain = child.make_agent()
    every = fsdurable.Config().replace(checkpoint_debounce=0.0)
    contenders = {
        "fsdurable": FsDurableAgent(plain, fsdurable.Store(os.path.join(work, "fs")),
                                    effects={"step": "none"}),
        "fsdurable_every": FsDurableAgent(plain, fsdurable.Store(os.path.join(work, "every"),
                                                                 config=every),
                                          effects={"step": "none"}),
        "fsdurable_ledger": FsDurableAgent(plain, fsdurable.Store(os.path.join(work, "ledger"),
                                                                  config=every),
                                           effects={"step": "external"}),
    }
    n = {"i": 0}
    expect = f"done after {child.STEPS} steps"

    def check(out: Any) -> None:
        if out != expect:
            raise RuntimeError(f"a run did not end as it should: {out!r}")

    def fs(d: Any) -> Any:
        def call() -> None:
            n["i"] += 1
            check(loop.run_until_complete(d.run("go", session_id=f"r{n['i']}")).output)

        return call

    calls = {"plain": lambda: check(loop.run_until_complete(plain.run("go")).output),
             **{k: fs(d) for k, d in contenders.items()},
             "dbos": lambda: check(loop.run_until_complete(dbos_run("go")))}
    try:
        res = measure(calls, min_reps=p["min_reps"], max_reps=p["max_reps"],
                      budget=p["budget"], warmup=1)
    finally:
        DBOS.destroy()
        loop.close()
    per_step = {k: v["median"] / child.STEPS for k, v in res.items()}
    for k, v in per_step.items():
        log(f"  pydantic_ai steps {k}: {v * 1e3:.2f} ms a step")
    return {"results": res, "per_step_ms": {k: v * 1e3 for k, v in per_step.items()},
            "steps": child.STEPS}


def _child(role: str, engine: str, path: str, n: int,
           **env: str) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = REPO + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env)
    return subprocess.run([sys.executable, "-m", "bench._pai_child", role, engine, path, str(n)],
                          env=e, capture_output=True, text=True, timeout=1800, cwd=REPO)


def _fresh(done: str) -> bool:
    """Is a cached crash state young enough to be resumed? Recovery abandons a turn older than
    the staleness window (``Config.stale_after``, 4 h) as it should: a state built by a run of
    the day before would measure ten abandonments, not ten resumes (it did: "0 of 10 interrupted
    runs resumed"). Rebuilt past half the window; DBOS resumes pending workflows of any age."""
    import time

    from fsdurable import Config

    return time.time() - os.path.getmtime(done) < Config().stale_after / 2


def _prepared(engine: str, base: str, p: dict[str, Any], env: dict[str, str]) -> str:
    """The state a crash leaves (N finished runs, K killed at step 10), built once and cached."""
    path = os.path.join(base, "store" if engine == "fsdurable" else "dbos.sqlite")
    done = os.path.join(base, "ready")
    if os.path.exists(done) and (engine != "fsdurable" or _fresh(done)):
        return path
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    k = _child("prepare", engine, path, p["finished"], PAI_BENCH_KILLED=str(p["interrupted"]),
               **env)
    if k.returncode != -9:
        raise RuntimeError(f"{engine}: the crash child was not SIGKILLed (rc {k.returncode}): "
                           f"{k.stderr[-2000:]}")
    with open(done, "w") as fh:
        fh.write("ok\n")
    return path


STARTUP: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("fsdurable", "fsdurable", {}),
    ("fsdurable_ledger", "fsdurable", {"PAI_BENCH_EFFECT": "idempotent"}),
    ("dbos", "dbos", {}))


def _startup(base: str, p: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, engine, env in STARTUP:
        src = _prepared(engine, os.path.join(base, name), p, env)
        secs, reruns = [], []
        for _ in range(p["startup_reps"]):
            scratch = os.path.join(base, f"scratch-{name}")
            shutil.rmtree(scratch, ignore_errors=True)
            os.makedirs(scratch)
            dst = os.path.join(scratch, os.path.basename(src))
            if os.path.isdir(src):
                shutil.copytree(src, dst, symlinks=True)
            else:
                shutil.copy2(src, dst)
            r = _child("recover", engine, dst, p["interrupted"], **env)
            shutil.rmtree(scratch, ignore_errors=True)
            if r.returncode != 0:
                raise RuntimeError(f"{name}: recovery failed: {r.stderr[-2000:]}")
            got = json.loads(r.stdout.splitlines()[-1])
            ok = [o for o in got["outputs"] if o in ("completed", "done after 20 steps")]
            if len(ok) != p["interrupted"]:
                raise RuntimeError(f"{name}: {len(ok)} of {p['interrupted']} interrupted runs "
                                   f"resumed to their end: {got['outputs']}")
            secs.append(got["seconds"])
            reruns.append(got["tool_reruns"])
        from ._harness import stats

        out[name] = {**stats(secs), "tool_reruns": reruns[-1]}
        log(f"  pydantic_ai startup {name}: {out[name]['median']:.2f} s for "
            f"{p['interrupted']} among {p['finished']} finished, {reruns[-1]} tool calls rerun")
    return out


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    try:
        import dbos  # noqa: F401
    except ImportError as e:  # never a silent skip: the comparison is the point of this part
        raise RuntimeError("bench.pydantic_ai needs dbos (pip install -e '.[test]')") from e
    p = QUICK if quick else FULL
    work = os.path.join(cache_dir(quick), "pydantic_ai")
    scratch = os.path.join(work, "steps")
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    env = environment(scratch)
    body = {"params": p, "steps": _steps(scratch, p),
            "startup": _startup(os.path.join(work, "startup"), p)}
    write_result(out_dir, "pydantic_ai", env, body, quick=quick, cleanup=scratch)
    return body


def section(d: dict[str, Any]) -> str:
    """bench/README.md's table (``bench.report``)."""
    from .report import table

    st, up = d["steps"], d["startup"]
    rows = [[f"`{k}`", f"{v:.2f} ms"] for k, v in st["per_step_ms"].items()]
    rows2 = [[f"`{k}`", f"{v['median']:.2f} s", str(v["tool_reruns"])] for k, v in up.items()]
    p = d["params"]
    return (f"A {st['steps']}-step run (offline `FunctionModel`), all contenders interleaved "
            "in one run; per step = median run / steps. `plain`: `agent.run`, not durable; "
            "`fsdurable`: `FsDurableAgent` as it comes (checkpoints debounced 2 s); "
            "`fsdurable_every`: every node boundary committed (as DBOS journals every model "
            "request); `fsdurable_ledger`: that, and the tool's intent and outcome committed "
            "(declared `external`); `dbos`: `DBOSDurability` inside a `@DBOS.workflow` on "
            "SQLite.\n\n"
            + table(["run", "per step (median)"], rows)
            + f"\n\nStartup: {p['interrupted']} runs SIGKILLed at step 10 among "
            f"{p['finished']:,} finished ones; a fresh process finds and resumes them (imports "
            "included). Tool calls run again: of the steps before the crash — `fsdurable` as it "
            "comes re-runs an effect-free tool after its last (debounced) checkpoint, "
            "`fsdurable_ledger` (the tool declared `idempotent`) answers every completed call "
            "from the ledger, DBOS re-runs every function tool (a tool is not a DBOS step).\n\n"
            + table(["recovery", "to the last resumed run's end (median)",
                     "tool calls run again"], rows2))


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
