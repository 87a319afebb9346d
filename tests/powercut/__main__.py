"""``python -m tests.powercut [--cuts N] [--variant V | --teeth] [--json]``: cut the power of a
workload on ext4 N times and print the figures (root, losetup and mkfs.ext4 needed).

Without ``--variant`` the store is the real one and every violation is a bug: exit status 1.
``--teeth`` runs every broken variant (``workload.VARIANTS``) until its first violation and
exits 1 if one of them went uncaught in ``--cuts`` cuts."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from . import run, workload

SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


# the cut methods that can see each broken variant (a random cut's window between a session's
# and its marker's write is microseconds wide; no unlink, append or marker removal is near it)
TEETH_METHODS = ("fsync", "fsync_dir", "rename")


def _one(args: argparse.Namespace, variant: str, stop: bool,
         methods: tuple[str, ...] = run.METHODS) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="fsd-powercut-") as base, \
            tempfile.TemporaryDirectory(dir=args.image_dir or SHM, prefix="fsd-pc-img-") as img:
        os.environ["FSDURABLE_STATE_DIR"] = os.path.join(base, "state")
        return run.run(base, cuts=args.cuts, seed=args.seed, variant=variant,
                       epoch=args.epoch, stop_at_first=stop, progress=not args.json,
                       image_dir=img, methods=methods,
                       max_seconds=None if args.minutes is None else args.minutes * 60)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.powercut")
    p.add_argument("--cuts", type=int, default=30)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epoch", type=int, default=25, help="cuts per fresh filesystem")
    p.add_argument("--variant", choices=workload.VARIANTS, default="correct")
    p.add_argument("--teeth", action="store_true",
                   help="run each broken variant until its first violation")
    p.add_argument("--minutes", type=float, default=None,
                   help="stop cutting after this long (the figures are still printed)")
    p.add_argument("--all-cuts", action="store_true",
                   help="with a broken --variant: go on after its first violation")
    p.add_argument("--dir", default=None, help="where the logs go (default: the temp dir)")
    p.add_argument("--image-dir", default=None, help="where the image goes (default /dev/shm)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    a = p.parse_args(argv)
    os.environ.setdefault("FSDURABLE_NODE", "node-powercut")
    if a.teeth:
        res: dict[str, Any] = {v: _one(a, v, True, TEETH_METHODS) for v in workload.VARIANTS
                               if v != "correct"}
        missed = [v for v, r in res.items() if not r["violations"]]
        status = 1 if missed else 0
    else:
        res = _one(a, a.variant, a.variant != "correct" and not a.all_cuts)
        status = 1 if res["violations"] and a.variant == "correct" else 0
    print(json.dumps(res, indent=None if a.json else 1, sort_keys=True))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
