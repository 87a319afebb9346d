"""Pydantic AI stored the way the session is (docs/storage.md, "Lanes"): a durable run's
conversation appended to the lane ``pydantic_ai_run`` (a checkpoint writes the messages added
since the last one, not the conversation), an older session's inline history migrated by the
repair gate with its event, and ``write_record`` with the fsyncs the commit protocol needs
(each entry, the entries' directory once, the record and its directory)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from pydantic_ai.conversation_store import ConversationEntry, ConversationRecord
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)

import fsdurable
from fsdurable import _pydantic_history as hist
from fsdurable import _repair
from fsdurable.pydantic_ai import FileConversationStore

from .conftest import io_log
from .test_schemas import assert_valid


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _store(root: Path, inline: int | None = None) -> fsdurable.Store:
    """``inline``: the inline tail's bound (0: every new message to a segment)."""
    config = fsdurable.Config() if inline is None else fsdurable.Config(inline_tail_bytes=inline)
    return fsdurable.Store(root, node_id="node-test", clock=Clock(), config=config)



def conversation(n: int) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    for i in range(n):
        out.append(ModelRequest(parts=[UserPromptPart(f"question {i} " + "q" * 300)]) if i % 2 == 0
                   else ModelResponse(parts=[TextPart(f"answer {i} " + "a" * 300)]))
    return out


def lane_files(root: Path, sid: str) -> list[Path]:
    return sorted((root / "history" / sid).glob(hist.KEY + "-*.json"))


def test_a_checkpoint_appends_the_new_messages_never_the_conversation(root: Path) -> None:
    """Before lanes every checkpoint re-encoded and rewrote the whole history in the
    document: at 200 messages one more wrote ~70 KB; now it writes the same at 2 as at 200
    (here with no inline tail: each checkpoint's new messages in a segment)."""
    store = _store(root, inline=0)
    store.create("r", source="pydantic-ai")
    msgs = conversation(203)
    cost = {}
    for k in (2, 3, 200, 201, 202, 203):
        s = store.load("r")
        with io_log() as ops:
            s = store.commit(hist.checkpoint_record(msgs[:k])(s), s.version)
        cost[k] = sum(len(a[1]) for op, a in ops if op == "write")
        segs = [a for op, a in ops if op == "write" and "history" in a[0]]
        assert len(segs) == 1
        if k in (3, 201):  # one message more: one message in the segment
            assert json.loads(segs[0][1])["first"] == k - 1
            assert len(json.loads(segs[0][1])["items"]) == 1
    assert abs(cost[201] - cost[3]) < 64 and abs(cost[203] - cost[3]) < 64, cost
    assert hist.messages(_store(root).load("r")) == msgs
    for p in lane_files(root, "r"):
        assert_valid("segment", p.read_bytes(), where=str(p))
    assert_valid("session", (root / "sessions" / "r.json").read_bytes())
    assert "messages" not in json.loads((root / "sessions" / "r.json").read_bytes())[
        "metadata"].get(hist.KEY, {})


def test_checkpoints_write_the_document_alone_until_the_inline_tail_passes_its_bound(
        root: Path) -> None:
    """Format 6: a step's new message joins the lane's inline tail (the document alone, two
    fsyncs); a segment is written each time the tail passes ``inline_tail_bytes`` — so a
    40-step run leaves a few segments, not one per checkpoint, and a resume reads those."""
    store = _store(root)
    store.create("r", source="pydantic-ai")
    msgs = conversation(41)
    bound = fsdurable.Config().inline_tail_bytes
    flushed = 0
    for k in range(1, 42):
        s = store.load("r")
        with io_log() as ops:
            store.commit(hist.checkpoint_record(msgs[:k])(s), s.version)
        segs = [a for op, a in ops if op == "write" and "history" in a[0]]
        if segs:
            flushed += 1
            assert len(segs) == 1 and len(segs[0][1]) > bound
        else:
            put = [a[1] for op, a in ops if op in ("rename", "link")]
            assert put == [str(root / "sessions" / "r.json")] and _fsyncs(ops) == 2
    one = len(json.dumps(hist.encode(msgs[:1])[0], separators=(",", ":")))
    assert 1 <= flushed <= 41 * (one + 1) // bound + 1, flushed
    assert len(lane_files(root, "r")) == flushed
    assert hist.messages(_store(root).load("r")) == msgs
    assert_valid("session", (root / "sessions" / "r.json").read_bytes())


def test_a_history_that_does_not_extend_the_stored_one_is_stored_whole(root: Path) -> None:
    store = _store(root)
    store.create("r", source="pydantic-ai")
    msgs = conversation(6)
    s = store.load("r")
    s = store.commit(hist.checkpoint_record(msgs[:4])(s), s.version)
    other = [*msgs[:3], *conversation(9)[7:9]]  # the fourth message is another one
    s = store.commit(hist.end_record(other)(store.load("r")), s.version)
    assert hist.messages(_store(root).load("r")) == other
    assert hist.record(_store(root).load("r")) == {}


def test_an_older_durable_run_s_inline_history_migrates_through_the_repair_gate(
        root: Path) -> None:
    store = _store(root)
    msgs = conversation(4)
    store.create("r", source="pydantic-ai",
                 metadata={hist.KEY: {"messages": hist.encode(msgs), "run": None}})
    s = _store(root).load("r")
    assert hist.messages(s) == msgs  # reads as before
    # recovery's claim judges the session it loaded: the gate migrates it first
    assert _repair.migrate_session(store, "r", loaded=s).action == "migrated"
    doc = json.loads((root / "sessions" / "r.json").read_bytes())
    assert "messages" not in doc["metadata"][hist.KEY] and doc["lanes"][hist.KEY]["count"] == 4
    assert [e.code for e in store.events("r")].count("session_migrated") == 1
    assert hist.messages(_store(root).load("r")) == msgs
    # a run's begin does the same (hist.migrate), once
    store.create("q", source="pydantic-ai", metadata={hist.KEY: {"messages": hist.encode(msgs)}})
    hist.migrate(_store(root), "q")
    hist.migrate(_store(root), "q")
    assert [e.code for e in store.events("q")].count("session_migrated") == 1
    assert hist.messages(_store(root).load("q")) == msgs


def _fsyncs(ops: list[tuple[str, tuple[Any, ...]]]) -> int:
    return sum(1 for op, _ in ops if op in ("fsync", "fsync_dir"))


def test_write_record_does_the_fsyncs_the_commit_needs(root: Path) -> None:
    """Each entry, the entries' directory once, the record and its directory: N + 3 (it was
    2N + 2: six for a request and its reply)."""
    conv = FileConversationStore(_store(root))
    msgs = conversation(4)
    entries = [ConversationEntry(id=f"e{i}", parent_id=f"e{i - 1}" if i else None,
                                 message=m) for i, m in enumerate(msgs)]

    def rec(head: str, revision: str) -> ConversationRecord:
        return ConversationRecord(conversation_id="c", head_id=head, revision=revision)

    asyncio.run(conv.write_record(rec("e1", "r1"), new_entries=entries[:2],
                                  expected_revision=None))
    with io_log() as ops:
        asyncio.run(conv.write_record(rec("e3", "r2"), new_entries=entries[2:],
                                      expected_revision="r1"))
    assert _fsyncs(ops) == 5, ops
    assert [op for op, _ in ops if op == "fsync_dir"].count("fsync_dir") == 2
    got = asyncio.run(conv.read_history("e3"))
    assert [e.message for e in got] == msgs
