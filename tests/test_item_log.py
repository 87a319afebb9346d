"""The Agents SDK's items in an append-only item log (fsdurable/_itemlog.py, _oaitems.py;
docs/storage.md, "Item logs"): what a change writes, what a reader parses, a torn tail, a short
log, a rewrite, the migration of older sessions, the repair gate and doctor, the schemas."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

import fsdurable
from fsdurable import _fsio, _itemlog, _quarantine, _segments
from fsdurable._oaitems import KEY, with_record
from fsdurable.cli import main
from fsdurable.openai_agents import FileSession

from .conftest import io_log as recording

REPO = Path(__file__).resolve().parent.parent
SCHEMA = {k: Draft202012Validator(json.loads((REPO / "schemas" / f"{k}.schema.json").read_text()))
          for k in ("itemlog", "itemframe")}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def msg(i: int | str) -> dict[str, Any]:
    return {"role": "user", "content": f"m{i}"}


def log(root: Path, sid: str = "s1", n: int = 0) -> Path:
    return root / "history" / sid / f"items-{n:06d}.log"



def test_a_change_is_one_append_and_one_fdatasync_and_no_document(tmp_path: Path) -> None:
    root = tmp_path / "store"
    s = FileSession("s1", fsdurable.Store(root))
    run(s.add_items([msg(0)]))  # the first: log 0 written whole, then the document
    for op in ("add", "pop", "clear"):
        with recording() as ops:
            if op == "add":
                run(s.add_items([msg(1), msg(2)]))
            elif op == "pop":
                assert run(s.pop_item()) == msg(2)
            else:
                run(s.clear_session())
        writes = [(o, a[0]) for o, a in ops if o not in ("mkdir",)]
        assert writes == [("append", str(log(root))), ("fsync", str(log(root)))], (op, ops)
    assert run(s.pop_item()) is None  # nothing to do: nothing written
    with recording() as ops:
        assert run(s.get_items()) == []
    assert ops == []


def test_what_a_writer_keeps_of_its_own_frames_is_what_a_reader_parses(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = fsdurable.Store(root)
    s = FileSession("s1", store)

    async def work() -> None:
        for i in range(5):
            await s.add_items([msg(i), msg(f"{i}b")])
        await s.pop_item()
        await s.pop_item()
        await s.pop_item()  # into the frame before
        await s.add_items([msg("x")])

    run(work())
    mine = s._items._view
    fresh = _itemlog.scan(str(log(root)), None, store.config.max_file_bytes)
    assert mine is not None and fresh is not None
    assert (mine.end, mine.count, mine.frames, mine.live, mine.torn) == (
        fresh.end, fresh.count, fresh.frames, fresh.live, fresh.torn)
    assert fresh.end == log(root).stat().st_size
    want = [msg(0), msg("0b"), msg(1), msg("1b"), msg(2), msg("2b"), msg(3), msg("x")]
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == want
    assert run(FileSession("s1", fsdurable.Store(root)).get_items(3)) == want[-3:]


def test_a_torn_tail_is_ignored_then_cut_by_the_next_write(tmp_path: Path) -> None:
    root = tmp_path / "store"
    s = FileSession("s1", fsdurable.Store(root))
    run(s.add_items([msg(1), msg(2)]))
    whole = log(root).read_bytes()
    frame = _itemlog.encode_frame(2, b'[{"role":"user","content":"m3"}]', 1)
    for torn in (frame[:-3], frame[:5], b"\x00" * 40, frame[:12] + b"x" + frame[13:]):
        log(root).write_bytes(whole + torn)  # a write a crash cut short
        assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == [msg(1), msg(2)]
        finding = [f for f in fsdurable.doctor(fsdurable.Store(root))
                   if f.code == "item_log_torn_tail"]
        assert len(finding) == 1 and finding[0].severity == "info"
        run(FileSession("s1", fsdurable.Store(root)).add_items([msg(4)]))
        got = log(root).read_bytes()
        assert got[:len(whole)] == whole and got[len(whole):].startswith(b"\x1eITM")
        assert run(s.get_items()) == [msg(1), msg(2), msg(4)]
        assert run(s.pop_item()) == msg(4)
        whole = log(root).read_bytes()


def test_a_short_log_is_waiting_for_sync_never_fewer_items(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = fsdurable.Store(root)
    s = FileSession("s1", store)
    run(s.add_items([msg(1), msg(2)]))  # the document has seen log 0 to its end
    whole = log(root).read_bytes()
    header = whole[:whole.index(b"\n") + 1]
    for short in (header, None):  # the frames not delivered yet; the log not delivered at all
        if short is None:
            log(root).unlink()
        else:
            log(root).write_bytes(short)
        for op in (FileSession("s1", fsdurable.Store(root)).get_items(),
                   FileSession("s1", fsdurable.Store(root)).add_items([msg(3)])):
            with pytest.raises(fsdurable.UnreadableState) as info:
                run(op)
            assert info.value.reason == "log_short"
        assert (log(root).read_bytes() if short else None) == short  # nothing written
        [f] = [f for f in fsdurable.doctor(fsdurable.Store(root))
               if f.code == "item_log_short"]
        assert f.severity == "problem"
        cli = fsdurable.Store(root)
        from fsdurable.openai_agents import describe

        assert "log_short" in describe(cli, cli.load("s1"))["unreadable"]
    log(root).write_bytes(whole)  # delivered: read whole again
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == [msg(1), msg(2)]


def test_a_resume_waits_for_a_short_log_without_spending_an_attempt(tmp_path: Path) -> None:
    from fsdurable._resume import waiting_for

    root = tmp_path / "store"
    store = fsdurable.Store(root)
    run(FileSession("s1", store).add_items([msg(1)]))
    s = store.load("s1")
    assert waiting_for(None, s, store) is None
    whole = log(root).read_bytes()
    log(root).write_bytes(whole[:whole.index(b"\n") + 1])
    got = waiting_for(None, s, store)
    assert got is not None and got[0] == "log_short"


def test_a_rewrite_keeps_the_live_items_and_removes_the_old_log(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = fsdurable.Store(root, config=fsdurable.Config(item_log_slack=256))
    s = FileSession("s1", store)
    run(s.add_items([msg(i) for i in range(4)]))
    n = 0
    for i in range(40):  # the SDK's correction loop: add, pop, add
        run(s.add_items([msg(f"x{i}")]))
        assert run(s.pop_item()) == msg(f"x{i}")
        now = store.load("s1").metadata[KEY]["items_log"]["n"]
        if now != n:
            assert not log(root, n=n).exists() and log(root, n=now).exists()
            n = now
    assert n >= 2
    assert sorted(p.name for p in (root / "history" / "s1").iterdir()) == [f"items-{n:06d}.log"]
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == [msg(i) for i in range(4)]
    assert log(root, n=n).stat().st_size < 2 * 256 + 400  # dead bytes bounded by the slack


@pytest.mark.parametrize("layout", ["lane", "inline"])
def test_an_older_session_is_read_in_place_then_migrated_once(tmp_path: Path,
                                                              layout: str) -> None:
    root = tmp_path / "store"
    store = fsdurable.Store(root, config=fsdurable.Config(inline_tail_bytes=0,
                                                          segment_grace=0))
    old = [msg(i) for i in range(3)]
    if layout == "lane":  # fsdurable before the item log: the items as segments of a lane
        store.create("s1", source="openai-agents", lanes={KEY: old})
    else:  # before lanes: the items inline in the metadata
        store.create("s1", source="openai-agents", metadata={KEY: {"items": old}})
    before = sorted(p.name for p in (root / "history").rglob("*"))
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == old  # read in place
    assert sorted(p.name for p in (root / "history").rglob("*")) == before  # nothing moved
    run(FileSession("s1", store).add_items([msg(3)]))
    s = store.load("s1")
    assert KEY not in s.lanes and s.metadata[KEY]["items_log"]["n"] == 0
    assert "items" not in s.metadata[KEY]
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == [*old, msg(3)]
    reasons = [e.reason for e in store.events("s1") if e.code == "session_migrated"]
    assert reasons[-1] == "item_log" and len(reasons) == (1 if layout == "lane" else 2)
    segs = [p for p in (root / "history" / "s1").iterdir() if p.suffix == ".json"]
    assert segs  # the lane's segments (the inline items went to one first), named by nothing
    fsdurable.doctor(store, repair=True)  # ... go through the repair gate, with events
    assert [p.name for p in (root / "history" / "s1").iterdir()] == ["items-000000.log"]
    removed = [e for e in store.events("s1") if e.code == "segment_removed"]
    assert len(removed) == len(segs)
    run(FileSession("s1", store).add_items([msg(4)]))
    assert len([e for e in store.events("s1") if e.code == "session_migrated"]) == len(reasons)


def test_an_unnamed_log_is_set_aside_never_overwritten(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = fsdurable.Store(root)
    run(FileSession("s1", store).add_items([msg(1)]))
    theirs = log(root).read_bytes()
    os.unlink(root / "sessions" / "s1.json")  # a first write a crash cut short, or another
    run(FileSession("s1", store).add_items([msg(2)]))  # node's log before its document
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == [msg(2)]
    [q] = list((root / "quarantine").iterdir())
    assert q.read_bytes() == theirs
    assert [e.code for e in store.events("s1")].count("file_quarantined") == 1
    from fsdurable._quarantine import listing  # what `fsdurable quarantine` lists

    [item] = listing(store)
    assert (item.kind, item.reason, item.original) == ("item-log", "unnamed_log",
                                                       "items-000000.log")


def test_an_old_log_a_crash_left_unnamed_goes_through_the_repair_gate(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = fsdurable.Store(root, config=fsdurable.Config(segment_grace=0))
    run(FileSession("s1", store).add_items([msg(1)]))
    stale = log(root, n=7)
    stale.write_bytes(_itemlog.encode_header("s1", store.node_id, 7, "g7"))
    other = log(root, n=8)
    other.write_bytes(_itemlog.encode_header("s1", "n-other", 8, "g8"))
    found = {f.code for f in fsdurable.doctor(fsdurable.Store(root, config=store.config))}
    assert "orphan_segments" in found
    fsdurable.doctor(store, repair=True)
    assert not stale.exists() and other.exists() and log(root).exists()  # another node's stays
    assert run(FileSession("s1", store).get_items()) == [msg(1)]


def test_a_symlink_in_place_of_the_history_directory_is_never_followed(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store = fsdurable.Store(root)
    run(FileSession("s1", store).add_items([msg(1)]))
    (root / "history" / "s1").rename(elsewhere)
    os.symlink(elsewhere, root / "history" / "s1")
    before = (elsewhere / "items-000000.log").read_bytes()
    for op in (FileSession("s1", fsdurable.Store(root)).get_items(),
               FileSession("s1", fsdurable.Store(root)).add_items([msg(2)])):
        with pytest.raises(fsdurable.UnreadableState) as info:
            run(op)
        assert info.value.reason == "not_a_directory"
    assert (elsewhere / "items-000000.log").read_bytes() == before


def test_a_run_s_count_names_the_log_end_it_was_counted_from() -> None:
    s = fsdurable.Session(id="s1", created_at=0.0, updated_at=0.0,
                          metadata={KEY: {"items_log": {"n": 1, "at": 100}}})
    ref = with_record(s, items_at=3, seen={"n": 1, "at": 180}).metadata[KEY]
    assert ref["items_log"] == {"n": 1, "at": 180} and ref["run"]["items_at"] == 3
    for seen in ({"n": 1, "at": 90}, {"n": 0, "at": 500}, {"n": 2, "at": 500}):
        got = with_record(s, items_at=3, seen=seen).metadata[KEY]["items_log"]
        assert got == {"n": 1, "at": 100}  # never back, never another log's


def test_every_log_the_store_writes_validates(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = fsdurable.Store(root, config=fsdurable.Config(item_log_slack=64))
    with recording() as ops:
        s = FileSession("s1", store)
        run(s.add_items([msg(1), msg(2)]))
        run(s.pop_item())
        run(s.clear_session())
        for i in range(4):
            run(s.add_items([msg(i)]))
    headers = frames = 0
    pending: dict[str, bytes] = {}
    for op, args in ops:
        if op == "write":
            pending[args[0]] = args[1]
        elif op == "rename" and args[1].endswith(".log"):
            data = pending.pop(args[0])
            nl = data.index(b"\n")
            assert not list(SCHEMA["itemlog"].iter_errors(json.loads(data[:nl])))
            headers += 1
            rest = data[nl + 1:]
            frames += _check_frames(rest)
        elif op == "append" and args[0].endswith(".log"):
            frames += _check_frames(args[1])
    assert headers >= 2 and frames >= 6


def _check_frames(data: bytes) -> int:
    n = 0
    while data:
        assert data[:4] == _itemlog.MAGIC
        size = int.from_bytes(data[4:8], "big")
        body = data[12:12 + size]
        nl = body.index(b"\n")
        hdr = json.loads(body[:nl])
        assert not list(SCHEMA["itemframe"].iter_errors(hdr)), hdr
        assert len(json.loads(body[nl + 1:]) if hdr["n"] else []) == hdr["n"]
        data = data[12 + size:]
        n += 1
    return n


def test_a_failed_rewrite_never_reports_the_durable_change_as_failed(tmp_path: Path) -> None:
    """The change is appended and fdatasync'd before the rewrite it triggers: a rewrite that
    fails (a full disk writing log n + 1) must not raise, or a caller's retry would pop twice."""
    import errno

    root = tmp_path / "store"
    store = fsdurable.Store(root, config=fsdurable.Config(item_log_slack=0))
    fs = FileSession("c", store)
    run(fs.add_items([{"n": 0, "pad": "z" * 200}]))
    run(fs.add_items([{"n": 1, "pad": "x" * 600}]))

    def full(op: str, args: tuple[Any, ...]) -> None:
        if op == "create" and "items-000001" in str(args[0]):
            raise OSError(errno.ENOSPC, "full")

    prev = _fsio.set_recorder(full)
    try:
        assert run(fs.pop_item()) == {"n": 1, "pad": "x" * 600}  # durable; the rewrite failed
    finally:
        _fsio.set_recorder(prev)
    [ev] = [e for e in store.events("c") if e.code == "item_log_rewrite_failed"]
    assert "full" in ev.detail["error"]
    assert run(FileSession("c", fsdurable.Store(root)).get_items()) == [{"n": 0, "pad": "z" * 200}]
    with recording() as ops:  # not tried again at once: a failing disk is not made to copy
        run(fs.add_items([{"n": 2}]))  # the whole session at every change
    assert not [a for o, a in ops if "items-000001" in str(a[0])]
    for i in range(3, 30):  # once as many bytes again are written, it is
        run(fs.add_items([{"n": i, "pad": "x" * 100}]))
        assert run(fs.pop_item())["n"] == i
        if store.load("c").metadata[KEY]["items_log"]["n"] == 1:
            break
    assert store.load("c").metadata[KEY]["items_log"]["n"] == 1
    assert run(FileSession("c", fsdurable.Store(root)).get_items()) == [
        {"n": 0, "pad": "z" * 200}, {"n": 2}]
    assert len([e for e in store.events("c") if e.code == "item_log_rewrite_failed"]) == 1


