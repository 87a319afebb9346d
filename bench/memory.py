"""Memory: peak RSS and peak Python allocations of discovery, per number of sessions N.

Command: ``python -m bench.memory`` (full: N = 1k, 10k, 100k) or ``python -m bench.memory --quick``.
Writes ``memory.json``. Each figure comes from a fresh process (peak RSS of the whole process from
``VmHWM`` in /proc/self/status, else ``getrusage``; ``tracemalloc`` peak of the discovery call
alone), with 10 interrupted turns.
Contenders: fsdurable (``Store(root).interrupted()``), the floor (``os.scandir`` of ``markers/`` +
``json``) and the full scan of ``sessions/`` that file-based agents do today.

Second part, loading one big session (10 MB of messages; 1 MB with ``--quick``, written by 20
message-adding commits): peak RSS of a fresh process that opens the store, loads the session and
reads every message (``tuple(session.messages)``), against one that ``json.loads`` the same
messages from one file (what a whole-file design reads), and the interpreter alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from ._harness import environment, log, script_main, write_result

PROBE = """\
import json, os, resource, sys, tracemalloc
kind, root = sys.argv[1], sys.argv[2]
if kind == "fsdurable":
    import fsdurable
    store = fsdurable.Store(root)
    call = store.interrupted
else:  # the same code as bench/discovery.py's floor and full_scan, without importing bench
    def floor(markers_dir):
        out = []
        for e in os.scandir(markers_dir):
            with open(e.path, "rb") as f:
                out.append(json.loads(f.read()))
        return out

    def full_scan(sessions_dir):
        out = []
        for e in os.scandir(sessions_dir):
            with open(e.path, "rb") as f:
                d = json.loads(f.read())
            if d.get("in_progress"):
                out.append(d)
        return out

    call = ((lambda: floor(os.path.join(root, "markers"))) if kind == "floor"
            else (lambda: full_scan(os.path.join(root, "sessions"))))
def peak_kb():
    # VmHWM: this process image's own high-water mark. ru_maxrss is not: Linux carries it over
    # exec from the parent's memory when the child was spawned by vfork (as subprocess does).
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
before = peak_kb()
found = call()
after = peak_kb()
peak = None
if sys.argv[3] == "1":  # once more under tracemalloc, for the Python allocations
    tracemalloc.start()
    call()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
print(json.dumps({"found": len(found), "traced_peak_bytes": peak,
                  "rss_peak_kb": after, "rss_before_kb": before}))
"""


LOAD_PROBE = """\
import sys
kind, where = sys.argv[1], sys.argv[2]
if kind == "fsdurable":
    import fsdurable
    n = len(tuple(fsdurable.Store(where).load("big").messages))
elif kind == "json_loads":
    import json
    with open(where, "rb") as f:
        n = len(json.loads(f.read()))
