"""FileSession keeps the document it last committed and its item log's view, and reuses them
only while the files on disk are still those: the document judged by ``Store._load_known`` (by
stat, a recent stat confirmed from the file's first bytes), the log by its identity and size.
Whatever replaced either meanwhile — another process's appends, a sync tool's older copy or
another node's log, a corrupt document, an older or a newer format, a deletion — is read
again, never written over from the stale copy."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import fsdurable
from fsdurable import _codec
from fsdurable.openai_agents import FileSession


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def msg(i: int | str) -> dict[str, Any]:
    return {"role": "user", "content": f"m{i}"}


def doc(root: Path, sid: str = "s1") -> Path:
    return root / "sessions" / f"{sid}.json"


def test_a_mutation_parses_the_document_only_when_it_changed(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """The items live in the item log: a mutation appends a frame and commits no document, so
    the document, unchanged, is never parsed again — by this session or by another writer's."""
    root = tmp_path / "store"
    s = FileSession("s1", fsdurable.Store(root))
    parsed: list[str] = []
    real = _codec.parse_session

    def counting(*a: Any, **kw: Any) -> Any:
        parsed.append(kw.get("session_id", "?"))
        return real(*a, **kw)

    monkeypatch.setattr(_codec, "parse_session", counting)

    async def main() -> None:
        await s.add_items([msg(0)])  # the file does not exist yet: nothing to parse
        for i in range(1, 6):
            await s.add_items([msg(i)])
        assert await s.pop_item() == msg(5)
        await s.clear_session()
        await s.add_items([msg(6)])

    run(main())
    assert parsed == []  # every mutation after the first reused the document it committed
    other = FileSession("s1", fsdurable.Store(root))
    run(other.add_items([msg(7)]))  # another writer's first look parses the document once
    assert parsed == ["s1"]
    parsed.clear()
    for i in range(8, 11):  # writers taking turns: the document never changed, never parsed
        run(other.add_items([msg(f"o{i}")]))
        run(s.add_items([msg(i)]))
    assert parsed == []
    assert run(s.get_items()) == [msg(6), msg(7), msg("o8"), msg(8), msg("o9"), msg(9),
                                  msg("o10"), msg(10)]


def test_another_writer_s_commits_are_seen(tmp_path: Path) -> None:
    root = tmp_path / "store"
    a = FileSession("s1", fsdurable.Store(root))
    b = FileSession("s1", fsdurable.Store(root))  # another store: another process's view

    async def main() -> None:
        await a.add_items([msg("a1")])
        await b.add_items([msg("b1")])
        await a.add_items([msg("a2")])
        assert await b.pop_item() == msg("a2")
        assert await a.pop_item() == msg("b1")  # not the a2 a's own last commit held
        await b.add_items([msg("b2")])
        await a.clear_session()
        assert await b.get_items() == []
        await b.add_items([msg("b3")])
        assert await a.pop_item() == msg("b3")
        assert await a.pop_item() is None

    run(main())


def log(root: Path, sid: str = "s1", n: int = 0) -> Path:
    return root / "history" / sid / f"items-{n:06d}.log"


def test_a_sync_tool_s_older_copy_of_the_log_is_read_again(tmp_path: Path) -> None:
    root = tmp_path / "store"
    s = FileSession("s1", fsdurable.Store(root))
    run(s.add_items([msg(1)]))
    old = log(root).read_bytes()
    run(s.add_items([msg(2)]))
    tmp = log(root).with_suffix(".sync")
    tmp.write_bytes(old)
    os.replace(tmp, log(root))  # a sync tool puts back the older version (a new file)
    run(s.add_items([msg(3)]))  # built on what is on disk, not on the view held
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == [msg(1), msg(3)]


def test_another_node_s_log_delivered_is_read_again(tmp_path: Path) -> None:
    root, other = tmp_path / "store", tmp_path / "other"
    s = FileSession("s1", fsdurable.Store(root))
    run(s.add_items([msg(1)]))
    shutil.copytree(root, other)
    run(s.add_items([msg(2)]))
    run(FileSession("s1", fsdurable.Store(other)).add_items([msg("x")]))
    tmp = log(root).with_suffix(".sync")
    shutil.copyfile(log(other), tmp)
    os.replace(tmp, log(root))  # the sync tool delivers the other node's log
    assert run(s.pop_item()) == msg("x")
    assert run(s.get_items()) == [msg(1)]