def test_a_durable_run_s_checkpoints_name_the_log_end_they_counted_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run record's ``items_at`` is never ahead of the log end its document names: a sync
    tool that delivers the document before the frames makes the log short (waiting for sync),
    never a resume that goes on with fewer items than its checkpoint counted. And a session
    the turn protocol created is not reported migrated by its first ``add_items``."""
    pytest.importorskip("agents", reason="the openai-agents extra is not installed")
    from fsdurable import openai_agents as oa

    from . import oa_agent

    monkeypatch.setenv("OA_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    root = tmp_path / "store"
    store = fsdurable.Store(root)
    checkpoints: list[tuple[int, dict[str, int]]] = []
    real = store._commit_locked

    def watching(new: Any, base: int, **kw: Any) -> Any:
        ns = new.metadata.get(KEY, {})
        if "run" in ns and "items_log" in ns:
            checkpoints.append((ns["run"]["items_at"], ns["items_log"]))
        return real(new, base, **kw)

    monkeypatch.setattr(store, "_commit_locked", watching)

    async def main() -> Any:
        return await oa.run(oa_agent.make_agent(), "add", session=FileSession("chat", store),
                            effects=oa_agent.EFFECTS, debounce=0)

    assert run(main()).final_output == oa_agent.FINAL
    data = log(root, "chat").read_bytes()
    counted = [c for c in checkpoints if c[0] > 0]
    assert counted
    for items_at, ref in counted:
        part = tmp_path / "part.log"
        part.write_bytes(data[:ref["at"]])  # the log as far as the document has seen it
        view = _itemlog.scan(str(part), None, 1 << 20)
        assert view is not None and view.end == ref["at"] and view.count >= items_at
    assert not [e for e in store.events("chat") if e.code == "session_migrated"]


def test_items_a_reader_would_reject_are_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame past ``max_file_bytes`` (every read's bound) would read as a torn tail and be
    cut by the next writer: refused whole instead. A log written whole is cut into frames, so
    a big session never makes one frame (nor one parse for ``get_items(1)``)."""
    from fsdurable import _oaitems

    root = tmp_path / "store"
    store = fsdurable.Store(root, config=fsdurable.Config(max_file_bytes=4096))
    fs = FileSession("s1", store)
    run(fs.add_items([msg(1)]))
    before = log(root).read_bytes()
    with pytest.raises(fsdurable.InvalidState) as info:
        run(fs.add_items([{"big": "x" * 5000}]))
    assert info.value.reason == "too_large" and log(root).read_bytes() == before
    monkeypatch.setattr(_oaitems, "_CHUNK", 100)
    big = fsdurable.Store(tmp_path / "big", config=fsdurable.Config(inline_tail_bytes=0))
    big.create("s1", source="openai-agents", lanes={KEY: [msg(i) for i in range(40)]})
    run(FileSession("s1", big).add_items([msg(40)]))  # migrated: written whole, in frames
    view = _itemlog.scan(str(log(tmp_path / "big")), None, 1 << 20)
    assert view is not None and len(view.frames) >= 10
    parsed: list[int] = []
    real = _itemlog.read_items
    monkeypatch.setattr(_oaitems, "read_items", lambda p, v, lo, hi, m: (
        parsed.append(len(list(v.spans(lo, hi)))) or real(p, v, lo, hi, m)))
    assert run(FileSession("s1", fsdurable.Store(tmp_path / "big")).get_items(1)) == [msg(40)]
    assert parsed == [1]
    assert run(FileSession("s1", fsdurable.Store(tmp_path / "big")).get_items()) == [
        msg(i) for i in range(41)]


