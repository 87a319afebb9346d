"""fsdurable.claude.FileSessionStore: the Claude Agent SDK's own conformance suite with every
optional contract (and the SDK's InMemorySessionStore through the same suite in the same run),
the SDK's store-backed helpers on a real transcript, idempotent retries, processes, bad files."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":
    pytest.importorskip("claude_agent_sdk", reason="the claude extra is not installed")

from claude_agent_sdk import (
    InMemorySessionStore,
    SessionStore,
    get_session_messages_from_store,
    import_session_to_store,
    list_sessions_from_store,
    project_key_for_directory,
)
from claude_agent_sdk.testing import run_session_store_conformance
from jsonschema import Draft202012Validator

import fsdurable
from fsdurable.claude import FileSessionStore

from .conftest import PYTHON, REPO, subprocess_env

OPTIONAL = ("list_sessions", "list_session_summaries", "delete", "list_subkeys")
BATCH_SCHEMA = Draft202012Validator(
    json.loads((REPO / "schemas" / "claude_batch.schema.json").read_text()))
KEY = {"project_key": "proj", "session_id": "sess"}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def e(**kw: Any) -> dict[str, Any]:
    return {"type": "x", **kw}


def batches(root: Path) -> list[Path]:
    d = root / "entries" / "claude"
    return sorted(d.iterdir()) if d.exists() else []


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_the_sdks_conformance_suite_with_every_optional_contract(kind: str,
                                                                 tmp_path: Path) -> None:
    made: list[Path] = []

    def make() -> Any:
        if kind == "memory":
            return InMemorySessionStore()
        made.append(tmp_path / f"s{len(made)}")
        return FileSessionStore(fsdurable.Store(made[-1]))

    probe = make()
    for m in OPTIONAL:  # the suite skips what a store lacks: prove nothing is skipped
        assert getattr(type(probe), m) is not getattr(SessionStore, m), m
    run(run_session_store_conformance(make, skip_optional=frozenset()))
    if kind == "file":
        assert len(made) > 14  # a fresh store per contract, as the suite asks


def test_a_retried_batch_is_not_duplicated(tmp_path: Path) -> None:
    st = FileSessionStore(fsdurable.Store(tmp_path / "s"))

    async def main() -> Any:
        await st.append(KEY, [e(uuid="a"), e(uuid="b"), e(title="no uuid")])
        await st.append(KEY, [e(uuid="b"), e(uuid="c"), e(title="no uuid")])  # a retry + more
        await st.append(KEY, [e(uuid="a")])  # nothing new: no batch, no commit
        return await st.load(KEY)

    got = run(main())
    assert [x.get("uuid") or x["title"] for x in got] == ["a", "b", "no uuid", "c", "no uuid"]
    assert len(batches(tmp_path / "s")) == 2


def test_batches_are_immutable_files_and_the_index_is_committed(tmp_path: Path) -> None:
    store = fsdurable.Store(tmp_path / "s")
    st = FileSessionStore(store)
    run(st.append(KEY, [e(uuid="1", text="héllo 🌍")]))
    [first] = batches(tmp_path / "s")
    data, ino = first.read_bytes(), first.stat().st_ino
    run(st.append(KEY, [e(uuid="2")]))
    run(st.append({**KEY, "subpath": "subagents/agent-1"}, [e(uuid="3")]))
    files = batches(tmp_path / "s")
    assert len(files) == 3 and first.read_bytes() == data and first.stat().st_ino == ino
    for f in files:
        assert not list(BATCH_SCHEMA.iter_errors(json.loads(f.read_bytes()))), f
        assert f.stat().st_mode & 0o777 == 0o600
    [sid] = store.sessions()
    s = store.load(sid)
    assert s.source == "claude" and s.version == 3  # created, then one commit per append
    assert run(st.load(KEY)) == [e(uuid="1", text="héllo 🌍"), e(uuid="2")]


def test_delete_removes_the_index_then_the_batches(tmp_path: Path) -> None:
    store = fsdurable.Store(tmp_path / "s")
    st = FileSessionStore(store)
    run(st.append(KEY, [e(uuid="1")]))
    run(st.append({**KEY, "subpath": "subagents/a"}, [e(uuid="2")]))
    run(st.append({"project_key": "proj", "session_id": "other"}, [e(uuid="3")]))
    run(st.delete(KEY))
    assert len(batches(tmp_path / "s")) == 1
    assert "session_deleted" in [x.code for x in store.events()]


CHILD = """
import asyncio, sys
import fsdurable
from fsdurable.claude import FileSessionStore

async def main():
    st = FileSessionStore(fsdurable.Store(sys.argv[1]))
    for i in range(15):
        await st.append({"project_key": "proj", "session_id": "sess"},
                        [{"type": "x", "uuid": sys.argv[2] + str(i)}])