def test_a_file_corrupted_or_deleted_under_a_held_document(tmp_path: Path) -> None:
    root = tmp_path / "store"
    s = FileSession("s1", fsdurable.Store(root))
    run(s.add_items([msg(1), msg(2)]))
    doc(root).write_bytes(b'{"format": "fsdurable.ses')
    run(s.add_items([msg(3)]))  # quarantined by the repair gate, then started over
    assert run(s.get_items()) == [msg(3)]
    assert len(list((root / "quarantine").iterdir())) == 2  # the document, and its log
    fsdurable.Store(root).delete("s1")
    assert run(s.pop_item()) is None  # the deletion is seen: nothing to pop
    run(s.add_items([msg(4)]))
    assert run(s.get_items()) == [msg(4)]


def test_an_older_session_put_under_a_held_document_is_migrated_first(tmp_path: Path) -> None:
    """The compare-and-swap sees another commit; the re-read meets an older fsdurable's
    session (its items inline): the repair gate migrates it (an event), then the item is
    added to its items."""
    root = tmp_path / "store"
    s = FileSession("s1", fsdurable.Store(root))
    run(s.add_items([msg(1)]))
    other = fsdurable.Store(root)  # another process replaces the session with an older one
    other.delete("s1")
    other.create("s1", source="openai-agents",
                 metadata={"openai_agents": {"items": [msg("old")]}})
    run(s.add_items([msg(2)]))
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == [msg("old"), msg(2)]
    got = [e.reason for e in fsdurable.Store(root).events("s1")
           if e.code == "session_migrated"]
    assert len(got) == 2 and got[-1] == "item_log"  # its inline items, then into the log


@pytest.mark.parametrize("op", ["add", "pop"])
def test_a_newer_fsdurable_s_file_under_a_held_document_is_never_written(tmp_path: Path,
                                                                         op: str) -> None:
    import json

    root = tmp_path / "store"
    s = FileSession("s1", fsdurable.Store(root))
    run(s.add_items([msg(1)]))
    d = json.loads(doc(root).read_bytes())
    d.update({"format": "fsdurable.session/99", "commit_id": "ab" * 8})
    doc(root).write_text(json.dumps(d))
    before = doc(root).read_bytes()
    logged = (root / "history" / "s1" / "items-000000.log").read_bytes()
    with pytest.raises(fsdurable.UnreadableState) as info:  # the repair gate leaves it
        run(s.add_items([msg(2)]) if op == "add" else s.pop_item())
    assert info.value.reason == "unknown_version"
    assert doc(root).read_bytes() == before  # and the log it names: neither written over
    assert (root / "history" / "s1" / "items-000000.log").read_bytes() == logged
    assert not (root / "quarantine").exists() or not list((root / "quarantine").iterdir())


def test_a_durable_run_s_model_calls_read_no_document_of_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At each model call the driver counts the session's items from the document this session
    last committed (unread while the file is that commit) and hands the checkpoint it commits
    to the session, whose next ``add_items`` starts from it: on 984eefb each of the three read
    the document again (a parse per boundary, and one per ``add_items`` after it)."""
    pytest.importorskip("agents", reason="the openai-agents extra is not installed")
    import traceback

    from fsdurable import openai_agents as oa

    from . import oa_agent

    monkeypatch.setenv("OA_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    where: list[set[str]] = []
    real = _codec.parse_session

    def counting(*a: Any, **kw: Any) -> Any:
        where.append({f.name for f in traceback.extract_stack()})
        return real(*a, **kw)

    monkeypatch.setattr(_codec, "parse_session", counting)
    store = fsdurable.Store(tmp_path / "store")

    async def main() -> Any:
        fs = FileSession("chat", store)
        return await oa.run(oa_agent.make_agent(), "add", session=fs, effects=oa_agent.EFFECTS,
                            debounce=0)

    assert run(main()).final_output == oa_agent.FINAL
    assert [w for w in where if "_boundary" in w and "_patch" not in w] == []  # its count
    assert sum("_boundary" in w for w in where) <= 3  # the turn API's read-modify-writes
    mutations = sum("_mutate" in w for w in where)
    assert mutations <= 2  # after a commit of a tool's outcome (the turn API reads those)
