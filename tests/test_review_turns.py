"""The review queue across turns and drivers: a parked call shows its arguments from the ledger
(a driver whose transcript is not fsdurable's), a cancelled begin never comes back, a stale or
exhausted turn's in-doubt calls are parked (never dropped with the turn), answers belong to one
turn's call, and a re-run happens once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from fsdurable import AgentLoop, ScriptedModel, Store, arecover, recover, tool
from fsdurable import _events as ev
from fsdurable._model import LedgerEntry, Message, ToolCall, with_entry
from fsdurable.cli import main

from .conftest import PYTHON, subprocess_env

CHARGES_ENV = "FSDURABLE_TEST_CHARGES"  # the directory where each charge leaves a file
OVERLAP_ENV = "FSDURABLE_TEST_OVERLAP"  # set: a charge waits a little for a second one


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


def loop_died_in_charge(st: Store, sid: str, calls: tuple[str, ...] = ("call_0",),
                        amount: int = 42) -> str:
    """The reference loop's turn as a process killed inside ``charge_card`` leaves it: the
    model's calls in the transcript, their intents on the ledger, no outcome (a turn of a
    session created here, or its next turn). Returns the turn id."""
    if sid not in st.sessions():
        st.create(sid)
    tid = st.begin_turn(sid, "charge the order").turn.id  # type: ignore[union-attr]

    def asked(s: Any) -> Any:
        s = attrs.evolve(s, messages=(*s.messages, Message("assistant", "", tuple(
            ToolCall(c, "charge_card", {"amount": amount}) for c in calls))))
        for c in calls:
            s = with_entry(s, LedgerEntry(c, "charge_card", "external", f"{sid}:{tid}:{c}",
                                          "intent", st.clock()))
        return s

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
    capsys.readouterr()
    assert main(["recover", "--root", str(root)]) == 0
    text = capsys.readouterr().out
    assert "abandoned" in text and "wait for review (fsdurable review order)" in text, text
    st = Store(root)
    [e] = [e for e in st.events("order") if e.code == ev.ABANDONED]
    assert (e.turn_id, e.reason) == (tid, why)
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


@tool(effect="external")
def charge_card(ctx: Any, amount: int) -> str:
    """Charges (a file per charge, outside the store). Waits a little for a second charge to
    start, so two unguarded re-runs overlap; a guarded second one never starts."""
    out = Path(os.environ[CHARGES_ENV])
    (out / f"{os.getpid()}.{ctx.idempotency_key.replace(':', '_')}").write_text(str(amount))
    for _ in range(30 if os.environ.get(OVERLAP_ENV) else 0):
        if len(list(out.iterdir())) > 1:
            break
        time.sleep(0.1)
    return f"charged {amount}"


def charge_host(store: Store) -> Any:
    """``--host tests.test_review_turns:charge_host``: a loop whose one tool charges."""
    return AgentLoop(store, ScriptedModel([], final="done"), [charge_card])


def test_two_concurrent_reruns_run_the_call_once(root: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 17 item 17: two processes run ``fsdurable review ID --rerun`` at once; the check
    (answered "did not run", not yet re-run), the run and its record happen under one lock, so
    the second is refused and the card is charged once."""
    charges = tmp_path / "charges"
    charges.mkdir()
    st = Store(root)
    loop_died_in_charge(st, "order")
    [o] = recover(st, charge_host(st)).outcomes
    assert o.outcome == "review_required"
    code, _ = run(capsys, "review", "order", "--did-not-run", "--root", str(root))
    assert code == 0
    env = subprocess_env(**{CHARGES_ENV: str(charges), OVERLAP_ENV: "1"})
    argv = [PYTHON, "-m", "fsdurable", "review", "order", "--rerun", "--host",
            "tests.test_review_turns:charge_host", "--root", str(root), "--json"]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), p.communicate()) for p in procs]
    assert len(list(charges.iterdir())) == 1, results  # one charge, whoever won
    codes = sorted(code for code, _ in results)
    assert codes[0] == 0 and codes[1] != 0, results
    [refused] = [out for code, out in results if code != 0]
    assert "already" in (refused[0] + refused[1]), refused
    [e] = [e for e in st.events("order") if e.code == ev.REVIEW_RERUN]
    assert e.detail["result"] == "charged 42"


