"""Startup: what a fresh process pays to find the interrupted turns, and what it imports.

Command: ``python -m bench.startup`` (full) or ``python -m bench.startup --quick``.
Writes ``startup.json``. Three figures:

1. imports: a fresh ``python -c "import fsdurable; fsdurable.Store(root).interrupted()"`` must not
   load watchfiles, portalocker, cattrs or orjson (the discovery path needs none of them); the
   modules it does load and the in-process time of import + open + discover are recorded.
2. cold start: fresh processes, interleaved, on the largest data set with 10 interrupted turns:
   ``python -c pass`` (the interpreter alone, for scale), the floor script (one ``os.scandir`` of
   ``markers/``, each marker read with ``json``, ids printed), the same through fsdurable, the
   CLI ``fsdurable --root R interrupted --json``, and SQLite (``sqlite3`` connect + the indexed
   SELECT on the same sessions, ids printed).
3. growth: ``store.interrupted()`` with 10 interrupted turns over 1,000 ... 100,000 sessions,
   interleaved in one process (issue 2: the cost must not grow with the number of sessions).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from ._harness import REPO, environment, log, ratio, script_main, stats, write_result

HEAVY = ("watchfiles", "portalocker", "cattrs", "orjson", "platformdirs", "atomicwrites")
MUST_NOT = ("watchfiles", "portalocker", "cattrs")

FLOOR_SCRIPT = """\
import json, os, sys
d = os.path.join(sys.argv[1], "markers")
out = []
for e in os.scandir(d):
    with open(e.path, "rb") as f:
        out.append(json.loads(f.read()))
sys.stdout.write(json.dumps(sorted(m["session_id"] for m in out)) + "\\n")
"""

SQLITE_SCRIPT = """\
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT id, turn_id, node_id, checkpoint_at, resume_attempts FROM sessions"
                  " WHERE in_progress = 1").fetchall()
sys.stdout.write(json.dumps(sorted(r[0] for r in rows)) + "\\n")
"""

FSDURABLE_SCRIPT = """\
import sys
import fsdurable
ms = fsdurable.Store(sys.argv[1]).interrupted()
sys.stdout.write("[" + ", ".join('"%s"' % m.session_id for m in ms) + "]\\n")
"""

PROBE_SCRIPT = """\
import sys, time, json
t00 = time.perf_counter()
import attrs
t0 = time.perf_counter()
import fsdurable
t1 = time.perf_counter()
st = fsdurable.Store(sys.argv[1])
t2 = time.perf_counter()
ms = st.interrupted()
t3 = time.perf_counter()
heavy = %r
print(json.dumps({"attrs_import": t0 - t00, "import": t1 - t0, "open": t2 - t1,
                  "interrupted": t3 - t2,
                  "markers": len(ms), "modules": len(sys.modules),
                  "loaded": sorted(m for m in heavy if m in sys.modules)}))
