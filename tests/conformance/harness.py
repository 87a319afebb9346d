"""The driver conformance suite's harness: one scenario language, real child processes, SIGKILL.

The chapter's pitfalls (§40.4-40.8) are checked once, in ``tests/test_conformance.py``, against
EVERY driver of the turn protocol. A driver is a module ``tests/conformance/drivers/<name>.py``
that runs a ``Scenario`` with its framework's real package and offline test model, inside a child
process (``python -m tests.conformance DRIVER ACTION ROOT SID SCENARIO``). It implements:

- ``DRIVER``: the driver id the turn records (``Turn.driver``: loop, langgraph, openai-agents, ...);
- ``live(store, sid, scenario, *, attended, approve) -> dict``: one live turn of ``scenario`` on
  session ``sid`` (``approve``: the live caller's answer to every approval request, asked only when
  ``attended``). Returns ``{"status": ..., "reply": ...}``;
- ``recover(store, scenario, *, fail) -> list[dict]``: this driver's startup recovery, as a host
  calls it (``fail``: the program's model raises on every call — a resume that fails). Returns the
  report's outcomes (``Outcome.to_dict()``);
- ``proceed(store, sid, scenario) -> dict``: continue the session in its own framework after a human
  answered its parked calls: a new live, attended turn whose user input is ``CONTINUE``; the model
  of every driver answers a ``CONTINUE`` turn with the final reply at once. It must complete.

Every tool of a scenario is run by the driver's framework and must call ``perform(name, args, key,
attended)`` — the one body of every test tool: it logs the execution to the effects log (outside the
store, fsynced), and honours the crash and sleep points of the environment:

- ``FSDC_CRASH=<tool>:before`` / ``<tool>:after`` — SIGKILL this process inside the tool, before
  or after its effect is logged (``<tool>:after``: the effect happened, its result never returned);
- ``FSDC_RAISE=<tool>:after`` — raise ``KeyboardInterrupt`` inside the tool after its effect is
  logged (a Ctrl-C: the run ends by an exception no tool wrapper may swallow);
- ``FSDC_SLEEP=<tool>:<seconds>`` — the tool sleeps (after logging ``start``), so the parent can act
  while the run is live (a second process's recover, a cancel);
- ``FSDC_CONFIG`` — JSON overrides of the store's ``Config`` (``store_for``).

The model of every scenario is a script of tool-call batches followed by a final reply; the step to
play is derived from the conversation (how many batches have been answered), so a resumed run in a
fresh process gets the step the dead one would have got.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .forkclient import Proc
from .forkclient import server as _server

REPO = Path(__file__).resolve().parents[2]
CONTINUE = "continue"  # a proceed turn's input: every driver's model answers it with the final one


@dataclass(frozen=True)
class ToolSpec:
    """A test tool: its effect (``none``/``idempotent``/``external``) and whether it needs a
    human's approval."""

    name: str
    effect: str = "none"
    needs_approval: bool = False


@dataclass(frozen=True)
class Scenario:
    """Tools, the model's script (a list of batches of ``(tool, arguments)`` calls) and the
    final reply."""

    name: str
    tools: tuple[ToolSpec, ...]
    steps: tuple[tuple[tuple[str, dict[str, Any]], ...], ...]
    final: str = "done"

    def tool(self, name: str) -> ToolSpec:
        return next(t for t in self.tools if t.name == name)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        d = json.loads(text)
        return cls(name=d["name"], tools=tuple(ToolSpec(**t) for t in d["tools"]),
                   steps=tuple(tuple((c[0], dict(c[1])) for c in b) for b in d["steps"]),
                   final=d["final"])


# A lookup without effect, then a charge with an external effect: what a card payment looks like.
PAY = Scenario("pay", (ToolSpec("lookup"), ToolSpec("charge", "external")),
               ((("lookup", {"q": "order-7"}),), (("charge", {"amount": 5, "to": "acme"}),)),
               final="paid")
# The same, with a charge that accepts an idempotency key (a repeat with the same key is a no-op).
IDEM = Scenario("idem", (ToolSpec("lookup"), ToolSpec("charge", "idempotent")),
                ((("lookup", {"q": "order-7"}),), (("charge", {"amount": 5, "to": "acme"}),)),
                final="paid")
# A tool that needs a human's approval, then one on the unattended deny-list (Config's "shell").
GUARDED = Scenario("guarded", (ToolSpec("lookup"), ToolSpec("publish", needs_approval=True),
                               ToolSpec("shell")),
                   ((("lookup", {"q": "draft"}),), (("publish", {"post": "hello"}),),
                    (("shell", {"cmd": "rm -rf ~/build"}),)),
                   final="finished")
SCENARIOS = {s.name: s for s in (PAY, IDEM, GUARDED)}


# ---------------------------------------------------------------------- inside the child


