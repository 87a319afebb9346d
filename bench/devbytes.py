"""What reaches the device: the growth chat's bytes counted by the block device, journal included.

Command: ``python -m bench.devbytes --mount DIR --device NAME [--turns N]``, where ``DIR`` is an
empty ext4 (or any) filesystem on block device ``NAME`` (``/sys/block/NAME/stat``) that nothing
else writes to — e.g., as root: ``truncate -s 1G img; mkfs.ext4 -q img; losetup -f --show img``
and ``mount /dev/loopN DIR``. The run itself needs no root (the counters are world-readable).

``write_bytes`` of ``/proc/self/io`` (``bench.growth``'s figure) counts the pages a process dirties;
it misses what the filesystem writes for it — the journal (on ext4, every fsync that has
metadata to commit writes a transaction: a descriptor, a copy of each changed metadata block,
a commit block) and the directory blocks. The device's own count of sectors written (after a
``sync`` on each side) has both. Same chat and floor as ``bench.growth`` (``growth.chat``:
``begin_turn`` with a ~2 KB question, a checkpoint, ``end_turn`` with a ~2 KB reply; the floor:
marker, two appends with an fdatasync each, marker removed), one after the other. Prints one
JSON document (not part of ``python -m bench``: it needs a device of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any

from .growth import floor_turns, io_counters


def sectors_written(device: str) -> int:
    with open(f"/sys/block/{device}/stat", encoding="ascii") as f:
        return int(f.read().split()[6]) * 512


def measure(device: str, fn: Any) -> dict[str, int]:
    os.sync()
    time.sleep(1.0)  # let the journal thread finish what the sync started
    d0, io0 = sectors_written(device), io_counters()
    fn()
    os.sync()
    time.sleep(1.0)
    io1 = io_counters()
    return {"device_bytes": sectors_written(device) - d0,
            "write_bytes": io1["write_bytes"] - io0["write_bytes"]}


def run(mount: str, device: str, turns: int) -> dict[str, Any]:
    import fsdurable

    from ._data import _text

    work = os.path.join(mount, f"devbytes-{os.getpid()}")
    os.makedirs(work)
    rng = random.Random(18)
    texts = [(_text(rng, 2000), _text(rng, 2000)) for _ in range(turns)]
    content = sum(len(q.encode()) + len(a.encode()) for q, a in texts)
    store = fsdurable.Store(os.path.join(work, "store"))
    sid = store.create("chat").id

    def chat() -> None:
        for q, a in texts:
            s = store.begin_turn(sid, q)
            s = store.checkpoint(s, phase="model_reply")
            store.end_turn(s, a)

    floor_dir = os.path.join(work, "floor")
    os.makedirs(floor_dir)
    out: dict[str, Any] = {"turns": turns, "content_bytes": content,
                           "fsdurable": measure(device, chat),
                           "floor_append": measure(device, lambda: floor_turns(floor_dir, texts))}
    for k in ("fsdurable", "floor_append"):
        r = out[k]
        r["device_bytes_per_turn"] = r["device_bytes"] / turns
        r["device_bytes_vs_content"] = r["device_bytes"] / content
        r["write_bytes_vs_content"] = r["write_bytes"] / content
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mount", required=True, help="a directory on the device, nothing else on it")
    p.add_argument("--device", required=True, help="its block device's name (loop0, sdb, ...)")
    p.add_argument("--turns", type=int, default=300)
    a = p.parse_args(argv)
    print(json.dumps(run(a.mount, a.device, a.turns), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
