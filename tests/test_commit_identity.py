"""Issue 9 item 5: the commit's compare-and-swap compares the commit's identity (version and
commit id), so a file a sync tool replaced with another node's commit of the SAME version number
is a ConflictError, never a silently lost update.

Two stores on two roots stand for two nodes; the "sync tool" is rsync (-a: mtime kept) where
installed, else a copy-and-rename, the way Syncthing and Dropbox put a file in place.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest

import fsdurable
from fsdurable import ConflictError
from fsdurable._filecache import key as _key


def _sync_file(src: Path, dst: Path) -> None:
    """Put ``src`` under ``dst`` as a sync tool does (a temp file beside it, then a rename)."""
    if shutil.which("rsync"):
        # -I: never skip by size and mtime (two commits in one second have equal ones)
        subprocess.run(["rsync", "-a", "-I", str(src), str(dst)], check=True)
    else:
        tmp = dst.with_name(f".{dst.name}.XXXXXX")
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)


def _two_nodes(tmp_path: Path) -> tuple[fsdurable.Store, fsdurable.Store, Path, Path]:
    # one fixed clock: both nodes' commit times print with the same digits, so two commits that
    # differ only by "a"/"b" have files of the same size (a wall clock made that a coin toss)
    a = fsdurable.Store(tmp_path / "a", node_id="node-a", clock=lambda: 1_800_000_000.25)
    b = fsdurable.Store(tmp_path / "b", node_id="node-b", clock=lambda: 1_800_000_000.25)
    a.create("chat", metadata={"n": 0})
    fa, fb = tmp_path / "a" / "sessions" / "chat.json", tmp_path / "b" / "sessions" / "chat.json"
    _sync_file(fa, fb)  # both nodes at version 1, the same commit
    return a, b, fa, fb


def test_another_nodes_commit_of_the_same_version_is_a_conflict(tmp_path: Path) -> None:
    # base 19e7a73 (format 3, CAS by version number): A's save was accepted, B's update lost
    a, b, fa, fb = _two_nodes(tmp_path)
    mine = a.load("chat")
    theirs = b.patch("chat", lambda s: attrs.evolve(s, metadata={"n": 0, "by": "b"}))
    assert theirs.version == 2
    _sync_file(fb, fa)  # the sync tool puts B's version 2 under the name on A
    # A's own version 2, derived from version 1, would overwrite B's version 2: refused
    with pytest.raises(ConflictError) as info:
        a.save(attrs.evolve(mine, metadata={"n": 1}))
    assert info.value.reason == "version_mismatch"  # 2 on disk, not 1: the plain case
    # now the case the version number cannot see: each node commits its own version 2
    a2, b2, fa2, fb2 = _two_nodes(tmp_path / "again")
    ours = a2.patch("chat", lambda s: attrs.evolve(s, metadata={"n": 1, "by": "a"}))
    b2.patch("chat", lambda s: attrs.evolve(s, metadata={"n": 1, "by": "b"}))
    _sync_file(fb2, fa2)
    with pytest.raises(ConflictError) as info:
        a2.save(attrs.evolve(ours, metadata={"n": 2, "by": "a"}))
    assert info.value.reason == "commit_mismatch"
    assert info.value.expected == 2 and info.value.actual == 2
    on_disk = a2.load("chat")
    assert on_disk.metadata == {"n": 1, "by": "b"}  # B's update is still there
    # the conflict is resolvable as usual: a save based on what is on disk goes through
    assert a2.save(attrs.evolve(on_disk, metadata={"n": 2})).version == 3


def test_a_replace_the_stat_cannot_see_is_caught_by_the_prefix_recheck(tmp_path: Path) -> None:
    """A coarse filesystem (or a tool that restores size and times) can leave the stat as it
    was: within the racy window the file's first bytes are re-read, and they carry the commit
    id."""
    a, b, fa, fb = _two_nodes(tmp_path)
    ours = a.patch("chat", lambda s: attrs.evolve(s, metadata={"n": 1, "by": "a"}))
    b.patch("chat", lambda s: attrs.evolve(s, metadata={"n": 1, "by": "b"}))
    data = fb.read_bytes()
    assert len(data) == fa.stat().st_size  # same size: "a" and "b"
    with open(fa, "r+b") as f:  # in place: same inode, same size
        f.write(data)
    seen = a._cache._seen["chat"]
    seen.key = _key(os.lstat(fa))  # as if the stat had not changed (a coarse clock)
    seen.racy = True
    with pytest.raises(ConflictError) as info:
        a.save(attrs.evolve(ours, metadata={"n": 2, "by": "a"}))
    assert info.value.reason == "commit_mismatch"


def test_sync_resolve_commits_over_the_local_copy_it_read(tmp_path: Path) -> None:
    """``resolve`` keeps a conflict copy whose commit id is not the local file's: the commit
    compares against the local file it read (``base_commit_id``), not the kept copy's id."""
    a, b, fa, fb = _two_nodes(tmp_path)
    a.patch("chat", lambda s: attrs.evolve(s, metadata={"n": 1, "by": "a"}))
    b.patch("chat", lambda s: attrs.evolve(s, metadata={"n": 5, "by": "b"}))
    b.patch("chat", lambda s: attrs.evolve(s, metadata={"n": 6, "by": "b"}))
    shutil.copyfile(fb, fa.with_name("chat.sync-conflict-20261130-101010-ABCDEFG.json"))
    res = fsdurable.resolve(a, "chat")
    assert res.changed and a.load("chat").metadata == {"n": 6, "by": "b"}


