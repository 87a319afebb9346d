"""The crash-state explorer for ``fsdurable.langgraph``: every state a power cut may leave while
the saver puts, writes, copies, prunes and deletes threads.

``record`` runs a workload through ``FsDurableSaver`` with ``_fsio``'s recorder on, noting for
every saver call the op count at which it started and returned and what each thread must look
like after it (its latest checkpoint per namespace, that checkpoint's pending writes, every
listed checkpoint). ``explore`` replays the log into ``FsModel`` and at every crash point, for
every state the model allows, opens the store in a fresh saver and checks each thread:

* it is readable (``get_tuple`` and ``list`` raise nothing, every listed checkpoint loads);
* what it shows is what the last acknowledged call left, or what the call in flight would
  leave (that call may or may not have happened) — never a mix, never older;
* "in progress => marker" holds for every thread's session, discovery never raises;
* a new put to the thread then succeeds and becomes its latest checkpoint (a record left
  numbered above the head by the crash is replaced).
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import attrs

from fsdurable import _fsio
from fsdurable._config import Config
from fsdurable._store import Store

from .explorer import SHM, Clock, _marker_biconditional, _parse_all
from .fsmodel import FsModel, Snapshot, snapshot, states_on_disk

View = dict[str, Any]  # {"latest": {ns: id}, "writes": {ns: n}, "ids": sorted [(ns, id)]}


@attrs.define
class Call:
    start: int
    end: int
    after: dict[str, View]  # every thread's view once the call returned


@attrs.define
class LgRecording:
    root: str
    ops: list[tuple[str, tuple[Any, ...]]]
    calls: list[Call]
    threads: list[str]
    snap: Snapshot
    kinds: set[str]


def view(saver: Any, thread: str) -> View:
    """What a reader sees of one thread (raises if it cannot read it)."""
    out: View = {"latest": {}, "writes": {}, "ids": []}
    for tup in saver.list({"configurable": {"thread_id": thread}}):
        c = tup.config["configurable"]
        ns, ckid = c["checkpoint_ns"], c["checkpoint_id"]
        out["ids"].append((ns, ckid))
        assert tup.checkpoint["id"] == ckid
        if ns not in out["latest"]:  # newest first within a namespace
            out["latest"][ns] = ckid
            latest = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ns}})
            assert latest is not None and latest.config["configurable"]["checkpoint_id"] == ckid
            out["writes"][ns] = len(latest.pending_writes or [])
            step = latest.metadata["step"]
            want = {"log": [f"m{i}" for i in range(step + 1)], "step": min(step, 1)}
            got = latest.checkpoint["channel_values"]
            assert got == want, f"{thread}: blobs {got} != {want}"  # incl. an older record's
    out["ids"].sort()
    return out


def _step(step: int, run: str) -> tuple[Any, Any, Any]:
    """Checkpoint, metadata and new versions of step ``step`` of the workload's threads."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    log = [f"m{i}" for i in range(step + 1)]  # a growing message list, as LangGraph's
    cp = generate_checkpoint(channel_values={"log": log, "step": step},
                             channel_versions={"log": step + 1, "step": step + 1})
    if step >= 2:  # "step" unchanged: its blob stays in an older record
        cp["channel_versions"]["step"] = 2
        cp["channel_values"]["step"] = 1
    nv = {"log": step + 1} if step >= 2 else {"log": step + 1, "step": step + 1}
    md: Any = {"source": "loop", "step": step, "parents": {}, "run_id": run}
    return cp, md, nv