def perform(name: str, args: Mapping[str, Any], key: str, attended: bool) -> str:
    """The body of every test tool (see the module doc). Returns the tool's result text."""
    crash = os.environ.get("FSDC_CRASH", "")
    sleep = os.environ.get("FSDC_SLEEP", "")
    _log("start", name, args, key, attended)
    if sleep.startswith(name + ":"):
        time.sleep(float(sleep.split(":", 1)[1]))
    if crash == f"{name}:before":
        os.kill(os.getpid(), signal.SIGKILL)
    _log("effect", name, args, key, attended)
    if crash == f"{name}:after":
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("FSDC_RAISE") == f"{name}:after":  # Ctrl-C right after the effect
        raise KeyboardInterrupt
    return f"{name} ok"


def _log(what: str, name: str, args: Mapping[str, Any], key: str, attended: bool) -> None:
    path = os.environ.get("FSDC_EFFECTS")
    if not path:
        return
    line = json.dumps({"what": what, "tool": name, "args": dict(args), "key": key,
                       "attended": attended, "pid": os.getpid()}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def store_for(root: str) -> Any:
    """The store a driver runs on: ``FSDC_CONFIG`` overrides of the default ``Config`` (no
    debounce by default, so every phase boundary is a checkpoint the suite can crash after)."""
    import fsdurable

    over = {"checkpoint_debounce": 0.0, **json.loads(os.environ.get("FSDC_CONFIG") or "{}")}
    if "unattended_deny" in over:
        over["unattended_deny"] = frozenset(over["unattended_deny"])
    return fsdurable.Store(root, config=fsdurable.Config().replace(**over))


def step_of(answered_batches: int, sc: Scenario) -> tuple[tuple[str, dict[str, Any]], ...] | None:
    """The batch the model plays after ``answered_batches`` answered batches (None: the final
    reply)."""
    return sc.steps[answered_batches] if answered_batches < len(sc.steps) else None


class ModelFailure(RuntimeError):
    """The model of a ``fail=True`` recover: every call raises (a resume that fails)."""


# ---------------------------------------------------------------------- in the test process


@dataclass
class Child:
    """One child run's result: its exit code, its JSON answer (None if it died), its stderr."""

    returncode: int
    answer: Any
    stderr: str


@dataclass
class World:
    """A store root, an effects log and the environment the children share."""

    root: Path
    effects: Path
    config: dict[str, Any] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env["FSDC_EFFECTS"] = str(self.effects)
        env["FSDC_CONFIG"] = json.dumps(self.config)
        env.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
        for k in ("FSDC_CRASH", "FSDC_SLEEP", "FSDC_RAISE"):
            env.pop(k, None)
        env.update(extra)
        return env

    def start(self, driver: str, action: str, sid: str, sc: Scenario, *flags: str,
              **env: str) -> Proc:
        """A child run, forked from the driver's fork server (``forkserver``: its framework
        imported once) or, where that cannot fork or ``FSDC_EXEC=1``, a fresh interpreter."""
        argv = [driver, action, str(self.root), sid, sc.name, *flags]
        server = _server(driver)
        if server is None:
            return subprocess.Popen([sys.executable, "-m", "tests.conformance", *argv], cwd=REPO,
                                    env=self.env(**env), text=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
        return server.spawn(argv, self.env(**env), self.root.parent)

    def run(self, driver: str, action: str, sid: str, sc: Scenario, *flags: str,
            timeout: float = 120, **env: str) -> Child:
        p = self.start(driver, action, sid, sc, *flags, **env)
        out, err = p.communicate(timeout=timeout)
        return finished(p, out, err)

    def effects_log(self) -> list[dict[str, Any]]:
        if not self.effects.exists():
            return []
        return [json.loads(x) for x in self.effects.read_text().splitlines() if x.strip()]

    def effects_of(self, tool: str, what: str = "effect") -> list[dict[str, Any]]:
        return [e for e in self.effects_log() if e["tool"] == tool and e["what"] == what]

    def wait_for(self, tool: str, what: str = "start", timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.effects_of(tool, what):
            if time.monotonic() > deadline:
                raise AssertionError(f"{tool} never reached {what!r}: {self.effects_log()}")
            time.sleep(0.02)


def forked(driver: str) -> bool:
    """Are ``driver``'s children forked from its fork server (started in milliseconds) rather
    than exec'd (seconds: a fresh interpreter imports the framework first)?"""
    return _server(driver) is not None


def finished(p: Proc, out: str, err: str) -> Child:
    answer = None
    lines = [x for x in out.splitlines() if x.strip()]
    if lines:
        try:
            answer = json.loads(lines[-1])
        except ValueError:
            answer = None
    return Child(p.returncode, answer, err)


def outcomes_for(child: Child, sid: str) -> list[dict[str, Any]]:
    assert child.returncode == 0, child.stderr
    return [o for o in child.answer["outcomes"] if o["session_id"] == sid]


def answered_batches(calls_answered: Sequence[str]) -> int:
    return len(calls_answered)


__all__ = ["CONTINUE", "GUARDED", "IDEM", "PAY", "SCENARIOS", "Child", "ModelFailure", "Proc",
           "Scenario", "ToolSpec", "World", "forked", "outcomes_for", "perform", "step_of",
           "store_for"]
