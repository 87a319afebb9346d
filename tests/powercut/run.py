"""The driver: cut the power of a workload again and again, and judge every reboot.

``run(base, cuts=N)`` (run it in a process of its own: it forks) imports fsdurable and the
frameworks once, makes an ext4 image on a loop device, and for each cut:

1. forks the workload (``workload.run``) in a process group of its own, with a cut method:
   ``random`` (the driver issues the shutdown ioctl at a random moment, restart included), or a
   chosen operation (``workload.CUT_KINDS``: the workload issues it itself);
2. once the power is cut, waits a few milliseconds (the workload goes on meeting EIO, and
   must acknowledge nothing), SIGKILLs the group, unmounts, mounts again (journal replay);
3. forks a fresh checker (``check.check``) on the raw state and collects its verdict.

The next workload's start is the reboot: recovery and ``doctor --repair`` on what the cut left.
Every ``epoch`` cuts the filesystem is made anew (the stores stay small, the checks fast).
``variant`` breaks the store in the workload only (``workload.VARIANTS``); ``stop_at_first``
ends the run at the first violation (the teeth runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import sys
import time
from collections import Counter
from typing import Any

from tests.torture.kills import _die_with_parent

from . import check, workload
from .disk import Ext4, HarnessError, shutdown

__all__ = ["METHODS", "run"]

METHODS = ("random", *workload.CUT_KINDS)
# a chosen cut the workload never reaches (fewer operations than N) falls back to the driver's
CHOSEN_TIMEOUT = 4.0
# chosen-cut counts are drawn up to these (about the operations of one short workload run)
MAX_N = {"fsync": 120, "fsync_dir": 60, "rename": 40, "unlink": 30, "append": 25, "unmark": 10}
RANDOM_CUT = (0.05, 2.0)  # seconds after the workload's start: its restart included
AFTER_CUT = (0.005, 0.04)  # the workload runs on (every call failing) before the kill


def _child(fn: Any, *args: Any, stderr: str | None = None, **kw: Any) -> int:
    """Fork ``fn`` in a process group of its own (its subprocesses die with it), its stderr
    to the file ``stderr`` if given (the store's warnings about the dead disk)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)
            _die_with_parent()  # never a workload left running on the mount
            if stderr is not None:
                fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(fd, 2)
                os.close(fd)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            fn(*args, **kw)
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.setpgid(pid, pid)
    return pid


def _kill_group(pid: int) -> int:
    """SIGKILL the process group of ``pid``; its wait status."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return 0


def _checker(root: str, ack_files: list[str], out: str) -> None:
    res = check.check(root, ack_files)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(res, f)


def _preload() -> None:
    """Import everything the workload and the checker use, once: forks start at once."""
    import langgraph.checkpoint.conformance.test_utils  # noqa: F401
    import pydantic_ai.models.test  # noqa: F401

    import fsdurable._codec as codec
    import fsdurable.claude
    import fsdurable.langgraph
    import fsdurable.openai_agents
    import fsdurable.pydantic_ai  # noqa: F401
    import tests.torture.explorer  # noqa: F401  (the marker_after_session variant)

    codec._conv()


def _wait_for(fd: int, want: bytes, deadline: float) -> bool:
    """Read the status pipe until ``want`` arrives or ``deadline`` (monotonic) passes."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return False
        data = os.read(fd, 64)
        if not data:  # the workload died
            return False
        if want in data:
            return True


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # so the finally below unmounts and detaches


def run(base: str, *, cuts: int = 30, seed: int = 1, variant: str = "correct",
        epoch: int = 25, stop_at_first: bool = False, progress: bool = False,
        methods: tuple[str, ...] = METHODS, image_dir: str | None = None,
        max_seconds: float | None = None) -> dict[str, Any]:
    """Cut the power ``cuts`` times (or until ``max_seconds`` have passed); the figures and
    every violation (see the module docstring)."""
    _preload()
    previous = signal.signal(signal.SIGTERM, _terminate)
    rnd = random.Random(seed)
    disk = Ext4(image_dir or base)
    options = ""
    logs = os.path.join(base, "logs")
    os.makedirs(logs, exist_ok=True)
    violations: list[str] = []
    per: dict[str, Counter[str]] = {m: Counter() for m in methods}
    totals: Counter[str] = Counter()
    t0 = time.monotonic()
    done = 0
    ack_files: list[str] = []
    quarantined: set[str] = set()
    try:
        for k in range(cuts):
            if max_seconds is not None and time.monotonic() - t0 > max_seconds:
                break
            if k % epoch == 0:
                disk.format()
                options = disk.mount_options()
                ack_files = []
            root = os.path.join(disk.mnt, "store")
            method = methods[k % len(methods)]
            # half the chosen cuts count from the start (they land in the restart's recovery
            # too), half from the end of the restart (in the workload's own calls)
            cut = None if method == "random" else workload.Cut(
                method, rnd.randint(1, MAX_N[method]), after_restart=rnd.random() < 0.5)
            acks = os.path.join(logs, f"acks-{k}.jsonl")
            errs = os.path.join(logs, f"errors-{k}.jsonl")
            ack_files.append(acks)
            rfd, wfd = os.pipe()
            pid = _child(workload.run, root, acks, errs, gen=k, seed=rnd.randrange(1 << 30),
                         status_fd=wfd, mnt=disk.mnt, cut=cut, variant=variant,
                         stderr=os.path.join(logs, f"stderr-{k}.txt"))
            os.close(wfd)
            start = time.monotonic()
            cut_at = float("inf")  # a chosen cut: the workload logs when it issued it
            how = method
            try:
                if cut is None or not _wait_for(rfd, b"C", start + CHOSEN_TIMEOUT):
                    if cut is not None:
                        how = f"{method}->random"  # not reached: the driver cuts
                    else:
                        time.sleep(max(0.0, start + rnd.uniform(*RANDOM_CUT)
                                       - time.monotonic()))
                    cut_at = time.monotonic()
                    shutdown(disk.mnt)
                time.sleep(rnd.uniform(*AFTER_CUT))
            finally:
                wstatus = _kill_group(pid)
                os.close(rfd)
            disk.remount()
            verdict = os.path.join(logs, f"verdict-{k}.json")
            cpid = _child(_checker, root, list(ack_files), verdict)
            _, status = os.waitpid(cpid, 0)
            if status != 0 or not os.path.exists(verdict):
                raise HarnessError(f"cut {k}: the checker failed (status {status})")
            with open(verdict, encoding="utf-8") as f:
                res = json.load(f)
            found = [f"cut {k} ({how}, {variant}): {v}" for v in res["violations"]]
            if os.WIFEXITED(wstatus):  # it never lives to its end: something escaped it
                with open(os.path.join(logs, f"stderr-{k}.txt"), errors="replace") as f:
                    found.append(f"cut {k} ({how}): the workload died by itself: "
                                 f"{f.read()[-1500:]}")
            errors = check.read_acks(errs)
            cut_at = min([cut_at, *(e["t"] for e in errors if e.get("cut"))])
            for e in errors:
                if e.get("cut"):
                    continue
                if e["t"] < cut_at:
                    found.append(f"cut {k} ({how}): workload error before the cut: "
                                 f"{e['error']}")
                else:
                    totals["errors_after_cut"] += 1
            mine = check.read_acks(acks)
            per[method]["cuts"] += 1
            per[method]["acked"] += len(mine)
            per[method]["violations"] += len(found)
            if how != method:
                per[method]["fell_back_to_random"] += 1
            totals.update({s: n for s, n in res["stats"].items() if not s.startswith("acked")})
            # each acknowledged call is checked after its own cut and every later one of its
            # filesystem's epoch
            totals["ack_checks"] += sum(n for s, n in res["stats"].items()
                                        if s.startswith("acked_") and s != "acked_commits")
            violations += found
            # what doctor --repair moved aside, by kind (a temp file a cut left: expected)
            quarantined.update(q.split("-~")[0].split(",")[0] for q in res["quarantined"])
            done += 1
            if progress and (done % 10 == 0 or found):
                print(f"  {done} cuts, {len(violations)} violations, "
                      f"{time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
            if found and stop_at_first:
                break
    finally:
        disk.close()
        signal.signal(signal.SIGTERM, previous)
    return {"cuts": done, "variant": variant, "seconds": round(time.monotonic() - t0, 1),
            "violations": violations[:50], "violation_count": len(violations),
            "acknowledged": sum(c["acked"] for c in per.values()),
            "per_method": {m: dict(c) for m, c in per.items()}, "stats": dict(totals),
            "quarantined": sorted(quarantined),
            "mount_options": options}
