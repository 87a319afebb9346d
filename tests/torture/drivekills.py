"""The kill torture of a framework driver: its real runs SIGKILLed at random moments.

For any driver of the conformance suite (``tests/conformance/drivers``: ``langgraph`` — real
graph runs, ``durability="sync"`` —, ``pydantic_ai``, ``openai_agents``, ``loop``, ...), each
round starts a live run of scenario ``idem`` (a lookup, then an idempotent charge, then the final
reply) on its own thread/session in a child process, SIGKILLs it after a random delay, then runs
that driver's ``recover`` in child processes — each of which may be SIGKILLed too — until no run
of the thread is left interrupted. End-state checks, per thread:

- nothing is left in progress and no marker is left (every killed run settled);
- a thread whose run began either completed once (the reply ``paid``, exactly once) or was
  abandoned with an event (``interrupted_turn_abandoned``) — never dropped silently;
- every execution of ``charge`` carries the same idempotency key (a repeat is a re-run of the
  in-doubt call with its key, never a new call), and it ran at most once per kill that could have
  cut it short, plus one;
- the resumed executions were unattended.

    python -m tests.torture.drivekills --driver langgraph --kills 1000 [--seed N]

The children are forked from the conformance suite's fork server (the framework imported once:
``tests/conformance/forkserver.py``) — real processes, real SIGKILLs; ``FSDC_EXEC=1`` starts a
fresh interpreter for each instead (seconds a child).

CI runs a few kills per driver (tests/test_langgraph_turns.py, tests/test_kill_torture.py).
Figures: docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.conformance.harness import IDEM, World


def _kill_after(p: Any, delay: float) -> bool:
    """SIGKILL ``p`` ``delay`` seconds after it started unless it ended first; True if it was
    killed."""
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline:
        if p.poll() is not None:
            return False
        time.sleep(0.002)
    if p.poll() is not None:
        return False
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)
    return True


def _window(w: World, driver: str, sid: str) -> float:
    """How long a live run of ``sid`` takes from its start to its turn's end (the marker gone
    after it appeared): the span the kills are drawn from, so they land inside runs (a forked
    child starts at once; its exit after the turn ended takes as long again)."""
    marker = w.root / "markers" / f"{sid}.json"
    t0 = time.monotonic()
    p = w.start(driver, "live", sid, IDEM)
    seen = False
    while p.poll() is None:
        if marker.exists():
            seen = True
        elif seen:
            break
        time.sleep(0.001)
    took = time.monotonic() - t0
    p.communicate(timeout=120)
    return took


def run(base: str, *, kills: int, seed: int = 0, max_rounds: int | None = None,
        driver: str = "langgraph") -> dict[str, Any]:
    import fsdurable

    rng = random.Random(seed)
    root = Path(base) / "store"  # one store for every round: threads side by side
    done: dict[str, Any] = {"kills": 0, "cut_in_run": 0, "rounds": 0, "completed": 0,
                            "abandoned": 0, "not_started": 0, "resumes": 0, "charge_reruns": 0}
    violations: list[str] = []
    t = time.monotonic()
    from tests.conformance import forkclient

    forkclient.server(driver)  # the framework imported before the clock of a window starts
    spans = sorted(_window(World(root, Path(base) / f"effects-w{i}.jsonl"), driver, f"w{i}")
                   for i in range(3))
    span = 1.5 * spans[1]
    done["window_s"] = round(span, 3)
    while done["kills"] < kills and (max_rounds is None or done["rounds"] < max_rounds):
        sid = f"t{done['rounds']}"
        done["rounds"] += 1
        # an effects log per round: the polls and checks read this round's lines only
        w = World(root, Path(base) / f"effects-{sid}.jsonl")
        cut = 0
        p = w.start(driver, "live", sid, IDEM)
        if _kill_after(p, rng.uniform(0.0, span)):
            cut += 1
            st = fsdurable.Store(w.root)
            done["cut_in_run"] += any(m.session_id == sid for m in st.interrupted())
        else:
            _out, err = p.communicate(timeout=120)
            if p.returncode != 0:
                violations.append(f"{sid}: the live run failed: {err[-1500:]}")
        for _ in range(12):  # recover until nothing of the thread is interrupted
            st = fsdurable.Store(w.root)
            if not any(m.session_id == sid for m in st.interrupted()):
                break
            r = w.start(driver, "recover", sid, IDEM)
            done["resumes"] += 1
            if rng.random() < 0.3 and _kill_after(r, rng.uniform(0.0, span)):
                cut += 1
                continue
            _out, err = r.communicate(timeout=180)
            if r.returncode != 0:
                violations.append(f"{sid}: recover failed: {err[-1500:]}")
                break
        done["kills"] += cut
        violations += _check(w, sid, cut, done)
    done["seconds"] = round(time.monotonic() - t)
    return {**done, "violations": violations}


def _check(w: World, sid: str, cut: int, done: dict[str, Any]) -> list[str]:
    import fsdurable

    out: list[str] = []
    st = fsdurable.Store(w.root)
    if any(m.session_id == sid for m in st.interrupted()):
        out.append(f"{sid}: still interrupted after its recoveries")
    try:
        s = st.load(sid)
    except fsdurable.SessionNotFound:
        done["not_started"] += 1  # killed before the run's first checkpoint
        s = None
    if s is not None:
        if s.in_progress:
            out.append(f"{sid}: still in progress")
        replies = [m.content for m in s.messages if m.role == "assistant" and m.content]
        codes = [e.code for e in st.events(sid)]
        if replies == [IDEM.final]:
            done["completed"] += 1
        elif not replies and "interrupted_turn_abandoned" in codes:
            done["abandoned"] += 1
        elif not replies and "turn_started" not in codes:
            done["not_started"] += 1
        else:
            out.append(f"{sid}: replies {replies}, events {codes}")
    mine = [e for e in w.effects_log() if e["key"].startswith(f"{sid}:")]
    charges = [e for e in mine if e["tool"] == "charge" and e["what"] == "start"]
    if len({e["key"] for e in charges}) > 1:
        out.append(f"{sid}: charge ran under several keys {[e['key'] for e in charges]}")
    if len(charges) > cut + 1:
        out.append(f"{sid}: charge ran {len(charges)} times with {cut} kills")
    done["charge_reruns"] += max(0, len(charges) - 1)
    pids = sorted({e["pid"] for e in mine}, key=[e["pid"] for e in mine].index)
    for e in mine:
        if e["pid"] != pids[0] and e["attended"]:
            out.append(f"{sid}: a resumed execution was attended: {e}")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.torture.drivekills")
    ap.add_argument("--driver", default="langgraph")
    ap.add_argument("--kills", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix=f"fsd-{a.driver}-kills-") as base:
        res = run(base, kills=a.kills, seed=a.seed, driver=a.driver)
    print(json.dumps(res, indent=1))
    return 1 if res["violations"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
