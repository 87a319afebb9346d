"""Commit: one checkpoint of a session of 1 KB, 64 KB, 1 MB and 10 MB.

Command: ``python -m bench.commit`` (full) or ``python -m bench.commit --quick`` (1 KB - 1 MB).
Writes ``commit.json``.

Contenders, interleaved round by round, all on the same filesystem:
  fsdurable        ``store.checkpoint(session)`` of an in-progress session (commit lock, version
                   compare-and-swap, encode, temp + fsync + rename + directory fsync; the marker
                   is fresh, so it is not rewritten)
  fsdurable_cold   the same by a store that has just loaded the session (a new ``Store`` and a
                   ``load`` before each call, not timed): the first checkpoint after a load
  floor            the same bytes: write a temp file, fsync, rename over the target, fsync the
                   directory (no encoding, no lock, no check)
  floor_encoded    the floor that issue 13's targets are set against: the same document encoded
                   with the fastest encoder available (``orjson.dumps`` of the session's dict, as
                   ready-made dicts), then the floor's write, fsync, rename and directory fsync
  floor_protocol   the design's protocol done bare, the same bytes ready-made: the floor's
                   steps plus the ones a checkpoint must take that it does not (the commit
                   lock's ``flock`` and release, the compare-and-swap of a file younger than a
                   timestamp granule: open, ``fstat``, read, close; the marker's ``lstat``; a
                   random temp name created ``O_EXCL``; the inode's ``fstat`` after the rename),
                   no Python logic: between it and fsdurable is what the Python costs
  sqlite           SQLite (stdlib ``sqlite3``), WAL, ``synchronous=FULL``, the same bytes as one
                   blob row (UPDATE in its own transaction)
  part_*           two parts of fsdurable's checkpoint on their own, for the breakdown: taking
                   and releasing the session's commit lock, and encoding (warm encoder)
Fresh process (``first_commit``): a new process (a user's: the clean venv of bench/_venv.py,
fsdurable installed from its wheel; no ``FSDURABLE_*`` variable, bytecode on) opens the store,
loads an in-progress 1 KB session and checkpoints it twice; the first checkpoint (the imports and
set-up a commit needs the first time: the lock module and directory, the atomic writer, the marker
read once) against the second (warm), ratio of the medians over rounds. Interleaved with it, the
same process with the modules that first checkpoint imports (as the plain process reports them)
imported and timed on their own before it: their cost, and the first checkpoint without it. That
process then times ``import portalocker`` too (after its commits: the commit path does not import
it on POSIX): what taking the lock through the declared lock package would cost a fresh process.
Two references for that ratio, in the same rounds: the floor's own first write against its
second in a fresh process (``floor_first``: a third process in the same state, store opened and
session loaded, writing the session's bytes with the floor's steps into a directory of its own),
and each process's third write after a 50 ms pause (``*_after_pause``): the disk's part of a
first write is paid by any write after a pause (an agent's checkpoints are seconds apart), not
only by a fresh process's first. And the least a commit path imported on first use costs
(``floor_lazy``: a fourth process in the same state whose first write imports the floor's steps,
one module that takes a ``flock`` and so imports ``fcntl``: bench/_floor.py's ``locked_put``,
against its second), with the import
machinery alone timed beside it: as many empty modules as fsdurable's own that the first
checkpoint imports, imported one by one in that process.
The peers get the bytes ready-made (their serialization is not counted): a ring of 16 encodings
of successive checkpoints of the same session (version and timestamps advance, as they do in
fsdurable's checkpoints). SQLite rewrites only the pages that changed when a blob keeps its
length, so its figure is that of a checkpoint that adds no message.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import sqlite3
from collections.abc import Callable
from typing import Any

from ._floor import put
from ._harness import cache_dir, environment, log, measure, ratio, script_main, write_result

FULL: dict[str, Any] = {
    "sizes": [1 << 10, 64 << 10, 1 << 20, 10 << 20],
    "reps": {1 << 10: 300, 64 << 10: 300, 1 << 20: 100, 10 << 20: 30}, "budget": 10.0}
QUICK: dict[str, Any] = {
    "sizes": [1 << 10, 64 << 10, 1 << 20], "reps": {1 << 10: 30, 64 << 10: 30, 1 << 20: 10},
    "budget": 1.0}


def session_of_size(store: Any, sid: str, target: int) -> Any:
    """An in-progress session whose encoding is about ``target`` bytes (a realistic transcript)."""
    import attrs

    from ._data import inline_document, make_messages

    s = store.create(sid)
    s = store.begin_turn(sid, "start")
    msgs = make_messages(random.Random(target), target)
    lo, hi = 1, len(msgs)
    while lo < hi:  # the longest prefix that stays under the target (as one whole file)
        mid = (lo + hi + 1) // 2
        if len(inline_document(attrs.evolve(s, messages=msgs[:mid]))) <= target:
            lo = mid
        else:
            hi = mid - 1
    return store.commit(attrs.evolve(s, messages=msgs[:lo]), s.version)


def checkpoint_ring(s: Any, k: int = 16) -> list[bytes]:
    """Encodings of ``k`` successive checkpoints of ``s`` (what fsdurable writes each time)."""
    import time

    import attrs

    from fsdurable._codec import encode_session

    out = []
    now = time.time()
    for i in range(k):
        t = now + 0.0137 * (i + 1)
        turn = attrs.evolve(s.turn, checkpoint_at=t, phase=("model_replied", "tools_done")[i % 2])
        out.append(encode_session(attrs.evolve(s, version=s.version + i + 1, updated_at=t,
                                               turn=turn)))
    return out


class Floor:
    """Temp file + fsync + rename + directory fsync, with nothing else (bench/_floor.py)."""

    def __init__(self, directory: str, ring: list[bytes]) -> None:
        self.dir = directory
        self.path = os.path.join(directory, "floor.json")
        self.ring = ring
        self.i = 0

    def __call__(self) -> None:
        self.i += 1
        self.write(self.ring[self.i % len(self.ring)])

    def write(self, data: bytes) -> None:
        """The floor's steps: temp, fsync, rename, directory fsync."""
        put(self.dir, "floor.json", data)


