"""The crash-state explorer for the Agents SDK adapter's item log (``fsdurable._oaitems``,
``fsdurable._itemlog``): every state a power cut may leave while ``FileSession`` adds, pops,
clears, rewrites its log and migrates sessions of the older layouts.

``record`` runs a workload through ``FileSession`` with ``_fsio``'s recorder on, noting for
every call the op count at which it started and returned and what every session's items are
once it returned (kept by a plain list beside the store: what the call acknowledged, whatever
the store's own bookkeeping says). ``explore`` replays the log into ``FsModel`` and at every
crash point, for every state the model allows, checks each session:

* it reads (``FileSession(sid, Store(root)).get_items()``, a fresh store) without error — a
  document naming a log the state lacks, or one shorter than the document has seen
  (``log_short``), is a violation: the protocol makes a log durable before a document names it;
* its items are those the last acknowledged call left, or those the call in flight would leave
  (that call may or may not have happened) — never a mix, never older;
* startup (``Store.interrupted`` and ``doctor --repair``) leaves no problem and loses nothing:
  every session then reads as before it, and no log its document does not name is left (a
  first write or rewrite a crash cut short, an old log whose removal was not durable yet);
* a new add then succeeds, and a fresh reader sees the items read plus the one added (a torn
  tail the crash left is cut by it; a log a crashed first write or rewrite left named by
  nothing is never read, and goes to ``quarantine/`` when a write needs its name).

Broken variants of the protocol (``OA_MUTANTS``) must each produce a violation.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs

from fsdurable import _fsio
from fsdurable._config import Config
from fsdurable._fsio import _write
from fsdurable._store import Store

from .explorer import SHM, Clock
from .fsmodel import FsModel, Snapshot, snapshot, states_on_disk
from .lgcrash import LgReport

Items = tuple[Any, ...]
# the workload's rewrite threshold: a few pops and clears pass it (the live items' bytes too)
SLACK = 800
# the sessions: a new one (adds, pops, a clear, rewrites, a torn tail), one of the older layout
# with its items inline in the metadata, one with them in the lane (segments)
SESSIONS = ("chat", "inl", "lane")


@attrs.define
class Call:
    start: int
    end: int
    after: dict[str, Items]  # every session's items once the call returned
    kind: str = ""


@attrs.define
class OaRecording:
    root: str
    ops: list[tuple[str, tuple[Any, ...]]]
    calls: list[Call]
    snap: Snapshot
    t0: float
    kinds: set[str] = attrs.Factory(set)
    # what the workload saw itself (a read right after a call that is not what it acknowledged)
    violations: list[str] = attrs.Factory(list)


def item(tag: str, i: int) -> dict[str, Any]:
    """An item of the workload: about 90 bytes of JSON, unique."""
    return {"role": "user", "content": f"{tag} {i} " + "x" * 48, "id": f"{tag}-{i}"}


async def aread(root: str, sid: str) -> list[Any]:
    """A session's items as a fresh process reads them (raises if it cannot)."""
    from fsdurable.openai_agents import FileSession

    return await FileSession(sid, Store(root, config=Config(fsync=False))).get_items()


def read_items(root: str, sid: str) -> list[Any]:
    return asyncio.run(aread(root, sid))


def log_paths(root: str, sid: str) -> list[str]:
    d = os.path.join(root, "history", sid)
    names = sorted(n for n in os.listdir(d) if n.startswith("items-")) if os.path.isdir(d) \
        else []
    return [os.path.join(d, n) for n in names]


