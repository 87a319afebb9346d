"""LangGraph ``put``, this checkout's saver beside another revision's, in one run.

Command: ``python -m bench.lgput --base main`` (``--quick``: fewer puts). The saver of revision
``--base`` is exported from git (``git archive``) into a scratch directory as the package
``fsdurable_base`` and imported beside this checkout's ``fsdurable``; both put onto threads of
their own stores, interleaved round by round with ``SqliteSaver`` (WAL, ``synchronous=FULL``:
one fsync per put) and ``synchronous=NORMAL`` (none). Figures: the median put, ratios of
medians to ``sqlite_full``, and the bytes one put writes (``/proc/self/io``: ``wchar`` passed to
write, ``write_bytes`` sent to the storage layer). No ``FSDURABLE_*`` variable is read or set.
Writes ``lgput.json`` (with ``--out``, else bench/results/tmp/). Fails if git or the revision
is missing: it never reports a figure it did not measure.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from ._harness import QUICK_RESULTS, cache_dir, environment, log, measure, ratio, write_result
from .langgraph import Putter, _append_floor, _sqlite, bytes_per_put

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_base(rev: str, into: str) -> Any:
    """The ``fsdurable`` package of revision ``rev``, imported as ``fsdurable_base``."""
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", REPO, "archive", sha, "fsdurable"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    os.rename(os.path.join(into, "fsdurable"), os.path.join(into, "fsdurable_base"))
    sys.path.insert(0, into)
    base = importlib.import_module("fsdurable_base")
    importlib.import_module("fsdurable_base.langgraph")
    assert base.__file__ is not None
    assert os.path.dirname(base.__file__) == os.path.join(into, "fsdurable_base")
    return base, sha


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lgput", description=__doc__)
    p.add_argument("--base", required=True, help="git revision of the saver to compare with")
    p.add_argument("--quick", action="store_true", help="fewer puts")
    p.add_argument("--out", default=None, help="directory for lgput.json")
    args = p.parse_args(argv)
    out = args.out or QUICK_RESULTS
    reps, history, budget = (20, 10, 1.0) if args.quick else (300, 50, 10.0)
    import fsdurable
    from fsdurable.langgraph import FsDurableSaver

    work = os.path.join(cache_dir(args.quick), "lgput-work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = environment(work)
    with tempfile.TemporaryDirectory(prefix="fsd-lgput-base-") as into:
        base, sha = load_base(args.base, into)
        new = FsDurableSaver(fsdurable.Store(os.path.join(work, "new"), node_id="bench"))
        savers = {
            "fsdurable": Putter(new, "t", history),
            "fsdurable_base": Putter(base.langgraph.FsDurableSaver(
                base.Store(os.path.join(work, "base"), node_id="bench")), "t", history),
            "sqlite_full": Putter(_sqlite(os.path.join(work, "full.db"), "FULL"), "t", history),
            "sqlite_normal": Putter(_sqlite(os.path.join(work, "normal.db"), "NORMAL"), "t",
                                    history),
        }
        floor = _append_floor(work, new, savers["fsdurable"])
        puts = measure({**{k: v.put for k, v in savers.items()}, "floor_append": floor},
                       min_reps=10, max_reps=reps, budget=budget)
        written = bytes_per_put({**savers, "floor_append": floor},
                                50 if not args.quick else 10)
    ratios = {f"{k}_vs_sqlite_full": ratio(puts[k], puts["sqlite_full"])
              for k in ("fsdurable", "fsdurable_base", "floor_append")}
    ratios["fsdurable_vs_floor_append"] = ratio(puts["fsdurable"], puts["floor_append"])
    ratios["fsdurable_vs_fsdurable_base"] = ratio(puts["fsdurable"], puts["fsdurable_base"])
    for k, v in puts.items():
        b = written[k]
        log(f"  {k:15s} put median {v['median'] * 1e3:7.3f} ms  p90 {v['p90'] * 1e3:7.3f} ms  "
            f"n={v['n']:4d}  wchar/put {b['wchar']:9,.0f}  "
            f"write_bytes/put {b['write_bytes']:9,.0f}")
    for k, r in ratios.items():
        log(f"  {k}: {r:.2f}x")
    body = {"base": {"rev": args.base, "sha": sha}, "put": puts, "bytes_per_put": written,
            "ratios": ratios,
            "targets": {"put_vs_sqlite_full": {"value": ratios["fsdurable_vs_sqlite_full"],
                                               "target": "<= 1.5",
                                               "met": ratios["fsdurable_vs_sqlite_full"] <= 1.5}}}
    write_result(out, "lgput", env, body, quick=args.quick, cleanup=work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
