"""``fsdurable demo``: real crashes, real recovery, five scenarios, one table.

A small scripted agent (a file-writing tool, an idempotent "send email" tool, a non-idempotent
"charge card" tool, a deny-listed "delete files" tool) runs its turn in a child process that is
SIGKILLed mid-turn; a fresh process then runs ``fsdurable.recover``. The parent checks what
happened — on disk, in the fake outside world and in the event log — and prints it.

The scripted setup is module-level so tests (and torture runs) can drive it from a child process:
``python -m fsdurable.demo turn|recover ...`` (see ``child_main``), or ``build_loop(store, world)``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .cli import Result, command

if TYPE_CHECKING:
    from ._model import Message
    from ._tools import Reply

KILL_ENV = "FSDURABLE_DEMO_KILL"  # "send_email" | "charge_card" | "model:<n>": SIGKILL there


# Windows has no SIGKILL: there os.kill(pid, SIGTERM) is TerminateProcess, just as abrupt (no
# cleanup, no flush, no finally), and the child's exit code is the signal number.
_KILL_SIGNAL = getattr(signal, "SIGKILL", signal.SIGTERM)
KILLED = -_KILL_SIGNAL if os.name != "nt" else int(_KILL_SIGNAL)  # the killed child's returncode


def kill_now() -> None:
    """Die the way an OOM kill or a power cut does: no cleanup, no flush, no finally."""
    os.kill(os.getpid(), _KILL_SIGNAL)


def _kill_point(name: str) -> None:
    if os.environ.get(KILL_ENV) == name:
        kill_now()


class World:
    """The fake outside world the tools act on: files, an email provider that drops a repeat
    of the same idempotency key, and a card processor that has no such key."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.join(path, "files"), mode=0o700, exist_ok=True)

    def _append(self, name: str, record: Mapping[str, Any]) -> None:
        with open(os.path.join(self.path, name), "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _read(self, name: str) -> list[dict[str, Any]]:
        try:
            with open(os.path.join(self.path, name), encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def emails(self) -> list[dict[str, Any]]:
        return self._read("outbox.jsonl")

    def charges(self) -> list[dict[str, Any]]:
        return self._read("charges.jsonl")

    def files(self) -> list[str]:
        return sorted(os.listdir(os.path.join(self.path, "files")))

    # -- the tools' bodies
    def write_file(self, ctx: Any, name: str, text: str) -> str:
        target = os.path.join(self.path, "files", os.path.basename(name))
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
        return f"wrote {len(text)} bytes to {os.path.basename(name)}"

    def send_email(self, ctx: Any, to: str, body: str) -> str:
        if any(e["key"] == ctx.idempotency_key for e in self.emails()):
            return f"already sent (key {ctx.idempotency_key})"  # the provider drops the repeat
        self._append("outbox.jsonl", {"key": ctx.idempotency_key, "to": to, "body": body,
                                      "session": ctx.session_id})
        _kill_point("send_email")  # accepted by the provider, outcome not yet committed
        return f"sent to {to}"

    def charge_card(self, ctx: Any, amount: int) -> str:
        self._append("charges.jsonl", {"amount": amount, "session": ctx.session_id})
        _kill_point("charge_card")  # charged, outcome not yet committed: in doubt
        return f"charged {amount}"

    def delete_files(self, ctx: Any) -> str:
        names = self.files()
        for n in names:
            os.unlink(os.path.join(self.path, "files", n))
        return f"deleted {len(names)} files"


def demo_tools(world: World, on_slow: threading.Event | None = None) -> list[Any]:
    from ._tools import Tool

    def slow_task(ctx: Any) -> str:
        if on_slow is not None:
            on_slow.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not ctx.cancelled():
            time.sleep(0.01)
        return "stopped early" if ctx.cancelled() else "finished"

    return [
        Tool("write_file", world.write_file, effect="idempotent",
             description="write a text file (same name, same text: a repeat changes nothing)"),
        Tool("send_email", world.send_email, effect="idempotent",
             description="send an email; the provider drops a repeat of the same key"),
        Tool("charge_card", world.charge_card, effect="external",
             description="charge the card on file (no idempotency key)"),
        Tool("delete_files", world.delete_files, effect="external",
             description="delete every file written so far"),
        Tool("slow_task", slow_task, description="a long computation that can be cancelled"),
    ]


def _scripts() -> dict[str, Any]:
    from ._tools import Reply, ScriptedModel, call

    def boot_loop(transcript: Sequence[Any]) -> Reply:
        kill_now()  # this model call kills the process, every time
        raise AssertionError("unreachable")

    notes = call("write_file", "w1", name="notes.txt", text="meeting notes")
    return {
        "fresh_email": ScriptedModel([
            Reply("Writing the notes and mailing them.",
                  [notes, call("send_email", "e1", to="ana@example.com", body="notes attached")]),
            Reply("Cleaning up the scratch files.", [call("delete_files", "d1")]),
        ], final="Notes written and mailed."),
        "fresh_charge": ScriptedModel([
            Reply("Charging the order.", [call("charge_card", "c1", amount=42)]),
        ], final="Order charged."),
        "stale": ScriptedModel([Reply("Writing the notes.", [notes])], final="Done."),
        "boot_loop": ScriptedModel([boot_loop]),
        "cancelled": ScriptedModel([Reply("Crunching.", [call("slow_task", "s1")])]),
        "disabled": ScriptedModel([Reply("Writing the notes.", [notes])], final="Done."),
    }


class DemoModel:
    """Dispatches on the ``[scenario]`` tag of the turn's user message; deterministic, so a
    fresh process continues a resumed turn with the right step."""

    def __init__(self) -> None:
        self.scripts = _scripts()

    def __call__(self, transcript: Sequence[Message], specs: Sequence[Mapping[str, Any]]
                 ) -> Reply:
        from ._tools import Reply, ScriptedModel

        user = next((m.content for m in reversed(transcript) if m.role == "user"), "")
        tag = user[1:user.index("]")] if user.startswith("[") and "]" in user else ""
        _kill_point(f"model:{ScriptedModel.step_index(transcript)}")
        model = self.scripts.get(tag)
        return model(transcript, specs) if model is not None else Reply("(no script)")


def build_loop(store: Any, world: World | str, *, on_slow: threading.Event | None = None) -> Any:
    """The demo agent on ``store``: ``AgentLoop(store, DemoModel(), demo_tools(world))``."""
    from ._loop import AgentLoop

    w = world if isinstance(world, World) else World(world)
    return AgentLoop(store, DemoModel(), demo_tools(w, on_slow))


PROMPTS = {
    "fresh_email": "Write up the meeting notes, mail them to Ana, then tidy up.",
    "fresh_charge": "Charge the customer for order 42.",
    "stale": "Write up the meeting notes.",
    "boot_loop": "Do the thing that crashes the model.",
    "cancelled": "Run the long analysis.",
    "disabled": "Write up the meeting notes.",
}


# ---------------------------------------------------------------------- child processes


def child_main(argv: Sequence[str]) -> int:
    """``turn``: create a desktop session and run its turn live (attended) until a kill point;
    ``recover``: run recovery on the named sessions and print the report as JSON."""
    p = argparse.ArgumentParser(prog="python -m fsdurable.demo")
    p.add_argument("mode", choices=("turn", "recover"))
    p.add_argument("--root", required=True)
    p.add_argument("--world", required=True)
    p.add_argument("--session", action="append", default=[])
    p.add_argument("--scenario", default="")
    p.add_argument("--clock-offset", type=float, default=0.0)
    p.add_argument("--disabled", action="store_true")
    a = p.parse_args(argv)
    from ._store import Store

    offset = a.clock_offset
    store = Store(a.root, clock=lambda: time.time() - offset)
    if a.mode == "recover":
        from ._recovery import RecoveryPolicy, recover

        policy = RecoveryPolicy.from_config(store.config)
        if a.disabled:
            policy = policy.replace(enabled=False)
        wanted = set(a.session)
        report = recover(store, build_loop(store, a.world), policy,
                         select=lambda m: m.session_id in wanted)
        print(json.dumps(report.to_dict()))
        return 0
    sid = a.session[0]
    store.create(sid, source="desktop")
    content = f"[{a.scenario}] {PROMPTS[a.scenario]}"
    if a.scenario != "cancelled":
        build_loop(store, a.world).run(sid, content, attended=True)
        return 0
    started = threading.Event()
    loop = build_loop(store, a.world, on_slow=started)
    t = threading.Thread(target=loop.run, args=(sid, content), kwargs={"attended": True},
                         daemon=True)
    t.start()
    started.wait(10)
    loop.cancel(sid)  # the user pressed stop ...
    kill_now()  # ... and the daemon died right after
    return 1


# ---------------------------------------------------------------------- the parent


class _Runner:
    def __init__(self, root: str | None, world: str) -> None:
        from ._layout import new_id
        from ._store import Store

        self.store = Store(root)
        self.world = World(world)
        self.run_id = new_id()[:8]
        self.env = dict(os.environ)
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.env["PYTHONPATH"] = pkg + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env.pop(KILL_ENV, None)

    def sid(self, scenario: str) -> str:
        return f"demo-{self.run_id}-{scenario.replace('_', '-')}"

    def child(self, *args: str, kill: str | None = None) -> tuple[int, str]:
        import subprocess

        env = dict(self.env)
        if kill:
            env[KILL_ENV] = kill
        p = subprocess.run([sys.executable, "-m", "fsdurable.demo", *args, "--root",
                            self.store.root, "--world", self.world.path], env=env,
                           capture_output=True, text=True, timeout=60, check=False)
        if p.returncode not in (0, KILLED):
            raise RuntimeError(f"demo child {args[:1]} failed ({p.returncode}):\n{p.stderr}")
        return p.returncode, p.stdout

    def crash(self, scenario: str, kill: str | None, *extra: str) -> bool:
        rc, _ = self.child("turn", "--session", self.sid(scenario), "--scenario", scenario,
                           *extra, kill=kill)
        return rc == KILLED

    def recover(self, *scenarios: str, disabled: bool = False) -> tuple[int, dict[str, Any]]:
        args = ["recover", *(x for s in scenarios for x in ("--session", self.sid(s)))]
        rc, out = self.child(*args, *(["--disabled"] if disabled else []))
        if rc != 0:
            return rc, {}
        rep = json.loads(out.strip().splitlines()[-1])
        return rc, {o["session_id"]: o for o in rep["outcomes"]}

    def codes(self, scenario: str) -> list[str]:
        return [e.code for e in self.store.events(self.sid(scenario))]

    def session(self, scenario: str) -> Any:
        return self.store.load(self.sid(scenario))


def _row(n: int, name: str, expected: str, outcome: str, evidence: list[str],
         ok: bool) -> dict[str, Any]:
    return {"n": n, "scenario": name, "expected": expected, "outcome": outcome,
            "evidence": evidence, "ok": ok}


def _scenarios(r: _Runner) -> list[dict[str, Any]]:
    from ._events import RESUMING, REVIEW_REQUIRED, TOOL_REFUSED

    rows = []
    # (1) fresh crash: email sent but its outcome not committed; a charge made, outcome unknown
    k1 = r.crash("fresh_email", "send_email")
    k2 = r.crash("fresh_charge", "charge_card")
    _, out = r.recover("fresh_email", "fresh_charge")
    oe, oc = out.get(r.sid("fresh_email"), {}), out.get(r.sid("fresh_charge"), {})
    emails = [e for e in r.world.emails() if e["session"] == r.sid("fresh_email")]
    charges = [c for c in r.world.charges() if c["session"] == r.sid("fresh_charge")]
    refused = [e for e in r.store.events(r.sid("fresh_email")) if e.code == TOOL_REFUSED]
    s1 = r.session("fresh_email")
    ok = (k1 and k2 and oe.get("outcome") == "resumed" and oe.get("status") == "completed"
          and len(emails) == 1 and any(e.detail.get("tool") == "delete_files"
                                       and e.detail.get("attended") is False for e in refused)
          and "notes.txt" in r.world.files() and not s1.in_progress
          and oc.get("outcome") == "review_required" and len(charges) == 1
          and REVIEW_REQUIRED in r.codes("fresh_charge") and RESUMING not in r.codes("fresh_charge")
          and "review_required" in r.session("fresh_charge").metadata)
    rows.append(_row(1, "fresh crash (desktop session)",
                     "resumed unattended; deny-listed tool refused; email once; charge parked",
                     f"{oe.get('outcome')} / {oc.get('outcome')}",
                     [f"emails sent: {len(emails)} (key reused, provider dropped the repeat)",
                      f"delete_files refused unattended: {bool(refused)}",
                      f"charges made: {len(charges)}, in-doubt charge parked for review"], ok))
    # (2) a checkpoint older than the staleness window (the child's clock runs 5 h behind)
    k = r.crash("stale", "model:1", "--clock-offset", str(5 * 3600))
    _, out = r.recover("stale")
    o = out.get(r.sid("stale"), {})
    ok = (k and o.get("outcome") == "abandoned" and o.get("reason") == "stale"
          and RESUMING not in r.codes("stale") and not r.session("stale").in_progress)
    rows.append(_row(2, "checkpoint 5 h old", "abandoned (stale) with an event, not run",
                     f"{o.get('outcome')} ({o.get('reason')})",
                     [f"age at recovery: {o.get('age', 0) / 3600:.1f} h > window 4 h"], ok))
    # (3) the model call kills the process every time: each restart counts one attempt
    k = r.crash("boot_loop", None)
    kills, o, starts = 0, {}, 0
    while starts < 8:
        starts += 1
        rc, out = r.recover("boot_loop")
        if rc != 0:
            kills += 1
            continue
        o = out.get(r.sid("boot_loop"), {})
        break
    resumes = r.codes("boot_loop").count(RESUMING)
    ok = (k and kills == 3 and resumes == 3 and o.get("outcome") == "abandoned"
          and o.get("reason") == "exhausted" and not r.session("boot_loop").in_progress)
    rows.append(_row(3, "model call crashes every time", "abandoned after exactly 3 attempts",
                     f"{o.get('outcome')} ({o.get('reason')})",
                     [f"recovery processes killed: {kills}, resume attempts: {resumes}, "
                      f"starts until settled: {starts}"], ok))
    # (4) the user cancels, then the daemon dies: the turn never comes back
    k = r.crash("cancelled", None)
    _, out = r.recover("cancelled")
    codes = r.codes("cancelled")
    ok = (k and r.sid("cancelled") not in out and "turn_cancelled" in codes
          and RESUMING not in codes and not r.session("cancelled").in_progress)
    rows.append(_row(4, "cancelled, then killed", "never resumed (no marker left)",
                     "not found" if r.sid("cancelled") not in out else "FOUND",
                     ["turn_cancelled committed before the kill; recovery saw no marker"], ok))
    # (5) recovery disabled: found, reported, marker kept, nothing run
    k = r.crash("disabled", "model:1")
    _, out = r.recover("disabled", disabled=True)
    o = out.get(r.sid("disabled"), {})
    ok = (k and o.get("verdict") == "disabled" and o.get("outcome") == "kept"
          and r.store.read_marker(r.sid("disabled")) is not None
          and RESUMING not in r.codes("disabled") and r.session("disabled").in_progress)
    rows.append(_row(5, "recovery disabled", "found and reported; not run; marker kept",
                     f"{o.get('verdict')} -> {o.get('outcome')}",
                     ["marker still on disk; no resume event"], ok))
    return rows


def run_demo(root: str | None = None, *, keep: bool = False) -> dict[str, Any]:
    """Run the five scenarios in a store of their own and return the results: ``root`` (created
    if needed), else a temporary store deleted afterwards (``keep``: kept). Never the user's
    default store, where an agent's ``recover`` could resume the demo's turns with real tools."""
    import shutil
    import tempfile

    t0 = time.monotonic()
    world = tempfile.mkdtemp(prefix="fsdurable-demo-world-")
    temp = None
    if root is None:
        temp = tempfile.mkdtemp(prefix="fsdurable-demo-")
        root = os.path.join(temp, "store")
    try:
        r = _Runner(root, world)
        rows = _scenarios(r)
        sids = {r.sid(s) for s in PROMPTS}
        events = [{"at": e.at, "code": e.code, "session_id": e.session_id, "reason": e.reason,
                   "detail": e.detail} for e in r.store.events() if e.session_id in sids]
        if not keep:
            for sid in sorted(sids):
                if r.store.exists(sid):
                    r.store.delete(sid)
    finally:
        shutil.rmtree(world, ignore_errors=True)
        if temp is not None and not keep:
            shutil.rmtree(temp, ignore_errors=True)
    return {"root": r.store.root, "temporary": temp is not None, "run_id": r.run_id,
            "ok": all(x["ok"] for x in rows),
            "kept": keep, "seconds": round(time.monotonic() - t0, 2), "scenarios": rows,
            "events": events}


def render(data: Mapping[str, Any]) -> str:
    from .cli import iso, table

    rows = [[str(x["n"]), x["scenario"], x["expected"], x["outcome"],
             "ok" if x["ok"] else "FAILED"] for x in data["scenarios"]]
    out = [table(rows, ["#", "scenario", "expected", "outcome", "check"]), ""]
    for x in data["scenarios"]:
        out += [f"({x['n']}) {x['scenario']}"] + [f"    {line}" for line in x["evidence"]]
    out += ["", "event log (this run's sessions):"]
    prefix = f"demo-{data['run_id']}-"
    ev_rows = []
    for e in data["events"]:
        detail = ", ".join(f"{k}={v}" for k, v in e["detail"].items()
                           if k in ("attempt", "tool", "attended", "age", "cap", "status"))
        ev_rows.append([iso(e["at"]), e["code"],
                        (e["session_id"] or "").removeprefix(prefix), e["reason"] or "", detail])
    out.append(table(ev_rows, ["at", "event", "session", "reason", "detail"]))
    verdict = "all scenarios behaved" if data["ok"] else "SOME SCENARIOS FAILED"
    if data.get("temporary"):
        where = (f"a temporary store, kept at {data['root']}" if data["kept"]
                 else "a temporary store, deleted (--keep keeps it)")
    else:
        where = f"store {data['root']}" + ("" if data["kept"] else
                                            " (demo sessions deleted; --keep keeps them)")
    out += ["", f"{verdict} in {data['seconds']} s; {where}"]
    return "\n".join(out)


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep", action="store_true",
                   help="keep the demo's store and sessions (printed at the end)")


@command("demo", args=_demo_args)
def _demo(args: argparse.Namespace) -> Result:
    """``--root`` is the demo's own store (never $FSDURABLE_ROOT); default: a temporary one."""
    data = run_demo(args.root, keep=args.keep)
    return (0 if data["ok"] else 1), data, render(data)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
