"""Kill torture: worker processes run agent loops on one shared store and are SIGKILLed at random.

The driver (``run``; run it in a process of its own: it forks) imports fsdurable once and forks
``workers`` children. Each child opens the store, runs startup recovery, then loops at random:
live turns (attended or not) on its own and on shared sessions, read-modify-write patches of a
shared counter, cancels of any session's turn, recovery again; every ``ROTATE`` kills the
restarted workers move to new session ids (the old sessions, interrupted turns and all, stay
for recovery). Its tools act on a "world" directory outside the store:

* ``charge`` is ``external`` (no key): every execution appends a line — never twice per call;
* ``send`` is ``idempotent``: the provider dedupes by the idempotency key (``O_EXCL`` file);
  an application appends ``apply``, a dropped repeat ``dedupe``;
* ``approve_me`` needs approval: it must never run in a resumed (unattended) turn;
* every tool logs the ``attended``/``resumed`` the loop gave it.

After every kill (the others keep running) the driver checks every session that changed,
holding each session's commit lock so that no commit is half-seen: every session and marker
parses; in progress => marker of the same turn; resume attempts never above the cap; no temp
file under a final name. At the end it stops everyone, runs recovery and ``doctor --repair``
and checks the world: no lost update (every acknowledged counter value unique and <= the final
one), no acknowledged version lost, no idempotent effect applied twice, no external call run
twice, recovery never attended.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from typing import Any

import attrs

from fsdurable._config import Config
from fsdurable._errors import FsDurableError
from fsdurable._model import ToolCall

CAP = 3
SHARED = ("shared-0", "shared-1")
# A session file is rewritten whole at each commit, so its cost grows with its history: without
# rotation a 10,000-kill run slows quadratically (the shared sessions reached megabytes). Every
# ROTATE kills the restarted workers move to a new generation of session ids; the old sessions
# stay in the store, with whatever turns the kills interrupted, for every later recovery to find.
ROTATE = 500


def shared_ids(gen: int) -> tuple[str, ...]:
    return SHARED if gen == 0 else tuple(f"{sid}-g{gen}" for sid in SHARED)


def own_ids(wid: int, gen: int) -> list[str]:
    return [f"w{wid}-{k}" + (f"-g{gen}" if gen else "") for k in range(3)]


def _config() -> Config:
    # short lock waits: a worker stuck behind a killed holder retries instead of idling; no
    # debounce, so kills land between many checkpoints
    return Config(route_lock_timeout=2.0, commit_lock_timeout=5.0, checkpoint_debounce=0.0,
                  max_resume_attempts=CAP)


def _append(path: str, rec: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)


def make_loop(store: Any, world: str, wid: int) -> Any:
    from fsdurable._loop import AgentLoop
    from fsdurable._tools import Reply, ScriptedModel, Tool

    log = os.path.join(world, f"tools-{wid}.jsonl")

    def note(kind: str, ctx: Any, **kw: Any) -> None:
        _append(log, {"kind": kind, "sid": ctx.session_id, "tid": ctx.turn_id,
                      "cid": ctx.tool_call_id, "key": ctx.idempotency_key,
                      "attended": ctx.attended, "resumed": ctx.resumed, **kw})

    def charge(ctx: Any, amount: int = 1) -> str:
        note("external", ctx)
        time.sleep(random.uniform(0, 0.004))
        return "charged"

    def send(ctx: Any, to: str = "x") -> str:
        time.sleep(random.uniform(0, 0.003))
        try:
            fd = os.open(os.path.join(world, "idem", ctx.idempotency_key.replace(":", "_")),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            note("dedupe", ctx)
            return "already sent"
        os.close(fd)
        note("apply", ctx)
        return "sent"

    def lookup(ctx: Any, q: str = "") -> str:
        note("none", ctx)
        return "42"

    def approve_me(ctx: Any) -> str:
        note("approved", ctx)
        return "approved action done"

    def slow(transcript: Any) -> Reply:
        time.sleep(random.uniform(0, 0.004))
        return Reply("thinking", (ToolCall("c3", "charge", {"amount": 1}),
                                  ToolCall("c4", "approve_me", {})))

    model = ScriptedModel([
        Reply("", (ToolCall("c1", "lookup", {"q": "a"}), ToolCall("c2", "send", {"to": "b"}))),
        slow,
    ], final="done")
    tools = [Tool("charge", charge, effect="external"), Tool("send", send, effect="idempotent"),
             Tool("lookup", lookup), Tool("approve_me", approve_me, needs_approval=True)]
    return AgentLoop(store, model, tools, approve=lambda ctx, call: True)


def worker(root: str, world: str, wid: int, seed: int, gen: int = 0) -> None:
    """The body of a forked child; never returns (it is killed). ``gen``: the generation of
    session ids it works on (see ``ROTATE``)."""
    from fsdurable._recovery import recover
    from fsdurable._store import Store

    random.seed(seed)
    acks = os.path.join(world, f"acks-{wid}.jsonl")
    errors = os.path.join(world, f"errors-{wid}.jsonl")
    st = Store(root, config=_config())
    loop = make_loop(st, world, wid)
    own, shared = own_ids(wid, gen), list(shared_ids(gen))

    def guarded(fn: Any) -> Any:
        try:
            return fn()
        except FsDurableError:
            return None  # a conflict, a busy lock, a turn in progress: normal under contention
        except Exception as e:
            _append(errors, {"error": f"{type(e).__name__}: {e}"})
            return None

    guarded(lambda: recover(st, loop))
    for sid in own + shared:  # a shared one may be created by another worker meanwhile
        if not st.exists(sid):
            guarded(lambda sid=sid: st.create(sid, metadata={"n": 0}))
    while True:
        r = random.random()
        sid = random.choice(own + shared)
        if r < 0.55:
            res = guarded(lambda sid=sid: loop.run(sid, "go", attended=random.random() < 0.5))
            if res is not None and res.session is not None:
                _append(acks, {"sid": sid, "version": res.session.version})
        elif r < 0.85:
            def inc(s: Any) -> Any:
                return attrs.evolve(s, metadata={**s.metadata, "n": s.metadata.get("n", 0) + 1})

            s = guarded(lambda: st.patch(random.choice(shared), inc))
            if s is not None:
                _append(acks, {"sid": s.id, "version": s.version, "n": s.metadata["n"]})
        elif r < 0.93:
            guarded(lambda sid=sid: st.cancel(sid))
        else:
            guarded(lambda: recover(st, loop))


# ---------------------------------------------------------------------- checks


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n"):
        if line.strip():
            with contextlib.suppress(ValueError):  # a line torn by the kill
                out.append(json.loads(line))
    return out


RACY_WINDOW_NS = 2_000_000_000  # fsdurable._filecache.RACY_WINDOW


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def check_live(store: Any, seen: dict[str, Any] | None = None) -> list[str]:
    """Invariants that hold at every instant, read under each session's commit lock.

    ``seen`` (kept by the caller between checks): a session whose file and marker are the very
    files checked last time (inode, size, mtime) is not parsed again — its findings cannot
    have changed — so a check costs what changed since the last one, not the whole store."""
    from fsdurable._codec import parse_marker, parse_session
    from fsdurable._names import NameKind, classify

    out = []
    lay = store.layout
    ids = set()
    for d in (lay.sessions, lay.markers):
        for name in os.listdir(d):
            kind, sid = classify(name)
            if kind is NameKind.OWN and sid:
                ids.add(sid)
    for sid in sorted(ids):
        with store._commit_lock(sid):
            s = m = None
            if seen is not None:
                key = (_stat(lay.session(sid)), _stat(lay.marker(sid)))
                if seen.get(sid) == key:
                    continue
                # a stat younger than a timestamp granule may repeat after a replace (the
                # store's own "racily clean" rule): such files are checked again next time
                young = time.time_ns() - RACY_WINDOW_NS
                if any(st is not None and st[2] > young for st in key):
                    seen.pop(sid, None)
                else:
                    seen[sid] = key
            try:
                with open(lay.session(sid), "rb") as f:
                    s, _ = parse_session(f.read(), history_dir=lay.history_dir(sid))
                # every document on disk names segments that are on disk, whole (storage.md)
                if len(tuple(s.messages)) != len(s.messages):
                    out.append(f"session {sid}: its history reads short")
            except FileNotFoundError:
                pass
            except Exception as e:
                out.append(f"session {sid} does not parse or its history does not read: {e}")
            try:
                with open(lay.marker(sid), "rb") as f:
                    m = parse_marker(f.read())
            except FileNotFoundError:
                pass
            except Exception as e:
                out.append(f"marker {sid} does not parse: {e}")
        if s is not None and s.in_progress:
            assert s.turn is not None
            if m is None:
                out.append(f"session {sid} in progress without a marker")
            elif m.turn_id != s.turn.id:
                out.append(f"session {sid} on turn {s.turn.id}, marker on {m.turn_id}")
            if s.turn.resume_attempts > CAP:
                out.append(f"session {sid}: {s.turn.resume_attempts} resume attempts > {CAP}")
        if m is not None and m.resume_attempts > CAP:
            out.append(f"marker {sid}: {m.resume_attempts} resume attempts > {CAP}")
    return out


def check_final(store: Any, world: str) -> tuple[list[str], dict[str, int]]:
    from fsdurable import _events as ev

    out: list[str] = []
    stats: Counter[str] = Counter()
    files = os.listdir(world)
    tools = [r for f in files if f.startswith("tools-") for r in _read_jsonl(f"{world}/{f}")]
    acks = [r for f in files if f.startswith("acks-") for r in _read_jsonl(f"{world}/{f}")]
    for f in files:
        if f.startswith("errors-"):
            out += [f"worker error: {r['error']}" for r in _read_jsonl(f"{world}/{f}")]
    per: Counter[tuple[str, str, str, str]] = Counter()
    for r in tools:
        stats[f"tool_{r['kind']}"] += 1
        if r["key"] != f"{r['sid']}:{r['tid']}:{r['cid']}":
            out.append(f"idempotency key {r['key']} is not <session>:<turn>:<call>")
        if r["resumed"] and r["attended"]:
            out.append(f"a resumed turn ran attended: {r}")
        if r["kind"] == "approved" and r["resumed"]:
            out.append(f"an approval was granted in a resumed (unattended) turn: {r}")
        if r["kind"] in ("apply", "external"):
            per[(r["kind"], r["sid"], r["tid"], r["cid"])] += 1
        if r["resumed"]:
            stats["tool_calls_in_resumed_turns"] += 1
    for (kind, sid, tid, cid), n in per.items():
        if n > 1:
            what = "idempotent effect applied" if kind == "apply" else "external call run"
            out.append(f"{what} {n} times: {sid}:{tid}:{cid}")
    # no lost update: every acknowledged counter value is unique and none is above the final one
    seen: Counter[tuple[str, int]] = Counter((a["sid"], a["n"]) for a in acks if "n" in a)
    out += [f"lost update: counter {sid} reached {n} twice" for (sid, n), c in seen.items()
            if c > 1]
    final: dict[str, Any] = {}
    for a in acks:
        if a["sid"] not in final:  # load each session once: shared ones grow to megabytes
            try:
                final[a["sid"]] = store.load(a["sid"])
            except FsDurableError as e:
                final[a["sid"]] = None
                out.append(f"acknowledged session {a['sid']} unreadable: {e}")
        s = final[a["sid"]]
        if s is None:
            continue
        if s.version < a["version"]:
            out.append(f"acknowledged {a['sid']} v{a['version']} lost (disk v{s.version})")
        if "n" in a and s.metadata.get("n", 0) < a["n"]:
            out.append(f"counter {a['sid']} went back below acknowledged {a['n']}")
    stats["acknowledged_commits"] = len(acks)
    for event in store.events():
        stats[f"event_{event.code}"] += 1
        if event.code in (ev.ABANDONED, ev.FILE_QUARANTINED, ev.MARKER_REPAIRED):
            stats[f"event_{event.code}:{event.reason}"] += 1
        if event.code == ev.RESUME_FAILED:
            stats[f"resume_failed:{str(event.detail.get('error'))[:60]}"] += 1
        if event.code == ev.RESUMING and int(event.detail.get("attempt", 0)) > CAP:
            out.append(f"resume attempt {event.detail.get('attempt')} above the cap {CAP}")
    return out, dict(stats)


# ---------------------------------------------------------------------- the driver


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this worker if the driver dies (no orphan loops forever)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def run(base: str, *, kills: int = 200, workers: int = 3, seed: int = 1,
        max_delay: float = 0.12, progress: bool = False,
        max_seconds: float | None = None, rotate_every: int = ROTATE) -> dict[str, Any]:
    """Fork ``workers`` children, SIGKILL one at random ``kills`` times (restarting it), check
    after every kill and at the end. Returns the figures and the violations. ``max_seconds``
    ends the killing early (the final checks still run; ``kills`` in the result is the count
    actually done)."""
    # everything a worker needs is imported here, once: a forked child starts at once, and an
    # edit of the source tree during a long run cannot half-break a child's import
    import fsdurable._codec as codec
    import fsdurable._doctor
    import fsdurable._loop
    import fsdurable._recovery
    import fsdurable._tools  # noqa: F401
    from fsdurable._store import Store

    codec._conv()  # cattrs converter (imported lazily on the first session parse)
    rnd = random.Random(seed)
    root, world = os.path.join(base, "store"), os.path.join(base, "world")
    os.makedirs(os.path.join(world, "idem"), exist_ok=True)
    seeder = Store(root, config=_config())
    for sid in shared_ids(0):
        if not seeder.exists(sid):
            seeder.create(sid, metadata={"n": 0})
    del seeder
    t0 = time.monotonic()
    pids: dict[int, int] = {}

    def spawn(wid: int) -> None:
        child_seed = rnd.randrange(1 << 30)
        gen = done // rotate_every
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _die_with_parent()
                worker(root, world, wid, child_seed, gen)
            finally:
                os._exit(1)
        pids[wid] = pid

    violations: list[str] = []
    checker = Store(root, config=_config())
    seen: dict[str, Any] = {}
    previous = signal.signal(signal.SIGTERM, _terminate)  # so the finally below reaps workers
    done = 0
    try:
        for wid in range(workers):
            spawn(wid)
        while done < kills:
            if max_seconds is not None and time.monotonic() - t0 > max_seconds:
                break
            time.sleep(rnd.uniform(0.0, max_delay))
            wid = rnd.randrange(workers)
            os.kill(pids[wid], signal.SIGKILL)
            os.waitpid(pids[wid], 0)
            done += 1
            violations += check_live(checker, seen)
            spawn(wid)
            if progress and done % 100 == 0:
                print(f"  {done} kills, {time.monotonic() - t0:.0f}s", file=sys.stderr,
                      flush=True)
            if len(violations) > 20:
                break
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            except ProcessLookupError:
                pass
        signal.signal(signal.SIGTERM, previous)
    violations += check_live(checker)
    # final startup: recovery and doctor --repair, twice; then nothing may be left
    from fsdurable._doctor import doctor, problems
    from fsdurable._recovery import recover

    outcomes: Counter[str] = Counter()
    for _ in range(2):
        st = Store(root, config=_config())
        rep = recover(st, make_loop(st, world, 99))
        outcomes.update(o.outcome for o in rep.outcomes)
        # a call that may have run waits for a human (fsdurable review): reported, not repaired
        left = [f for f in problems(doctor(st, repair=True)) if f.code != "review_required"]
        violations += [f"doctor --repair left {f.code} {f.path}" for f in left]
    st = Store(root, config=_config())
    violations += check_live(st)
    left_markers = [m.session_id for m in st.interrupted()]
    violations += [f"marker {sid} left after recovery" for sid in left_markers]
    final, stats = check_final(st, world)
    violations += final
    stats.update({f"final_recovery_{k}": v for k, v in outcomes.items()})
    return {"kills": done, "workers": workers, "seconds": round(time.monotonic() - t0, 1),
            "violations": violations, "stats": stats, "sessions": len(st.sessions())}


def main(argv: list[str]) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(prog="python -m tests.torture.kills")
    p.add_argument("--kills", type=int, default=200)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dir", default=None)
    p.add_argument("--rotate", type=int, default=ROTATE,
                   help="kills per generation of session ids (default %(default)s)")
    a = p.parse_args(argv)
    os.environ.setdefault("FSDURABLE_NODE", "node-torture")
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="fsd-kill-") as base:
        os.environ.setdefault("FSDURABLE_STATE_DIR", os.path.join(base, "state"))
        res = run(base, kills=a.kills, workers=a.workers, seed=a.seed, progress=True,
                  rotate_every=a.rotate)
    print(json.dumps(res, indent=1, sort_keys=True))
    return 1 if res["violations"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
