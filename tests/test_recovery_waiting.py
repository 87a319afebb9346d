"""Recovery meets a turn whose history is not on disk yet (docs/storage.md, "Missing, wrong and
short history"; docs/recovery.md): a sync tool delivered the session document (and its marker)
before the ``history/<id>/`` segments it names. That is "waiting for sync, never corrupt": the
resume is put off WITHOUT spending an attempt (outcome ``waiting_for_sync``, an
``interrupted_turn_skipped`` event, the marker kept) and the turn resumes normally once the
segments arrive. A segment that does not match its digest still fails the attempt, and the turn
is abandoned at the cap, as before.

On 6162f66 each start spent an attempt (``interrupted_turn_resume_failed``) and the third one
abandoned the turn (``exhausted``): three restarts during a sync lag lost the user's turn."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import fsdurable
from fsdurable import AgentLoop, Reply, ScriptedModel, Tool, ToolCall, ToolContext
from fsdurable import _events as ev
from fsdurable._config import Config
from fsdurable._recovery import arecover, recover


def _store(root: Path) -> fsdurable.Store:
    # every commit writes its messages as a segment (no inline tail): the history is on disk
    # only as segments, so a missing one is what the run needs
    return fsdurable.Store(root, node_id="node-test", config=Config(inline_tail_bytes=0))


def _interrupted(root: Path, sid: str = "chat") -> fsdurable.Store:
    st = _store(root)
    st.create(sid)
    st.begin_turn(sid, "hello " * 40)  # the turn's first message: in a segment
    return st


def _segments(root: Path, sid: str = "chat") -> list[Path]:
    return sorted((root / "history" / sid).glob("*.json"))


def _away(root: Path, sid: str = "chat") -> list[tuple[Path, Path]]:
    """Move the session's segments out of the store (the sync tool has not delivered them)."""
    moved = []
    for p in _segments(root, sid):
        to = root.parent / f"in-flight-{p.name}"
        p.rename(to)
        moved.append((to, p))
    assert moved
    return moved


def _arrive(moved: list[tuple[Path, Path]]) -> None:
    for src, dst in moved:
        src.rename(dst)


def _loop(st: fsdurable.Store, final: str = "done") -> AgentLoop:
    return AgentLoop(st, ScriptedModel([], final=final), [])


def test_a_history_waiting_for_sync_costs_no_attempt_and_resumes_once_it_arrives(
        root: Path) -> None:
    _interrupted(root)
    moved = _away(root)
    st = _store(root)
    for _ in range(4):  # more starts than the attempt cap
        [o] = recover(st, _loop(st)).outcomes
        assert (o.outcome, o.reason, o.attempts) == ("waiting_for_sync", "history_missing", 0)
        [m] = st.interrupted()
        assert (m.session_id, m.resume_attempts) == ("chat", 0)
        s = st.load("chat")
        assert s.in_progress and s.turn is not None and s.turn.resume_attempts == 0
    codes = [e.code for e in st.events("chat")]
    assert ev.RESUMING not in codes and ev.RESUME_FAILED not in codes
    assert ev.ABANDONED not in codes
    skipped = [e for e in st.events("chat") if e.code == ev.SKIPPED]
    assert [e.reason for e in skipped] == ["waiting_for_sync"] * 4
    assert skipped[0].detail["cause"] == "history_missing"
    assert skipped[0].detail["path"].endswith(moved[0][1].name)
    _arrive(moved)
    st = _store(root)
    [o] = recover(st, _loop(st, "welcome back")).outcomes
    assert (o.outcome, o.status, o.attempts) == ("resumed", "completed", 1)
    assert not st.interrupted()
    assert st.load("chat").messages[-1].content == "welcome back"


def test_arecover_waits_for_the_history_too(root: Path) -> None:
    _interrupted(root)
    moved = _away(root)
    st = _store(root)
    for _ in range(3):
        [o] = asyncio.run(arecover(st, _loop(st))).outcomes
        assert (o.outcome, o.attempts) == ("waiting_for_sync", 0)
    assert st.interrupted()[0].resume_attempts == 0
    _arrive(moved)
    [o] = asyncio.run(arecover(st, _loop(st))).outcomes
    assert (o.outcome, o.status) == ("resumed", "completed")


