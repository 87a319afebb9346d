"""Generated data sets: stores of N realistic (~20 KB) sessions, M of them interrupted, and the
same sessions in the peers' databases (SQLite with an indexed in-progress column; LangGraph's
SqliteSaver when installed).

Sessions are encoded once by fsdurable's own codec (so every file is a valid session) and written
with plain file writes (generating 100,000 files through the fsynced commit path would take an
hour). The data sets live in a cache directory outside the repository, keyed by a hash of the
encoded templates, and are reused between runs; ``configure(M)`` flips the first ``MAX_M``
sessions between idle and interrupted (session file, marker, SQLite row, LangGraph pending write)
so one data set serves every M.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sqlite3
import time
from typing import Any

from ._harness import log

MAX_M = 100
NODE = "bench-node"
N_TEMPLATES = 32
ID_WIDTH = 8  # "s" + 7 digits: every id has the same length, so templates splice by bytes
PLACEHOLDER = "sXXXXXXX"
TURN_PLACEHOLDER = "tXXXXXXX"
_VOCABULARY = """the agent reads file config yaml path error retry model tool call result user asks
fix test build deploy function return value list index memory cache session turn json commit write
sync marker disk crash resume plan step check output line module"""
WORDS = tuple(_VOCABULARY.split())


def sid(i: int) -> str:
    return f"s{i:07d}"


def _text(rng: random.Random, n_chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def make_messages(rng: random.Random, target_bytes: int) -> tuple[Any, ...]:
    """A plausible agent transcript of about ``target_bytes`` encoded bytes: user asks, the
    assistant calls tools, tool results come back (the bulk), the assistant answers."""
    from fsdurable._model import Message, ToolCall

    msgs: list[Any] = [Message("system", _text(rng, 400))]
    size = 450
    k = 0
    while size < target_bytes:
        k += 1
        user = _text(rng, rng.randint(80, 400))
        call = ToolCall(id=f"call_{k}", name=rng.choice(["read_file", "grep", "run_tests"]),
                        arguments={"path": f"src/module_{k}.py", "limit": 200})
        result = _text(rng, rng.randint(800, 2400))
        reply = _text(rng, rng.randint(200, 900))
        msgs += [Message("user", user), Message("assistant", "", tool_calls=(call,)),
                 Message("tool", result, tool_call_id=call.id), Message("assistant", reply)]
        size += len(user) + len(result) + len(reply) + 400
    return tuple(msgs)


def inline_document(s: Any) -> bytes:
    """``s`` as one file with its messages inline (format 3, which the store reads and migrates):
    the data sets hold 100,000 such sessions, whose ids are filled into one template each —
    segments, named by their digest, cannot be templated. Discovery reads none of it."""
    import attrs
    import orjson

    from fsdurable._codec import _conv, session_to_dict

    d = session_to_dict(attrs.evolve(s, messages=()), None)
    del d["history"]
    d["format"] = "fsdurable.session/3"
    d["messages"] = [_conv().unstructure(m) for m in s.messages]
    return orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE)


def templates(session_bytes: int) -> list[tuple[bytes, bytes, bytes]]:
    """(idle session, interrupted session, marker) encodings with placeholder ids."""
    import attrs

    from fsdurable._codec import encode_marker
    from fsdurable._model import Marker, Session, Turn

    out = []
    for t in range(N_TEMPLATES):
        rng = random.Random(t)
        now = 1_790_000_000.0 + t
        s = Session(id=PLACEHOLDER, version=7, created_at=now - 3600, updated_at=now,
                    source="api", route_key=f"session:{PLACEHOLDER}",
                    messages=make_messages(rng, session_bytes),
                    metadata={"title": _text(rng, 40), "model": "some-model-1"})
        idle = inline_document(s)
        turn = Turn(id=TURN_PLACEHOLDER, started_at=now - 5, checkpoint_at=now - 1,
                    phase="tool_batch_finished")
        busy_s = attrs.evolve(s, in_progress=True, turn=turn)
        busy = inline_document(busy_s)
        marker = encode_marker(Marker.of(busy_s, NODE))
        out.append((idle, busy, marker))
    return out


def _fill(tpl: bytes, i: int) -> bytes:
    s = sid(i).encode()
    return tpl.replace(PLACEHOLDER.encode(), s).replace(TURN_PLACEHOLDER.encode(),
                                                         b"t" + s[1:])


class Dataset:
    """One store of ``n`` sessions and its peers' databases, under ``path``."""

    def __init__(self, base: str, n: int, session_bytes: int = 20_000,
                 langgraph: bool = True) -> None:
        self.n = n
        self.session_bytes = session_bytes
        self.tpl = templates(session_bytes)
        digest = hashlib.sha256(b"".join(b"".join(t) for t in self.tpl)).hexdigest()[:12]
        self.path = os.path.join(base, f"n{n}-{session_bytes}-{digest}")
        self.root = os.path.join(self.path, "store")
        self.sessions = os.path.join(self.root, "sessions")
        self.markers = os.path.join(self.root, "markers")
        self.sqlite = os.path.join(self.path, "peer-sqlite.db")
        self.langgraph_db = os.path.join(self.path, "peer-langgraph.db")
        self.want_langgraph = langgraph and langgraph_available()
        self.m = -1
        self.avg_bytes = sum(len(t[0]) for t in self.tpl) / len(self.tpl)

    # ------------------------------------------------------------------ build

    def ensure(self) -> Dataset:
        done = os.path.join(self.path, "done.json")
        if not os.path.exists(done):
            self._build_store()
            self._build_sqlite()
            _write_json(done, {"n": self.n, "bytes": self.session_bytes})
        if self.want_langgraph and not os.path.exists(os.path.join(self.path, "lg-done.json")):
            self._build_langgraph()
            _write_json(os.path.join(self.path, "lg-done.json"), {"n": self.n})
        state = os.path.join(self.path, "m.json")
        if os.path.exists(state):
            with open(state, encoding="utf-8") as f:
                self.m = json.load(f)["m"]
        return self

    def _build_store(self) -> None:
        import fsdurable

        t0 = time.perf_counter()
        if os.path.exists(self.path):
            shutil.rmtree(self.path)
        os.makedirs(self.path)
        fsdurable.Store(self.root, config=fsdurable.Config(fsync=False), node_id=NODE)
        tpl = self.tpl
        for i in range(self.n):
            with open(os.path.join(self.sessions, sid(i) + ".json"), "wb") as f:
                f.write(_fill(tpl[i % N_TEMPLATES][0], i))
        _write_json(os.path.join(self.path, "m.json"), {"m": 0})
        log(f"  built store n={self.n} in {time.perf_counter() - t0:.1f}s")

    def _build_sqlite(self) -> None:
        t0 = time.perf_counter()
        db = sqlite3.connect(self.sqlite)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")  # building only; the measured reads don't care
        db.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, in_progress INTEGER NOT NULL,"
                   " turn_id TEXT, node_id TEXT, checkpoint_at REAL, resume_attempts INTEGER,"
                   " data BLOB NOT NULL)")
        db.execute("CREATE INDEX sessions_in_progress ON sessions(in_progress)")
        with db:
            db.executemany("INSERT INTO sessions VALUES (?,0,NULL,NULL,NULL,NULL,?)",
                           ((sid(i), _fill(self.tpl[i % N_TEMPLATES][0], i))
                            for i in range(self.n)))
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.close()
        log(f"  built sqlite n={self.n} in {time.perf_counter() - t0:.1f}s")

    def _build_langgraph(self) -> None:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite import SqliteSaver

        t0 = time.perf_counter()
        if os.path.exists(self.langgraph_db):
            os.unlink(self.langgraph_db)
        conn = sqlite3.connect(self.langgraph_db, check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        conn.execute("PRAGMA synchronous=OFF")  # building only
        msgs = [json.loads(t[0])["messages"] for t in self.tpl]
        for i in range(self.n):
            cp = empty_checkpoint()
            cp["channel_values"] = {"messages": msgs[i % N_TEMPLATES]}
            cp["channel_versions"] = {"messages": 1}
            cfg: Any = {"configurable": {"thread_id": sid(i), "checkpoint_ns": ""}}
            saver.put(cfg, cp, {"source": "loop", "step": 3}, {"messages": 1})
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        log(f"  built langgraph n={self.n} in {time.perf_counter() - t0:.1f}s")

    # ------------------------------------------------------------------ M interrupted turns

    def configure(self, m: int) -> None:
        """Make exactly sessions 0..m-1 interrupted (session, marker and peer rows agree)."""
        top = min(MAX_M, self.n)
        if not 0 <= m <= top:
            raise ValueError(f"m={m} must be within 0..{top}")
        if m == self.m:
            return
        db = sqlite3.connect(self.sqlite)
        with db:
            for i in range(top):
                busy = i < m
                idle_t, busy_t, marker_t = self.tpl[i % N_TEMPLATES]
                with open(os.path.join(self.sessions, sid(i) + ".json"), "wb") as f:
                    f.write(_fill(busy_t if busy else idle_t, i))
                mpath = os.path.join(self.markers, sid(i) + ".json")
                if busy:
                    with open(mpath, "wb") as f:
                        f.write(_fill(marker_t, i))
                    mk = json.loads(_fill(marker_t, i))
                    db.execute("UPDATE sessions SET in_progress=1, turn_id=?, node_id=?,"
                               " checkpoint_at=?, resume_attempts=?, data=? WHERE id=?",
                               (mk["turn_id"], mk["node_id"], mk["checkpoint_at"],
                                mk["resume_attempts"], _fill(busy_t, i), sid(i)))
                else:
                    if os.path.exists(mpath):
                        os.unlink(mpath)
                    db.execute("UPDATE sessions SET in_progress=0, turn_id=NULL, node_id=NULL,"
                               " checkpoint_at=NULL, resume_attempts=NULL, data=? WHERE id=?",
                               (_fill(idle_t, i), sid(i)))
        db.close()
        if self.want_langgraph:
            self._configure_langgraph(m)
        self.m = m
        _write_json(os.path.join(self.path, "m.json"), {"m": m})

    def _configure_langgraph(self, m: int) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(self.langgraph_db, check_same_thread=False)
        saver = SqliteSaver(conn)
        with conn:
            conn.execute("DELETE FROM writes")
        for i in range(m):
            tup = saver.get_tuple({"configurable": {"thread_id": sid(i), "checkpoint_ns": ""}})
            assert tup is not None
            # a task of the interrupted step wrote its output, the step never completed
            saver.put_writes(tup.config, [("messages", {"role": "assistant",
                                                        "content": "partial"})], task_id="t1")
        conn.close()

    def warm_page_cache(self) -> float:
        """Read every file of the data set once, untimed: the figures are warm-cache figures,
        and a scan that happens to meet evicted pages would measure the disk instead."""
        t0 = time.perf_counter()
        paths = [e.path for d in (self.sessions, self.markers) for e in os.scandir(d)]
        paths += [p for p in (self.sqlite, self.langgraph_db) if os.path.exists(p)]
        for path in paths:
            with open(path, "rb") as f:
                while f.read(1 << 22):
                    pass
        return time.perf_counter() - t0

    def interrupted_ids(self) -> list[str]:
        return [sid(i) for i in range(self.m)]


def langgraph_available() -> bool:
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
    except ImportError:
        return False
    return True


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f)
