"""A real ext4 filesystem to cut the power of: an image file on a loop device, mounted.

The power cut is the kernel's shutdown ioctl, as xfstests issues it (``godown``):
``EXT4_IOC_SHUTDOWN`` with ``EXT4_GOING_FLAGS_NOLOGFLUSH``. From that instant nothing more
reaches the image: neither dirty data in the page cache nor the journal transaction still
running; every later call on the mount fails with EIO. Unmounting then drops the page cache, and
mounting again replays the journal — what a machine sees when it boots after losing power
(short of the drive's own volatile cache, which a loop device on a file does not have).

``Ext4`` owns one image, its loop device and its mount point. Everything it attaches is undone by
``close`` (call it in a ``finally``): a leaked loop device or mount breaks later runs.
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import time

__all__ = ["EXT4_GOING_FLAGS_NOLOGFLUSH", "EXT4_IOC_SHUTDOWN", "Ext4", "HarnessError",
           "shutdown"]

# linux/fs/ext4/ext4.h: #define EXT4_IOC_SHUTDOWN _IOR('X', 125, __u32)
EXT4_IOC_SHUTDOWN = 0x8004587D
EXT4_GOING_FLAGS_NOLOGFLUSH = 0x2  # drop the running journal transaction, flush nothing
IMAGE_BYTES = 96 << 20  # sparse: costs only what is written
TOOLS = ("mkfs.ext4", "losetup", "mount", "umount")


class HarnessError(RuntimeError):
    """The harness itself failed (a mount, an unmount): no verdict on the store."""


def _run(*cmd: str) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        raise HarnessError(f"{' '.join(cmd)}: timed out") from e
    if out.returncode != 0:
        raise HarnessError(f"{' '.join(cmd)}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip()


def shutdown(mount_point: str) -> None:
    """Cut the power of the filesystem mounted at ``mount_point`` (see the module docstring)."""
    fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
    finally:
        os.close(fd)


class Ext4:
    """``Ext4(base)``: an image ``base/ext4.img`` mounted at ``base/mnt`` (``format`` makes a
    new filesystem on it: one per epoch of cuts, so the stores stay small)."""

    def __init__(self, base: str) -> None:
        self.image = os.path.join(base, "ext4.img")
        self.mnt = os.path.join(base, "mnt")
        os.makedirs(self.mnt, exist_ok=True)
        self.dev = ""
        self.mounted = False

    def format(self) -> None:
        """A fresh, empty ext4 (the previous one unmounted and detached first)."""
        self.close()
        with open(self.image, "wb") as f:
            f.truncate(IMAGE_BYTES)
        # no lazy init (no background writer racing the cut), the defaults otherwise:
        # data=ordered, a 5 s journal commit interval, no fast commits
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
             self.image)
        self.dev = _run("losetup", "--find", "--show", self.image)
        self.mount()

    def mount(self) -> None:
        _run("mount", "-t", "ext4", self.dev, self.mnt)  # replays the journal
        self.mounted = True

    def unmount(self) -> None:
        """Unmount (after a shutdown this works and drops the page cache). Busy only if a
        process still holds a file on it: retried briefly, then a HarnessError — a lazy
        unmount would keep the shut-down superblock alive under the next mount."""
        if not self.mounted:
            return
        err = ""
        for wait in (0.0, 0.05, 0.2, 0.5, 1.0, 2.0):
            time.sleep(wait)
            out = subprocess.run(["umount", self.mnt], capture_output=True, text=True,
                                 timeout=60)
            if out.returncode == 0:
                self.mounted = False
                return
            err = out.stderr.strip()
        raise HarnessError(f"umount {self.mnt}: {err}")

    def remount(self) -> None:
        """The reboot after the cut: unmount, mount again (journal replay)."""
        self.unmount()
        self.mount()

    def mount_options(self) -> str:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 3 and fields[1] == self.mnt:
                    return fields[3]
        return ""

    def close(self) -> None:
        """Unmount (lazily as a last resort) and detach the loop device; never raises."""
        if self.mounted:
            try:
                self.unmount()
            except HarnessError:
                subprocess.run(["umount", "-l", self.mnt], capture_output=True, timeout=60)
                self.mounted = False
        if self.dev:
            subprocess.run(["losetup", "-d", self.dev], capture_output=True, timeout=60)
            self.dev = ""
