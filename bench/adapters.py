"""Adapters: the import time a user pays for each fsdurable framework adapter, next to the
framework's own store import, and next to the bare interpreter.

Command: ``python -m bench.adapters`` (full) or ``python -m bench.adapters --quick``.
Writes ``adapters.json``.

Each contender is a fresh ``python -c '<import>'`` process (wall time of the whole process),
timed interleaved round by round, so background load hits all of them alike:
  interpreter           ``pass``
  fsdurable             ``import fsdurable`` (imports no framework)
  openai_agents         ``from fsdurable.openai_agents import FileSession`` (needs no ``agents``)
  agents_sqlite         ``from agents import SQLiteSession`` (the SDK's own store)
  pydantic_ai           ``from fsdurable.pydantic_ai import FileConversationStore``
  pydantic_ai_memory    ``from pydantic_ai.conversation_store import InMemoryConversationStore``
  pydantic_ai_durable   ``from fsdurable.pydantic_ai import FsDurableAgent`` (durable runs)
  pydantic_ai_dbos      ``from pydantic_ai.durable_exec.dbos import DBOSDurability`` (the
                        framework's own durable runs, on DBOS)
  claude                ``from fsdurable.claude import FileSessionStore`` (no SDK import)
  claude_memory         ``from claude_agent_sdk import InMemorySessionStore``
  adk                   ``from fsdurable.adk import FileSessionService`` (durable runs are in the
                        same module: ``DurableRunner``)
  adk_memory            ``from google.adk.sessions import InMemorySessionService``
  adk_database          ``from google.adk.sessions import DatabaseSessionService`` (ADK's own
                        durable store, on SQLAlchemy)
A framework that is not installed is left out (and named in ``missing``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from ._harness import (
    REPO,
    cache_dir,
    environment,
    log,
    measure,
    run_child,
    script_main,
    write_result,
)

CONTENDERS = {
    "interpreter": ("pass", None),
    "fsdurable": ("import fsdurable", None),
    "openai_agents": ("from fsdurable.openai_agents import FileSession", None),
    "agents_sqlite": ("from agents import SQLiteSession", "agents"),
    "pydantic_ai": ("from fsdurable.pydantic_ai import FileConversationStore", "pydantic_ai"),
    "pydantic_ai_memory": ("from pydantic_ai.conversation_store import "
                           "InMemoryConversationStore", "pydantic_ai"),
    "pydantic_ai_durable": ("from fsdurable.pydantic_ai import FsDurableAgent", "pydantic_ai"),
    "pydantic_ai_dbos": ("from pydantic_ai.durable_exec.dbos import DBOSDurability", "dbos"),
    "claude": ("from fsdurable.claude import FileSessionStore", None),
    "claude_memory": ("from claude_agent_sdk import InMemorySessionStore", "claude_agent_sdk"),
    "adk": ("from fsdurable.adk import FileSessionService", "google.adk"),
    "adk_memory": ("from google.adk.sessions import InMemorySessionService", "google.adk"),
    "adk_database": ("from google.adk.sessions import DatabaseSessionService", "google.adk"),
}
PAIRS = {"openai_agents": "agents_sqlite", "pydantic_ai": "pydantic_ai_memory",
         "pydantic_ai_durable": "pydantic_ai_dbos", "claude": "claude_memory",
         "adk": "adk_database"}
FULL = {"min_reps": 10, "max_reps": 20, "budget": 20.0, "warmup": 1}
QUICK = {"min_reps": 1, "max_reps": 1, "budget": 1.0, "warmup": 0}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing (google.adk)
        return False


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    p = QUICK if quick else FULL
    work = os.path.join(cache_dir(quick), "adapters")
    env = environment(work)
    child = dict(os.environ)
    child["PYTHONPATH"] = REPO + os.pathsep + child.get("PYTHONPATH", "")
    missing = sorted({m for _, m in CONTENDERS.values() if m and not _installed(m)})
    calls = {}
    for name, (code, module) in CONTENDERS.items():
        if module in missing:
            continue

        def call(code: str = code) -> None:
            if run_child([sys.executable, "-c", code], env=child, kill_after=120):
                raise RuntimeError(f"the import failed: {code}")

        calls[name] = call
    res = measure(calls, min_reps=p["min_reps"], max_reps=p["max_reps"], budget=p["budget"],
                  warmup=p["warmup"])
    base = res["interpreter"]["median"]
    over = {k: (v["median"] - base) * 1e3 for k, v in res.items()}
    ratios = {f"{a}_vs_{b}": res[a]["median"] / res[b]["median"]
              for a, b in PAIRS.items() if a in res and b in res}
    for k, v in res.items():
        log(f"  adapters {k}: {v['median'] * 1e3:.1f} ms (+{over[k]:.1f} ms over the "
            "interpreter)")
    body = {"params": p, "results": res, "over_interpreter_ms": over, "ratios": ratios,
            "commands": {k: c for k, (c, _) in CONTENDERS.items()}, "missing": missing}
    write_result(out_dir, "adapters", env, body, quick=quick)
    return body


def section(d: dict[str, Any]) -> str:
    """bench/README.md's table (``bench.report``)."""
    from .report import table

    r, over = d["results"], d["over_interpreter_ms"]
    rows = [[f"`{d['commands'][k]}`", f"{r[k]['median'] * 1e3:.0f} ms", f"+{over[k]:.0f} ms"]
            for k in r]
    return ("A fresh `python -c` process per import, interleaved; the interpreter alone is the "
            "first row.\n\n" + table(["import", "process (median)", "over the interpreter"],
                                       rows))


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