def record(base: str) -> OaRecording:
    """Run the workload on a fresh store under ``base``; returns the recording."""
    from fsdurable.openai_agents import FileSession

    root = os.path.join(base, "store")
    t0 = time.time()
    clock = Clock(t0)
    Store(root, clock=clock)  # created (and synced) before recording starts
    rec = OaRecording(root=os.path.realpath(root), ops=[], calls=[], snap=snapshot(root), t0=t0)
    check = FsModel(root)  # the model must accept every op
    want: dict[str, list[Any]] = {}

    def recorder(op: str, args: tuple[Any, ...]) -> None:
        rec.ops.append((op, args))
        check.record(op, args)

    config = Config(item_log_slack=SLACK)
    store = Store(root, clock=clock, config=config)
    # the older lane layout: its values in segments, none inline in the document
    lane_store = Store(root, clock=clock, config=config.replace(inline_tail_bytes=0))
    sessions = {sid: FileSession(sid, store) for sid in SESSIONS}

    async def call(kind: str, sid: str, fn: Callable[[], Awaitable[Any]],
                   change: Callable[[list[Any]], Any]) -> Any:
        start = len(rec.ops)
        out = await fn()
        end = len(rec.ops)
        items = want.setdefault(sid, [])
        expect = change(items)
        if out != expect:
            rec.violations.append(f"{kind} of {sid} (ops {start}..{end}) returned {out!r}, "
                                  f"not {expect!r}")
        prev = _fsio.set_recorder(None)  # a check's read, not the workload's
        try:
            got = await aread(root, sid)
        finally:
            _fsio.set_recorder(prev)
        if got != items:
            rec.violations.append(f"{kind} of {sid} (ops {start}..{end}): a fresh reader sees "
                                  f"{got}, not the {items} acknowledged")
        rec.calls.append(Call(start, end, {s: tuple(v) for s, v in want.items()}, kind))
        rec.kinds.add(kind)
        return out

    def add(sid: str, new: list[Any], kind: str = "add",
            fs: Any = None) -> Awaitable[Any]:
        s = fs if fs is not None else sessions[sid]
        return call(kind, sid, lambda: s.add_items(new), lambda items: items.extend(new))

    def pop(sid: str, kind: str = "pop") -> Awaitable[Any]:
        return call(kind, sid, sessions[sid].pop_item,
                    lambda items: items.pop() if items else None)

    def clear(sid: str) -> Awaitable[Any]:
        return call("clear", sid, sessions[sid].clear_session, lambda items: items.clear())

    async def torn_tail(sid: str) -> None:
        """A frame a crash tore (its first half, durable): no reader may take it, the next
        writer cuts it. Not the adapter's own write: through ``_fsio`` (recorded)."""
        from fsdurable._itemlog import encode_frame, log_name, ref_of
        from fsdurable._oaitems import KEY

        path = os.path.join(root, "history", sid, log_name(ref_of(store.load(sid), KEY)["n"]))
        size = os.path.getsize(path)
        frame = encode_frame(len(want[sid]), b'[{"torn": true, "pad": "' + b"y" * 40 + b'"}]',
                             1)
        start = len(rec.ops)
        _write.append_at(path, size, frame[:len(frame) // 2])  # never a mutant's append_at
        rec.calls.append(Call(start, len(rec.ops),
                              {s: tuple(v) for s, v in want.items()}, "torn_tail"))
        rec.kinds.add("torn_tail")

    async def work() -> None:
        # a new session: log 0 written whole, then the document created naming it
        await add("chat", [item("u", 0)], "first_add")
        await add("chat", [item("a", 1), item("a", 2)])  # one frame, two items
        await add("chat", [item("a", 3)])
        await pop("chat")  # the last frame's only item
        await pop("chat", "pop_across_frames")  # into the frame before it: a cut inside it
        await add("chat", [item("a", 4)])
        await clear("chat")
        await add("chat", [item("b", 0), item("b", 1)], "add_after_clear")
        for i in range(2, 5):
            await add("chat", [item("b", i)])
        # pops and adds until the dead bytes pass the slack and the live bytes: a rewrite
        for i in range(5, 9):
            await pop("chat")
            await add("chat", [item("c", i)])
        # a torn tail (a crashed append's first half), cut by the next add of a new process
        await torn_tail("chat")
        await add("chat", [item("d", 0)], "add_cuts_torn_tail",
                  fs=FileSession("chat", Store(root, clock=clock, config=config)))
        await add("chat", [item("d", 1)])
        # an older session, its items inline in the metadata: migrated at its first write
        await call("create_inline", "inl", lambda: _sync(lambda: store.create(
            "inl", metadata={"openai_agents": {"items": [item("i", 0), item("i", 1)]}})),
            lambda items: _then(items, [item("i", 0), item("i", 1)]))
        await add("inl", [item("i", 2)], "migrate_inline")
        await add("inl", [item("i", 3)])
        # an older session, its items in the lane (segments): migrated at its first write, a pop
        await call("create_lane", "lane", lambda: _sync(lambda: lane_store.create(
            "lane", source="openai-agents",
            lanes={"openai_agents": [item("l", i) for i in range(3)]})),
            lambda items: _then(items, [item("l", i) for i in range(3)]))
        await pop("lane", "migrate_lane")
        await add("lane", [item("l", 9)])

    prev = _fsio.set_recorder(recorder)
    try:
        asyncio.run(work())
    finally:
        _fsio.set_recorder(prev)
    return rec


def frames(rec: OaRecording) -> list[tuple[str, int, int]]:
    """Every frame the workload appended to a log: (log path, at, n); a frame whose header
    does not parse (the torn one) is left out."""
    import orjson

    from fsdurable._itemlog import MAGIC

    out = []
    for op, args in rec.ops:
        if op != "append" or not os.path.basename(args[0]).startswith("items-"):
            continue
        data: bytes = args[1]
        if not data.startswith(MAGIC) or b"\n" not in data[12:]:
            continue
        try:
            hdr = orjson.loads(data[12:data.index(b"\n", 12)])
        except orjson.JSONDecodeError:
            continue
        out.append((args[0], hdr["at"], hdr["n"]))
    return out


def evidence(rec: OaRecording) -> set[str]:
    """What the recorded operations show the workload did (not what it says it did)."""
    rel = [(op, [os.path.relpath(a, rec.root) if isinstance(a, str) else a for a in args])
           for op, args in rec.ops]
    seen: set[str] = set()
    renamed = [(i, a[1]) for i, (op, a) in enumerate(rel) if op == "rename"]

    def first(pred: Callable[[str], bool], after: int = -1) -> int | None:
        return next((i for i, dst in renamed if i > after and pred(dst)), None)

    for sid in SESSIONS:  # log 0 durable, then the document naming it
        log0, doc = f"history/{sid}/items-000000.log", f"sessions/{sid}.json"
        at = first(log0.__eq__)
        if at is not None and first(doc.__eq__, at) is not None:
            seen.add(f"log0_then_document:{sid}")
    if first(lambda d: d.startswith("history/lane/openai_agents-")) is not None:
        seen.add("lane_segments")
    for i, dst in renamed:  # a rewrite: log n + 1, the document, then log n removed
        if dst.startswith("history/chat/items-") and not dst.endswith("000000.log"):
            old = f"history/chat/items-{int(dst[-10:-4]) - 1:06d}.log"
            named = first("sessions/chat.json".__eq__, i)
            if named is not None and any(op == "unlink" and a[0] == old
                                         for op, a in rel[named:]):
                seen.add("rewrite")
    if any(op == "truncate" and os.path.basename(a[0]).startswith("items-") for op, a in rel):
        seen.add("torn_tail_cut")
    stacks: dict[str, list[list[int]]] = {}
    for path, at, n in frames(rec):
        stack = stacks.setdefault(path, [])
        while stack and stack[-1][0] >= at:
            stack.pop()
        if stack and stack[-1][0] + stack[-1][1] > at:
            stack[-1][1] = at - stack[-1][0]
            if n == 0:
                seen.add("pop_inside_frame")  # a pop into a frame written before it
        if n:
            stack.append([at, n])
        seen.add("clear" if n == 0 and at == 0 else "pop" if n == 0 else
                 "add_many" if n > 1 else "add")
    return seen


async def _sync(fn: Callable[[], Any]) -> str:
    """A store call (a session of the older layout created), as the workload's calls."""
    fn()
    return "created"


def _then(items: list[Any], new: list[Any]) -> str:
    """A session of the older layout created holding ``new``."""
    items.extend(new)
    return "created"


# ---------------------------------------------------------------------- checking


@attrs.define
class OaReport(LgReport):  # the LangGraph explorer's figures, and:
    from_states: int = 0  # crash states with a violation (the rest: what the workload saw)
    started: int = 0  # states started up (discovery, doctor --repair)
    repaired: dict[str, int] = attrs.Factory(dict)  # what those startups repaired, by code
    # states that leave, after the add that follows the crash, a log no document names (a
    # rewrite cut short before its document, or before the old log's removal was durable):
    # dead bytes, never read; a violation only once startup ran (the repair gate removes them)
    stray_logs: int = 0


def _expected(rec: OaRecording, sid: str, k: int) -> list[Items]:
    """What ``sid`` may show at crash point ``k``: the items of the last acknowledged call,
    and those of the call in flight (if any)."""
    done: Items = ()
    flight: Items | None = None
    for c in rec.calls:
        if sid not in c.after:
            continue
        if c.end <= k:
            done = c.after[sid]
        elif c.start < k:
            flight = c.after[sid]
    return [done] if flight is None or flight == done else [done, flight]


def startup(root: str, clock: Callable[[], float]) -> tuple[list[str], list[str]]:
    """Startup on a crashed store (discovery, ``doctor --repair``): the problems it leaves,
    and the codes of what it repaired."""
    from fsdurable._doctor import doctor, problems

    store = Store(root, config=Config(fsync=False), clock=clock)
    store.interrupted()
    found = doctor(store, repair=True)
    return ([f"{f.code} {f.path}: {f.detail}" for f in problems(found)],
            [f.code for f in found if f.repaired])


def stray_logs(root: str, sid: str) -> list[str]:
    """The item logs of ``sid`` its document does not name."""
    from fsdurable._itemlog import ref_of
    from fsdurable._oaitems import KEY

    try:
        named = ref_of(Store(root, config=Config(fsync=False)).load(sid), KEY)["n"]
    except Exception:
        named = None
    return [p for p in log_paths(root, sid) if not p.endswith(f"items-{named:06d}.log")] \
        if named is not None else log_paths(root, sid)


AFTER = {"role": "user", "content": "after the crash"}


def _read_or_say(root: str, sid: str, where: str, out: list[str]) -> list[Any] | None:
    """``sid``'s items; None (and a violation in ``out``) if they do not read."""
    from fsdurable._errors import UnreadableState

    try:
        return read_items(root, sid)
    except UnreadableState as e:
        if e.reason == "log_short":  # never right: a log is durable before a document names it
            out.append(f"{where}: the document of {sid!r} names an item log the state lacks or "
                       f"holds shorter ({e})")
        else:
            out.append(f"{where}: {sid!r} is unreadable ({e.reason}: {e})")
    except Exception:
        out.append(f"{where}: reading {sid!r} raised\n{traceback.format_exc(limit=4)}")
    return None


def check_state(rec: OaRecording, k: int, where_root: str, note: str, *,
                with_startup: bool = True, report: OaReport | None = None) -> list[str]:
    from fsdurable.openai_agents import FileSession

    where = f"op {k} [{note}]"
    out: list[str] = []
    # past segment_grace (materialised files are new): repair_history removes what it may
    later = rec.t0 + 7200.0
    got: dict[str, list[Any]] = {}
    for sid in SESSIONS:
        items = _read_or_say(where_root, sid, where, out)
        if items is None:
            continue
        got[sid] = items
        allowed = _expected(rec, sid, k)
        if tuple(items) not in allowed:
            out.append(f"{where}: session {sid!r} shows {_short(items)}, expected one of "
                       f"{[_short(a) for a in allowed]}")
    if out:
        return out
    if with_startup:
        try:
            left, repaired = startup(where_root, lambda: later)
        except Exception:
            return [f"{where}: startup raised\n{traceback.format_exc(limit=6)}"]
        out += [f"{where}: doctor --repair left {p}" for p in left]
        if report is not None:
            report.started += 1
            for code in repaired:
                report.repaired[code] = report.repaired.get(code, 0) + 1
        for sid in SESSIONS:
            now = _read_or_say(where_root, sid, where + " after startup", out)
            if now is not None and now != got[sid]:
                out.append(f"{where}: startup changed {sid!r}: {_short(got[sid])} -> "
                           f"{_short(now)}")
            # the repair gate removes a log no document names (this node's, past the grace)
            left_logs = [os.path.basename(p) for p in stray_logs(where_root, sid)]
            if left_logs:
                out.append(f"{where}: doctor --repair left {sid!r}'s unnamed logs {left_logs}")
    stray = False
    for sid in SESSIONS:
        try:
            store = Store(where_root, config=Config(fsync=False, item_log_slack=SLACK),
                          clock=lambda: later)
            asyncio.run(FileSession(sid, store).add_items([AFTER]))
        except Exception:
            out.append(f"{where}: an add to {sid!r} after the crash raised\n"
                       f"{traceback.format_exc(limit=6)}")
            continue
        now = _read_or_say(where_root, sid, where + " after an add", out)
        if now is not None and now != [*got[sid], AFTER]:
            out.append(f"{where}: after an add, {sid!r} shows {_short(now)}, not "
                       f"{_short([*got[sid], AFTER])}")
        stray = stray or bool(stray_logs(where_root, sid))
    if report is not None:
        report.stray_logs += stray
    return out


def _short(items: Sequence[Any]) -> list[str]:
    return [i.get("id", "after") if isinstance(i, dict) else repr(i) for i in items]


def explore(rec: OaRecording, *, exhaustive: bool = False, max_violations: int = 20,
            startup_every: int = 1) -> OaReport:
    """Check every crash state of the recording; ``startup_every``: run startup (doctor) on
    one state in that many (1: all; 0: none)."""
    t = time.monotonic()
    report = OaReport(ops=len(rec.ops), calls=len(rec.calls), violations=list(rec.violations))
    for k, state, where_root in states_on_disk(
            rec.root, rec.snap, rec.ops, lambda k: sum(1 for c in rec.calls if c.end <= k),
            exhaustive=exhaustive, where=SHM, prefix="fsd-oacrash-"):
        report.states += 1
        v = check_state(rec, k, where_root, state.note, report=report,
                        with_startup=startup_every > 0
                        and report.states % startup_every == 0)
        if v:
            report.from_states += 1
            report.violations.extend(v[:3])
            if len(report.violations) >= max_violations:
                report.crash_points = k + 1
                report.seconds = time.monotonic() - t
                return report
    report.crash_points = len(rec.ops) + 1
    report.seconds = time.monotonic() - t
    return report


def run(*, exhaustive: bool = False, startup_every: int = 1) -> OaReport:
    with tempfile.TemporaryDirectory(dir=SHM, prefix="fsd-oarec-") as base:
        return explore(record(base), exhaustive=exhaustive, startup_every=startup_every)


# ---------------------------------------------------------------------- broken protocols

_ORIGINAL: dict[tuple[Any, str], Any] = {}


def _append_not_durable(path: str, offset: int, data: bytes, *, durable: bool = True) -> int:
    """_fsio.append_at with no fdatasync: an acknowledged add may be lost."""
    return int(_ORIGINAL[(_fsio, "append_at")](path, offset, data, durable=False))


def _append_at_the_end(path: str, offset: int, data: bytes, *, durable: bool = True) -> int:
    """_fsio.append_at that never cuts a torn tail: it appends after it (and says it wrote
    where it was asked to)."""
    size = os.lstat(path).st_size
    return int(_ORIGINAL[(_fsio, "append_at")](path, size, data, durable=durable)) \
        - size + offset


def _document_first(self: Any, s: Any, op: Any) -> tuple[Any, Any]:
    """Items._first committing the document that names log 0 before writing log 0."""
    import attrs as _attrs

    from fsdurable._itemlog import REF
    from fsdurable._model import with_adapter_ns
    from fsdurable._oaitems import KEY, SOURCE, legacy_items

    old = list(legacy_items(s))
    got = op(len(old), old.__getitem__)
    if got is None:
        return s, None
    at, new, out = got
    items = [*old[:at], *new]
    data, ref = self.encoded(items, 0)
    if s is None:
        doc = self.store.create(self.sid, source=SOURCE, metadata={KEY: {REF: ref}})
    else:
        lanes = {k: v for k, v in s.lanes.items() if k != KEY}
        doc = self.store._commit_locked(with_adapter_ns(_attrs.evolve(s, lanes=lanes), KEY,
                                                        items=None, **{REF: ref}), s.version)
    self.write_new_log(0, data)
    return doc, out


def _rewrite_document_first(self: Any, s: Any, v: Any) -> Any:
    """Items._rewrite committing the document that names log n + 1 before writing it."""
    from fsdurable._itemlog import REF
    from fsdurable._itemlog import read_items as log_items
    from fsdurable._model import with_adapter_ns
    from fsdurable._oaitems import KEY

    items = log_items(self.path(v.n), v, 0, v.count, self._max)
    n = v.n + 1
    data, ref = self.encoded(items, n)
    doc = self.store._commit_locked(with_adapter_ns(s, KEY, **{REF: ref}), s.version)
    self.write_new_log(n, data)
    _fsio.unlink(self.path(v.n), durable=self.store.config.fsync)
    return doc


def _rewrite_unlink_first(self: Any, s: Any, v: Any) -> Any:
    """Items._rewrite removing log n before the document naming log n + 1 is committed."""
    from fsdurable._itemlog import REF
    from fsdurable._itemlog import read_items as log_items
    from fsdurable._model import with_adapter_ns
    from fsdurable._oaitems import KEY

    items = log_items(self.path(v.n), v, 0, v.count, self._max)
    ref = self._whole(items, v.n + 1)
    _fsio.unlink(self.path(v.n), durable=self.store.config.fsync)
    return self.store._commit_locked(with_adapter_ns(s, KEY, **{REF: ref}), s.version)


def _patches(name: str) -> list[tuple[Any, str, Any]]:
    import re

    from fsdurable import _segments
    from fsdurable._oaitems import Items

    patches: dict[str, list[tuple[Any, str, Any]]] = {
        "append_not_durable": [(_fsio, "append_at", _append_not_durable)],
        "document_before_first_log": [(Items, "_first", _document_first)],
        "document_before_rewritten_log": [(Items, "_rewrite", _rewrite_document_first)],
        "torn_tail_not_cut": [(_fsio, "append_at", _append_at_the_end)],
        "old_log_unlinked_first": [(Items, "_rewrite", _rewrite_unlink_first)],
        # the repair gate blind to item logs: a log no document names stays for ever
        "unnamed_log_kept": [(_segments, "LOG_RE", re.compile(r"(?!)"))],
    }
    return patches[name]


# (a) the append not fdatasynced; (b) a document committed before the log it names is written,
# at a first write (new or migrated) and at a rewrite; (c) a torn tail not cut (the frame goes
# after it); (d) a rewrite's old log removed before the document naming the new one is
# committed; and doctor --repair never removing a log no document names
OA_MUTANTS = ("append_not_durable", "document_before_first_log",
              "document_before_rewritten_log", "torn_tail_not_cut", "old_log_unlinked_first",
              "unnamed_log_kept")


@contextmanager
def mutant(name: str) -> Iterator[None]:
    """Install one broken variant of the item log's protocol."""
    patches = _patches(name)
    old = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
    for owner, attr, impl in patches:
        _ORIGINAL[(owner, attr)] = getattr(owner, attr)
        setattr(owner, attr, impl)
    try:
        yield
    finally:
        for owner, attr, was in old:
            setattr(owner, attr, was)


def run_mutant(name: str) -> OaReport:
    """Record the workload with the protocol broken as ``name`` says, then explore (the
    reader after the crash writes with it too): the explorer must find a violation."""
    with mutant(name), tempfile.TemporaryDirectory(dir=SHM, prefix="fsd-oarec-") as base:
        rec = record(base)
        return explore(rec, max_violations=1)