class FloorEncoded(Floor):
    """``orjson.dumps(document)`` then the floor's temp + fsync + rename + directory fsync."""

    def __init__(self, directory: str, docs: list[dict[str, Any]]) -> None:
        super().__init__(directory, [])
        self.docs = docs

    def __call__(self) -> None:
        import orjson

        self.i += 1
        self.write(orjson.dumps(self.docs[self.i % len(self.docs)],
                                option=orjson.OPT_APPEND_NEWLINE))


class FloorProtocol(Floor):
    """The design's own protocol done bare (stdlib, the same bytes ready-made, no Python logic):
    the steps a checkpoint must take that the floor does not — the session's commit lock
    (``flock`` and its release on a lock file kept open), the compare-and-swap of a file
    written less than a timestamp granule ago (open, ``fstat``, read of its first bytes,
    close), the marker's ``lstat``, a temp file of a random name created exclusively and never
    through a link, the stat of the new inode after the rename — around the floor's write,
    fsync, rename and directory fsync. What is left between it and fsdurable is Python."""

    def __init__(self, directory: str, ring: list[bytes]) -> None:
        import fcntl

        super().__init__(directory, ring)
        self.flock = fcntl.flock
        self.ex, self.un = fcntl.LOCK_EX | fcntl.LOCK_NB, fcntl.LOCK_UN
        self.lock = os.open(os.path.join(directory, "commit.lock"), os.O_RDWR | os.O_CREAT,
                            0o600)
        self.marker = os.path.join(directory, "marker.json")
        with open(self.marker, "wb") as f:
            f.write(b"{}")
        self.prefix = os.path.join(directory, "~floor.json.")
        self.flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.read = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        with open(self.path, "wb") as f:
            f.write(ring[0])

    def write(self, data: bytes) -> None:
        self.flock(self.lock, self.ex)
        try:
            fd = os.open(self.path, self.read)  # the compare-and-swap of a young file
            try:
                os.fstat(fd)
                os.read(fd, 1024)
            finally:
                os.close(fd)
            os.lstat(self.marker)  # the marker says the same: not rewritten
            tmp = self.prefix + os.urandom(6).hex() + ".tmp"
            fd = os.open(tmp, self.flags, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
                os.replace(tmp, self.path)
                os.fstat(fd)
            finally:
                os.close(fd)
            dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        finally:
            self.flock(self.lock, self.un)

    def close(self) -> None:
        os.close(self.lock)


def document_ring(s: Any, k: int = 16) -> list[dict[str, Any]]:
    """The dicts of ``k`` successive checkpoints of ``s`` (the floor_encoded contender's input)."""
    import time

    import attrs

    from fsdurable._codec import session_to_dict

    now = time.time()
    return [session_to_dict(attrs.evolve(s, version=s.version + i + 1, updated_at=now + i,
                                         turn=attrs.evolve(s.turn, checkpoint_at=now + i)))
            for i in range(k)]


class SqlitePeer:
    def __init__(self, path: str, ring: list[bytes]) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, data BLOB)")
        self.db.execute("INSERT OR REPLACE INTO sessions VALUES ('s', ?)", (ring[0],))
        self.ring = ring
        self.i = 0

    def __call__(self) -> None:
        self.i += 1
        self.db.execute("BEGIN")
        self.db.execute("UPDATE sessions SET data = ? WHERE id = 's'",
                        (self.ring[self.i % len(self.ring)],))
        self.db.execute("COMMIT")


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    import fsdurable
    from fsdurable import _codec

    p = QUICK if quick else FULL
    work = os.path.join(cache_dir(quick), "commit")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = environment(work)
    store = fsdurable.Store(os.path.join(work, "store"))
    rows = []
    for size in p["sizes"]:
        sid = f"c{size}"
        box = {"s": session_of_size(store, sid, size)}
        cold = {"s": session_of_size(store, sid + "-cold", size)}
        ring = checkpoint_ring(box["s"])
        data = ring[0]
        floor_dir = os.path.join(work, f"floor-{size}")
        os.makedirs(floor_dir)
        enc_dir = os.path.join(work, f"floor-encoded-{size}")
        os.makedirs(enc_dir)
        proto_dir = os.path.join(work, f"floor-protocol-{size}")
        os.makedirs(proto_dir)
        proto = FloorProtocol(proto_dir, ring)

        def checkpoint(box: dict[str, Any]) -> None:
            box["s"] = box.get("store", store).checkpoint(box["s"])

        def setup(name: str, sid: str = sid, cold: dict[str, Any] = cold) -> None:
            if name == "fsdurable_cold":  # a store that has just read the session
                cold["store"] = fsdurable.Store(store.root)
                cold["s"] = cold["store"].load(sid + "-cold")

        peer = SqlitePeer(os.path.join(work, f"sqlite-{size}.db"), ring)
        def lock_only(sid: str = sid) -> None:
            with store._commit_lock(sid):
                pass

        def encode_only(b: dict[str, Any] = box) -> bytes:
            return _codec.encode_session(b["s"])

        calls: dict[str, Callable[[], Any]] = {
            "fsdurable": functools.partial(checkpoint, box),
            "fsdurable_cold": functools.partial(checkpoint, cold),
            "floor": Floor(floor_dir, ring),
            "floor_encoded": FloorEncoded(enc_dir, document_ring(box["s"])),
            "floor_protocol": proto,
            "sqlite": peer,
            # parts of a checkpoint, for the breakdown (no disk write)
            "part_commit_lock": lock_only,
            "part_encode": encode_only}
        res = measure(calls, min_reps=min(10, p["reps"][size]), max_reps=p["reps"][size],
                      budget=p["budget"], setup=setup)
        peer.db.close()
        proto.close()
        f = res["fsdurable"]
        row = {"size": size, "bytes": len(data), "messages": len(box["s"].messages),
               "results": res,
               "ratios": {"fsdurable_vs_floor_encoded": ratio(f, res["floor_encoded"]),
                          "fsdurable_vs_floor": ratio(f, res["floor"]),
                          "fsdurable_vs_floor_protocol": ratio(f, res["floor_protocol"]),
                          "floor_protocol_vs_floor_encoded": ratio(res["floor_protocol"],
                                                                   res["floor_encoded"]),
                          "fsdurable_cold_vs_floor": ratio(res["fsdurable_cold"], res["floor"]),
                          "sqlite_vs_floor": ratio(res["sqlite"], res["floor"]),
                          "fsdurable_vs_sqlite": ratio(f, res["sqlite"])}}
        log(f"  commit {size}: " + ", ".join(f"{k} {v['median'] * 1e3:.2f}ms"
                                            for k, v in res.items()))
        rows.append(row)
    targets = {}
    for size, limit in ((64 << 10, 1.2), (1 << 20, 1.3)):  # issue 13: vs the encoding floor
        r = next((r for r in rows if r["size"] == size), None)
        if r is not None:
            v = r["ratios"]["fsdurable_vs_floor_encoded"]
            targets[f"checkpoint_vs_floor_{size >> 10}KB"] = {
                "value": v, "target": f"<= {limit}", "met": v <= limit,
                "vs_floor_without_encoding": r["ratios"]["fsdurable_vs_floor"],
                "vs_floor_protocol": r["ratios"]["fsdurable_vs_floor_protocol"],
                "floor_protocol_vs_floor_encoded":
                    r["ratios"]["floor_protocol_vs_floor_encoded"]}
    fc = first_commit(work, 5 if quick else 30)
    targets["first_commit_vs_warm"] = {"value": fc["first_vs_warm"], "target": "<= 2",
                                       "met": fc["first_vs_warm"] <= 2,
                                       "floor_lazy_first_vs_second": fc[
                                           "floor_lazy_first_vs_second"]}
    body = {"params": {"sizes": p["sizes"]}, "rows": rows, "first_commit": fc,
            "targets": targets}
    write_result(out_dir, "commit", env, body, quick=quick, cleanup=work)
    return body


