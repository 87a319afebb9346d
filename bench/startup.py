"""Startup: what a fresh process pays to find the interrupted turns, and what it imports.

Command: ``python -m bench.startup`` (full) or ``python -m bench.startup --quick``.
Writes ``startup.json``. Measured as a user runs it: the full run builds a CLEAN virtualenv
(``bench/_venv.py``: only fsdurable, from a wheel built from this checkout, and its dependencies)
and times every fsdurable contender with that venv's interpreter; ``--quick`` (the CI smoke run)
uses the current interpreter and says so. Figures:

1. imports: a fresh ``python -c "import fsdurable; fsdurable.Store(root).interrupted()"`` must not
   load any of ``MUST_NOT`` (issue 13's set: the discovery path is stdlib); the modules it does
   load and the in-process time of import + open + discover are recorded.
2. cold start, paired: each round starts every contender once as a fresh process, in turn, on a
   data set with 10 interrupted turns; a ratio is taken within each round and the median of those
   ratios is reported (with the ratio of the medians): ``python -c pass`` (the interpreter alone:
   what the floor contains), the floor script (one ``os.scandir`` of ``markers/``, each marker
   read with ``json``, ids printed), the same through fsdurable, ``fsdurable interrupted --json``,
   ``fsdurable recover --dry-run --json``, the floor as an installed command (``floor_cli``: a copy
   of the console script the installer wrote for ``fsdurable``, importing the floor's listing,
   printed as an indented JSON document: the floor for the CLI rows), and plain ``sqlite3`` with
   an index (connect + the indexed SELECT). The peers a user would otherwise pick run in the
   CURRENT interpreter (they are not in the clean venv; its own ``python -c pass`` is measured
   beside them): LangGraph's
   ``SqliteSaver`` opening its database and listing its threads with pending writes, and the
   OpenAI Agents SDK's ``SQLiteSession`` opening its database and reading one session's items.
3. growth: ``store.interrupted()`` with 10 interrupted turns over 1,000 ... 100,000 sessions,
   interleaved in one process (issue 2: the cost must not grow with the number of sessions).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

from ._harness import REPO, environment, log, ratio, run_child, script_main, stats, write_result

HEAVY = ("watchfiles", "portalocker", "cattrs", "orjson", "platformdirs", "atomicwrites", "attrs",
         "asyncio", "ssl", "secrets", "pathlib", "typing")
MUST_NOT = ("attrs", "cattrs", "asyncio", "ssl", "portalocker", "watchfiles", "platformdirs",
            "secrets", "pathlib")

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

# The floor as a command a user installs: the console-script wrapper the installer wrote for
# `fsdurable` (its text copied, only its import changed; pip's imports re and strips a suffix
# from argv[0]) around a stdlib module that parses the same arguments, lists markers/ and prints
# the listing as an indented JSON document. What any Python CLI pays over a `python -c` script,
# measured rather than argued.
FLOOR_CLI_MODULE = """\
import json, os, sys


def main():
    args = sys.argv[1:]
    root = args[args.index("--root") + 1]
    if "interrupted" not in args or "--json" not in args:
        sys.stderr.write("usage: --root ROOT interrupted --json\\n")
        return 2
    d = os.path.join(root, "markers")
    out = []
    for e in os.scandir(d):
        with open(e.path, "rb") as f:
            out.append(json.loads(f.read()))
    out.sort(key=lambda m: m["session_id"])
    print(json.dumps({"interrupted": out}, indent=2, ensure_ascii=False), flush=True)
    return 1 if out else 0


if __name__ == "__main__":
    sys.exit(main())