asyncio.run(main())
"""


def test_two_processes_append_to_one_transcript(tmp_path: Path) -> None:
    fsdurable.Store(tmp_path / "s")
    procs = [subprocess.Popen([PYTHON, "-c", CHILD, str(tmp_path / "s"), tag],
                              env=subprocess_env()) for tag in "pq"]
    assert [p.wait(120) for p in procs] == [0, 0]
    got = [x["uuid"] for x in run(FileSessionStore(fsdurable.Store(tmp_path / "s")).load(KEY))]
    assert sorted(got) == sorted(f"{t}{i}" for t in "pq" for i in range(15))
    for t in "pq":  # each process's appends in its call order
        assert [u for u in got if u[0] == t] == [f"{t}{i}" for i in range(15)]
    summaries = run(FileSessionStore(fsdurable.Store(tmp_path / "s")).list_session_summaries(
        "proj"))
    assert [s["session_id"] for s in summaries] == ["sess"]


def test_a_corrupt_batch_is_reported_and_left_in_place(tmp_path: Path) -> None:
    """A read never moves a file (issue 17 item 21): the read raises, the batch stays."""
    store = fsdurable.Store(tmp_path / "s")
    st = FileSessionStore(store)
    run(st.append(KEY, [e(uuid="1")]))
    [f] = batches(tmp_path / "s")
    f.write_bytes(b"\xff not json")
    with pytest.raises(fsdurable.UnreadableState) as got:
        run(st.load(KEY))
    assert got.value.reason == "unreadable"
    assert f.read_bytes() == b"\xff not json"
    q = tmp_path / "s" / "quarantine"
    assert not q.exists() or not list(q.iterdir())
    assert "file_quarantined" not in [x.code for x in store.events()]


def test_non_json_entries_are_refused(tmp_path: Path) -> None:
    st = FileSessionStore(fsdurable.Store(tmp_path / "s"))
    with pytest.raises(fsdurable.InvalidState):
        run(st.append(KEY, [e(x=object())]))
    deep: Any = "x"
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(fsdurable.InvalidState) as info:  # was a raw RecursionError
        run(st.append(KEY, [e(uuid="a"), e(x=deep)]))
    assert info.value.reason == "too_deep"
    assert run(st.load(KEY)) is None


def test_entries_orjson_cannot_write_are_stored_and_read_back_exactly(tmp_path: Path) -> None:
    """An integer past 64 bits, a lone surrogate and nesting past orjson's 254 levels pass the
    JSON copy (the standard library's) and then made the batch write raise orjson's raw
    TypeError; a batch the standard library wrote must be read by it (orjson reads such an
    integer as a float, silently)."""
    deep: Any = "x"
    for _ in range(400):
        deep = [deep]
    odd = [e(uuid="1", n=2**64 + 1), e(uuid="2", s="\ud800"), e(uuid="3", deep=deep)]
    st = FileSessionStore(fsdurable.Store(tmp_path / "s"))
    run(st.append(KEY, [e(uuid="0")]))
    run(st.append(KEY, odd))
    for reader in (st, FileSessionStore(fsdurable.Store(tmp_path / "s"))):
        got = run(reader.load(KEY))
        assert got == [e(uuid="0"), *odd] and type(got[1]["n"]) is int
    docs = [json.loads(f.read_bytes()) for f in batches(tmp_path / "s")]
    assert sorted(d.get("stdlib", False) for d in docs) == [False, True]
    for d in docs:
        assert not list(BATCH_SCHEMA.iter_errors(d))


def transcript(session_id: str, cwd: str) -> list[dict[str, Any]]:
    """A small Claude Code JSONL transcript: a user prompt and an assistant reply."""
    u, a = str(uuid.uuid4()), str(uuid.uuid4())
    common = {"sessionId": session_id, "cwd": cwd, "isSidechain": False, "version": "2.0.0",
              "userType": "external"}
    return [
        {**common, "type": "user", "uuid": u, "parentUuid": None,
         "timestamp": "2026-01-01T00:00:00.000Z",
         "message": {"role": "user", "content": "summarise my inbox"}},
        {**common, "type": "assistant", "uuid": a, "parentUuid": u,
         "timestamp": "2026-01-01T00:00:01.000Z",
         "message": {"role": "assistant", "content": [{"type": "text",
                                                      "text": "3 threads need you"}]}},
    ]


def test_the_sdks_store_helpers_see_the_same_as_with_its_in_memory_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real on-disk session imported with the SDK's own ``import_session_to_store``, then
    listed and read back with its store-backed helpers: identical to InMemorySessionStore."""
    cfg, work = tmp_path / "claude-config", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(cfg))
    sid = str(uuid.uuid4())
    proj = cfg / "projects" / project_key_for_directory(str(work))
    proj.mkdir(parents=True)
    lines = transcript(sid, str(work))
    (proj / f"{sid}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    async def through(store: Any) -> tuple[Any, Any, Any]:
        await import_session_to_store(sid, store, directory=str(work))
        await import_session_to_store(sid, store, directory=str(work))  # idempotent on uuid
        listed = [(i.session_id, i.summary, i.first_prompt)
                  for i in await list_sessions_from_store(store, directory=str(work))]
        msgs = [(m.type, m.uuid) for m in await get_session_messages_from_store(
            store, sid, directory=str(work))]
        raw = await store.load({"project_key": project_key_for_directory(str(work)),
                                "session_id": sid})
        return listed, msgs, raw

    mine = run(through(FileSessionStore(fsdurable.Store(tmp_path / "s"))))
    theirs = run(through(InMemorySessionStore()))
    assert mine[0] == theirs[0] and mine[0][0][0] == sid
    assert mine[1] == theirs[1] and len(mine[1]) == 2
    assert mine[2] == lines  # the transcript, deep-equal, once
    assert theirs[2] == lines + lines  # (the in-memory store does not honour the uuid key)
