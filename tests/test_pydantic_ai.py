"""fsdurable.pydantic_ai.FileConversationStore with Pydantic AI's TestModel/FunctionModel (no
network). The store-level scenarios run against FileConversationStore AND Pydantic AI's own
InMemoryConversationStore in the same run: a behaviour only one of them has is a wrong test."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":
    pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

from jsonschema import Draft202012Validator
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationConflict, InMemoryConversationStore
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import fsdurable
from fsdurable.pydantic_ai import FileConversationStore

from .conftest import PYTHON, REPO, subprocess_env

KINDS = ("file", "memory")
ENTRY_SCHEMA = Draft202012Validator(
    json.loads((REPO / "schemas" / "pydantic_ai_entry.schema.json").read_text()))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(params=KINDS)
def conv_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "file":
        return FileConversationStore(fsdurable.Store(tmp_path / "store"))
    return InMemoryConversationStore()


def echo_agent() -> Agent[None, str]:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(1 for m in messages if m.kind == "request")
        return ModelResponse(parts=[TextPart(f"answer {n}")])

    return Agent(FunctionModel(answer))


async def chat(store: Any, cid: str, prompts: list[str]) -> Conversation:
    agent = echo_agent()
    for p in prompts:
        conv = await store.load(cid) or Conversation(conversation_id=cid)
        result = await agent.run(p, conversation=conv)
        await store.save(result)
    loaded = await store.load(cid)
    assert loaded is not None
    return loaded


def texts(conv: Conversation) -> list[str]:
    out = []
    for m in conv.messages:
        for part in m.parts:
            content = getattr(part, "content", None)
            if isinstance(content, str):
                out.append(content)
    return out


def entry_files(root: Path) -> dict[str, bytes]:
    d = root / "entries" / "pydantic_ai"
    return {p.name: p.read_bytes() for p in d.iterdir()} if d.exists() else {}


# ---------------------------------------------------------------------------------- both stores


def test_a_conversation_grows_run_by_run(conv_store: Any) -> None:
    conv = run(chat(conv_store, "c1", ["hi", "again", "third"]))
    assert texts(conv) == ["hi", "answer 1", "again", "answer 2", "third", "answer 3"]
    assert run(conv_store.load("c1", limit=2)).messages == conv.messages[-2:]


def test_a_stale_save_is_a_conflict(conv_store: Any) -> None:
    async def main() -> None:
        await chat(conv_store, "c", ["hi"])
        a = await conv_store.load("c")
        b = await conv_store.load("c")
        agent = echo_agent()
        await conv_store.save(await agent.run("from a", conversation=a))
        with pytest.raises(ConversationConflict):
            await conv_store.save(await agent.run("from b", conversation=b))
        # a new conversation under an existing id is a conflict too
        with pytest.raises(ConversationConflict):
            await conv_store.save(await agent.run("x", conversation=Conversation(
                conversation_id="c")))
        assert texts(await conv_store.load("c"))[-2:] == ["from a", "answer 2"]

    run(main())


def test_fork_and_branch_share_history(conv_store: Any) -> None:
    async def main() -> None:
        await chat(conv_store, "orig", ["one", "two"])
        entries = await conv_store.load_entries("orig")
        fork = await conv_store.fork("orig", at=2, new_conversation_id="fork")
        assert texts(fork) == ["one", "answer 1"]
        shared = await conv_store.load_entries("fork")
        assert [e.id for e in shared] == [e.id for e in entries[:2]]  # pointed at, not copied
        await conv_store.save(await echo_agent().run("fork turn", conversation=fork))
        orig = await conv_store.load("orig")
        assert texts(orig) == ["one", "answer 1", "two", "answer 2"]  # the original carries on
        br = await conv_store.branch("orig", at=2, expected_revision=orig.revision)
        await conv_store.save(await echo_agent().run("redo", conversation=br))
        assert texts(await conv_store.load("orig")) == ["one", "answer 1", "redo", "answer 2"]
        rec = await conv_store.read_record("orig")
        assert rec.branches == [entries[-1].id]  # the history it left stays reachable
        old = await conv_store.branch("orig", from_entry=entries[-1].id,
                                      expected_revision=rec.revision)
        assert texts(old) == ["one", "answer 1", "two", "answer 2"]

    run(main())


def test_a_paused_runs_deferred_tool_requests_are_kept(conv_store: Any) -> None:
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        TestModel(), output_type=[str, DeferredToolRequests])
    ran: list[str] = []

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        ran.append(path)
        return f"deleted {path}"

    async def main() -> None:
        r = await agent.run("delete it", conversation=Conversation(conversation_id="p"))
        assert isinstance(r.output, DeferredToolRequests) and not ran
        await conv_store.save(r)
        conv = await conv_store.load("p")
        assert conv.deferred_tool_requests == r.output
        [call] = conv.deferred_tool_requests.approvals
        results = DeferredToolResults(approvals={call.tool_call_id: True})
        r2 = await agent.run(conversation=conv, deferred_tool_results=results)
        await conv_store.save(r2)
        assert ran == ["a"]
        assert (await conv_store.load("p")).deferred_tool_requests is None

    run(main())


def test_records_list_newest_first_by_scope_and_limit(conv_store: Any) -> None:
    async def main() -> None:
        for cid, scope in (("a", "ana"), ("b", "bob"), ("c", "ana")):
            conv = Conversation(conversation_id=cid)
            await conv_store.save(await echo_agent().run("hi", conversation=conv), scope=scope)
        ids = [r.conversation_id for r in await conv_store.list_conversations()]
        assert ids == ["c", "b", "a"]
        assert [r.conversation_id for r in await conv_store.list_conversations(scope="ana")] \
            == ["c", "a"]
        assert len(await conv_store.list_conversations(limit=1)) == 1
        assert await conv_store.load("b", scope="ana") is None  # another owner's: not there

    run(main())


def test_delete_needs_the_current_revision(conv_store: Any) -> None:
    async def main() -> None:
        await chat(conv_store, "d", ["hi"])
        rec = await conv_store.read_record("d")
        with pytest.raises(ConversationConflict):
            await conv_store.delete_record("d", expected_revision="not-it")
        await conv_store.delete_record("d", expected_revision=rec.revision)
        assert await conv_store.read_record("d") is None and await conv_store.load("d") is None
        with pytest.raises(LookupError):
            await conv_store.read_entry("0000-missing")

    run(main())


# ---------------------------------------------------------------------------------- the file store


def test_entries_are_immutable_files_that_validate(tmp_path: Path) -> None:
    store = FileConversationStore(fsdurable.Store(tmp_path / "store"))
    run(chat(store, "c", ["one"]))
    first = entry_files(tmp_path / "store")
    stats = {n: os.stat(tmp_path / "store" / "entries" / "pydantic_ai" / n).st_ino for n in first}
    conv = run(chat(store, "c", ["two"]))
    after = entry_files(tmp_path / "store")
    assert len(after) == len(conv.messages) == 4
    for name, data in first.items():  # a save appends files; it never rewrites one
        assert after[name] == data
        assert os.stat(tmp_path / "store" / "entries" / "pydantic_ai" / name).st_ino == stats[name]
    for name, data in after.items():
        errors = list(ENTRY_SCHEMA.iter_errors(json.loads(data)))
        assert not errors, (name, errors)
        assert json.loads(data)["id"] + ".json" == name
    for p in (tmp_path / "store" / "entries" / "pydantic_ai").iterdir():
        assert p.stat().st_mode & 0o777 == 0o600


def test_the_record_goes_through_the_commit_function(tmp_path: Path) -> None:
    fs = fsdurable.Store(tmp_path / "store")
    store = FileConversationStore(fs)
    run(chat(store, "c", ["one", "two"]))
    s = fs.load("c")
    assert s.source == "pydantic-ai" and s.version == 2  # created, then one commit per save
    assert s.metadata["pydantic_ai"]["conversation_id"] == "c"


CHILD = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
import fsdurable
from fsdurable.pydantic_ai import FileConversationStore
from tests.test_pydantic_ai import chat, texts

async def main():
    store = FileConversationStore(fsdurable.Store(sys.argv[2]))
    before = texts(await store.load("c"))
    after = texts(await chat(store, "c", ["from the child"]))
    print(json.dumps([before, after]))
asyncio.run(main())
"""