_CHILD = """
import sys, time
import fsdurable
st = fsdurable.Store(sys.argv[1])
s = st.load("first")
imp = pl = 0.0
pre = [m for m in sys.argv[2].split(",") if m]
if pre:  # the modules a first checkpoint imports, timed on their own
    import importlib
    t = time.perf_counter()
    for m in pre:
        importlib.import_module(m)
    imp = time.perf_counter() - t
before = set(sys.modules)
t0 = time.perf_counter()
s = st.checkpoint(s)
t1 = time.perf_counter()
s = st.checkpoint(s)
t2 = time.perf_counter()
new = sorted(set(sys.modules) - before)
time.sleep(0.05)
t3 = time.perf_counter()
s = st.checkpoint(s)
t4 = time.perf_counter()
if pre:
    t = time.perf_counter()
    import portalocker
    pl = time.perf_counter() - t
print(t1 - t0, t2 - t1, imp, pl, ",".join(new) or "-", t4 - t3)
"""

# the floor's steps (bench/_floor.py, copied beside the child as floor_commit.py: the clean venv
# has no bench) in a fresh process in the same state as _CHILD's before its first checkpoint,
# imported before it writes: first write, second, third after a pause
_FLOOR_CHILD = """
import sys, time
import fsdurable
st = fsdurable.Store(sys.argv[1])
s = st.load("first")
with open(st.layout.session("first"), "rb") as f:
    data = f.read()
d = sys.argv[2]
sys.path.insert(0, sys.argv[3])
import floor_commit
def write():
    t = time.perf_counter()
    floor_commit.put(d, "floor.json", data)
    return time.perf_counter() - t
a = write()
b = write()
time.sleep(0.05)
c = write()
print(a, b, c)
"""

