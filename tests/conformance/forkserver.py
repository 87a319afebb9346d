"""A fork server for the conformance children: one process per driver that imports the driver's
framework once, then forks a child per run.

A child of the suite is ``python -m tests.conformance DRIVER ACTION ...`` (see ``harness``); a
fresh interpreter spends most of its life importing its framework (LangGraph, the Agents SDK,
Pydantic AI: 1-5 s each on a loaded 2-core machine), and the suite and the kill tortures start
hundreds of them. Here that import happens once: ``python -m tests.conformance.forkserver
DRIVER`` imports the driver module (and the modules its ``WARM`` tuple names), then serves
requests on stdin, one JSON line each (``argv``, ``env``, ``cwd``, ``out``, ``err``):

- it forks; the child takes the request's environment, working directory and argv, sends its
  stdout/stderr to the request's files, and returns out of the server loop to run the suite's
  ``main`` at the top level — so it exits as a fresh ``python -m`` process would: atexit
  handlers and thread joins run, an uncaught exception prints its traceback and exits 1, an
  uncaught ``KeyboardInterrupt`` dies of SIGINT; a SIGKILL is a real SIGKILL of a real process;
- the server answers ``pid <pid>`` at once and ``exit <pid> <returncode>`` (negative: the signal)
  when the child ends.

The server forks only while it is single-threaded (a fork of a threaded process copies locks
held by threads that do not exist in the child): if an import started a thread it answers
``nofork`` at startup and the harness runs real ``exec`` children instead. ``FSDC_EXEC=1`` makes
the harness always ``exec``. On EOF of stdin the server SIGKILLs the children still running and
exits.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
import threading
from typing import Any


def _reap(out: Any, live: set[int]) -> None:
    while live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        live.discard(pid)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        out.write(f"exit {pid} {code}\n")
        out.flush()


# what every driver's run imports lazily (the store's commit, locks, recovery; the CLI children
# of the suite are exec'd, not forked)
COMMON = ("fsdurable._store", "fsdurable._locks", "fsdurable._codec", "fsdurable._history",
          "fsdurable._turns", "fsdurable._recovery", "fsdurable._repair", "fsdurable._review")


def serve(driver: str, warm: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The server loop; returns a request in a forked child (None in the server at EOF).
    ``driver`` is a conformance driver, or ``-`` for a server of ``python -m MODULE`` children
    (``run_module``) that imports only ``warm`` (the framework and fsdurable modules): the
    child's module itself runs fresh in the child, so what it reads from its environment at
    import is the child's."""
    if driver != "-":
        mod = importlib.import_module(f"tests.conformance.drivers.{driver.replace('-', '_')}")
        warm = (*getattr(mod, "WARM", ()), "tests.conformance.__main__", *warm)
    for name in (*COMMON, *warm):
        importlib.import_module(name)
    out = sys.stdout
    if threading.active_count() != 1:
        out.write(f"nofork {threading.active_count()} threads after import\n")
        out.flush()
        return None
    out.write("ready\n")
    out.flush()
    live: set[int] = set()
    buf = b""
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.02)
        _reap(out, live)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # the test process is gone or done: no orphans
            for pid in live:
                os.kill(pid, signal.SIGKILL)
            return None
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return dict(req)
            live.add(pid)
            out.write(f"pid {pid}\n")
            out.flush()


def _become(req: dict[str, Any]) -> list[str]:
    """In the child: the request's stdio, environment, working directory; its argv."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for target, path in ((1, req["out"]), (2, req["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, target)
        os.close(f)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    argv = [str(a) for a in req["argv"]]
    sys.argv = ["-m", *argv]
    return argv


def main() -> int:
    driver = sys.argv[1]
    req = serve(driver, tuple(sys.argv[2:]))
    if req is None:
        return 0
    argv = _become(req)
    if driver == "-":  # argv: MODULE ARGS...: run it as ``python -m`` runs it
        import runpy

        sys.argv = [argv[0], *argv[1:]]
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        return 0
    from tests.conformance.__main__ import main as child_main

    return child_main(argv)


if __name__ == "__main__":
    sys.exit(main())