"""


def floor_cli_command(python: str, where: str, cli: list[str]) -> list[str]:
    """Write the floor's module (``FLOOR_CLI_MODULE``) into ``where``, and beside it a copy of
    the installed ``fsdurable`` script (``cli``: ``cli_command``'s) that imports it instead;
    return the command that runs it as ``cli`` runs (a shebang script, else ``python``)."""
    os.makedirs(where, exist_ok=True)
    module = os.path.join(where, "fsdurable_floor_cli.py")
    with open(module, "w") as f:
        f.write(FLOOR_CLI_MODULE)
    if len(cli) != 1:  # no installed script (``python -m fsdurable``): no wrapper either
        return [python, module]
    with open(cli[0]) as f:
        text = f.read()
    wrapped = text.replace("from fsdurable.cli import main", "from fsdurable_floor_cli import main")
    if wrapped == text or not text.startswith("#!"):
        raise RuntimeError(f"{cli[0]} is not the console script this bench knows:\n{text[:500]}")
    script = os.path.join(where, "fsdurable-floor")
    with open(script, "w") as f:
        f.write(wrapped)
    os.chmod(script, 0o755)
    return [script]


FSDURABLE_SCRIPT = """\
import sys
import fsdurable
ms = fsdurable.Store(sys.argv[1]).interrupted()
sys.stdout.write("[" + ", ".join('"%s"' % m.session_id for m in ms) + "]\\n")
"""

LANGGRAPH_SCRIPT = """\
import json, sqlite3, sys
from langgraph.checkpoint.sqlite import SqliteSaver
saver = SqliteSaver(sqlite3.connect(sys.argv[1], check_same_thread=False))
ids = {t.config["configurable"]["thread_id"] for t in saver.list(None) if t.pending_writes}
sys.stdout.write(json.dumps(sorted(ids)) + "\\n")
"""

OPENAI_SCRIPT = """\
import asyncio, json, sys
from agents import SQLiteSession
items = asyncio.run(SQLiteSession(sys.argv[2], sys.argv[1]).get_items())
sys.stdout.write(json.dumps(len(items)) + "\\n")
"""

PROBE_SCRIPT = """\
import sys, time, json
before = set(sys.modules)
t0 = time.perf_counter()
import fsdurable
t1 = time.perf_counter()
st = fsdurable.Store(sys.argv[1])
t2 = time.perf_counter()
ms = st.interrupted()
t3 = time.perf_counter()
heavy = %r
print(json.dumps({"import": t1 - t0, "open": t2 - t1, "interrupted": t3 - t2,
                  "markers": len(ms), "modules": len(sys.modules),
                  "loaded": sorted(m for m in heavy if m in set(sys.modules) - before)}))
""".replace("%r", repr(HEAVY))


def child_env(state_dir: str, *, checkout: bool = True) -> dict[str, str]:
    """The children's environment; ``checkout``: import this checkout's fsdurable (PYTHONPATH),
    else the installed one (the clean venv's wheel)."""
    env = dict(os.environ)
    if checkout:
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    else:
        env.pop("PYTHONPATH", None)
    # as a user runs it: no FSDURABLE_* variable (a state dir or node id set would skip the
    # platformdirs lookup a user's process pays); locks and the node id go to the user state dir
    for k in [k for k in env if k.startswith("FSDURABLE_")]:
        del env[k]
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    # Bytecode as in any installed package: with PYTHONDONTWRITEBYTECODE set (some sandboxes and
    # CI images do), fsdurable's modules would be compiled from source at every start while the
    # stdlib the floor uses loads from its .pyc files. The warm-up run writes the .pyc files.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def cli_command(python: str = sys.executable) -> list[str]:
    script = os.path.join(os.path.dirname(python), "fsdurable")
    if os.path.exists(script):
        return [script]
    found = shutil.which("fsdurable")
    return [found] if found else [python, "-m", "fsdurable"]


def probe_imports(python: str, root: str, env: dict[str, str], reps: int,
                  cwd: str) -> dict[str, Any]:
    runs = []
    for _ in range(reps):
        out = subprocess.run([python, "-c", PROBE_SCRIPT, root], env=env,
                             capture_output=True, text=True, timeout=120, cwd=cwd)
        if out.returncode != 0:  # say why: a bench part that cannot measure fails loudly
            raise RuntimeError(f"the import probe ({python}) exited {out.returncode}:\n"
                               f"{out.stderr[-3000:]}")
        runs.append(json.loads(out.stdout))
    loaded = sorted({m for r in runs for m in r["loaded"]})
    return {
        "loaded_heavy_modules": loaded,
        "must_not_load": list(MUST_NOT),
        "ok": not any(m in loaded for m in MUST_NOT),
        "modules_total": runs[-1]["modules"],
        "markers_found": runs[-1]["markers"],
        "in_process": {k: stats([r[k] for r in runs]) for k in ("import", "open",
                                                                "interrupted")},
    }


def cold_start(python: str, root: str, sqlite_db: str, env: dict[str, str], reps: int,
               cwd: str, peers: dict[str, list[str]]) -> dict[str, Any]:
    """Paired cold starts: every round runs each command once; ratios within each round."""
    cli = cli_command(python)
    cmds = {
        "python_alone": [python, "-c", "pass"],
        "floor": [python, "-c", FLOOR_SCRIPT, root],
        "fsdurable": [python, "-c", FSDURABLE_SCRIPT, root],
        "cli": [*cli, "--root", root, "interrupted", "--json"],
        "floor_cli": [*floor_cli_command(python, os.path.join(cwd, "floor-cli"), cli),
                      "--root", root, "interrupted", "--json"],
        "cli_recover_dry_run": [*cli, "--root", root, "recover", "--dry-run", "--json"],
        "sqlite": [python, "-c", SQLITE_SCRIPT, sqlite_db],
        **peers,
    }
    outputs: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name, cmd in list(cmds.items()):  # warm up, and check they agree where they should
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=cwd)
        outputs[name] = p.stdout
        ok = p.returncode in (0, 1)  # the CLI exits 1 when it found interrupted turns...
        if ok and name.startswith(("cli", "floor_cli")):
            try:  # ... and on an error: only a JSON answer is a run worth timing
                json.loads(p.stdout)
            except ValueError:
                ok = False
        if not ok:
            if not name.startswith(("cli", "peer_")):
                raise RuntimeError(f"{name} failed ({p.returncode}): {p.stderr[-2000:]}")
            skipped[name] = f"exit {p.returncode}: {p.stderr.strip()[-300:]}"
            del cmds[name]
    floor_cli_ids = sorted(m["session_id"]
                           for m in json.loads(outputs["floor_cli"])["interrupted"])
    if not json.loads(outputs["floor"]) == json.loads(outputs["fsdurable"]) == \
            json.loads(outputs["sqlite"]) == floor_cli_ids:
        raise AssertionError("the floor, fsdurable, sqlite and floor_cli listings disagree")
    samples: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(reps):
        for name, cmd in cmds.items():
            t0 = time.perf_counter()
            if run_child(cmd, env=env, cwd=cwd) not in (0, 1):
                raise RuntimeError(f"{name} failed while being timed: {' '.join(cmd)}")
            samples[name].append(time.perf_counter() - t0)
    res = {k: stats(v) for k, v in samples.items()}
    floor = samples["floor"]
    paired = {f"{k}_vs_floor": statistics.median(a / b for a, b in zip(v, floor, strict=True))
              for k, v in samples.items() if k not in ("floor",)}
    # the CLI rows against the floor as an installed command, paired the same way
    vs_floor_cli = {f"{k}_vs_floor_cli": statistics.median(
        a / b for a, b in zip(samples[k], samples["floor_cli"], strict=True))
        for k in samples if k.startswith("cli")}
    return {
        "root": root, "command": {k: " ".join(v) for k, v in cmds.items()},
        "ratios_vs_floor_cli": vs_floor_cli,
        "results": res,
        "skipped": skipped,
        "ratios": paired,  # median over rounds of (contender / floor) in the same round
        "ratios_of_medians": {f"{k}_vs_floor": ratio(res[k], res["floor"]) for k in res
                              if k != "floor"},
        "over_interpreter_ms": {k: (res[k]["median"] - res["python_alone"]["median"]) * 1e3
                                for k in res if not k.startswith("peer_")},
    }


def openai_db(path: str, n: int = 10, items: int = 20) -> str | None:
    """A SQLiteSession database of ``n`` sessions (``s0``...) of ``items`` messages, built with
    the SDK itself; None if the SDK is not installed."""
    try:
        from agents import SQLiteSession
    except ImportError:
        return None
    if not os.path.exists(path):
        import asyncio

        async def build() -> None:
            for i in range(n):
                s = SQLiteSession(f"s{i}", path)
                await s.add_items([{"role": "user", "content": f"message {j} of s{i}"}
                                   for j in range(items)])
                s.close()

        asyncio.run(build())
    return path


def peer_commands(ds: Any) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The peers, in the current interpreter (where they are installed)."""
    from ._data import langgraph_available

    peers: dict[str, list[str]] = {"peer_python_alone": [sys.executable, "-c", "pass"]}
    missing = {}
    if ds.want_langgraph and langgraph_available():
        peers["peer_langgraph_sqlitesaver"] = [sys.executable, "-c", LANGGRAPH_SCRIPT,
                                               ds.langgraph_db]
    else:
        missing["peer_langgraph_sqlitesaver"] = "langgraph-checkpoint-sqlite not installed"
    db = openai_db(os.path.join(ds.path, "peer-openai-agents.db"))
    if db is not None:
        peers["peer_openai_sqlitesession"] = [sys.executable, "-c", OPENAI_SCRIPT, db, "s0"]
    else:
        missing["peer_openai_sqlitesession"] = "openai-agents not installed"
    return peers, missing


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    from .discovery import FULL, QUICK, datasets_for, run_growth

    p = QUICK if quick else FULL
    datasets = datasets_for(p["ns"], quick)
    ds = datasets[0]  # cold start is independent of N (figure 3); the peers list every thread
    ds.configure(10)
    env = environment(ds.path)
    state = os.path.join(os.path.dirname(ds.path), "state")
    # the quick run too: the smoke test then proves the clean venv builds (it broke unseen once)
    use_venv = os.environ.get("FSDURABLE_BENCH_VENV", "1") == "1"
    if use_venv:
        from ._venv import clean_venv, describe

        python = clean_venv()
        interpreter = {"clean_venv": True, **describe(python)}
    else:
        python = sys.executable
        interpreter = {"clean_venv": False, "python": sys.version.split()[0],
                       "executable": python,
                       "note": "the current interpreter and this checkout (PYTHONPATH); its "
                               "site-packages may be crowded: python -c pass shows what it costs"}
    cenv = child_env(state, checkout=not use_venv)
    cwd = os.path.dirname(ds.path)  # never the checkout: python -c puts the cwd on sys.path
    log(f"startup: imports ({python}) ...")
    imports = probe_imports(python, ds.root, cenv, 5 if quick else 20, cwd)
    log(f"  heavy modules loaded: {imports['loaded_heavy_modules']}")
    if quick:  # the peers import big frameworks (seconds each): not in the CI smoke run
        peers: dict[str, Any] = {}
        missing = {"peers": "not run with --quick"}
    else:
        peers, missing = peer_commands(ds)
    log("startup: cold start (paired rounds) ...")
    cold = cold_start(python, ds.root, ds.sqlite, cenv, 5 if quick else 40, cwd, peers)
    cold["skipped"].update(missing)
    log("  cold start: " + ", ".join(f"{k} {v['median'] * 1e3:.1f}ms"
                                      for k, v in cold["results"].items()))
    log("  paired ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in cold["ratios"].items()))
    log("startup: interrupted() growth with N ...")
    big = datasets[-1]
    big.configure(10)
    growth = run_growth(datasets, 10, p["fast_reps"])
    log(f"  growth {growth['n_smallest']} -> {growth['n_largest']}: "
        f"{growth['ratio_largest_vs_smallest']:.2f}x")
    r = cold["ratios"]

    def target(key: str, limit: float) -> dict[str, Any]:
        v = r.get(key)
        return {"value": v, "target": f"<= {limit}", "met": v is not None and v <= limit}

    targets = {
        "imports_ok": {"value": imports["loaded_heavy_modules"], "met": imports["ok"],
                       "target": "none of " + ", ".join(MUST_NOT)},
        "cold_start_vs_floor": target("fsdurable_vs_floor", 1.3),
        "cli_interrupted_vs_floor": target("cli_vs_floor", 1.3),  # issue 18 (was 1.5)
        "cli_recover_dry_run_vs_floor": target("cli_recover_dry_run_vs_floor", 1.3),
        "interrupted_growth": {"value": growth["ratio_largest_vs_smallest"], "target": "<= 1.1",
                               "met": growth["ratio_largest_vs_smallest"] <= 1.1},
    }
    body = {"n": ds.n, "m": 10, "interpreter": interpreter, "imports": imports,
            "cold_start": cold, "growth": growth, "targets": targets}
    write_result(out_dir, "startup", env, body, quick=quick)
    return body


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