# The floor with its code imported when first used, as the startup rule (DESIGN.md "Layers")
# requires of a commit path: the same module, imported by the first write, which takes a
# ``flock`` (``locked_put``); then ``sys.argv[4]`` empty modules of a package, each imported on
# its own: what the import machinery alone costs per module in this interpreter.
_FLOOR_LAZY_CHILD = """
import importlib, sys, time
import fsdurable
st = fsdurable.Store(sys.argv[1])
s = st.load("first")
with open(st.layout.session("first"), "rb") as f:
    data = f.read()
d = sys.argv[2]
sys.path.insert(0, sys.argv[3])
t = time.perf_counter()
import floor_commit
floor_commit.locked_put(d, "floor.json", data)
a = time.perf_counter() - t
t = time.perf_counter()
floor_commit.locked_put(d, "floor.json", data)
b = time.perf_counter() - t
t = time.perf_counter()
for i in range(int(sys.argv[4])):
    importlib.import_module(f"floor_empty.m{i}")
print(a, b, time.perf_counter() - t)
"""


def first_commit(work: str, rounds: int) -> dict[str, Any]:
    """The first checkpoint of a fresh process against its second (see the module doc)."""
    import statistics
    import subprocess
    import sys

    import fsdurable

    root = os.path.join(work, "first")
    st = fsdurable.Store(root)
    st.create("first")
    st.begin_turn("first", "hello")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSDURABLE_")}
    # a user's process: the clean venv (fsdurable from its wheel) as bench/startup.py; the
    # crowded development interpreter has tempfile & co. loaded by its site hooks, which hid
    # what importing the commit path costs a user (atomicwrites' tempfile: 3.3 ms there)
    use_venv = os.environ.get("FSDURABLE_BENCH_VENV", "1") == "1"
    if use_venv:
        from ._venv import clean_venv

        python = clean_venv()
    else:
        python = sys.executable
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # Bytecode as in any installed package (as bench/startup.py): with PYTHONDONTWRITEBYTECODE
    # set (some sandboxes and CI images do), every module the first commit imports would be
    # compiled from source in every round. The warm-up round (not counted) writes the .pyc files.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    floor_dir = os.path.join(work, "first-floor")
    os.makedirs(floor_dir, exist_ok=True)
    lazy_dir, code_dir = os.path.join(work, "first-lazy"), os.path.join(work, "first-lazy-code")
    os.makedirs(os.path.join(code_dir, "floor_empty"), exist_ok=True)
    os.makedirs(lazy_dir, exist_ok=True)
    shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_floor.py"),
                    os.path.join(code_dir, "floor_commit.py"))
    lazy: list[list[float]] = [[], [], []]  # the lazy floor's first, second, the empty modules
    n_own = 0  # fsdurable's own modules the first checkpoint imports (the warm-up round says)
    firsts, warms, pre_firsts, imports, portalocker = [], [], [], [], []
    paused: list[float] = []
    floors: list[list[float]] = [[], [], []]  # the floor's first, second, after a pause
    modules = ""  # what the first checkpoint imports (the warm-up round's plain process says)
    for i in range(rounds + 1):  # interleaved: the plain process, one importing them first, floor
        for pre in (False, True):
            out = subprocess.run([python, "-c", _CHILD, root, modules if pre else ""],
                                 env=env, cwd=work, capture_output=True, text=True,
                                 timeout=120, check=True).stdout.split()
            first, warm, imp, pl = map(float, out[:4])
            if not pre and i == 0:
                modules = "" if out[4] == "-" else out[4]
            if i == 0:
                continue
            if not pre:
                firsts.append(first)
                warms.append(warm)
                paused.append(float(out[5]))
            else:
                pre_firsts.append(first)
                imports.append(imp)
                portalocker.append(pl)
        out = subprocess.run([python, "-c", _FLOOR_CHILD, root, floor_dir, code_dir], env=env,
                             cwd=work, capture_output=True, text=True, timeout=120,
                             check=True).stdout.split()
        if i:
            for acc, v in zip(floors, out, strict=True):
                acc.append(float(v))
        if i == 0:  # the package of as many empty modules as the first checkpoint imports
            n_own = sum(m.startswith("fsdurable.") for m in modules.split(","))
            for k in range(n_own):
                open(os.path.join(code_dir, "floor_empty", f"m{k}.py"), "w").close()
            open(os.path.join(code_dir, "floor_empty", "__init__.py"), "w").close()
        out = subprocess.run([python, "-c", _FLOOR_LAZY_CHILD, root, lazy_dir, code_dir,
                              str(n_own)], env=env, cwd=work, capture_output=True,
                             text=True, timeout=120, check=True).stdout.split()
        if i:
            for acc, v in zip(lazy, out, strict=True):
                acc.append(float(v))
    med = statistics.median
    r = med(firsts) / med(warms)
    r_pre = med(pre_firsts) / med(warms)
    f1, f2, f3 = (med(v) for v in floors)
    l1, l2, empty = (med(v) for v in lazy)
    log(f"  first commit of a fresh process {med(firsts) * 1e3:.2f}ms, warm "
        f"{med(warms) * 1e3:.2f}ms ({r:.1f}x); its imports ({modules or 'none'}) "
        f"{med(imports) * 1e3:.2f}ms, then the first commit {med(pre_firsts) * 1e3:.2f}ms "
        f"({r_pre:.1f}x); import portalocker {med(portalocker) * 1e3:.2f}ms; the floor's "
        f"first write {f1 * 1e3:.2f}ms vs second {f2 * 1e3:.2f}ms ({f1 / f2:.1f}x); after a "
        f"50 ms pause: the floor {f3 * 1e3:.2f}ms, a warm commit {med(paused) * 1e3:.2f}ms; "
        f"the floor imported by its first write {l1 * 1e3:.2f}ms vs second {l2 * 1e3:.2f}ms "
        f"({l1 / l2:.1f}x); {n_own} empty modules {empty * 1e3:.2f}ms")
    return {"rounds": rounds, "clean_venv": use_venv, "python": python,
            "first_median_s": med(firsts), "warm_median_s": med(warms),
            "first_vs_warm": r, "first_imports": modules.split(",") if modules else [],
            "imports_median_s": med(imports), "first_after_imports_median_s": med(pre_firsts),
            "first_after_imports_vs_warm": r_pre, "portalocker_import_median_s": med(portalocker),
            "floor_first_median_s": f1, "floor_second_median_s": f2,
            "floor_first_vs_second": f1 / f2,
            "floor_after_pause_median_s": f3, "warm_after_pause_median_s": med(paused),
            "first_vs_warm_after_pause": med(firsts) / med(paused),
            "floor_lazy_first_median_s": l1, "floor_lazy_second_median_s": l2,
            "floor_lazy_first_vs_second": l1 / l2, "empty_modules": n_own,
            "empty_modules_import_median_s": empty}


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
