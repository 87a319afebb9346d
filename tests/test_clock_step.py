"""Clock steps (issue 9 item 9, the gate): a time from the future never decides staleness.

A wall clock an hour ahead when a turn starts, corrected later (NTP), leaves checkpoint times from
the future in the marker. The gate judges a turn by the newest of its checkpoint times that is not
from the future; a turn checkpointed a minute ago with the corrected clock is resumed, not
abandoned, and the step is recorded (``clock_step`` event). When every time is from the future
the turn cannot be shown fresh and stays stale (test_recovery.py).
"""

from __future__ import annotations

from pathlib import Path

from fsdurable import AgentLoop, Reply, ScriptedModel, Store, recover
from fsdurable._layout import Layout
from fsdurable._recordcodec import encode_marker

T0 = 1_000_000.0
HOUR = 3600.0


def _resume(store: Store) -> tuple[str, str, str | None]:
    loop = AgentLoop(store, ScriptedModel([Reply("done")]), [])
    [o] = recover(store, loop).outcomes
    return o.verdict, o.outcome, o.reason


def test_a_clock_corrected_back_never_abandons_a_turn_checkpointed_a_minute_ago(
        root: Path) -> None:
    now = [T0 + HOUR]  # the clock is an hour ahead when the turn starts
    store = Store(root, clock=lambda: now[0])
    store.create("s")
    s = store.begin_turn("s", "go")
    now[0] = T0 + 600  # NTP steps it back; ten minutes of work later, a checkpoint
    store.checkpoint(s, phase="model_reply")
    now[0] += 60  # the process dies a minute after that checkpoint
    # the marker no longer carries the bogus time once a checkpoint was taken after the step
    m = store.read_marker("s")
    assert m is not None and m.checkpoint_at == T0 + 600
    after = Store(root, clock=lambda: now[0])
    assert _resume(after)[1] == "resumed"
    assert not after.load("s").in_progress


def test_a_marker_time_from_the_future_is_not_trusted_when_the_session_has_a_sound_one(
        root: Path) -> None:
    """A marker left by an fsdurable that kept the bogus time (no refresh after a step back)."""
    now = [T0 + HOUR]
    store = Store(root, clock=lambda: now[0])
    store.create("s")
    s = store.begin_turn("s", "go")
    bogus = store.read_marker("s")
    assert bogus is not None
    now[0] = T0 + 600
    store.checkpoint(s, phase="model_reply")
    path = Layout(root).marker("s")
    with open(path, "wb") as f:  # as the old commit left it: the marker keeps the future time
        f.write(encode_marker(bogus.replace(session_version=store.load("s").version)))
    now[0] += 60
    after = Store(root, clock=lambda: now[0])
    verdict, outcome, _ = _resume(after)
    assert outcome == "resumed", verdict
    [step] = [e for e in after.events("s") if e.code == "clock_step"]
    assert s.turn is not None and step.turn_id == s.turn.id
    assert step.detail["ahead"] == HOUR - 660  # how far ahead the marker's time is of now
    assert step.detail["trusted_checkpoint_at"] == T0 + 600


def test_every_time_from_the_future_is_still_stale_and_the_step_is_recorded(root: Path) -> None:
    now = [T0 + HOUR]
    store = Store(root, clock=lambda: now[0])
    store.create("s")
    store.begin_turn("s", "go")
    now[0] = T0
    after = Store(root, clock=lambda: now[0])
    assert _resume(after) == ("stale", "abandoned", "stale")
    assert [e.code for e in after.events("s") if e.code == "clock_step"] == ["clock_step"]
