"""Events: ``store.events(session_id)`` must cost that session's events, not the store's history.

Command: ``python -m bench.events`` (full) or ``python -m bench.events --quick``.
Writes ``events.json``. Two stores, each with session ``a`` holding the same 20 events; beside
it, 10 other sessions (small) or ``OTHERS`` other sessions (large) with 20 events each, all on one
day and one node, as a busy host's log looks. ``events("a")`` on both, interleaved in one process;
the target is the large store's time within 1.1x of the small store's. ``events()`` (the whole
log) is measured too, for scale: it reads everything, by design.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from ._harness import cache_dir, environment, log, measure, ratio, script_main, write_result

PER_SESSION = 20


def build(root: str, others: int) -> Any:
    import fsdurable

    st = fsdurable.Store(root, config=fsdurable.Config(fsync=False), node_id="bench-node")
    for i in range(PER_SESSION):
        st.emit("tick", session_id="a", i=i)
    for k in range(others):
        for i in range(PER_SESSION):
            st.emit("tick", session_id=f"o{k}", i=i)
    return fsdurable.Store(root, node_id="bench-node")


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    others = 200 if quick else 5000
    work = os.path.join(cache_dir(quick), "events")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = environment(work)
    log(f"events: building stores (10 and {others} other sessions) ...")
    small = build(os.path.join(work, "small"), 10)
    large = build(os.path.join(work, "large"), others)
    assert len(small.events("a")) == len(large.events("a")) == PER_SESSION
    reps = 20 if quick else 200
    res = measure({"small": lambda: small.events("a"), "large": lambda: large.events("a")},
                  min_reps=reps, max_reps=reps, budget=1e9)
    whole = measure({"small_all": small.events, "large_all": large.events},
                    min_reps=3, max_reps=3 if quick else 10, budget=1e9)
    v = ratio(res["large"], res["small"])
    log(f"  events('a'): small {res['small']['median'] * 1e3:.3f}ms, large "
        f"{res['large']['median'] * 1e3:.3f}ms ({v:.2f}x); whole log: small "
        f"{whole['small_all']['median'] * 1e3:.1f}ms, "
        f"large {whole['large_all']['median'] * 1e3:.1f}ms")
    targets = {"session_query_large_vs_small": {"value": v, "target": "<= 1.1", "met": v <= 1.1}}
    body = {"per_session": PER_SESSION, "others": {"small": 10, "large": others},
            "results": {**res, **whole}, "targets": targets}
    write_result(out_dir, "events", env, body, quick=quick, cleanup=work)
    return body


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