def test_a_dry_run_says_waiting_for_sync_as_the_real_run_does(root: Path) -> None:
    _interrupted(root)
    _away(root)
    st = _store(root)
    before = sorted(p.name for p in (root / "events").rglob("*"))
    [o] = recover(st, _loop(st), dry_run=True).outcomes
    assert (o.outcome, o.reason) == ("waiting_for_sync", "history_missing")
    assert sorted(p.name for p in (root / "events").rglob("*")) == before
    [real] = recover(st, _loop(st)).outcomes
    assert real.outcome == o.outcome


def test_a_corrupt_segment_still_fails_each_attempt_until_the_cap(root: Path) -> None:
    """Not waiting: a segment whose bytes do not match the digest naming it fails the attempt
    (``history_corrupt``), and the cap abandons the turn, as before."""
    _interrupted(root)
    seg = _segments(root)[0]
    data = bytearray(seg.read_bytes())
    data[-3] ^= 1
    seg.write_bytes(bytes(data))
    st = _store(root)
    got = [recover(st, _loop(st)).outcomes[0] for _ in range(3)]
    assert [(o.outcome, o.attempts) for o in got] == [("failed", 1), ("failed", 2),
                                                       ("abandoned", 3)]
    assert got[-1].reason == "exhausted"
    assert not st.interrupted()


def test_a_turn_in_doubt_whose_history_waits_is_not_an_error(root: Path) -> None:
    """Parking an in-doubt call answers the unanswered tool calls of the transcript: with the
    history not on disk, the turn waits for it (no attempt, marker kept) — not an ``error``."""
    st = _store(root)
    st.create("chat")
    charged: list[str] = []

    def charge(ctx: ToolContext) -> str:
        charged.append(ctx.idempotency_key)
        raise KeyboardInterrupt  # the process dies inside the call: intent, no outcome

    loop = AgentLoop(st, ScriptedModel([Reply("", [ToolCall("c1", "charge", {})])]),
                     [Tool("charge", charge, effect="external")])
    with pytest.raises(KeyboardInterrupt):
        loop.run("chat", "pay " * 40)
    moved = _away(root)
    st = _store(root)
    host = AgentLoop(st, ScriptedModel([]), [Tool("charge", charge, effect="external")])
    [o] = recover(st, host).outcomes
    assert (o.outcome, o.attempts) == ("waiting_for_sync", 0), o
    assert st.interrupted()
    _arrive(moved)
    [o] = recover(st, host).outcomes
    assert (o.outcome, o.reason) == ("review_required", "in_doubt")
    assert len(charged) == 1


def test_a_stale_turn_waiting_for_its_history_is_still_abandoned(root: Path) -> None:
    """The staleness window bounds the wait: a history that never arrives does not keep the turn
    forever (the stale gate reads no history)."""
    st = _interrupted(root)
    _away(root)
    late = fsdurable.Store(root, node_id="node-test", config=Config(inline_tail_bytes=0),
                           clock=lambda: time.time() + 5 * 3600)
    [o] = recover(late, _loop(late)).outcomes
    assert (o.outcome, o.reason) == ("abandoned", "stale")
    assert not st.interrupted()


class _CheckRaises:
    """A host whose own ``history_ready`` raises something that is not "waiting for sync"."""

    def __init__(self, loop: AgentLoop, error: Exception) -> None:
        self.loop, self.error = loop, error

    def __getattr__(self, name: str) -> object:
        return getattr(self.loop, name)

    def history_ready(self, session: fsdurable.Session) -> None:
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("the host's own check broke"),
                                   fsdurable.StorageError("read failed: EIO", reason="EIO")])
def test_a_check_that_fails_otherwise_never_stops_recovery(root: Path,
                                                          error: Exception) -> None:
    """The check only ever puts a resume off: any other error it meets (a host's own check
    that raised, the disk's EIO) leaves the resume to meet it inside its own guard, as before
    the check — recovery and its dry run report an outcome, they never raise (one bad turn
    never stops recovery of the others)."""
    _interrupted(root)
    _interrupted(root, "other")
    st = _store(root)
    host = _CheckRaises(_loop(st), error)
    dry = {o.session_id: o.outcome for o in recover(st, host, dry_run=True).outcomes}  # type: ignore[arg-type]
    assert dry == {"chat": "would_resume", "other": "would_resume"}
    got = {o.session_id: (o.outcome, o.attempts)
           for o in recover(st, host).outcomes}  # type: ignore[arg-type]
    assert got == {"chat": ("resumed", 1), "other": ("resumed", 1)}
