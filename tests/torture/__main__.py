"""``python -m tests.torture [--kills N] [--quick] [--exhaustive]``: run every proof and print
the figures table (crash states explored, mutations caught, kills, faults, hostile inputs,
violations — which must be 0). Exit status 1 if any violation was found."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any


def _explorer(args: argparse.Namespace, rows: list[tuple[str, Any]], bad: list[str]) -> None:
    from . import explorer

    scale = 1 if args.quick else (4 if args.exhaustive else 2)
    r = explorer.run(exhaustive=args.exhaustive, scale=scale)
    rows += [("workload: ops recorded / commits / sessions", f"{r.ops} / {r.commits} / "
              f"{r.sessions}"),
             ("crash points", r.crash_points), ("crash states explored", r.states),
             ("step 0: documents with an inline tail / segments written / inline tails "
              "flushed", f"{r.inline_docs} / {r.segments_written} / {r.flushes}")]
    bad += r.violations
    if not (r.inline_docs and r.flushes):  # both paths of step 0 (storage.md), or it says so
        bad.append(f"the explorer's workload took one path of step 0 only: {r.inline_docs} "
                   f"inline documents, {r.flushes} inline tails flushed")
    caught = 0
    for name in explorer.MUTANTS:
        with explorer.mutant(name) as impl:
            m = explorer.run(commit_impl=impl, stop_at_first=True)
        if m.violations:
            caught += 1
        else:
            bad.append(f"broken protocol {name} NOT caught")
    rows.append(("mutations caught", f"{caught}/{len(explorer.MUTANTS)}"))
    rows.append(("explorer seconds", f"{r.seconds:.1f}"))


def _faults(args: argparse.Namespace, rows: list[tuple[str, Any]], bad: list[str]) -> None:
    from . import faults

    n = 0
    for sc in faults.scenarios():
        with tempfile.TemporaryDirectory(prefix="fsd-fault-") as d:
            v = faults.run_scenario(sc, os.path.join(d, "store"))
        n += 1
        bad += [f"fault {sc.name}: {x}" for x in v]
    real = 0
    for name in faults.REAL:
        with tempfile.TemporaryDirectory(prefix="fsd-fault-") as d:
            v2 = faults.run_real(name, d)
        if v2 is None:
            continue
        real += 1
        bad += [f"fault {name}: {x}" for x in v2]
    rows.append(("faults injected + staged for real", f"{n} + {real}"))


def _hostile(args: argparse.Namespace, rows: list[tuple[str, Any]], bad: list[str]) -> None:
    from . import hostile

    with tempfile.TemporaryDirectory(prefix="fsd-hostile-") as d:
        n, v = hostile.survive(d)
    bad += v
    if not args.quick:
        for rel in [*sorted(hostile.load_index()), *hostile.GENERATED]:
            with tempfile.TemporaryDirectory(prefix="fsd-hostile-") as d:
                bad += hostile.survive(d, only=rel)[1]
    rows.append(("hostile inputs", n))


def _kills(args: argparse.Namespace, rows: list[tuple[str, Any]], bad: list[str]) -> None:
    from . import kills

    n = args.kills if args.kills is not None else (50 if args.quick else 200)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm, prefix="fsd-kill-") as base:
        res = kills.run(base, kills=n, workers=args.workers, seed=args.seed,
                        progress=n >= 1000,
                        max_seconds=args.minutes * 60 if args.minutes else None)
    bad += res["violations"]
    st = res["stats"]
    rows += [("kills (SIGKILL of a worker mid-loop, restarted)", res["kills"]),
             ("  turns completed / resumed / parked in doubt",
              f"{st.get('event_turn_completed', 0)} / "
              f"{st.get('event_interrupted_turn_resumed', 0)} / "
              f"{st.get('event_interrupted_turn_review_required', 0)}"),
             ("  acknowledged commits checked", st.get("acknowledged_commits", 0)),
             ("  idempotent re-sends dropped by key", st.get("tool_dedupe", 0)),
             ("kill torture seconds", res["seconds"])]


def _oacrash(args: argparse.Namespace, rows: list[tuple[str, Any]], bad: list[str]) -> None:
    """The item log's crash-state explorer (FileSession needs no openai-agents)."""
    from . import oacrash

    t = time.monotonic()
    r = oacrash.run(exhaustive=args.exhaustive)
    bad += r.violations
    caught = sum(1 for name in oacrash.OA_MUTANTS if oacrash.run_mutant(name).from_states)
    if caught < len(oacrash.OA_MUTANTS):
        bad.append("a broken Agents SDK item log protocol was NOT caught")
    rows += [("Agents SDK item log: crash points / states", f"{r.crash_points} / {r.states}"),
             ("  broken item log protocols caught", f"{caught}/{len(oacrash.OA_MUTANTS)}"),
             ("  item log seconds (explorer + mutants)", f"{time.monotonic() - t:.0f}")]


