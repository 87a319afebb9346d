"""Cost growth: what a commit costs as a session grows, and what a long chat writes to disk.

Command: ``python -m bench.growth`` (full) or ``python -m bench.growth --quick``.
Writes ``growth.json``. Four figures (issue 18's targets, side by side in one run):

1. ``checkpoint_growth``: at 10, 100, 1,000 and 5,000 messages (~1 KB each on average, tool
   calls included), interleaved round by round: ``checkpoint`` (a phase boundary that adds no
   message), ``append_checkpoint`` (one new message, then the commit), ``patch`` (a metadata
   read-modify-write: it loads the session), ``begin_turn`` (a new turn with a user message; the
   turn is cancelled, untimed, before each call) and the two floors: ``floor_append`` (one
   append + fdatasync of the new message's bytes: an append-only design), ``floor_rename``
   (temp + fsync + rename + directory fsync of the session document's bytes) and
   ``floor_protocol`` (those bytes written with the steps the design's protocol adds, done bare:
   bench/commit.py's ``FloorProtocol``), so the small checkpoint's ratio to the rename floor
   shows beside it how much of it the protocol's syscalls are and how much is Python.
2. ``chat``: a 1,000-turn chat (quick: 100) through the store's turn API — per turn
   ``begin_turn`` with a ~2 KB user message, one checkpoint, ``end_turn`` with a ~2 KB reply —
   against the append-only floor with the same marker protocol (marker written, the two messages
   appended with an fdatasync each, marker removed) and the write-once floor (the issue's design
   bare with the same three commits a turn: ``floor_once_turns``). Time, and the bytes each
   wrote: ``wchar`` (bytes passed to write) and ``write_bytes`` (bytes sent to the storage
   layer, whole pages) of ``/proc/self/io``, next to the turns' content (the messages' UTF-8 bytes).
3. ``rsync``: the bytes ``rsync -a --no-whole-file`` sends (its ``--stats``) to bring a mirror
   of the store up to date after one turn of a 1,000-message session, against that turn's content.
4. ``throughput``: ``parse_session`` of a 1 MB session's document and the read of its whole
   history (``tuple(session.messages)``), against ``orjson.loads`` of the same messages as one
   file.
A part that cannot measure (no ``/proc/self/io``, no rsync) raises: the run fails, never a table
that silently says "not measured".
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

from ._floor import AppendFloor
from ._harness import cache_dir, environment, log, measure, ratio, script_main, write_result

FULL: dict[str, Any] = {
    "points": [10, 100, 1_000, 5_000], "reps": 200, "budget": 6.0, "tp_sizes": [1 << 20],
    "turns": 10, "chat_turns": 1_000, "rsync_messages": 1_000}
QUICK: dict[str, Any] = {
    "points": [10, 100, 1_000], "reps": 8, "budget": 0.5, "tp_sizes": [1 << 20], "turns": 2,
    "chat_turns": 100, "rsync_messages": 200}


def transcript(n: int) -> tuple[Any, ...]:
    from ._data import make_messages

    msgs: tuple[Any, ...] = ()
    k = 0
    while len(msgs) < n:
        msgs += make_messages(random.Random(k), 64 * 1024)[1:]
        k += 1
    return msgs[:n]


def io_counters() -> dict[str, int]:
    """This process's ``wchar`` and ``write_bytes`` (Linux ``/proc/self/io``); raises if absent:
    a figure that cannot be measured fails the run."""
    with open("/proc/self/io", encoding="ascii") as f:
        d = dict(line.split(": ") for line in f.read().splitlines())
    return {"wchar": int(d["wchar"]), "write_bytes": int(d["write_bytes"])}


def growth_points(store: Any, work: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    """Each operation at each session size, all sizes measured in one ``measure`` call,
    interleaved round by round: a machine whose disk or CPU drifts during the part (another
    tenant's load) moves every size alike, so the growth ratios compare like with like (sizes
    measured one after the other read drift as growth: a run at 8516f25 saw its own rename
    floor 1.5x slower at 5,000 messages than at 10)."""
    import attrs

    from fsdurable import _codec
    from fsdurable._model import Message, extended

    from .commit import Floor, FloorProtocol

    extra = Message("assistant", "noted; next step " * 6)
    extra_bytes = orjson_bytes(extra)
    calls: dict[str, Callable[[], Any]] = {}
    idles: dict[str, str] = {}
    docs: dict[int, bytes] = {}
    closers: list[Any] = []
    for n in p["points"]:
        sid = f"g{n}"
        s = store.begin_turn(store.create(sid).id, None)
        box = {"s": store.commit(attrs.evolve(s, messages=transcript(n)), s.version)}
        idle = f"g{n}-idle"
        store.create(idle)
        store.patch(idle, lambda cur, n=n: attrs.evolve(cur, messages=transcript(n)))
        doc = docs[n] = _codec.encode_session(box["s"])
        floor_dir = os.path.join(work, f"floor-{n}")
        os.makedirs(floor_dir)
        append = AppendFloor(os.path.join(floor_dir, "log.jsonl"), extra_bytes)
        protocol_dir = os.path.join(work, f"floor-protocol-{n}")
        os.makedirs(protocol_dir)
        protocol = FloorProtocol(protocol_dir, [doc, doc[:-1] + b" "])
        closers += [append, protocol]

        def checkpoint(box: dict[str, Any] = box) -> None:
            box["s"] = store.checkpoint(box["s"], phase="model_reply")

        def append_checkpoint(box: dict[str, Any] = box) -> None:
            s = box["s"]
            box["s"] = store.commit(attrs.evolve(s, messages=extended(s.messages, extra)),
                                    s.version)

        def patch(idle: str = idle) -> None:
            store.patch(idle, lambda cur: attrs.evolve(
                cur, metadata={"n": cur.metadata.get("n", 0) + 1}))

        def begin(idle: str = idle) -> None:
            store.begin_turn(idle, "one more question")

        idles[f"begin_turn@{n}"] = idle
        for name, fn in (("checkpoint", checkpoint), ("append_checkpoint", append_checkpoint),
                         ("patch", patch), ("begin_turn", begin), ("floor_append", append),
                         ("floor_rename", Floor(floor_dir, [doc, doc[:-1] + b" "])),
                         ("floor_protocol", protocol)):
            calls[f"{name}@{n}"] = fn

    def setup(name: str) -> None:
        idle = idles.get(name)
        if idle is not None:
            store.cancel(idle)  # untimed: the next begin_turn finds the session idle

    every = measure(calls, min_reps=5, max_reps=p["reps"], budget=p["budget"], setup=setup,
                    warmup=5)
    for c in closers:
        c.close()
    rows = []
    for n in p["points"]:
        res = {k.split("@")[0]: v for k, v in every.items() if k.endswith(f"@{n}")}
        doc = docs[n]
        row = {"messages": n, "document_bytes": len(doc), "results": res,
               "ratios": {"checkpoint_vs_floor_rename": ratio(res["checkpoint"],
                                                              res["floor_rename"]),
                          "checkpoint_vs_floor_protocol": ratio(res["checkpoint"],
                                                                res["floor_protocol"]),
                          "floor_protocol_vs_floor_rename": ratio(res["floor_protocol"],
                                                                  res["floor_rename"]),
                          "append_checkpoint_vs_floor_append": ratio(res["append_checkpoint"],
                                                                     res["floor_append"])}}
        log(f"  growth n={n} (document {len(doc)} B): " + ", ".join(
            f"{k} {v['median'] * 1e3:.2f}ms" for k, v in res.items()))
        rows.append(row)
    return rows


def orjson_bytes(m: Any) -> bytes:
    import orjson

    from fsdurable._codec import _conv

    return orjson.dumps(_conv().unstructure(m), option=orjson.OPT_APPEND_NEWLINE)


def chat(store: Any, work: str, p: dict[str, Any]) -> dict[str, Any]:
    """A long chat through the turn API, and the append-only floor doing the same turns."""
    from ._data import _text

    rng = random.Random(18)
    turns = p["chat_turns"]
    texts = [(_text(rng, 2000), _text(rng, 2000)) for _ in range(turns)]
    content = sum(len(q.encode()) + len(a.encode()) for q, a in texts)
    sid = store.create("chat").id
    before, t0 = io_counters(), time.perf_counter()
    for q, a in texts:
        s = store.begin_turn(sid, q)
        s = store.checkpoint(s, phase="model_reply")
        store.end_turn(s, a)
    seconds, after = time.perf_counter() - t0, io_counters()
    ours = {k: after[k] - before[k] for k in after}
    def measured(name: str, turns_of: Any) -> tuple[float, dict[str, int]]:
        d = os.path.join(work, name)
        os.makedirs(d)
        before, t0 = io_counters(), time.perf_counter()
        turns_of(d, texts)
        took, after = time.perf_counter() - t0, io_counters()
        return took, {k: after[k] - before[k] for k in after}

    floor_s, floor = measured("chat-floor", floor_turns)
    if not floor["write_bytes"]:
        raise RuntimeError("write_bytes stayed 0 (tmpfs?): bytes written cannot be measured here")
    once_s, once = measured("chat-floor-once", floor_once_turns)
    out = {"turns": turns, "content_bytes": content,
           "fsdurable": {"seconds": seconds, **ours}, "floor_append": {"seconds": floor_s, **floor},
           "floor_write_once": {"seconds": once_s, **once},
           "ratios": {"write_bytes_vs_content": ours["write_bytes"] / content,
                      "wchar_vs_content": ours["wchar"] / content,
                      "floor_write_bytes_vs_content": floor["write_bytes"] / content,
                      "floor_write_once_write_bytes_vs_content": once["write_bytes"] / content,
                      "write_bytes_vs_floor_write_once": ours["write_bytes"] / once["write_bytes"],
                      "seconds_vs_floor_append": seconds / floor_s,
                      "seconds_vs_floor_write_once": seconds / once_s}}
    sample = texts[: p.get("breakdown_turns", 50)]  # untimed: reading /proc/self/io per step
    out["breakdown"] = {"turns": len(sample), "fsdurable": chat_breakdown(store, sid, sample),
                        "floor_append": floor_breakdown(os.path.join(work, "floor-b"), sample)}
    log(f"  chat of {turns} turns: {out['ratios']}; per turn: {out['breakdown']}")
    return out


def floor_turns(floor_dir: str, texts: list[tuple[str, str]],
                at: Any = None, turn: Any = None) -> None:
    """The append-only floor's turns: marker (temp, fsync, rename, dir fsync); the two messages
    appended with an fdatasync each; marker removed (unlink, dir fsync). ``at(kind, op)``
    (untimed runs) is called before each operation, ``turn()`` after each turn."""
    marker = os.path.join(floor_dir, "marker.json")
    dfd = os.open(floor_dir, os.O_RDONLY)
    fd = os.open(os.path.join(floor_dir, "chat.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                 0o600)
    note = at or (lambda kind, op="": None)
    for q, a in texts:
        note("marker", "write")
        tmp = marker + ".tmp"
        mfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(mfd, b'{"session_id":"chat","turn_id":"t"}\n')
        note("marker", "fsync")
        os.fsync(mfd)
        os.close(mfd)
        note("marker", "rename")
        os.replace(tmp, marker)
        note("marker", "dir_fsync")
        os.fsync(dfd)
        for text in (q, a):
            note("log", "append")
            os.write(fd, json.dumps({"role": "user", "content": text}).encode() + b"\n")
            note("log", "fsync")
            os.fdatasync(fd)
        note("marker", "unlink")
        os.unlink(marker)
        note("marker", "dir_fsync")
        os.fsync(dfd)
        if turn is not None:
            turn()
    os.close(fd)
    os.close(dfd)


def floor_once_turns(floor_dir: str, texts: list[tuple[str, str]]) -> None:
    """The write-once floor's turns: the issue's design (the marker protocol, the session's
    document by fsync-and-rename at each commit, history in write-once files) bare, with the
    chat's three commits a turn and nothing of fsdurable's (no lock, no compare-and-swap, no
    event log, no checks): marker written; the document with the question inline (``begin_turn``),
    again with the phase (the checkpoint); the turn's two messages in one new file and the
    document naming it (``end_turn``); marker removed. Every file by temp, fsync, rename and
    directory fsync; the removal's directory fsynced."""
    dirs = {k: os.path.join(floor_dir, k) for k in ("markers", "sessions", "history")}
    for d in dirs.values():
        os.makedirs(d)
    dfds = {k: os.open(d, os.O_RDONLY) for k, d in dirs.items()}

    def put(kind: str, name: str, data: bytes) -> None:
        path = os.path.join(dirs[kind], name)
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        os.replace(path + ".tmp", path)
        os.fsync(dfds[kind])

    head, count = None, 0
    for i, (q, a) in enumerate(texts):
        put("markers", "chat.json", json.dumps({"session_id": "chat", "turn": i}).encode())
        doc = {"id": "chat", "version": 3 * i, "in_progress": True, "count": count, "head": head,
               "tail": [{"role": "user", "content": q}], "phase": None}
        put("sessions", "chat.json", json.dumps(doc).encode())
        doc.update(version=3 * i + 1, phase="model_reply")
        put("sessions", "chat.json", json.dumps(doc).encode())
        data = json.dumps({"prev": head, "messages": [{"role": "user", "content": q},
                                                      {"role": "assistant", "content": a}]})
        head, count = f"{count:012d}.json", count + 2
        put("history", head, data.encode())
        doc.update(version=3 * i + 2, in_progress=False, count=count, head=head, tail=[],
                   phase=None)
        put("sessions", "chat.json", json.dumps(doc).encode())
        os.unlink(os.path.join(dirs["markers"], "chat.json"))
        os.fsync(dfds["markers"])
    for fd in dfds.values():
        os.close(fd)


