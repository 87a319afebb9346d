"""FileSession keeps the document it last committed and reuses it for its next mutation only
while the file on disk is still that commit: a mutation that writes commits what it derives from
it and the commit's compare-and-swap judges the file (by stat, a recent stat confirmed from the
file's first bytes), one that writes nothing asks ``Store._load_known`` (judged alike). Whatever
replaced the file meanwhile — another process's commit, a sync tool's older copy or another
node's commit of the same version, a corrupt file, an older or a newer format, a deletion — is
read again, never written over from the stale copy."""

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
    run(other.add_items([msg(7)]))  # another writer's
    parsed.clear()
    run(s.add_items([msg(8)]))
    assert parsed == ["s1", "s1"]  # the compare-and-swap's read (ConflictError), the re-read
    for i, want in ((9, 3), (10, 2), (11, 2)):  # writers taking turns: each asks the file
        parsed.clear()  # first once it met the other (other's first meeting: two parses)
        run(other.add_items([msg(f"o{i}")]))
        run(s.add_items([msg(i)]))
        assert parsed == ["s1"] * want  # then each change is parsed once, by its reader
    asked: list[str] = []
    known = s.store._load_known

    def asking(sid: str, doc: Any) -> Any:
        asked.append(sid)
        return known(sid, doc)

    monkeypatch.setattr(s.store, "_load_known", asking)
    for i, ask in ((12, 1), (13, 0)):  # alone again: the first asks the file and finds its own
        parsed.clear()                 # commit, the next does not ask
        asked.clear()
        run(s.add_items([msg(i)]))
        assert parsed == [] and len(asked) == ask
    assert run(s.get_items()) == [msg(6), msg(7), msg(8), msg("o9"), msg(9), msg("o10"),
                                  msg(10), msg("o11"), msg(11), msg(12), msg(13)]


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


def test_a_sync_tool_s_older_copy_is_read_again(tmp_path: Path) -> None:
    root = tmp_path / "store"
    s = FileSession("s1", fsdurable.Store(root))
    run(s.add_items([msg(1)]))
    old = doc(root).read_bytes()
    run(s.add_items([msg(2)]))
    tmp = doc(root).with_suffix(".sync")
    tmp.write_bytes(old)
    os.replace(tmp, doc(root))  # a sync tool puts back the older version
    run(s.add_items([msg(3)]))  # built on what is on disk, not on the copy held
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == [msg(1), msg(3)]


def test_another_node_s_commit_of_the_same_version_is_read_again(tmp_path: Path) -> None:
    root, other = tmp_path / "store", tmp_path / "other"
    s = FileSession("s1", fsdurable.Store(root))
    run(s.add_items([msg(1)]))
    shutil.copytree(root, other)
    run(s.add_items([msg(2)]))
    run(FileSession("s1", fsdurable.Store(other)).add_items([msg("x")]))
    mine = fsdurable.Store(root).load("s1")
    theirs = fsdurable.Store(other).load("s1")
    assert mine.version == theirs.version and mine.commit_id != theirs.commit_id
    tmp = doc(root).with_suffix(".sync")
    shutil.copyfile(doc(other), tmp)
    os.replace(tmp, doc(root))  # the sync tool delivers the other node's commit
    assert run(s.pop_item()) == msg("x")
    assert run(s.get_items()) == [msg(1)]


def test_a_file_corrupted_or_deleted_under_a_held_document(tmp_path: Path) -> None:
    root = tmp_path / "store"
    s = FileSession("s1", fsdurable.Store(root))
    run(s.add_items([msg(1), msg(2)]))
    doc(root).write_bytes(b'{"format": "fsdurable.ses')
    run(s.add_items([msg(3)]))  # quarantined by the repair gate, then started over
    assert run(s.get_items()) == [msg(3)]
    assert len(list((root / "quarantine").iterdir())) == 1
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
    codes = [e.code for e in fsdurable.Store(root).events("s1")]
    assert codes.count("session_migrated") == 1


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
    if op == "add":
        with pytest.raises(fsdurable.UnreadableState) as info:
            run(s.add_items([msg(2)]))
        assert info.value.reason == "unknown_version"
    else:  # the repair gate leaves it; there is nothing this fsdurable can pop
        assert run(s.pop_item()) is None
    assert doc(root).read_bytes() == before


@pytest.mark.parametrize("op", ["add", "pop", "clear", "pop_empty", "clear_empty"])
def test_a_replace_the_stat_cannot_see_is_read_again(tmp_path: Path, op: str) -> None:
    """A held document's stat is trusted without re-reading the file's first bytes (the
    commit's compare-and-swap re-reads them); a replace that leaves the stat as it was (a
    coarse clock, a tool restoring size and times) is caught there and the mutation is made
    on what is on disk — a mutation that writes nothing confirms the file itself."""
    from fsdurable._filecache import key

    root, other = tmp_path / "store", tmp_path / "other"
    s = FileSession("s1", fsdurable.Store(root))
    empty = op.endswith("_empty")
    run(s.add_items([msg(1)]))
    if empty:
        run(s.clear_session())  # held: no items
    shutil.copytree(root, other)
    t = FileSession("s1", fsdurable.Store(other))
    if not empty:
        assert run(t.pop_item()) == msg(1)
    run(t.add_items([msg("x")]))  # the other copy holds x where ours holds 1 (or nothing)
    with open(doc(root), "r+b") as f:  # in place: the same inode
        f.write(doc(other).read_bytes())
        f.truncate()
    seen = s.store._cache._seen["s1"]
    seen.key = key(os.lstat(doc(root)))  # as if the stat had not changed (a coarse clock)
    seen.racy = True
    if op == "add":
        run(s.add_items([msg(2)]))
        assert run(s.get_items()) == [msg("x"), msg(2)]
    elif op.startswith("pop"):
        assert run(s.pop_item()) == msg("x")
        assert run(s.get_items()) == []
    else:
        run(s.clear_session())
        assert run(s.get_items()) == []


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
