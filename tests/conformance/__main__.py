"""``python -m tests.conformance DRIVER ACTION ROOT SID SCENARIO [flags]``: one child run of the
driver conformance suite (see ``harness``). ACTION: ``live`` (flags ``--attended``,
``--approve``), ``recover`` (flag ``--fail``) or ``proceed``. Prints one JSON line."""

from __future__ import annotations

import importlib
import json
import sys

from .harness import SCENARIOS


def main(argv: list[str]) -> int:
    driver, action, root, sid, name, *flags = argv
    mod = importlib.import_module(f"tests.conformance.drivers.{driver.replace('-', '_')}")
    sc = SCENARIOS[name]
    out: object
    if action == "live":
        out = mod.live(root, sid, sc, attended="--attended" in flags,
                       approve="--approve" in flags)
    elif action == "recover":
        out = {"outcomes": mod.recover(root, sc, fail="--fail" in flags)}
    elif action == "proceed":
        out = mod.proceed(root, sid, sc)
    else:
        raise SystemExit(f"unknown action {action!r}")
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