class _PerKind:
    """``write_bytes`` (``/proc/self/io``) and disk operations per kind of file, turn by turn:
    each delta of ``write_bytes`` goes to the step announced before it (the store's ``_fsio``
    recorder, or the floor's own steps). Reported per turn: the median of each kind's bytes
    (a page the kernel's writeback cleans and the process dirties again lands in one turn; a
    median keeps it out of the others), the mean of its operations."""

    def __init__(self) -> None:
        self.turns: list[dict[str, dict[str, int]]] = [{}]
        self.kind = ""
        self.last = io_counters()["write_bytes"]

    def at(self, kind: str, op: str = "") -> None:
        now = io_counters()["write_bytes"]
        by = self.turns[-1]
        if self.kind:
            row = by.setdefault(self.kind, {"write_bytes": 0})
            row["write_bytes"] += now - self.last
        self.kind, self.last = kind, now
        if kind and op:
            row = by.setdefault(kind, {"write_bytes": 0})
            row[op] = row.get(op, 0) + 1

    def turn(self) -> None:
        self.at("")
        self.turns.append({})

    def per_turn(self) -> dict[str, dict[str, float]]:
        turns = [t for t in self.turns if t]
        kinds = sorted({k for t in turns for k in t})
        out: dict[str, dict[str, float]] = {}
        for k in kinds:
            rows = [t.get(k, {"write_bytes": 0}) for t in turns]
            wb = sorted(r["write_bytes"] for r in rows)
            ops = sorted({op for r in rows for op in r} - {"write_bytes"})
            out[k] = {"write_bytes": wb[len(wb) // 2],
                      **{op: sum(r.get(op, 0) for r in rows) / len(rows) for op in ops}}
        return out


def chat_breakdown(store: Any, sid: str, texts: list[tuple[str, str]]) -> dict[str, Any]:
    """More turns of the chat with every ``_fsio`` operation recorded: per turn, per kind of
    file (marker, session document, segment, event log), its ``write_bytes`` and its writes,
    appends, fsyncs (files and directories), renames and unlinks."""
    from fsdurable import _fsio

    kinds = {"markers": "marker", "sessions": "document", "history": "segment",
             "events": "event"}
    pk = _PerKind()

    def rec(op: str, args: tuple[Any, ...]) -> None:
        rel = os.path.relpath(str(args[0]), store.root).split(os.sep)
        kind = kinds.get(rel[0], "other")
        pk.at(kind, {"fsync_dir": "dir_fsync", "create": "", "mkdir": ""}.get(op, op))

    prev = _fsio.set_recorder(rec)
    try:
        for q, a in texts:
            s = store.begin_turn(sid, q)
            s = store.checkpoint(s, phase="model_reply")
            store.end_turn(s, a)
            pk.turn()
    finally:
        _fsio.set_recorder(prev)
    return pk.per_turn()


def floor_breakdown(floor_dir: str, texts: list[tuple[str, str]]) -> dict[str, Any]:
    os.makedirs(floor_dir)
    pk = _PerKind()
    floor_turns(floor_dir, texts, pk.at, pk.turn)
    return pk.per_turn()


def _rsync(src: str, mirror: str) -> dict[str, int]:
    """``rsync -a --no-whole-file --stats src/ mirror/``: its total bytes sent and literal data."""
    got = subprocess.run(["rsync", "-a", "--no-whole-file", "--stats", src + "/", mirror + "/"],
                         capture_output=True, text=True, check=True)
    out = {}
    for key, label in (("sent", "Total bytes sent"), ("literal", "Literal data")):
        m = re.search(label + r": ([\d,.]+)", got.stdout)
        if m is None:
            raise RuntimeError(f"rsync --stats said no '{label}': {got.stdout[:300]}")
        out[key] = int(re.sub(r"[,.]", "", m.group(1)))
    return out


def _write_once_turn(root: str, seq: int, q: str, a: str) -> None:
    """The write-once floor's turn: the issue's design with nothing of fsdurable's: the turn's
    two messages in one new file named by sequence and digest (as a segment), then a small
    document naming it rewritten by rename (fsync off: rsync's bytes do not depend on it)."""
    import hashlib

    data = json.dumps([{"role": "user", "content": q},
                       {"role": "assistant", "content": a}]).encode()
    digest = hashlib.sha256(data).hexdigest()
    name = f"{seq:012d}-{digest[:16]}.json"
    with open(os.path.join(root, "history", name), "wb") as f:
        f.write(data)
    tmp = os.path.join(root, "session.json.tmp")
    with open(tmp, "wb") as f:
        f.write(json.dumps({"count": seq + 2, "head": name, "sha256": digest}).encode())
    os.replace(tmp, os.path.join(root, "session.json"))


def rsync_turn(work: str, p: dict[str, Any]) -> dict[str, Any]:
    """Bytes rsync sends to update a mirror after one turn of a long session: a store holding
    that one session, grown turn by turn (one segment per message, as a chat writes them; fsync
    off while it is built: the bytes do not depend on it). Beside it, the same turns in two
    floors synced the same way: the append-only floor (one log the messages are appended to,
    ``floor_turns``: rsync sends the new bytes and a match token per block of the old ones) and
    the write-once floor (``_write_once_turn``: one new file a turn and a small document, the
    issue's design bare: rsync's file list names every file of the session)."""
    import fsdurable

    if shutil.which("rsync") is None:
        raise RuntimeError("rsync is not installed: its figure cannot be measured")
    from ._data import _text

    store = fsdurable.Store(os.path.join(work, "rsync-store"),
                            config=fsdurable.Config(fsync=False))
    sid = store.create("rs").id
    append_root = os.path.join(work, "rsync-floor-append")
    once_root = os.path.join(work, "rsync-floor-once")
    os.makedirs(append_root)
    os.makedirs(os.path.join(once_root, "history"))
    rng = random.Random(4)
    texts = []
    for _ in range(p["rsync_messages"] // 2):
        q, a = _text(rng, 2000), _text(rng, 2000)
        s = store.begin_turn(sid, q)
        store.end_turn(s, a)
        texts.append((q, a))
    floor_turns(append_root, texts)
    for i, (q, a) in enumerate(texts):
        _write_once_turn(once_root, 2 * i, q, a)
    rng = random.Random(5)
    q, a = _text(rng, 2000), _text(rng, 2000)
    content = len(q.encode()) + len(a.encode())
    out: dict[str, Any] = {"messages": p["rsync_messages"], "turn_content_bytes": content}
    for name, root in (("fsdurable", store.root), ("floor_append", append_root),
                       ("floor_write_once", once_root)):
        mirror = os.path.join(work, "mirror-" + name)
        _rsync(root, mirror)
        unchanged = _rsync(root, mirror)["sent"]  # rsync's own floor: the file list alone
        if name == "fsdurable":
            s = store.begin_turn(sid, q)
            store.end_turn(store.checkpoint(s, phase="model_reply"), a)
        elif name == "floor_append":
            floor_turns(root, [(q, a)])
        else:
            _write_once_turn(root, 2 * len(texts), q, a)
        got = _rsync(root, mirror)
        out[name] = {
            "files": sum(len(fs) for _, _, fs in os.walk(root)),
            "bytes_sent": got["sent"], "ratio": got["sent"] / content,
            "bytes_sent_nothing_changed": unchanged,
            "ratio_above_file_list": (got["sent"] - unchanged) / content,
            # of what it sent, the changed files' bytes it had no match for (--stats'
            # "Literal data"; its "File list size" says 0 with incremental recursion)
            "literal_bytes": got["literal"]}
    f = out["fsdurable"]
    out.update({"files_in_store": f["files"], "bytes_sent": f["bytes_sent"],
                "ratio": f["ratio"], "bytes_sent_nothing_changed": f["bytes_sent_nothing_changed"],
                "ratio_above_file_list": f["ratio_above_file_list"],
                "literal_bytes": f["literal_bytes"],
                "vs_floor_append": f["bytes_sent"] / out["floor_append"]["bytes_sent"],
                "vs_floor_write_once": f["bytes_sent"] / out["floor_write_once"]["bytes_sent"]})
    log(f"  rsync after one turn at {p['rsync_messages']} messages: {out}")
    return out


def throughput(store: Any, p: dict[str, Any]) -> list[dict[str, Any]]:
    return [throughput_one(store, size, p) for size in p["tp_sizes"]]


def throughput_one(store: Any, size: int, p: dict[str, Any]) -> dict[str, Any]:
    import attrs
    import orjson

    import fsdurable
    from fsdurable import _codec

    msgs = transcript(max(1, size // 670))
    sid = f"tp{size}"
    store.create(sid)
    store.patch(sid, lambda cur: attrs.evolve(cur, messages=msgs))
    path = store.layout.session(sid)
    with open(path, "rb") as f:
        doc = f.read()
    whole = orjson.dumps([_codec._conv().unstructure(m) for m in msgs])

    def read_history() -> None:
        s = fsdurable.Store(store.root).load(sid)
        tuple(s.messages)

    calls = {"parse_document": lambda: _codec.parse_session(doc, path=path),
             "load_and_read_history": read_history,
             "orjson_loads_whole": lambda: orjson.loads(whole)}
    res = measure(calls, min_reps=3, max_reps=p["reps"], budget=p["budget"])
    out = {"history_bytes": len(whole), "document_bytes": len(doc), "results": res,
           "ratios": {"read_history_vs_orjson_loads": ratio(res["load_and_read_history"],
                                                            res["orjson_loads_whole"])}}
    log(f"  throughput {len(whole) >> 10} KB: {out['ratios']}")
    return out


def writes_per_turn(store: Any, p: dict[str, Any]) -> dict[str, Any]:
    import fsdurable
    from fsdurable import AgentLoop, Reply, ScriptedModel, _fsio, tool
    from fsdurable._tools import call

    @tool(effect="none")
    def lookup(ctx: Any, q: str) -> str:
        return f"result for {q}: " + "data " * 40

    steps = [Reply(f"step {i}", [call("lookup", f"c{i}a", q=f"a{i}"),
                                 call("lookup", f"c{i}b", q=f"b{i}")]) for i in range(12)]
    out: dict[str, Any] = {"model_steps": len(steps), "tool_calls": 2 * len(steps)}
    for label, debounce in (("debounce_2s", 2.0), ("no_debounce", 0.0)):
        cfg = store.config.replace(checkpoint_debounce=debounce)
        # the store's config too: the turn protocol debounces by the store's (_turns.py)
        st = fsdurable.Store(store.root, config=cfg)
        loop = AgentLoop(st, ScriptedModel(steps, final="all done"), [lookup], cfg)
        counts, rec = _counter(store.layout.sessions, store.layout.markers)

        times = []
        for t in range(p["turns"]):
            sid = st.create(f"w-{label}-{t}").id
            prev = _fsio.set_recorder(rec)
            try:
                t0 = time.perf_counter()
                result = loop.run(sid, "do the thing", attended=True)
                times.append(time.perf_counter() - t0)
            finally:
                _fsio.set_recorder(prev)
            if result.status != "completed":
                raise RuntimeError(f"bursty turn ended {result.status}")
        out[label] = {k: v / p["turns"] for k, v in counts.items()}
        out[label]["turn_seconds_median"] = sorted(times)[len(times) // 2]
        log(f"  writes per turn, {label}: {out[label]}")
    return out


def _counter(sessions_dir: str, markers_dir: str) -> tuple[dict[str, int], Any]:
    """Counts of the disk operations ``_fsio`` announces, and the recorder that counts them."""
    c = {"session_writes": 0, "marker_writes": 0, "marker_removals": 0, "fsyncs": 0}

    def rec(op: str, args: tuple[Any, ...]) -> None:
        if op == "rename" and len(args) == 2:
            d = os.path.dirname(args[1])
            if d == sessions_dir:
                c["session_writes"] += 1
            elif d == markers_dir:
                c["marker_writes"] += 1
        elif op == "unlink" and os.path.dirname(args[0]) == markers_dir:
            c["marker_removals"] += 1
        elif op in ("fsync", "fsync_dir"):
            c["fsyncs"] += 1

    return c, rec


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    import fsdurable

    p = QUICK if quick else FULL
    work = os.path.join(cache_dir(quick), "growth")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = environment(work)
    # as a user's process opens a store: no FSDURABLE_* variables (state dir, node id)
    store = fsdurable.Store(os.path.join(work, "store"))
    body: dict[str, Any] = {"params": p}
    body["checkpoint_growth"] = growth_points(store, work, p)
    body["chat"] = chat(store, work, p)
    body["rsync"] = rsync_turn(work, p)
    body["throughput"] = throughput(store, p)
    body["writes_per_turn"] = writes_per_turn(store, p)  # a failure fails the run
    g = body["checkpoint_growth"]
    first, last = g[0], g[-1]

    def grew(name: str) -> float:
        return ratio(last["results"][name], first["results"][name])

    n0, n1 = first["messages"], last["messages"]
    c = body["chat"]
    body["targets"] = {
        f"checkpoint_{n1}_vs_{n0}": {"value": grew("checkpoint"), "target": "<= 1.3",
                                     "met": grew("checkpoint") <= 1.3},
        f"append_checkpoint_{n1}_vs_{n0}": {"value": grew("append_checkpoint"),
                                            "target": "<= 1.3",
                                            "met": grew("append_checkpoint") <= 1.3},
        f"begin_turn_{n1}_vs_{n0}": {"value": grew("begin_turn"), "target": "<= 1.5",
                                     "met": grew("begin_turn") <= 1.5},
        f"patch_{n1}_vs_{n0}": {"value": grew("patch"), "target": "<= 1.5",
                                "met": grew("patch") <= 1.5},
        "chat_write_bytes_vs_content": {
            "value": c["ratios"]["write_bytes_vs_content"], "target": "<= 3",
            "met": c["ratios"]["write_bytes_vs_content"] <= 3,
            "floor": c["ratios"]["floor_write_bytes_vs_content"],
            "floor_write_once": c["ratios"]["floor_write_once_write_bytes_vs_content"]},
        "rsync_bytes_per_turn_vs_content": {
            "value": body["rsync"]["ratio"], "target": "<= 2", "met": body["rsync"]["ratio"] <= 2,
            "above_file_list": body["rsync"]["ratio_above_file_list"],
            "floor": body["rsync"]["floor_append"]["ratio"],
            "floor_write_once": body["rsync"]["floor_write_once"]["ratio"]},
        "small_checkpoint_vs_floor_rename": {
            "value": first["ratios"]["checkpoint_vs_floor_rename"], "target": "<= 1.3",
            "met": first["ratios"]["checkpoint_vs_floor_rename"] <= 1.3,
            "vs_floor_protocol": first["ratios"]["checkpoint_vs_floor_protocol"],
            "floor_protocol_vs_floor_rename": first["ratios"]["floor_protocol_vs_floor_rename"]},
    }
    write_result(out_dir, "growth", env, body, quick=quick, cleanup=work)
    return body


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