else:
    n = 0
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(f"{n} {peak}")
"""


def big_session(base: str, mb: int) -> tuple[str, str, int, int]:
    """A store with one session of ``mb`` MB of messages (20 commits) and the same messages as
    one JSON file; returns (store root, file, messages, bytes of the file)."""
    import os
    import shutil

    import attrs
    import orjson

    import fsdurable
    from fsdurable import _codec

    from .growth import transcript

    root, flat = os.path.join(base, f"load-{mb}mb"), os.path.join(base, f"load-{mb}mb.json")
    shutil.rmtree(root, ignore_errors=True)
    msgs = transcript(mb * 1024 * 1024 // 670)
    store = fsdurable.Store(root)
    store.create("big")
    step = -(-len(msgs) // 20)
    for i in range(step, len(msgs) + step, step):
        def grow(cur: fsdurable.Session, upto: int = i) -> fsdurable.Session:
            return attrs.evolve(cur, messages=msgs[:upto])

        store.patch("big", grow)
    whole = orjson.dumps([_codec._conv().unstructure(m) for m in msgs])
    with open(flat, "wb") as f:
        f.write(whole)
    return root, flat, len(msgs), len(whole)


def load_rss(base: str, env: dict[str, str], quick: bool) -> dict[str, Any]:
    mb = 1 if quick else 10
    root, flat, count, size = big_session(base, mb)
    where = {"fsdurable": root, "json_loads": flat, "interpreter": "-"}
    runs: dict[str, list[tuple[int, int]]] = {k: [] for k in where}
    for _ in range(3 if quick else 7):  # interleaved rounds: load hits them alike
        for kind, w in where.items():
            out = subprocess.run([sys.executable, "-c", LOAD_PROBE, kind, w], env=env,
                                 check=True, capture_output=True, text=True, timeout=600)
            n, peak = map(int, out.stdout.split())
            if kind != "interpreter" and n != count:
                raise AssertionError(f"{kind} read {n} messages, expected {count}")
            runs[kind].append((peak, n))
    med = {k: sorted(p for p, _ in v)[len(v) // 2] for k, v in runs.items()}
    res = {"messages": count, "bytes": size, "peak_rss_kb": med, "runs": len(runs["fsdurable"])}
    log(f"  load {size >> 20} MB: " + ", ".join(f"{k} {v / 1024:.1f} MB" for k, v in med.items()))
    return res


def probe(kind: str, root: str, env: dict[str, str], reps: int, *,
          traced: bool = True) -> dict[str, Any]:
    runs = []
    for _ in range(reps):
        out = subprocess.run([sys.executable, "-c", PROBE, kind, root, "1" if traced else "0"],
                             env=env, check=True, capture_output=True, text=True, timeout=600)
        runs.append(json.loads(out.stdout))
    runs.sort(key=lambda r: r["rss_peak_kb"])
    mid = runs[len(runs) // 2]
    return {**mid, "runs": len(runs)}


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    import os

    from .discovery import FULL, QUICK, datasets_for
    from .startup import child_env

    p = QUICK if quick else FULL
    datasets = datasets_for(p["ns"], quick)
    env = environment(datasets[-1].path)
    cenv = child_env(os.path.join(os.path.dirname(datasets[-1].path), "state"))
    rows = []
    for ds in datasets:
        ds.configure(10)
        row: dict[str, Any] = {"n": ds.n, "m": 10}
        for kind in ("fsdurable", "floor", "full_scan"):
            # the full scan is context, not a target: one process where it takes seconds
            big_scan = kind == "full_scan" and ds.n > 10_000
            row[kind] = probe(kind, ds.root, cenv, 1 if big_scan else 3, traced=not big_scan)
            if row[kind]["found"] != 10:
                raise AssertionError(f"{kind} found {row[kind]['found']} turns, expected 10")
        log(f"  memory n={ds.n}: " + ", ".join(
            f"{k} rss {row[k]['rss_peak_kb'] / 1024:.1f} MB traced {row[k]['traced_peak_bytes']}"
            for k in ("fsdurable", "floor", "full_scan")))
        rows.append(row)
    lo, hi = rows[0]["fsdurable"], rows[-1]["fsdurable"]
    rss_ratio = hi["rss_peak_kb"] / lo["rss_peak_kb"]
    traced_ratio = hi["traced_peak_bytes"] / max(1, lo["traced_peak_bytes"])
    targets = {"rss_largest_vs_smallest_n": {"value": rss_ratio, "target": "<= 1.05",
                                             "met": rss_ratio <= 1.05},
               "traced_peak_largest_vs_smallest_n": {"value": traced_ratio, "target": "<= 1.1",
                                                     "met": traced_ratio <= 1.1}}
    load = load_rss(os.path.dirname(datasets[-1].path), cenv, quick)
    pk = load["peak_rss_kb"]
    load_ratio = pk["fsdurable"] / pk["json_loads"]
    targets["load_rss_vs_json_loads"] = {"value": load_ratio, "target": "<= 1.2",
                                         "met": load_ratio <= 1.2}
    body = {"rows": rows, "load": load, "targets": targets}
    write_result(out_dir, "memory", env, body, quick=quick)
    return body


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