def test_base_commit_id_overrides_the_sessions_own(tmp_path: Path) -> None:
    store = fsdurable.Store(tmp_path / "s")
    s1 = store.create("x")
    other = attrs.evolve(s1, commit_id="0" * 16, metadata={"k": 1})
    with pytest.raises(ConflictError):
        store.commit(other, 1)
    assert store.commit(other, 1, base_commit_id=s1.commit_id).metadata == {"k": 1}


def test_the_prefix_recheck_knows_the_commit_it_saw_and_only_that(tmp_path: Path) -> None:
    """Within the racy window the file's first bytes decide: the commit the cache saw is
    recognised (no re-read), another commit id or version is not, and neither is a nested
    ``version``/``commit_id`` pair that happens to carry the cached values."""
    from fsdurable._filecache import _prefix_matches

    st = fsdurable.Store(tmp_path / "s")
    s = st.create("chat", metadata={"version": 1, "commit_id": "x"})
    path = st.layout.session("chat")
    seen = st._cache._seen["chat"]
    seen.racy = True
    assert st._cache.session_ident("chat", path, os.lstat(path)) == (s.version, s.commit_id)
    assert _prefix_matches(path, seen)
    seen.commit_id = s.commit_id[:-1] + ("0" if s.commit_id[-1] != "0" else "1")
    assert not _prefix_matches(path, seen)
    seen.commit_id, seen.version = s.commit_id, s.version + 1
    assert not _prefix_matches(path, seen)
    # the document's own "version" comes first: a metadata dict spelling the cached values
    # later in the file never stands in for it
    s2 = st.save(attrs.evolve(s, metadata={"version": 1, "commit_id": s.commit_id + "0",
                                                "z": 0}))
    seen = st._cache._seen["chat"]
    seen.version, seen.commit_id = 1, s.commit_id + "0"
    assert b'"version":1,"commit_id":"%s0",' % s.commit_id.encode() in Path(path).read_bytes()
    assert not _prefix_matches(path, seen)
    seen.version, seen.commit_id = s2.version, s2.commit_id
    assert _prefix_matches(path, seen)


def test_a_racy_file_of_our_own_commit_is_recognised_from_its_first_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the racy window the compare-and-swap confirms the commit from the file's first
    bytes (the exact bytes encode_session writes for version and commit id), never by parsing
    the file again; a file whose bytes differ is parsed (and then judged)."""
    store = fsdurable.Store(tmp_path / "s")
    s = store.create("chat")
    seen = store._cache._seen["chat"]
    assert seen.racy  # just written
    parsed: list[str] = []
    real = store._read

    def counting(sid: str) -> Any:
        parsed.append(sid)
        return real(sid)

    monkeypatch.setattr(store, "_read", counting)
    s = store.save(attrs.evolve(s, metadata={"n": 1}))
    s = store.save(attrs.evolve(s, metadata={"n": 2}))
    assert parsed == []
    path = tmp_path / "s" / "sessions" / "chat.json"
    data = path.read_bytes()
    # the same version and commit id written otherwise (a space): not the bytes we wrote, so
    # the file is parsed — and, being the same commit, written over
    spaced = data.replace(b'"version":%d,' % s.version, b'"version": %d,' % s.version, 1)
    assert spaced != data
    with open(path, "r+b") as f:
        f.write(spaced)
    seen = store._cache._seen["chat"]
    seen.key = _key(os.lstat(path))  # as if the stat had not changed (a coarse clock)
    seen.racy = True
    s = store.save(attrs.evolve(s, metadata={"n": 3}))
    assert parsed == ["chat"] and s.version == 4