def _oakills(args: argparse.Namespace, rows: list[tuple[str, Any]], bad: list[str]) -> None:
    _oacrash(args, rows, bad)
    try:
        from . import oakills
    except ImportError:  # openai-agents is not installed
        rows.append(("Agents SDK kills", "skipped (openai-agents not installed)"))
        return
    n = args.oa_kills if args.oa_kills is not None else (20 if args.quick else 100)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm, prefix="fsd-oakill-") as base:
        res = oakills.run(base, kills=n, seed=args.seed, progress=n >= 500)
    bad += res["violations"]
    st = res["stats"]
    rows += [("Agents SDK kills (SIGKILL mid-run, restarted)", res["kills"]),
             ("  runs completed / resumed / parked in doubt",
              f"{st.get('event_turn_completed', 0)} / "
              f"{st.get('event_interrupted_turn_resumed', 0)} / "
              f"{st.get('event_interrupted_turn_review_required', 0)}"),
             ("  tool calls refused (deny-list / approval)",
              f"{st.get('refused_unattended_deny', 0)} / {st.get('refused_approval_denied', 0)}"),
             ("  idempotent re-sends dropped by key", st.get("tool_dedupe", 0)),
             ("  Agents SDK kill seconds", res["seconds"])]


def _langgraph(args: argparse.Namespace, rows: list[tuple[str, Any]], bad: list[str]) -> None:
    try:
        from . import lgcrash
    except ImportError:  # langgraph is not installed: the saver cannot be run
        rows.append(("langgraph saver", "skipped (langgraph not installed)"))
        return
    r = lgcrash.run(exhaustive=args.exhaustive)
    bad += r.violations
    caught = sum(1 for name in lgcrash.LG_MUTANTS if lgcrash.run_mutant(name).violations)
    if caught < len(lgcrash.LG_MUTANTS):
        bad.append("a broken LangGraph saver protocol was NOT caught")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm, prefix="fsd-lgkill-") as base:
        k = lgcrash.kills(base, stride=4 if args.quick else 1)
    bad += k["violations"]
    rows += [("langgraph saver: crash points / states", f"{r.crash_points} / {r.states}"),
             ("  broken saver protocols caught", f"{caught}/{len(lgcrash.LG_MUTANTS)}"),
             ("  kills at disk steps (put, put_writes, delete_thread)", k["kills"]),
             ("  langgraph seconds", f"{r.seconds + k['seconds']:.0f}")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.torture", description=__doc__)
    p.add_argument("--kills", type=int, default=None, help="kills in the kill torture "
                   "(default 200; 50 with --quick)")
    p.add_argument("--oa-kills", type=int, default=None, help="kills in the Agents SDK kill "
                   "torture (default 100; 20 with --quick)")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--minutes", type=float, default=None,
                   help="stop the kill torture after this long (the table says how many kills)")
    p.add_argument("--quick", action="store_true", help="smaller runs (a smoke test)")
    p.add_argument("--exhaustive", action="store_true",
                   help="explorer: more torn-write cuts, every subset of up to 6 pending "
                        "directory operations, a 4x workload")
    p.add_argument("--only", choices=("explorer", "faults", "hostile", "kills", "langgraph",
                                      "openai-agents"),
                   action="append")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fsd-torture-") as state:
        os.environ.setdefault("FSDURABLE_STATE_DIR", state)
        os.environ.setdefault("FSDURABLE_NODE", "node-torture")
        rows: list[tuple[str, Any]] = []
        bad: list[str] = []
        t = time.monotonic()
        parts = {"explorer": _explorer, "faults": _faults, "hostile": _hostile,
                 "kills": _kills, "langgraph": _langgraph, "openai-agents": _oakills}
        for name, fn in parts.items():
            if args.only and name not in args.only:
                continue
            fn(args, rows, bad)
        rows.append(("violations", len(bad)))
        rows.append(("total seconds", f"{time.monotonic() - t:.0f}"))
    width = max(len(k) for k, _ in rows)
    print(f"{'figure'.ljust(width)} | value")
    print(f"{'-' * width}-|------")
    for k, v in rows:
        print(f"{k.ljust(width)} | {v}")
    for b in bad[:30]:
        print("VIOLATION:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