""".replace("%r", repr(HEAVY))


def child_env(state_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["FSDURABLE_STATE_DIR"] = state_dir
    env["FSDURABLE_NODE"] = "bench-node"
    env.pop("FSDURABLE_ROOT", None)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    # Bytecode as in any installed package: with PYTHONDONTWRITEBYTECODE set (some sandboxes and
    # CI images do), fsdurable's modules would be compiled from source at every start while the
    # stdlib the floor uses loads from its .pyc files. The warm-up run writes the .pyc files.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def cli_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "fsdurable")
    if os.path.exists(script):
        return [script]
    found = shutil.which("fsdurable")
    return [found] if found else [sys.executable, "-m", "fsdurable"]


def probe_imports(root: str, env: dict[str, str], reps: int) -> dict[str, Any]:
    runs = []
    for _ in range(reps):
        out = subprocess.run([sys.executable, "-c", PROBE_SCRIPT, root], env=env, check=True,
                             capture_output=True, text=True, timeout=120)
        runs.append(json.loads(out.stdout))
    loaded = sorted({m for r in runs for m in r["loaded"]})
    return {
        "loaded_heavy_modules": loaded,
        "must_not_load": list(MUST_NOT),
        "ok": not any(m in loaded for m in MUST_NOT),
        "modules_total": runs[-1]["modules"],
        "markers_found": runs[-1]["markers"],
        "in_process": {k: stats([r[k] for r in runs]) for k in ("attrs_import", "import", "open",
                                                            "interrupted")},
    }


def cold_start(root: str, sqlite_db: str, env: dict[str, str], reps: int) -> dict[str, Any]:
    cmds = {
        "python_alone": [sys.executable, "-c", "pass"],
        "floor": [sys.executable, "-c", FLOOR_SCRIPT, root],
        "fsdurable": [sys.executable, "-c", FSDURABLE_SCRIPT, root],
        "cli": [*cli_command(), "--root", root, "interrupted", "--json"],
        "sqlite": [sys.executable, "-c", SQLITE_SCRIPT, sqlite_db],
    }
    outputs: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name, cmd in list(cmds.items()):  # warm up, and check they agree where they should
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        outputs[name] = p.stdout
        if p.returncode not in (0, 1):  # the CLI exits 1 when it found interrupted turns
            if name != "cli":
                raise RuntimeError(f"{name} failed ({p.returncode}): {p.stderr[-2000:]}")
            skipped[name] = f"exit {p.returncode}: {p.stderr.strip()[-300:]}"
            del cmds[name]
    if not json.loads(outputs["floor"]) == json.loads(outputs["fsdurable"]) == \
            json.loads(outputs["sqlite"]):
        raise AssertionError("the floor, fsdurable and sqlite scripts disagree")
    samples: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(reps):
        for name, cmd in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=120)
            samples[name].append(time.perf_counter() - t0)
    res = {k: stats(v) for k, v in samples.items()}
    return {
        "root": root, "command": {k: " ".join(v) for k, v in cmds.items() if k != "floor"},
        "results": res,
        "skipped": skipped,
        "ratios": {f"{k}_vs_floor": ratio(res[k], res["floor"])
                   for k in ("fsdurable", "cli", "sqlite") if k in res},
        "over_interpreter_ms": {k: (res[k]["median"] - res["python_alone"]["median"]) * 1e3
                                for k in ("floor", "fsdurable", "cli", "sqlite") if k in res},
    }


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    from .discovery import FULL, QUICK, datasets_for, run_growth

    p = QUICK if quick else FULL
    datasets = datasets_for(p["ns"], quick)
    big = datasets[-1]
    big.configure(10)
    env = environment(big.path)
    state = os.path.join(os.path.dirname(big.path), "state")
    cenv = child_env(state)
    log("startup: imports ...")
    imports = probe_imports(big.root, cenv, 5 if quick else 20)
    log(f"  heavy modules loaded: {imports['loaded_heavy_modules']}")
    log("startup: cold start ...")
    cold = cold_start(big.root, big.sqlite, cenv, 5 if quick else 40)
    log("  cold start: " + ", ".join(f"{k} {v['median'] * 1e3:.1f}ms"
                                      for k, v in cold["results"].items()))
    log("startup: interrupted() growth with N ...")
    growth = run_growth(datasets, 10, p["fast_reps"])
    log(f"  growth {growth['n_smallest']} -> {growth['n_largest']}: "
        f"{growth['ratio_largest_vs_smallest']:.2f}x")
    targets = {
        "imports_ok": {"value": imports["loaded_heavy_modules"], "met": imports["ok"],
                       "target": "none of " + ", ".join(MUST_NOT)},
        "cold_start_vs_floor": {"value": cold["ratios"]["fsdurable_vs_floor"], "target": "<= 1.5",
                                "met": cold["ratios"]["fsdurable_vs_floor"] <= 1.5},
        "interrupted_growth": {"value": growth["ratio_largest_vs_smallest"], "target": "<= 1.1",
                               "met": growth["ratio_largest_vs_smallest"] <= 1.1},
    }
    body = {"n": big.n, "m": 10, "imports": imports, "cold_start": cold, "growth": growth,
            "targets": targets}
    path = write_result(out_dir, "startup", env, body, quick=quick)
    log(f"wrote {path}")
    return body


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