def test_a_second_rerun_after_the_first_ended_is_refused_as_already_run(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The concurrent test's other order: the second ``--rerun`` (no ``--call``) starts after
    the first has recorded its result. It is refused by the re-run's own check ("already run
    again", exit 1), not answered with a usage error listing no call (it was: the call was
    chosen among the calls not yet re-run, before the lock, and there were none)."""
    charges = tmp_path / "charges"
    charges.mkdir()
    monkeypatch.setenv(CHARGES_ENV, str(charges))
    st = Store(root)
    loop_died_in_charge(st, "order")
    [o] = recover(st, charge_host(st)).outcomes
    assert o.outcome == "review_required"
    assert run(capsys, "review", "order", "--did-not-run", "--root", str(root))[0] == 0
    argv = ("review", "order", "--rerun", "--host", "tests.test_review_turns:charge_host",
            "--root", str(root))
    assert run(capsys, *argv)[0] == 0
    capsys.readouterr()
    code = main([*argv, "--json"])
    captured = capsys.readouterr()
    assert code == 1, (code, captured)
    err = json.loads(captured.out or captured.err)
    assert "already run again" in json.dumps(err), err
    assert len(list(charges.iterdir())) == 1


def test_ran_without_call_is_refused_when_several_calls_wait(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 17 item 19: ``--ran`` without ``--call`` would record "ran" for calls nobody
    checked; with several waiting it is a usage error (exit 2) that names them, and records
    nothing. With one waiting, ``--call`` is not needed."""
    st = Store(root)
    loop_died_in_charge(st, "order", calls=("call_0", "call_1"))
    [o] = recover(st, charge_host(st)).outcomes
    assert o.outcome == "review_required"
    capsys.readouterr()
    assert main(["review", "order", "--ran", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "--call" in err and "call_0" in err and "call_1" in err, err
    assert "review_answers" not in st.load("order").metadata
    assert not [e for e in st.events("order") if e.code == ev.REVIEW_ANSWERED]
    code, out = run(capsys, "review", "order", "--ran", "--call", "call_1", "--root", str(root))
    assert code == 0 and [c["tool_call_id"] for c in out["answered"]] == ["call_1"]
    code, out = run(capsys, "review", "order", "--did-not-run", "--root", str(root))
    assert code == 0 and [c["tool_call_id"] for c in out["answered"]] == ["call_0"]
    assert "review_required" not in st.load("order").metadata  # all answered: out of the queue


def test_an_answer_belongs_to_one_turns_call(root: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 17 item 18: a driver numbering calls per turn parks turn 2's ``call_0`` (a new key,
    a bigger charge) after a human answered turn 1's ``call_0``: turn 1's answer is not turn 2's
    — the new call waits for its own answer, and doctor reports it."""
    st = Store(root)
    t1 = loop_died_in_charge(st, "order")
    assert recover(st, charge_host(st)).outcomes[0].outcome == "review_required"
    code, _ = run(capsys, "review", "order", "--ran", "--root", str(root))
    assert code == 0
    t2 = loop_died_in_charge(st, "order", amount=900)
    assert recover(st, charge_host(st)).outcomes[0].outcome == "review_required"
    code, out = run(capsys, "review", "--root", str(root))
    assert code == 1, out
    [w] = out["review"]
    assert (w["turn_id"], w["tool_call_id"], w["arguments"], w["answer"]) == (
        t2, "call_0", {"amount": 900}, None)
    assert w["idempotency_key"] == f"order:{t2}:call_0"
    code, doc = run(capsys, "doctor", "--root", str(root))
    assert [f["session_id"] for f in doc["findings"] if f["code"] == "review_required"] == [
        "order"]
    code, out = run(capsys, "review", "order", "--did-not-run", "--root", str(root))
    assert code == 0 and [c["turn_id"] for c in out["answered"]] == [t2]
    answers = st.load("order").metadata["review_answers"]
    assert sorted((a["turn_id"], a["tool_call_id"], a["answer"]) for a in answers.values()) == \
        sorted([(t1, "call_0", "ran"), (t2, "call_0", "did_not_run")])
    from fsdurable._review import answer_of

    s = st.load("order")
    assert [answer_of(s, t, "call_0")["answer"] for t in (t1, t2)] == ["ran", "did_not_run"]
    assert answer_of(s, "another-turn", "call_0") is None
    charges = tmp_path / "charges"
    charges.mkdir()
    monkeypatch.setenv(CHARGES_ENV, str(charges))
    code, out = run(capsys, "review", "order", "--rerun", "--host",
                    "tests.test_review_turns:charge_host", "--root", str(root))
    assert code == 0 and out["rerun"] == {"tool_call_id": "call_0", "result": "charged 900"}
    [charged] = charges.iterdir()  # turn 2's call, with turn 2's key
    assert charged.name.endswith(f"order_{t2}_call_0") and charged.read_text() == "900"


def _legacy(st: Store, sid: str, answers: dict[str, Any]) -> None:
    """Answers as an older fsdurable recorded them: keyed by the tool call id alone."""
    st.patch(sid, lambda s: attrs.evolve(s, metadata={**s.metadata, "review_answers": answers}))


def test_an_older_answer_keyed_by_call_id_belongs_to_the_call_it_was_given_for(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An answer of an older file (no turn id) belongs to the call of that id parked before it
    was given; a call parked after it waits. Rewritten to the per-turn key at the next answer."""
    st = Store(root)
    t1 = loop_died_in_charge(st, "order")
    assert recover(st, charge_host(st)).outcomes[0].outcome == "review_required"
    rr = st.load("order").metadata["review_required"]
    _legacy(st, "order", {"call_0": {"answer": "did_not_run", "at": st.clock(), "note": None}})
    st.patch("order", lambda s: attrs.evolve(s, metadata={
        k: v for k, v in {**s.metadata, "review_closed": {**rr, "closed_at": st.clock()}}.items()
        if k != "review_required"}))
    t2 = loop_died_in_charge(st, "order", amount=900)
    assert recover(st, charge_host(st)).outcomes[0].outcome == "review_required"
    code, out = run(capsys, "review", "--root", str(root))
    assert code == 1 and [(w["turn_id"], w["answer"]) for w in out["review"]] == [(t2, None)]
    code, out = run(capsys, "review", "order", "--ran", "--root", str(root))
    assert code == 0
    answers = st.load("order").metadata["review_answers"]
    assert sorted((a["turn_id"], a["tool_call_id"], a["answer"]) for a in answers.values()) == \
        sorted([(t1, "call_0", "did_not_run"), (t2, "call_0", "ran")])
    assert "call_0" not in answers  # migrated to its turn's key


def test_an_older_answer_that_two_turns_calls_share_is_reported(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two turns' ``call_0`` were both parked when an older fsdurable recorded one answer for
    ``call_0``: which call it was about cannot be told. Neither carries it, doctor says so, and
    each is answered by its idempotency key."""
    st = Store(root)
    t1 = loop_died_in_charge(st, "order")
    assert recover(st, charge_host(st)).outcomes[0].outcome == "review_required"
    t2 = loop_died_in_charge(st, "order", amount=900)
    assert recover(st, charge_host(st)).outcomes[0].outcome == "review_required"
    _legacy(st, "order", {"call_0": {"answer": "ran", "at": st.clock(), "note": None}})
    code, out = run(capsys, "review", "--root", str(root))
    assert code == 1 and sorted(w["turn_id"] for w in out["review"]) == sorted([t1, t2])
    assert all(w["answer"] is None for w in out["review"])
    code, doc = run(capsys, "doctor", "--root", str(root))
    assert code == 1
    codes = [f["code"] for f in doc["findings"] if f.get("session_id") == "order"]
    assert "review_answer_ambiguous" in codes and "review_required" in codes
    capsys.readouterr()
    assert main(["review", "order", "--ran", "--call", "call_0", "--root", str(root)]) == 2
    assert "idempotency key" in capsys.readouterr().err
    for t in (t1, t2):
        code, out = run(capsys, "review", "order", "--ran", "--call", f"order:{t}:call_0",
                        "--root", str(root))
        assert code == 0 and [c["turn_id"] for c in out["answered"]] == [t]
    assert "review_required" not in st.load("order").metadata
