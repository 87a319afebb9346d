"""Cost growth: checkpoints of a growing transcript, serialization throughput, writes per turn.

Command: ``python -m bench.growth`` (full) or ``python -m bench.growth --quick``.
Writes ``growth.json``. Three figures:

1. checkpoint cost as a transcript grows from 10 to 10,000 messages (~1 KB each on average, tool
   calls included): each sample appends one message and checkpoints. Contenders, interleaved:
   ``fsdurable`` (the encoder reuses the encoded prefix), ``fsdurable_cold`` (the encoder's cache
   emptied first: every message re-encoded, as after a load) and the ``floor`` (temp + fsync +
   rename + directory fsync of the same number of bytes).
2. serialization throughput (MB/s of session file) of ``encode_session`` (cold and with one new
   message), ``parse_session``, against ``orjson`` and stdlib ``json`` on the same document.
3. writes per turn of a bursty ``AgentLoop`` turn (12 model steps, 2 quick tool calls each, all
   within the debounce window) with the default 2 s checkpoint debounce and with it off (0 s):
   session and marker writes, fsyncs, counted through ``_fsio``'s recorder.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from typing import Any

from ._harness import cache_dir, environment, log, measure, ratio, script_main, write_result

FULL = {"points": [10, 100, 1_000, 10_000], "reps": 40, "budget": 8.0, "tp_sizes": [1 << 20,
                                                                                    10 << 20],
        "turns": 10}
QUICK = {"points": [10, 100, 1_000], "reps": 8, "budget": 1.0, "tp_sizes": [1 << 20],
         "turns": 2}


def transcript(n: int) -> tuple[Any, ...]:
    from ._data import make_messages

    msgs: tuple[Any, ...] = ()
    k = 0
    while len(msgs) < n:
        msgs += make_messages(random.Random(k), 64 * 1024)[1:]
        k += 1
    return msgs[:n]


def growth_points(store: Any, work: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    import attrs

    from fsdurable import _codec
    from fsdurable._model import Message

    from .commit import Floor

    rows = []
    extra = Message("assistant", "noted; next step " * 6)
    for n in p["points"]:
        msgs = transcript(n)
        boxes = {}
        for name in ("fsdurable", "fsdurable_cold"):
            sid = f"g{n}-{name.replace('_', '-')}"
            s = store.begin_turn(store.create(sid).id, None)
            boxes[name] = {"s": store.commit(attrs.evolve(s, messages=msgs), s.version)}
        data = _codec.encode_session(boxes["fsdurable"]["s"])
        floor_dir = os.path.join(work, f"floor-{n}")
        os.makedirs(floor_dir)

        def grow(box: dict[str, Any]) -> None:
            s = box["s"]
            box["s"] = store.commit(attrs.evolve(s, messages=(*s.messages, extra)), s.version)

        def setup(name: str, cold_id: str = boxes["fsdurable_cold"]["s"].id) -> None:
            if name == "fsdurable_cold":
                _codec._message_cache.discard(cold_id)

        calls = {"fsdurable": lambda b=boxes["fsdurable"]: grow(b),
                 "fsdurable_cold": lambda b=boxes["fsdurable_cold"]: grow(b),
                 "floor": Floor(floor_dir, [data, data[:-1] + b" "])}
        res = measure(calls, min_reps=5, max_reps=p["reps"], budget=p["budget"], setup=setup)
        row = {"messages": n, "bytes": len(data), "results": res,
               "ratios": {"fsdurable_vs_floor": ratio(res["fsdurable"], res["floor"]),
                          "fsdurable_cold_vs_floor": ratio(res["fsdurable_cold"], res["floor"])}}
        log(f"  growth n={n} ({len(data) >> 10} KB): " + ", ".join(
            f"{k} {v['median'] * 1e3:.2f}ms" for k, v in res.items()))
        rows.append(row)
    return rows


def throughput(p: dict[str, Any]) -> list[dict[str, Any]]:
    return [throughput_one(size, p) for size in p["tp_sizes"]]


def throughput_one(size: int, p: dict[str, Any]) -> dict[str, Any]:
    import attrs
    import orjson

    from fsdurable import _codec
    from fsdurable._model import Message, Session, Turn

    msgs = transcript(max(1, size // 670))
    s = Session(id="tp", version=3, in_progress=True, messages=msgs,
                turn=Turn(id="t", started_at=1.0, checkpoint_at=2.0))
    data = _codec.encode_session(s)
    cold = attrs.evolve(s, id="tp-cold")
    d = orjson.loads(data)
    text = data.decode()
    box = {"s": s}
    extra = Message("user", "one more")

    def warm() -> None:
        box["s"] = attrs.evolve(box["s"], messages=(*box["s"].messages, extra))
        _codec.encode_session(box["s"])

    calls = {
        "encode_cold": lambda: _codec.encode_session(cold),
        "encode_one_new_message": warm,
        "parse_session": lambda: _codec.parse_session(data),
        "orjson_dumps": lambda: orjson.dumps(d),
        "orjson_loads": lambda: orjson.loads(data),
        "json_dumps": lambda: json.dumps(d),
        "json_loads": lambda: json.loads(text),
    }

    def setup(name: str) -> None:
        if name == "encode_cold":
            _codec._message_cache.discard("tp-cold")

    res = measure(calls, min_reps=3, max_reps=p["reps"], budget=p["budget"], setup=setup)
    mbps = {k: len(data) / v["median"] / 1e6 for k, v in res.items()}
    log(f"  throughput {len(data) >> 10} KB: " + ", ".join(f"{k} {v:.0f} MB/s"
                                                           for k, v in mbps.items()))
    return {"bytes": len(data), "messages": len(msgs), "results": res, "mb_per_s": mbps}


def writes_per_turn(store: Any, p: dict[str, Any]) -> dict[str, Any]:
    import time

    import attrs

    from fsdurable import AgentLoop, Reply, ScriptedModel, _fsio, tool
    from fsdurable._tools import call

    @tool(effect="none")
    def lookup(ctx: Any, q: str) -> str:
        return f"result for {q}: " + "data " * 40

    steps = [Reply(f"step {i}", [call("lookup", f"c{i}a", q=f"a{i}"),
                                 call("lookup", f"c{i}b", q=f"b{i}")]) for i in range(12)]
    out: dict[str, Any] = {"model_steps": len(steps), "tool_calls": 2 * len(steps)}
    for label, debounce in (("debounce_2s", 2.0), ("no_debounce", 0.0)):
        cfg = attrs.evolve(store.config, checkpoint_debounce=debounce)
        loop = AgentLoop(store, ScriptedModel(steps, final="all done"), [lookup], cfg)
        counts, rec = _counter(store.layout.sessions, store.layout.markers)

        times = []
        for t in range(p["turns"]):
            sid = store.create(f"w-{label}-{t}").id
            prev = _fsio.set_recorder(rec)
            try:
                t0 = time.perf_counter()
                result = loop.run(sid, "do the thing", attended=True)
                times.append(time.perf_counter() - t0)
            finally:
                _fsio.set_recorder(prev)
            if result.status != "completed":
                raise RuntimeError(f"bursty turn ended {result.status}")
        out[label] = {k: v / p["turns"] for k, v in counts.items()}
        out[label]["turn_seconds_median"] = sorted(times)[len(times) // 2]
        log(f"  writes per turn, {label}: {out[label]}")
    return out


def _counter(sessions_dir: str, markers_dir: str) -> tuple[dict[str, int], Any]:
    """Counts of the disk operations ``_fsio`` announces, and the recorder that counts them."""
    c = {"session_writes": 0, "marker_writes": 0, "marker_removals": 0, "fsyncs": 0}

    def rec(op: str, args: tuple[Any, ...]) -> None:
        if op == "rename" and len(args) == 2:
            d = os.path.dirname(args[1])
            if d == sessions_dir:
                c["session_writes"] += 1
            elif d == markers_dir:
                c["marker_writes"] += 1
        elif op == "unlink" and os.path.dirname(args[0]) == markers_dir:
            c["marker_removals"] += 1
        elif op in ("fsync", "fsync_dir"):
            c["fsyncs"] += 1

    return c, rec


def run(quick: bool, out_dir: str) -> dict[str, Any]:
    import fsdurable

    p = QUICK if quick else FULL
    work = os.path.join(cache_dir(quick), "growth")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.environ.setdefault("FSDURABLE_STATE_DIR", os.path.join(work, "state"))
    env = environment(work)
    store = fsdurable.Store(os.path.join(work, "store"), node_id="bench-node")
    body: dict[str, Any] = {"params": p}
    body["checkpoint_growth"] = growth_points(store, work, p)
    body["throughput"] = throughput(p)
    try:
        body["writes_per_turn"] = writes_per_turn(store, p)
    except Exception as e:  # the reference loop is missing or broken: the rest still counts
        body["writes_per_turn"] = {"skipped": f"AgentLoop unavailable: {e!r}"[:300]}
    g = body["checkpoint_growth"]
    first, last = g[0], g[-1]
    body["summary"] = {
        "checkpoint_cost_largest_vs_smallest": ratio(last["results"]["fsdurable"],
                                                     first["results"]["fsdurable"]),
        "floor_cost_largest_vs_smallest": ratio(last["results"]["floor"],
                                                first["results"]["floor"]),
        "largest_vs_floor": last["ratios"]["fsdurable_vs_floor"],
        "largest_cold_vs_floor": last["ratios"]["fsdurable_cold_vs_floor"],
    }
    write_result(out_dir, "growth", env, body, quick=quick, cleanup=work)
    return body


def main(argv: list[str] | None = None) -> int:
    return script_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