def to_record_files(root: str, thread: str) -> None:
    """Rewrite ``thread`` as the saver before its log (lghead/1) wrote it: a file per record
    (``<seq>.ckpt|.writes``) and a head counting them, no log."""
    from fsdurable.langgraph import FsDurableSaver

    store = Store(root, config=Config(fsync=False))
    saver = FsDurableSaver(store)
    sid = saver.threads.sid(thread)
    s = store.load(sid)
    head = saver.threads.head(s)
    d = store.layout.lg_thread(sid)
    for n, kind, *_ in saver.threads.present(s, head):
        with open(os.path.join(d, f"{n:012d}.{kind}"), "wb") as f:
            f.write(saver.threads.raw(s, n, kind))
    for name in os.listdir(d):
        if name.endswith(".lglog"):
            os.unlink(os.path.join(d, name))
    old = {k: v for k, v in head.items() if k not in ("log", "legacy")}
    old["format"] = "fsdurable.lghead/1"
    store.commit(attrs.evolve(s, metadata={**s.metadata, "langgraph": old}), s.version)


def _legacy_thread(root: str, clock: Clock) -> tuple[Any, View]:
    """Thread "old" in the record-file layout, made before the recording (its last config and
    what it shows)."""
    from fsdurable.langgraph import FsDurableSaver

    saver = FsDurableSaver(Store(root, clock=clock))
    cfg: Any = {"configurable": {"thread_id": "old", "checkpoint_ns": ""}}
    for i in range(3):
        cp, md, nv = _step(i, "ro")
        cfg = saver.put(cfg, cp, md, nv)
    saver.close()
    to_record_files(root, "old")
    fresh = FsDurableSaver(Store(root, clock=clock))
    return cfg, view(fresh, "old")


def record(base: str) -> LgRecording:
    from fsdurable.langgraph import FsDurableSaver

    root = os.path.join(base, "store")
    clock = Clock(time.time())
    Store(root, clock=clock)
    old_cfg, old_view = _legacy_thread(root, clock)
    rec = LgRecording(root=os.path.realpath(root), ops=[], calls=[Call(0, 0, {"old": old_view})],
                      threads=["old"], snap=snapshot(root), kinds=set())
    check = FsModel(root)

    def recorder(op: str, args: tuple[Any, ...]) -> None:
        rec.ops.append((op, args))
        check.record(op, args)

    saver = FsDurableSaver(Store(root, clock=clock))
    prev = _fsio.set_recorder(recorder)
    try:
        def call(kind: str, thread: str, fn: Callable[[], Any]) -> Any:
            if thread not in rec.threads:
                rec.threads.append(thread)
            start = len(rec.ops)
            out = fn()
            end = len(rec.ops)
            # delete_for_runs may touch any thread: note what every one looks like now
            rec.calls.append(Call(start, end, {t: view(saver, t) for t in rec.threads}))
            rec.kinds.add(kind)
            return out

        def put(thread: str, parent: Any, step: int, ns: str = "", run: str = "r1") -> Any:
            cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
            if parent is not None:
                cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
            cp, md, nv = _step(step, run)
            return call("put", thread, lambda: saver.put(cfg, cp, md, nv))

        def writes(thread: str, cfg: Any, task: str, ws: list[tuple[str, Any]]) -> None:
            call("put_writes", thread, lambda: saver.put_writes(cfg, ws, task, "p"))

        c = None
        for i in range(4):
            c = put("chat", c, i, run="r1" if i < 2 else "r2")
        writes("chat", c, "t1", [("log", "w1"), ("__error__", "boom")])
        writes("chat", c, "t1", [("log", "w1")])  # a repeat: ignored, nothing written
        writes("chat", c, "t2", [("__interrupt__", {"ask": 1})])
        k = None
        for i in range(2):
            k = put("child", k, i, ns="sub:1", run="rc")
        put("child", None, 0, run="rc")
        c2 = None
        for i in range(3):
            c2 = put("gone", c2, i, run="rg")
        call("delete_thread", "gone", lambda: saver.delete_thread("gone"))
        call("copy_thread", "copy", lambda: saver.copy_thread("chat", "copy"))
        call("prune", "chat", lambda: saver.prune(["chat"]))
        call("delete_for_runs", "copy", lambda: saver.delete_for_runs(["r1"]))
        c3 = put("gone", None, 0, run="rg")  # a thread id reused after its deletion
        writes("gone", c3, "t9", [("log", "again")])
        # the record-file layout: the first write migrates it, a prune copies it into a log
        put("old", old_cfg, 3, run="ro")
        call("prune_old", "old", lambda: saver.prune(["old"]))
    finally:
        _fsio.set_recorder(prev)
    return rec


