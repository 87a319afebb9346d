"""The review queue across turns and drivers: a parked call shows its arguments from the ledger
(a driver whose transcript is not fsdurable's), a cancelled begin never comes back, a stale or
exhausted turn's in-doubt calls are parked (never dropped with the turn), answers belong to one
turn's call, and a re-run happens once."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from fsdurable import AgentLoop, ScriptedModel, Store, arecover, recover
from fsdurable import _events as ev
from fsdurable._model import LedgerEntry, Message, ToolCall, with_entry
from fsdurable.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


class SdkHost:
    """A recovery host of a driver whose transcript lives in its framework (not in
    ``Session.messages``): every tool has an external effect, so an in-doubt call is parked."""

    driver = "openai-agents"

    def tool_effect(self, name: str) -> str | None:
        return "external"

    def resume_claimed(self, session: Any) -> Any:
        raise AssertionError("an in-doubt external call must be parked, never resumed")


def died_in_call(st: Store, sid: str, call_id: str = "call_0", amount: int = 42) -> str:
    """A live run of the Agents SDK driver commits a charge's intent and dies inside the call
    (the route lock goes with the process; the turn stays in progress). Returns the turn id."""
    from fsdurable._turns import ToolRequest, TurnRun

    if sid not in st.sessions():
        st.create(sid, source="openai-agents")
    r = TurnRun.begin(st, sid, driver="openai-agents", attended=True)
    d = r.before_tool(ToolRequest(call_id, "charge_card", {"amount": amount},
                                  effect="external"))
    assert d.action == "run"
    r.release()  # the process is gone
    return r.turn_id


def test_a_parked_call_shows_its_arguments_from_the_ledger(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st = Store(root)
    tid = died_in_call(st, "sdk")
    assert st.load("sdk").messages == ()  # nothing of the call in fsdurable's transcript
    [o] = recover(st, SdkHost()).outcomes
    assert o.outcome == "review_required"
    [c] = st.load("sdk").metadata["review_required"]["calls"]
    assert (c["tool_call_id"], c["turn_id"], c["arguments"]) == ("call_0", tid, {"amount": 42})
    code, out = run(capsys, "review", "--root", str(root))
    assert code == 1
    [w] = out["review"]
    assert (w["tool"], w["arguments"]) == ("charge_card", {"amount": 42})
    code, out = run(capsys, "review", "sdk", "--root", str(root))
    assert code == 0 and out["review"][0]["arguments"] == {"amount": 42}


def loop_died_in_charge(st: Store, sid: str) -> str:
    """The reference loop's turn as a process killed inside ``charge_card`` leaves it: the
    model's call in the transcript, its intent on the ledger, no outcome. Returns the turn id."""
    st.create(sid)
    tid = st.begin_turn(sid, "charge the order").turn.id  # type: ignore[union-attr]

    def asked(s: Any) -> Any:
        s = attrs.evolve(s, messages=(*s.messages, Message("assistant", "", (
            ToolCall("call_0", "charge_card", {"amount": 42}),))))
        return with_entry(s, LedgerEntry("call_0", "charge_card", "external",
                                         f"{sid}:{tid}:call_0", "intent", st.clock()))

    st.patch(sid, asked)
    return tid


def test_an_arun_cancelled_during_its_begin_commit_never_comes_back(root: Path) -> None:
    """Issue 17 item 15: the task is cancelled while its begin commit runs in the worker thread
    (the commit completes: it is never stopped half-way); the turn it began must be cancelled,
    not left in progress for the next start's recovery to resume."""
    st = Store(root)
    st.create("s")
    entered, go = threading.Event(), threading.Event()
    real = st.begin_turn

    def held_begin(*a: Any, **k: Any) -> Any:
        entered.set()
        assert go.wait(30)
        return real(*a, **k)

    st.begin_turn = held_begin  # type: ignore[method-assign]
    loop = AgentLoop(st, ScriptedModel([], final="hello"), [])

    async def main() -> None:
        task = asyncio.create_task(loop.arun("s", "hi", attended=True))
        assert await asyncio.to_thread(entered.wait, 30)
        task.cancel()  # the cancel arrives while the begin commit is in flight
        await asyncio.sleep(0)
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    s = Store(root).load("s")
    assert not s.in_progress and s.turn is None
    assert Store(root).interrupted() == []
    codes = [e.code for e in st.events("s")]
    assert ev.TURN_STARTED in codes and ev.TURN_CANCELLED in codes
    fresh = Store(root)
    again = AgentLoop(fresh, ScriptedModel([], final="resumed!"), [])
    assert asyncio.run(arecover(fresh, again)).outcomes == ()
    assert [m.content for m in fresh.load("s").messages] == ["hi"]  # never answered


@pytest.mark.parametrize("why", ["stale", "exhausted"])
def test_an_abandoned_turn_puts_its_in_doubt_call_in_the_review_queue(
        root: Path, capsys: pytest.CaptureFixture[str], why: str) -> None:
    """Issue 17 item 16: a stale (or exhausted) turn is abandoned; its in-doubt charge (intent
    committed, no outcome: it may have run) goes to the review queue — never dropped with it."""
    if why == "stale":  # the run died five hours ago
        tid = loop_died_in_charge(Store(root, clock=lambda: time.time() - 5 * 3600), "order")
    else:  # every attempt so far died
        st = Store(root)
        tid = loop_died_in_charge(st, "order")
        st.patch("order", lambda s: attrs.evolve(s, turn=attrs.evolve(
            s.turn, resume_attempts=st.config.max_resume_attempts)))
    code, out = run(capsys, "recover", "--root", str(root))
    assert code == 0
    [o] = out["outcomes"]
    assert (o["session_id"], o["outcome"], o["reason"]) == ("order", "abandoned", why)
    st = Store(root)
    s = st.load("order")
    assert not s.in_progress
    [c] = s.metadata["review_required"]["calls"]
    assert (c["tool_call_id"], c["turn_id"], c["tool"], c["reason"]) == (
        "call_0", tid, "charge_card", why)
    assert c["idempotency_key"] == f"order:{tid}:call_0"
    codes = [e.code for e in st.events("order")]
    assert ev.ABANDONED in codes and ev.REVIEW_REQUIRED in codes
    code, out = run(capsys, "review", "--root", str(root))
    assert code == 1  # a call waits for a human
    [w] = out["review"]
    assert (w["session_id"], w["tool"], w["arguments"], w["answer"]) == (
        "order", "charge_card", {"amount": 42}, None)
    capsys.readouterr()
    assert main(["review", "--root", str(root)]) == 1
    assert "waiting" in capsys.readouterr().out
    code, doc = run(capsys, "doctor", "--root", str(root))
    assert [f["session_id"] for f in doc["findings"] if f["code"] == "review_required"] == [
        "order"]