def test_a_fresh_process_reloads_and_continues(tmp_path: Path) -> None:
    store = FileConversationStore(fsdurable.Store(tmp_path / "store"))
    conv = run(chat(store, "c", ["hi"]))
    out = subprocess.run([PYTHON, "-c", CHILD, str(REPO), str(tmp_path / "store")],
                         env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = json.loads(out.stdout)
    assert before == texts(conv)
    assert after == [*texts(conv), "from the child", "answer 2"]
    assert texts(run(store.load("c"))) == after


def test_two_writers_with_one_revision_one_wins(tmp_path: Path) -> None:
    """Threads with their own event loops and their own Store objects: the revision check and
    the write are one step under the session's commit lock."""
    root = tmp_path / "store"
    run(chat(FileConversationStore(fsdurable.Store(root)), "c", ["hi"]))
    results: list[str] = []
    go = threading.Barrier(4)

    def writer(i: int) -> None:
        async def main() -> str:
            st = FileConversationStore(fsdurable.Store(root))
            conv = await st.load("c")
            r = await echo_agent().run(f"w{i}", conversation=conv)
            go.wait()
            try:
                await st.save(r)
                return "saved"
            except ConversationConflict:
                return "conflict"

        results.append(asyncio.run(main()))

    ts = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(results) == ["conflict"] * 3 + ["saved"]
    assert len(texts(run(FileConversationStore(fsdurable.Store(root)).load("c")))) == 4


def test_a_corrupt_entry_is_reported_and_left_in_place(tmp_path: Path) -> None:
    """A read never moves a file (issue 17 item 21): the entry may be another node's, or a sync
    tool's transfer in flight; the read raises and the next read meets the same file."""
    fs = fsdurable.Store(tmp_path / "store")
    store = FileConversationStore(fs)
    run(chat(store, "c", ["hi"]))
    entries = run(store.load_entries("c"))
    bad = tmp_path / "store" / "entries" / "pydantic_ai" / f"{entries[0].id}.json"
    bad.write_bytes(b"{broken")
    for _ in range(2):
        with pytest.raises(fsdurable.UnreadableState) as got:
            run(store.load("c"))
        assert got.value.reason == "unreadable"
    assert bad.read_bytes() == b"{broken"
    assert not (tmp_path / "store" / "quarantine").exists() or not list(
        (tmp_path / "store" / "quarantine").iterdir())
    assert not any(e.code == "file_quarantined" for e in fs.events())
    with pytest.raises(fsdurable.UnreadableState):
        run(store.read_entry(entries[0].id))


def test_a_head_pointing_at_a_missing_entry_is_a_conflict(tmp_path: Path) -> None:
    from pydantic_ai.conversation_store import ConversationRecord

    store = FileConversationStore(fsdurable.Store(tmp_path / "store"))
    with pytest.raises(ConversationConflict):
        run(store.write_record(ConversationRecord(conversation_id="x", head_id="nope"),
                               expected_revision=None))
    assert run(store.read_record("x")) is None


def test_bad_conversation_ids_are_refused(tmp_path: Path) -> None:
    store = FileConversationStore(fsdurable.Store(tmp_path / "store"))
    with pytest.raises(fsdurable.InvalidSessionId):
        run(store.read_record("../escape"))
