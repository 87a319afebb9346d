"""The test process's side of the fork server (``forkserver``): a ``Forked`` child looks like a
``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``communicate``, ``kill``, ``returncode``), so
the suite and the tortures use either without knowing which."""

from __future__ import annotations

import atexit
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class Server:
    """One fork server (a driver's framework imported once) and the exits it reports."""

    def __init__(self, driver: str, warm: tuple[str, ...] = ()) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.conformance.forkserver",
                                      driver, *warm], cwd=REPO, env=env, text=True, bufsize=1,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        first = self.proc.stdout.readline().strip()
        self.ok = first == "ready"
        self.why = first
        self._exits: dict[int, int] = {}
        self._pids: queue.Queue[int] = queue.Queue()
        self._cond = threading.Condition()
        self._mu = threading.Lock()
        self._seq = itertools.count()
        if self.ok:
            threading.Thread(target=self._read, name=f"forkserver-{driver}",
                             daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, *rest = line.split()
            if kind == "pid":
                self._pids.put(int(rest[0]))
            elif kind == "exit":
                with self._cond:
                    self._exits[int(rest[0])] = int(rest[1])
                    self._cond.notify_all()
        with self._cond:  # the server died: nobody will report an exit again
            self.ok = False
            self._cond.notify_all()

    def spawn(self, argv: list[str], env: Mapping[str, str], workdir: Path) -> Forked:
        logs = workdir / "children"
        logs.mkdir(parents=True, exist_ok=True)
        n = next(self._seq)
        out, err = logs / f"{os.getpid()}-{n}.out", logs / f"{os.getpid()}-{n}.err"
        for f in (out, err):  # there before the child: one SIGKILLed at once never makes them
            f.touch(mode=0o600)
        req = {"argv": argv, "env": dict(env), "cwd": str(REPO), "out": str(out),
               "err": str(err)}
        assert self.proc.stdin is not None
        with self._mu:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            pid = self._pids.get(timeout=60)
        return Forked(self, pid, out, err)

    def exit_of(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while pid not in self._exits:
                if not self.ok:
                    raise RuntimeError(f"the fork server died before child {pid} ended")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            return self._exits[pid]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Forked:
    """A child forked by a ``Server``: the ``subprocess.Popen`` calls the harness uses."""

    def __init__(self, server: Server, pid: int, out: Path, err: Path) -> None:
        self.server, self.pid, self.out, self.err = server, pid, out, err
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_of(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.exit_of(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return (self.out.read_text(errors="replace"), self.err.read_text(errors="replace"))

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_SERVERS: dict[str, Server | None] = {}
_LOCK = threading.Lock()


def server(driver: str) -> Server | None:
    """The fork server of ``driver`` (started on first use, kept for the test process), or None
    where children must be exec'd (``FSDC_EXEC=1``, or the server could not fork)."""
    key = driver.replace("-", "_")
    return _started(key, key, ())


def _started(key: str, driver: str, warm: tuple[str, ...]) -> Server | None:
    """The server kept under ``key``, started on first use; None if children must be exec'd."""
    if os.environ.get("FSDC_EXEC") == "1":
        return None
    with _LOCK:
        if key not in _SERVERS:
            s = Server(driver, warm)
            if not s.ok:
                print(f"forkserver: none for {driver} {warm} ({s.why}): exec children",
                      file=sys.stderr)
                s.close()
            _SERVERS[key] = s if s.ok else None
        got = _SERVERS[key]
    return got if got is not None and got.ok else None


def module_server(warm: tuple[str, ...]) -> Server | None:
    """A fork server of ``python -m MODULE`` children that has imported ``warm`` (a framework
    and the fsdurable modules its children use); None where children must be exec'd. The
    module itself runs fresh in each child (``Server.spawn([MODULE, *args], ...)``)."""
    return _started("-" + ",".join(warm), "-", warm)


@atexit.register
def _close_all() -> None:
    for s in _SERVERS.values():
        if s is not None:
            s.close()


Proc = subprocess.Popen[str] | Forked

__all__ = ["Forked", "Proc", "Server", "module_server", "server"]
