"""Property: the debounce coalesces boundaries, never skips the flush before an effectful tool."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdurable import AgentLoop, Config, Reply, ScriptedModel, Store, Tool
from fsdurable._tools import call

# a turn: batches of tool calls; each call = (effect, seconds the tool takes on the fake clock)
CALL = st.tuples(st.sampled_from(["none", "none", "idempotent", "external"]),
                 st.sampled_from([0.0, 0.1, 0.5, 1.9, 2.0, 3.0]))
TURN = st.lists(st.lists(CALL, min_size=1, max_size=4), min_size=1, max_size=6)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turn=TURN, debounce=st.sampled_from([0.5, 2.0, 5.0]))
def test_debounce_property(turn: list[list[tuple[str, float]]], debounce: float) -> None:
    now = [1_000_000.0]
    cfg = Config(fsync=False, checkpoint_debounce=debounce)
    with tempfile.TemporaryDirectory() as d:
        store = Store(d, config=cfg, clock=lambda: now[0])
        store.create("s")
        results: list[str] = []  # every tool result so far, in order
        violations: list[str] = []

        def make(effect: str) -> Tool:
            def fn(ctx: Any, dt: float, i: str) -> str:
                disk = [m.content for m in store.load("s").messages if m.role == "tool"]
                if effect != "none" and disk != results:
                    violations.append(f"{i}: disk {disk} != {results}")
                now[0] += dt
                results.append(f"r{i}")
                return f"r{i}"
            return Tool(effect, fn, effect=effect)

        steps = [Reply(f"b{b}", [call(eff, f"c{b}_{k}", dt=dt, i=f"{b}_{k}")
                                 for k, (eff, dt) in enumerate(batch)])
                 for b, batch in enumerate(turn)]
        loop = AgentLoop(store, ScriptedModel(steps),
                         [make("none"), make("idempotent"), make("external")],
                         clock=lambda: now[0])
        start = now[0]
        assert loop.run("s", "go").status == "completed"
        assert violations == []
        s = store.load("s")
        assert [m.content for m in s.messages if m.role == "tool"] == results
        effectful = sum(1 for batch in turn for eff, _ in batch if eff != "none")
        forced = 1 + 1 + 2 * effectful + 1  # create, begin, intent+outcome per call, end
        debounced = s.version - forced
        # a boundary commits only once `debounce` seconds have passed since the last commit
        assert 0 <= debounced <= (now[0] - start) / debounce
        boundaries = 2 * len(turn)
        assert debounced <= boundaries


def test_the_loops_own_config_sets_its_debounce(tmp_path: Path) -> None:
    """``AgentLoop(store, ..., config)``: the loop's config decides its checkpoint debounce, not
    the store's (a loop given ``checkpoint_debounce=0`` commits at every phase boundary)."""
    now = [1_000.0]
    store = Store(tmp_path, config=Config(fsync=False, checkpoint_debounce=60.0),
                  clock=lambda: now[0])
    steps = [Reply("b0", [call("none", "c0", dt=0.0, i="0")]),
             Reply("b1", [call("none", "c1", dt=0.0, i="1")])]

    def versions(cfg: Config | None, sid: str) -> int:
        store.create(sid)
        t = Tool("none", lambda ctx, dt, i: f"r{i}", effect="none")
        loop = AgentLoop(store, ScriptedModel(steps), [t], cfg, clock=lambda: now[0])
        assert loop.run(sid, "go").status == "completed"
        return store.load(sid).version

    lazy = versions(None, "store-config")  # 60 s: no boundary commits, only begin and end
    eager = versions(Config(fsync=False, checkpoint_debounce=0.0), "loop-config")
    assert lazy == 1 + 1 + 1  # create, begin, end
    assert eager == lazy + 4  # + model reply and tool batch, twice