@attrs.define
class LgReport:
    crash_points: int = 0
    states: int = 0
    ops: int = 0
    calls: int = 0
    violations: list[str] = attrs.Factory(list)
    seconds: float = 0.0


def _expected(rec: LgRecording, thread: str, k: int) -> list[View]:
    """What ``thread`` may show at crash point ``k``: the last acknowledged view, and the view
    of the call in flight (if any)."""
    done: View = {"latest": {}, "writes": {}, "ids": []}
    flight = None
    for c in rec.calls:
        if thread not in c.after:
            continue
        if c.end <= k:
            done = c.after[thread]
        elif c.start < k:
            flight = c.after[thread]
    return [done] if flight is None else [done, flight]


def check_state(rec: LgRecording, k: int, where_root: str, note: str) -> list[str]:
    from fsdurable.langgraph import FsDurableSaver

    where = f"op {k} [{note}]"
    out: list[str] = []
    sessions, markers, bad = _parse_all(where_root, where)
    out += bad + _marker_biconditional(sessions, markers, where, orphans_ok=True)
    try:
        store = Store(where_root, config=Config(fsync=False))
        store.interrupted()
        saver = FsDurableSaver(store)
        for thread in rec.threads:
            got = view(saver, thread)
            allowed = _expected(rec, thread, k)
            if got not in allowed:
                out.append(f"{where}: thread {thread!r} shows {got}, expected one of {allowed}")
            cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

            cp = generate_checkpoint(channel_values={"log": ["after"]},
                                     channel_versions={"log": 999})
            saver.put(cfg, cp, {"source": "loop", "step": 99, "parents": {}}, {"log": 999})
            # read back by this saver and by another process's (what is on disk, no cache)
            other = FsDurableSaver(Store(where_root, config=Config(fsync=False)))
            for reader in (saver, other):
                tup = reader.get_tuple(cfg)
                if tup is None or tup.checkpoint["id"] != cp["id"] \
                        or tup.checkpoint["channel_values"] != {"log": ["after"]}:
                    out.append(f"{where}: a put after the crash is not the latest of "
                               f"{thread!r}")
        saver.close()  # the next crash state is another process: its runs' locks go
    except Exception:
        out.append(f"{where}: reading the threads raised\n{traceback.format_exc(limit=6)}")
    return out


def explore(rec: LgRecording, *, exhaustive: bool = False, max_violations: int = 20
            ) -> LgReport:
    t = time.monotonic()
    report = LgReport(ops=len(rec.ops), calls=len(rec.calls))
    for k, state, where_root in states_on_disk(
            rec.root, rec.snap, rec.ops, lambda k: sum(1 for c in rec.calls if c.end <= k),
            exhaustive=exhaustive, where=SHM, prefix="fsd-lgcrash-"):
        report.states += 1
        v = check_state(rec, k, where_root, state.note)
        if v:
            report.violations.extend(v[:3])
            if len(report.violations) >= max_violations:
                report.crash_points = k + 1
                report.seconds = time.monotonic() - t
                return report
    report.crash_points = len(rec.ops) + 1
    report.seconds = time.monotonic() - t
    return report


def run(*, exhaustive: bool = False) -> LgReport:
    with tempfile.TemporaryDirectory(dir=SHM, prefix="fsd-lgrec-") as base:
        return explore(record(base), exhaustive=exhaustive)


# ---------------------------------------------------------------------- broken protocols


def _frames_not_durable(self: Any, sid: str, new: Any, frames: Any, **kw: Any) -> int:
    """Threads._append with no fdatasync: an acknowledged put may be lost."""
    from fsdurable._lgstore import Threads

    durable, self._durable = self._durable, False
    try:
        return int(_ORIGINAL[(Threads, "_append")](self, sid, new, frames, **kw))
    finally:
        self._durable = durable