def test_a_read_racing_another_writer_s_rewrite_reads_the_new_log(tmp_path: Path) -> None:
    """A read takes no lock: the log it was about to read may be removed by another writer's
    rewrite (its document already names the next log) — read again, never ``log_short``."""
    root = tmp_path / "store"
    cfg = fsdurable.Config(item_log_slack=0)
    a = FileSession("s1", fsdurable.Store(root, config=cfg))
    b = FileSession("s1", fsdurable.Store(root, config=cfg))
    run(a.add_items([{"n": 0, "pad": "z" * 200}]))
    held = a._load()  # a's read has loaded the document ...
    run(b.add_items([{"n": 1, "pad": "x" * 600}]))
    assert run(b.pop_item())["n"] == 1  # ... b rewrites: log 1 named, log 0 removed
    assert not log(root).exists() and log(root, n=1).exists()
    real = a._load
    calls = iter([held])
    a._load = lambda **kw: next(calls, None) or real(**kw)  # type: ignore[method-assign]
    assert run(a.get_items()) == [{"n": 0, "pad": "z" * 200}]


def test_a_malformed_log_reference_keeps_every_file(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = fsdurable.Store(root, config=fsdurable.Config(segment_grace=0))
    run(FileSession("s1", store).add_items([msg(1)]))
    path = root / "sessions" / "s1.json"
    d = json.loads(path.read_bytes())
    d["metadata"][KEY]["items_log"]["at"] = -1
    path.write_text(json.dumps(d))
    codes = {f.code for f in fsdurable.doctor(fsdurable.Store(root, config=store.config),
                                              repair=True)}
    assert "orphan_segments" not in codes
    assert log(root).exists()  # "left as it is", and so it is


def test_a_restored_document_never_reads_the_log_of_the_session_started_over(
        tmp_path: Path) -> None:
    """A corrupt document is quarantined and the session started over with a new log 0;
    restoring the old document later must not read the new session's items as its own."""
    root = tmp_path / "store"
    store = fsdurable.Store(root)
    run(FileSession("s1", store).add_items([msg("old")]))
    old_doc = (root / "sessions" / "s1.json").read_bytes()
    (root / "sessions" / "s1.json").write_bytes(b"{not json")
    run(FileSession("s1", fsdurable.Store(root)).add_items([msg("new")]))
    (root / "sessions" / "s1.json").write_bytes(old_doc)  # a restore, by hand or by tool
    with pytest.raises(fsdurable.UnreadableState) as info:
        run(FileSession("s1", fsdurable.Store(root)).get_items())
    assert info.value.reason == "log_short" and "another log" in info.value.message
    [f] = [f for f in fsdurable.doctor(fsdurable.Store(root)) if f.code == "item_log_short"]
    assert "another log" in f.detail  # doctor judges it as every reader does


def test_an_integer_past_64_bits_reads_back_exactly(tmp_path: Path) -> None:
    """orjson reads an integer past 64 bits as a float without an error: 2**64 + 1 came back
    as 1.8446744073709552e19 (2**70 passed only because that float equals it). A frame the
    standard library wrote says so, and is read by it."""
    root = tmp_path / "store"
    fs = FileSession("s1", fsdurable.Store(root))
    big = [{"n": 2**64 + 1}, {"n": -(2**63) - 1}, {"n": 10**30 + 7, "s": "é"}]
    run(fs.add_items([msg(0)]))
    run(fs.add_items(big))
    for reader in (fs, FileSession("s1", fsdurable.Store(root))):
        got = run(reader.get_items())[1:]
        assert got == big and all(type(x["n"]) is int for x in got)
    small = fsdurable.Store(tmp_path / "small", config=fsdurable.Config(item_log_slack=0))
    fs = FileSession("s1", small)
    run(fs.add_items([msg(0), *big]))  # log 0 written whole
    run(fs.add_items([{"pad": "x" * 2000}]))
    run(fs.pop_item())  # and again, by a rewrite
    assert small.load("s1").metadata[KEY]["items_log"]["n"] == 1
    got = run(FileSession("s1", fsdurable.Store(tmp_path / "small")).get_items())
    assert got == [msg(0), *big] and all(type(x["n"]) is int for x in got[1:])


def _started_over(root: Path) -> tuple[bytes, str]:
    """Session s1 with items [old], its document corrupted, the session started over by a
    write ([new]): (the old document's bytes, the name its log 0 got in quarantine/)."""
    store = fsdurable.Store(root)
    run(FileSession("s1", store).add_items([msg("old")]))
    old_doc = (root / "sessions" / "s1.json").read_bytes()
    (root / "sessions" / "s1.json").write_bytes(b"{not json")
    run(FileSession("s1", fsdurable.Store(root)).add_items([msg("new")]))
    [q] = [q for q in _quarantine.listing(fsdurable.Store(root)) if q.kind == "item-log"]
    assert q.session_id == "s1" and q.restorable and q.reason == "unnamed_log"
    return old_doc, q.name


def test_restoring_a_document_brings_back_the_log_it_names(tmp_path: Path) -> None:
    """Before: the restored document read as "waiting for sync" forever (its log sat in
    quarantine/, which ``restore`` refused to touch) until someone moved the log by hand."""
    root = tmp_path / "store"
    old_doc, log_name = _started_over(root)
    store = fsdurable.Store(root)
    [doc] = [q for q in _quarantine.listing(store) if q.kind == "session"]
    Path(doc.path).write_bytes(old_doc)  # a human fixed the quarantined document
    store.delete("s1")  # and chose the old conversation over the new one
    _quarantine.restore(store, doc.name)
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == [msg("old")]
    left = {q.kind: q for q in _quarantine.listing(store)}
    assert set(left) == {"item-log"} and left["item-log"].reason == "displaced"
    assert log_name not in os.listdir(root / "quarantine")  # moved back, not copied
    [ev] = [e for e in store.events() if e.code == "quarantine_restored"]
    assert ev.detail["logs"] == [str(log(root))]
    assert not [f for f in fsdurable.doctor(fsdurable.Store(root)) if f.severity == "problem"]
    # the new session's log, set aside, is restorable only where a document names it
    with pytest.raises(fsdurable.InvalidState) as info:
        _quarantine.restore(store, left["item-log"].name)
    assert info.value.reason == "not_named"
    assert left["item-log"].name in os.listdir(root / "quarantine")


def test_an_item_log_is_restored_on_its_own_once_its_document_names_it(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    old_doc, log_name = _started_over(root)
    (root / "sessions" / "s1.json").write_bytes(old_doc)  # the document put back by hand
    store = fsdurable.Store(root)
    with pytest.raises(fsdurable.UnreadableState):  # the new session's log is in its place
        run(FileSession("s1", store).get_items())
    out = main(["--root", str(root), "quarantine", "restore", log_name])
    assert out == 0
    assert run(FileSession("s1", fsdurable.Store(root)).get_items()) == [msg("old")]
    [aside] = [q for q in _quarantine.listing(store) if q.kind == "item-log"]
    assert aside.reason == "displaced"
    before = log(root).read_bytes()
    with pytest.raises(fsdurable.InvalidState) as info:  # named by nothing: nothing moves
        _quarantine.restore(store, aside.name)
    assert info.value.reason == "not_named" and log(root).read_bytes() == before


def test_a_quarantined_item_log_never_stops_the_removal_of_orphans(tmp_path: Path) -> None:
    """The repair gate judges a session's history by its documents, those in quarantine/ too;
    an item log there (restorable since bd762c7) was parsed as one, failed, and so kept every
    orphan of the session for as long as the log sat there."""
    root = tmp_path / "store"
    _started_over(root)
    store = fsdurable.Store(root, config=fsdurable.Config(segment_grace=0))
    _quarantine.purge(store, [q.name for q in _quarantine.listing(store) if q.kind == "session"])
    assert _segments.referenced(store, "s1") == {"items-000000.log"}
    orphan = root / "history" / "s1" / "items-000007.log"
    orphan.write_bytes(log(root).read_bytes())
    os.utime(orphan, (1, 1))
    _segments.repair_history(store, "s1")
    assert not orphan.exists() and log(root).exists()


def test_restoring_a_log_never_goes_through_a_symlinked_history_dir(tmp_path: Path) -> None:
    root = tmp_path / "store"
    old_doc, log_name = _started_over(root)
    (root / "sessions" / "s1.json").write_bytes(old_doc)
    outside = tmp_path / "outside"
    (root / "history" / "s1").rename(outside)
    (root / "history" / "s1").symlink_to(outside)
    store = fsdurable.Store(root)
    before = sorted(os.listdir(root / "quarantine"))
    with pytest.raises(fsdurable.UnreadableState) as info:
        _quarantine.restore(store, log_name)
    assert info.value.reason == "not_a_directory"
    assert os.listdir(outside) == ["items-000000.log"]  # nothing moved out of it, or into it
    assert sorted(os.listdir(root / "quarantine")) == before
