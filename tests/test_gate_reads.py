"""The repair gate is the only mover and rewriter of a file the store did not just write: a
session of an older format met by recovery is migrated by the gate (``session_migrated``)
before any other commit of recovery; a read of an adapter's conversation never moves another
node's entry, and a newer format is left in place (``needs_newer``)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import attrs
import pytest

from fsdurable import Store, recover
from fsdurable import _events as ev
from fsdurable._codec import encode_marker
from fsdurable._errors import UnreadableState
from fsdurable._model import Marker
from fsdurable._sync import resolve

from .conftest import DATA

V2_ID = "legacy-turn_02"
V2_CHECKPOINT = 1764403600.5


class ParkingHost:
    """A host that knows no tool: an in-doubt call parks the turn."""

    def tool_effect(self, name: str) -> str | None:
        return None

    def resume_claimed(self, session: Any) -> Any:
        raise AssertionError("an in-doubt call of an unknown tool is never resumed")


def _raw_format(root: Path, sid: str) -> str:
    return str(json.loads((root / "sessions" / f"{sid}.json").read_bytes())["format"])


@pytest.mark.parametrize(("after", "outcome"), [(60.0, "review_required"),
                                                (5 * 3600.0, "abandoned")])
def test_recovery_migrates_an_older_session_through_the_gate(
        root: Path, after: float, outcome: str) -> None:
    """Issue 17 item 20: recovery meets a format-2 session in progress (its in-doubt call parks
    it, or it is stale); the session is migrated by the repair gate with ``session_migrated``
    before recovery commits anything else — not rewritten silently by recovery's own commit."""
    st = Store(root, node_id="node-a", clock=lambda: V2_CHECKPOINT + after)
    shutil.copyfile(DATA / "session_v2.json", root / "sessions" / f"{V2_ID}.json")
    (root / "markers" / f"{V2_ID}.json").write_bytes(encode_marker(Marker(
        session_id=V2_ID, turn_id="turn-7", session_version=4, node_id="node-a",
        route_key="chat:42", source="telegram", started_at=1764403500.0,
        checkpoint_at=V2_CHECKPOINT, resume_attempts=1)))
    [o] = recover(st, ParkingHost()).outcomes
    assert o.outcome == outcome
    codes = [e.code for e in st.events(V2_ID)]
    assert ev.SESSION_MIGRATED in codes, codes
    then = ev.REVIEW_REQUIRED if outcome == "review_required" else ev.ABANDONED
    assert codes.index(ev.SESSION_MIGRATED) < codes.index(then)
    [migrated] = [e for e in st.events(V2_ID) if e.code == ev.SESSION_MIGRATED]
    assert migrated.detail["version"] == 5  # the gate's rewrite is the first commit after v4
    s = st.load(V2_ID)
    assert not s.in_progress and s.version == 6 and s.metadata["title"] == "Train"
    assert _raw_format(root, V2_ID) != "fsdurable.session/2"
    assert [c["tool_call_id"] for c in s.metadata["review_required"]["calls"]] == ["call_1"]


def _untouched(root: Path, path: Path, raw: bytes, events: list[Any]) -> None:
    assert path.read_bytes() == raw  # left in place, as it is
    q = root / "quarantine"
    assert not q.exists() or list(q.iterdir()) == []
    assert ev.FILE_QUARANTINED not in [x.code for x in events]


NEWER_PYDANTIC = {
    "part_kind": lambda doc: {**doc, "message": {**doc["message"], "parts": [
        {"part_kind": "hologram", "content": "a part kind of a newer pydantic-ai"}]}},
    "entry_format": lambda doc: {**doc, "format": "fsdurable.pydantic_ai.entry/2"},
    "entry_kind": lambda doc: {**doc, "kind": "summary"},
}


@pytest.mark.parametrize("newer", sorted(NEWER_PYDANTIC))
def test_a_read_leaves_a_newer_pydantic_ai_entry_in_place(root: Path, newer: str) -> None:
    """Issue 17 item 21: another node, on a newer pydantic-ai or fsdurable, wrote an entry this
    one cannot read; reading the conversation reports it (``needs_newer``) and moves nothing —
    the newer node still finds its own entry."""
    from fsdurable.pydantic_ai import FileConversationStore

    from .test_pydantic_ai import chat, run

    fs = Store(root)
    conv = FileConversationStore(fs)
    run(chat(conv, "c", ["hi"]))
    head = run(conv.load_entries("c"))[-1]
    path = root / "entries" / "pydantic_ai" / f"{head.id}.json"
    raw = json.dumps(NEWER_PYDANTIC[newer](json.loads(path.read_bytes()))).encode()
    path.write_bytes(raw)
    for _ in range(2):  # and again: a read never changes what the next read meets
        with pytest.raises(UnreadableState) as got:
            run(conv.load("c"))
        assert got.value.reason == "needs_newer", got.value
    _untouched(root, path, raw, fs.events())


def test_a_read_leaves_a_newer_claude_batch_in_place(root: Path) -> None:
    """Issue 17 item 21: a batch of a newer batch format (another node's newer fsdurable) is
    ``needs_newer``; reading the transcript leaves it in place."""
    from fsdurable.claude import FileSessionStore

    fs = Store(root)
    st = FileSessionStore(fs)
    key = {"project_key": "proj", "session_id": "sess"}
    asyncio.run(st.append(key, [{"type": "x", "uuid": "1"}]))
    [path] = (root / "entries" / "claude").iterdir()
    raw = json.dumps({"format": "fsdurable.claude.batch/2", "id": path.stem,
                      "entries": {"chunks": []}}).encode()
    path.write_bytes(raw)
    for _ in range(2):
        with pytest.raises(UnreadableState) as got:
            asyncio.run(st.load(key))
        assert got.value.reason == "needs_newer", got.value
    _untouched(root, path, raw, fs.events())


@pytest.mark.parametrize("keep", ["newest", "local"])
def test_resolve_never_moves_a_newer_nodes_copy(root: Path, keep: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 17 item 22: an upgraded node's later commit arrives as a conflict copy in a session
    format this fsdurable cannot read. ``resolve`` must not keep the older local commit and
    quarantine the newer one: it refuses (``needs_newer``) and moves nothing."""
    from fsdurable._codec import encode_session
    from fsdurable.cli import main

    st = Store(root)
    st.create("s1")
    local = st.end_turn(st.begin_turn("s1", "hello"), "local reply")
    newer = json.loads(encode_session(attrs.evolve(local, version=4,
                                                   updated_at=local.updated_at + 60)))
    newer["format"] = "fsdurable.session/99"  # written by a newer fsdurable on the far node
    copy = root / "sessions" / "s1.sync-conflict-20261129-101010-ABCDEFG.json"
    raw = json.dumps(newer).encode()
    copy.write_bytes(raw)
    own = (root / "sessions" / "s1.json").read_bytes()
    with pytest.raises(UnreadableState) as got:
        resolve(st, "s1", keep=keep)
    assert got.value.reason == "needs_newer"
    capsys.readouterr()
    assert main(["resolve", "s1", "--keep", keep, "--root", str(root)]) != 0
    assert "newer" in capsys.readouterr().err
    assert copy.read_bytes() == raw and (root / "sessions" / "s1.json").read_bytes() == own
    q = root / "quarantine"
    assert not q.exists() or list(q.iterdir()) == []
    assert ev.CONFLICT_RESOLVED not in [e.code for e in st.events("s1")]
