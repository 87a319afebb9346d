"""Compare-and-swap on a filesystem with coarse (1 s) timestamps, where a replace by another
process can repeat a file's size, mtime and (freed) inode number: a real ext4 with 128-byte
inodes, loop-mounted. Skipped where this machine cannot mount one (not root, no loop device)."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from fsdurable import ConflictError, Store

from .conftest import PYTHON, need_tools, skip_or_fail, subprocess_env


@pytest.fixture
def coarse_dir(tmp_path: Path) -> Iterator[Path]:
    need_tools("mke2fs", "mount", root=True)
    img, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(32 << 20)
    mk = subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-I", "128", str(img)],
                        capture_output=True, text=True)
    if mk.returncode != 0:
        skip_or_fail(f"mke2fs failed: {mk.stderr.strip()}")
    m = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if m.returncode != 0:
        skip_or_fail(f"cannot loop-mount here: {m.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


CHILD = textwrap.dedent("""
    import sys, attrs, fsdurable
    b = fsdurable.Store(sys.argv[1])
    x = b.load(sys.argv[2])
    x = b.save(attrs.evolve(x, metadata={"who": "B"}))
    b.save(attrs.evolve(x, metadata={"who": "C"}))
""")


def test_no_lost_update_when_stat_repeats(coarse_dir: Path) -> None:
    root = coarse_dir / "store"
    a = Store(root)
    for i in range(8):
        sid = f"p{i}"
        s1 = a.create(sid, metadata={"who": "0"})
        # another process commits v2 and v3 within the same second: same size, maybe same inode
        subprocess.run([PYTHON, "-c", CHILD, str(root), sid], env=subprocess_env(), check=True,
                       timeout=60)
        with pytest.raises(ConflictError):
            a.save(attrs.evolve(s1, metadata={"who": "A"}))
        assert Store(root).load(sid).metadata == {"who": "C"}
