"""``python -m bench`` runs every benchmark (full: minutes) and regenerates bench/README.md's
tables and the plots; ``python -m bench --quick`` is the smoke run (under a minute, results in
bench/results/tmp/quick/, README untouched). ``--only discovery,commit`` runs a subset."""

from __future__ import annotations

import argparse
import importlib
import time

from ._harness import QUICK_RESULTS, RESULTS, log

PARTS = ("startup", "discovery", "commit", "growth", "memory", "looplag", "adapters",
         "events", "langgraph", "pydantic_ai")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    p.add_argument("--out", default=None, help="directory for the JSON results")
    p.add_argument("--only", default="", help="comma-separated subset of " + ", ".join(PARTS))
    p.add_argument("--no-report", action="store_true", help="do not rewrite bench/README.md")
    args = p.parse_args(argv)
    out = args.out or (QUICK_RESULTS if args.quick else RESULTS)
    parts = [x.strip() for x in args.only.split(",") if x.strip()] or list(PARTS)
    for name in parts:
        if name not in PARTS:
            p.error(f"unknown part {name!r}")
    t0 = time.perf_counter()
    for name in parts:
        log(f"== {name}")
        t = time.perf_counter()
        importlib.import_module(f"bench.{name}").run(args.quick, out)
        log(f"== {name} done in {time.perf_counter() - t:.1f}s")
    if not args.quick and not args.no_report and out == RESULTS:
        from . import report

        report.main([])
    log(f"all done in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
