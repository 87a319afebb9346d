"""Shared measuring machinery: interleaved timing, percentiles, the environment header, JSON out.

Interleaving: every round times each contender once (a contender that has used up its time budget
and has its minimum sample count sits the rest out), so background load hits all contenders alike
and ratios taken from one run are meaningful even on a shared machine.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")
QUICK_RESULTS = os.path.join(RESULTS, "tmp", "quick")
SCHEMA = "fsdurable.bench/1"


def cache_dir(quick: bool) -> str:
    """Generated data sets (big, never committed), reused between runs."""
    base = os.environ.get("FSDURABLE_BENCH_CACHE") or os.path.join(
        tempfile.gettempdir(), "fsdurable-bench-cache")
    return os.path.join(base, "quick" if quick else "full")


def stats(samples: list[float]) -> dict[str, Any]:
    """Median / p90 / p99 / min in seconds, and the sample count."""
    xs = sorted(samples)
    n = len(xs)

    def pct(p: float) -> float:
        if n == 1:
            return xs[0]
        k = (n - 1) * p
        lo = int(k)
        hi = min(lo + 1, n - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return {"median": statistics.median(xs), "p90": pct(0.90), "p99": pct(0.99),
            "min": xs[0], "n": n}


def measure(contenders: Mapping[str, Callable[[], Any]], *, min_reps: int = 5,
            max_reps: int = 200, budget: float = 5.0, warmup: int = 1,
            setup: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Time each contender, interleaved round by round.

    A contender stops once it has ``max_reps`` samples, or ``min_reps`` samples and more than
    ``budget`` seconds of measured time. ``setup(name)``, if given, runs untimed before each call.
    """
    for name, fn in contenders.items():
        for _ in range(warmup):
            if setup:
                setup(name)
            fn()
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    spent = dict.fromkeys(contenders, 0.0)
    active = list(contenders)
    while active:
        for name in list(active):
            if setup:
                setup(name)
            fn = contenders[name]
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            samples[name].append(dt)
            spent[name] += dt
            n = len(samples[name])
            if n >= max_reps or (n >= min_reps and spent[name] > budget):
                active.remove(name)
    return {k: stats(v) for k, v in samples.items()}


def ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Ratio of two medians (a / b)."""
    return float(a["median"] / b["median"])


def fsync_latency(directory: str, reps: int = 50) -> dict[str, Any]:
    """Measured latency of one small write + fsync on the filesystem of ``directory``."""
    path = os.path.join(directory, f".fsync-probe-{os.getpid()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    xs = []
    try:
        for i in range(reps):
            os.pwrite(fd, str(i).encode() * 64, 0)
            t0 = time.perf_counter()
            os.fsync(fd)
            xs.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return stats(xs)


def fs_type(path: str) -> str:
    """Filesystem type of ``path`` (from /proc/mounts on Linux, ``df``/``mount`` elsewhere)."""
    path = os.path.realpath(path)
    try:
        best = ("", "unknown")
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mnt = parts[1].replace("\\040", " ")
                    if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and \
                            len(mnt) > len(best[0]):
                        best = (mnt, parts[2])
        return best[1]
    except OSError:
        pass
    try:
        out = subprocess.run(["df", "-T", path], capture_output=True, text=True, timeout=10)
        return out.stdout.splitlines()[-1].split()[1]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def environment(data_dir: str) -> dict[str, Any]:
    """The header every result file carries: what ran, where, on what disk."""
    os.makedirs(data_dir, exist_ok=True)
    try:
        load = list(os.getloadavg())
    except OSError:
        load = []
    # FSDURABLE_BENCH_COMMIT: the commit a clean export (``git archive``) was made from
    commit = os.environ.get("FSDURABLE_BENCH_COMMIT", "")
    source = f"clean export of {commit}" if commit else "working tree"
    if not commit:
        try:
            commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "fsdurable"],
                                   capture_output=True, text=True, timeout=10).stdout.split("\n")
            changed = sorted(line[3:] for line in dirty if line.strip())
            if changed:
                source = "working tree with uncommitted changes in " + ", ".join(changed)
        except (OSError, subprocess.SubprocessError):
            pass
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "filesystem": fs_type(data_dir),
        "data_dir": data_dir,
        "fsync_latency": fsync_latency(data_dir),
        "loadavg_at_start": load,
        "git_commit": commit,
        "source": source,
        "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def write_result(out_dir: str, name: str, env: dict[str, Any], body: dict[str, Any],
                 *, quick: bool, cleanup: str | None = None) -> str:
    """Write ``<out_dir>/<name>.json`` (atomic replace), say so, remove the scratch directory
    ``cleanup`` if given, and return the path."""
    os.makedirs(out_dir, exist_ok=True)
    doc = {"schema": SCHEMA, "bench": name, "quick": quick, "environment": env, **body}
    path = os.path.join(out_dir, name + ".json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    log(f"wrote {path}")
    if cleanup is not None:
        shutil.rmtree(cleanup, ignore_errors=True)
    return path


def run_child(cmd: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
              kill_after: float = 300.0) -> int:
    """Run ``cmd`` (output discarded) and return its exit status, for timing a process: it waits
    with one blocking ``waitpid``. ``subprocess.run(..., timeout=...)`` polls with a doubling
    sleep (0.5, 1, 2, ... 32 ms, then 50 ms steps), which rounds every process's end up to the
    next poll: a 20 ms and a 30 ms start both measured as ~32 ms. A watchdog kills a child
    still running after ``kill_after`` seconds."""
    import threading

    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    watchdog = threading.Timer(kill_after, p.kill)
    watchdog.start()
    try:
        code = p.wait()
    finally:
        watchdog.cancel()
        if p.returncode is None:  # interrupted (Ctrl-C): leave no child behind
            p.kill()
            p.wait()
    if code < 0:
        raise RuntimeError(f"{cmd[0]} killed by signal {-code} (after {kill_after} s?)")
    return code


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def script_main(run: Any, doc: str | None, argv: list[str] | None) -> int:
    """The ``main`` of every ``bench/<part>.py``: ``--quick`` and ``--out``, then ``run``."""
    args = parse_args(argv, doc or "")
    run(args.quick, args.out)
    return 0


def parse_args(argv: list[str] | None, description: str) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    p.add_argument("--out", default=None, help="directory for the JSON results")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = QUICK_RESULTS if args.quick else RESULTS
    return args
