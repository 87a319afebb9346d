"""A real exFAT filesystem for tests: an image file on a loop device, mounted with exfat-fuse.

exFAT is what SD cards, USB drives and disks shared between macOS, Windows and Linux use: names
are case-insensitive (``Chat.json`` and ``chat.json`` are one file), there are no hard links
(``link()`` fails with EPERM), file modes are the mount's mask (every file shows 0777 whatever
chmod says) and timestamps are coarse (whole seconds here, 2 s on the disk).

``exfat_mount`` (session scope) mounts one 256 MiB sparse image for the whole run; ``exfat_dir``
gives each test a fresh directory on it. Needs root, ``losetup``, ``mkfs.exfat`` (exfatprogs),
``mount.exfat-fuse`` (exfat-fuse) and ``/dev/fuse``: where any is missing the tests skip with the
reason — except under ``CI=true``, where CI must have installed them, so a skip is a failure.
Debian packages ``exfat-fuse`` and ``exfatprogs`` (CI's ``.ci/run`` installs them; tests never do).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail  # the one skip policy: a skip fails under CI=true

TOOLS = {"losetup": "util-linux", "mkfs.exfat": "exfatprogs", "mount.exfat-fuse": "exfat-fuse",
         "umount": "util-linux"}


def _run(*cmd: str) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip()


@pytest.fixture(scope="session")
def exfat_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    missing = [f"{t} ({pkg})" for t, pkg in TOOLS.items() if shutil.which(t) is None]
    if missing:
        skip_or_fail(f"exFAT tests need {', '.join(missing)}: "
                     "the Debian packages exfat-fuse and exfatprogs (.ci/run installs them)")
    if os.geteuid() != 0:
        skip_or_fail("exFAT tests need root (losetup and mount of a loop device)")
    if not os.path.exists("/dev/fuse"):
        skip_or_fail("exFAT tests need /dev/fuse (exfat-fuse is a FUSE filesystem)")
    base = tmp_path_factory.mktemp("exfat")
    img, mnt = base / "exfat.img", base / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(256 << 20)  # sparse: costs only what is written
    loop = ""
    try:
        _run("mkfs.exfat", str(img))
        loop = _run("losetup", "-f", "--show", str(img))
        _run("mount.exfat-fuse", loop, str(mnt))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True, timeout=60)
        skip_or_fail(f"could not mount an exFAT image: {e}")
    try:
        assert os.path.ismount(mnt)
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=60).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)
        subprocess.run(["losetup", "-d", loop], capture_output=True, timeout=60)


@pytest.fixture
def exfat_dir(exfat_mount: Path) -> Path:
    """A fresh, empty directory on the exFAT mount."""
    d = exfat_mount / uuid.uuid4().hex[:12]
    d.mkdir()
    return d