def _document_before_frames(self: Any, thread_id: str, fn: Any, through: Any = None) -> Any:
    """Threads.mutate committing the document (naming the log's new end) first, then
    appending the frames it counts."""
    from fsdurable._lgstore import HEAD_FORMAT, new_head

    sid = self.sid(thread_id)
    with self.store.commit_lock(sid):
        s = self.session(sid)
        head = self.head(s) if s is not None else new_head(str(thread_id))
        if "log" not in head:  # the record-file layout: its migration is not what is broken
            return _ORIGINAL[(type(self), "mutate")](self, thread_id, fn, through)
        out = fn(s, head, head["seq"] + 1)
        if out is None:
            return s
        records, new, state = out
        new = {**new, "format": HEAD_FORMAT}
        seq = head["seq"]
        frames = []
        for kind, data in records:
            seq += 1
            frames.append((kind, seq, data))
        new["seq"] = seq
        if frames:  # where the frames will end: the log's valid end + their size
            from fsdurable import _lglog

            view = self._view(s, head) if s is not None else None
            at = (view.head_end or view.base) if view is not None else \
                len(_lglog.encode_header(new["thread_id"], new["gen"], new["log"]["n"]))
            size = len(_lglog.frames_of(
                [(k, q, raw, rec.header) for k, q, (raw, rec) in frames],
                {k2: v for k2, v in new.items() if k2 not in ("run", "log")})[0])
            new["log"] = {**new["log"], "at": at + size}
        s = through(s, new, state, False) if through is not None and s is not None \
            else self.commit(sid, s, new, state)
        if frames:
            self._append(sid, new, frames, migrating=False)
        return s


def _append_at_the_end(path: str, offset: int, data: bytes, *, durable: bool = True) -> int:
    """_fsio.append_at that never cuts a torn tail: it appends after it."""
    import os

    size = os.lstat(path).st_size
    return int(_ORIGINAL[(_fsio, "append_at")](path, size, data, durable=durable)) \
        - size + offset


def _classes() -> dict[str, tuple[Any, str, Any]]:
    from fsdurable._lgstore import Threads

    return {"frames_not_durable": (Threads, "_append", _frames_not_durable),
            "document_before_frames": (Threads, "mutate", _document_before_frames),
            "torn_tail_not_cut": (_fsio, "append_at", _append_at_the_end)}


LG_MUTANTS = ("frames_not_durable", "document_before_frames", "torn_tail_not_cut")
_ORIGINAL: dict[tuple[Any, str], Any] = {}


def run_mutant(name: str) -> LgReport:
    """Record the workload with the saver's protocol broken as ``name`` says, then explore:
    the explorer must find a violation."""
    owner, attr, impl = _classes()[name]
    old = getattr(owner, attr)
    _ORIGINAL[(owner, attr)] = old
    setattr(owner, attr, impl)
    try:
        with tempfile.TemporaryDirectory(dir=SHM, prefix="fsd-lgrec-") as base:
            rec = record(base)
        if name == "torn_tail_not_cut":  # the reader, after the crash, writes with it too
            return explore(rec, max_violations=1)
    finally:
        setattr(owner, attr, old)
    return explore(rec, max_violations=1)


# ---------------------------------------------------------------------- the kill torture


def _worker(root: str, kill_at: int, log_path: str) -> None:
    """One round (put, put_writes, put of a second thread, its delete_thread), SIGKILLed by
    its own recorder just before disk operation number ``kill_at``."""
    import signal

    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    from fsdurable.langgraph import FsDurableSaver

    saver = FsDurableSaver(root)
    n = 0

    def recorder(op: str, args: tuple[Any, ...]) -> None:
        nonlocal n
        if os.path.realpath(str(args[0])).startswith(saver.store.root) and op != "append":
            if n == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            n += 1

    def note(line: str) -> None:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def put(thread: str) -> Any:
        cur = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        if cur is not None:
            cfg["configurable"]["checkpoint_id"] = cur.config["configurable"]["checkpoint_id"]
        cp = generate_checkpoint(channel_values={"v": thread}, channel_versions={"v": 1})
        note(f"start put {thread} {cp['id']}")
        out = saver.put(cfg, cp, {"source": "loop", "step": 1, "parents": {}}, {"v": 1})
        note(f"ack put {thread} {cp['id']}")
        return out

    _fsio.set_recorder(recorder)
    cfg = put("k")
    ckid = cfg["configurable"]["checkpoint_id"]
    note(f"start writes k {ckid}")
    saver.put_writes(cfg, [("v", "w")], "task")
    note(f"ack writes k {ckid}")
    put("d")
    note("start delete d -")
    saver.delete_thread("d")
    note("ack delete d -")


def _allowed(lines: list[str]) -> dict[str, Any]:
    """Per thread: the latest checkpoints allowed after a crash, and (thread k) the pending
    write counts allowed for each checkpoint id. A call a kill cut short (a ``start`` with no
    ``ack``) may or may not have happened, in this round or an earlier one."""
    allowed: dict[str, set[str | None]] = {"k": {None}, "d": {None}}
    writes: dict[str, set[int]] = {}

    def apply(kind: str, thread: str, ckid: str, *, sure: bool) -> None:
        if kind == "writes":
            writes[ckid] = {1} if sure else writes.get(ckid, {0}) | {1}
            return
        got = ckid if kind == "put" else None
        allowed[thread] = {got} if sure else allowed[thread] | {got}

    flight: tuple[str, str, str] | None = None
    for line in lines:
        what, kind, thread, ckid = line.split()
        if what == "start":
            if flight is not None:  # the previous round was killed inside this call
                apply(*flight, sure=False)
            flight = (kind, thread, ckid)
            continue
        apply(kind, thread, ckid, sure=True)
        flight = None
    if flight is not None:
        apply(*flight, sure=False)
    return {"latest": allowed, "writes": writes}


def kills(base: str, *, stride: int = 1, max_steps: int = 400) -> dict[str, Any]:
    """Kill a worker before each of its disk operations in turn (0, stride, 2 * stride, ...
    until a round ends unkilled); after each kill a fresh saver must read every thread as
    acknowledged. Each round starts on the state the previous kill left."""
    import subprocess
    import sys

    from fsdurable.langgraph import FsDurableSaver

    root, log = os.path.join(base, "store"), os.path.join(base, "acks.log")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
    violations: list[str] = []
    killed = 0
    t = time.monotonic()
    for step in range(0, max_steps, stride):
        p = subprocess.run([sys.executable, "-m", "tests.torture.lgcrash", root, str(step), log],
                           env=env, capture_output=True, text=True, timeout=120)
        if p.returncode not in (0, -9):
            violations.append(f"kill at step {step}: worker failed\n{p.stderr[-2000:]}")
            break
        killed += p.returncode == -9
        with open(log) as f:
            exp = _allowed(f.read().splitlines())
        try:
            saver = FsDurableSaver(Store(root, config=Config(fsync=False)))
            saver.store.interrupted()
            for thread, ok in exp["latest"].items():
                tup = saver.get_tuple({"configurable": {"thread_id": thread,
                                                        "checkpoint_ns": ""}})
                got = None if tup is None else tup.checkpoint["id"]
                if got not in ok:
                    violations.append(f"kill at step {step}: thread {thread} latest {got}, "
                                      f"acknowledged {ok}")
                if tup is not None and thread == "k":
                    n = len(tup.pending_writes or [])
                    if n not in exp["writes"].get(got, {0}):
                        violations.append(f"kill at step {step}: {n} writes on {got}")
                    list(saver.list({"configurable": {"thread_id": thread}}))
        except Exception:
            violations.append(f"kill at step {step}: reading raised\n"
                              f"{traceback.format_exc(limit=6)}")
        if p.returncode == 0:
            break
    return {"kills": killed, "violations": violations, "seconds": round(time.monotonic() - t)}


if __name__ == "__main__":
    import sys

    _worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])
