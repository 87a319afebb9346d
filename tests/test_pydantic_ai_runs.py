"""fsdurable.pydantic_ai durable runs: the turn protocol's Pydantic AI driver, with Pydantic AI's
own ``FunctionModel`` (offline) and a real SIGKILL at every node boundary, inside each model call
and inside the tools, each recovered in a fresh process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from .conftest import in_ci

if in_ci():
    import pydantic_ai  # noqa: F401  (CI installs the extra: a missing package is a failure)
else:
    pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

from pydantic_ai import Agent, DeferredToolResults
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel

import fsdurable
from fsdurable import pydantic_ai as pai

from . import pai_agent
from .conftest import run_module, subprocess_env

# what tests/pai_agent.py's children import: once, in their fork server
PAI_WARM = ("pydantic_ai", "pydantic_ai.models.function", "fsdurable.pydantic_ai")

NODES = 9  # UserPrompt, then (ModelRequest, CallTools) x 4, then End: 9 boundaries


def child(mode: str, root: Path, log: Path, kill: str = "", script: str = "sums",
          debounce: float = 0, send_effect: str = "external"
          ) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(PAI_LOG=str(log), PAI_KILL=kill, PAI_SCRIPT=script,
                         PAI_DEBOUNCE=str(debounce), PAI_SEND_EFFECT=send_effect)
    return run_module("tests.pai_agent", [mode, str(root)], env, PAI_WARM, timeout=120)


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def effects(log: Path) -> list[str]:
    """The completed tool calls (a send's line without its idempotency key)."""
    return [" ".join(x.split()[:2]) for x in lines(log) if not x.startswith("model")]


@pytest.fixture(scope="module")
def uncrashed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("uncrashed")
    p = child("run", tmp / "store", tmp / "log")
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    assert (out["status"], out["final"], out["nodes"]) == ("completed", pai_agent.FINAL, NODES)
    assert out["returns"] == ["3", "sent to ana", "7"]
    return out


def recovered(root: Path, log: Path, **kw: Any) -> dict[str, Any]:
    r = child("recover", root, log, **kw)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def killed(root: Path, log: Path, kill: str, **kw: Any) -> None:
    p = child("run", root, log, kill, **kw)
    assert p.returncode == -9, (p.returncode, p.stderr)  # really SIGKILLed
    store = fsdurable.Store(root)
    assert [m.session_id for m in store.interrupted()] == ["chat"]
    assert store.load("chat").turn.driver == "pydantic-ai"  # type: ignore[union-attr]


KILLS = ([f"node{k}" for k in range(1, NODES)]
         + [f"model{n}" for n in range(4)] + ["add1", "add3"])


@pytest.mark.parametrize("kill", KILLS)
def test_sigkill_anywhere_then_recovered_in_a_fresh_process(tmp_path: Path, kill: str,
                                                            uncrashed: dict[str, Any]) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, kill)
    out = recovered(root, log)
    [o] = out["report"]["outcomes"]
    assert (o["outcome"], o["status"], o["attempts"]) == ("resumed", "completed", 1)
    # the conversation is the one an uncrashed run leaves, and the send ran exactly once
    assert (out["history"], out["returns"]) == (uncrashed["history"], uncrashed["returns"])
    assert effects(log).count("send ana") == 1, lines(log)
    if not kill.startswith("add"):  # an effect-free tool killed mid-call runs again
        assert effects(log) == ["add 1", "send ana", "add 3"], lines(log)
    store = fsdurable.Store(root)
    assert store.interrupted() == [] and not store.load("chat").in_progress
    codes = [e.code for e in store.events("chat")]
    assert "interrupted_turn_resuming" in codes and "interrupted_turn_resumed" in codes


@pytest.mark.parametrize("kill", ["node5", "node7", "model3"])
def test_a_long_debounce_loses_checkpoints_never_the_ledger(tmp_path: Path, kill: str,
                                                          uncrashed: dict[str, Any]) -> None:
    """No history checkpoint since the begin (debounce 1 h): the resume starts from the prompt,
    the model is asked again, and the send is answered from the ledger, not run again."""
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, kill, debounce=3600)
    out = recovered(root, log, debounce=3600)
    assert out["report"]["outcomes"][0]["status"] == "completed"
    assert (out["history"], out["returns"]) == (uncrashed["history"], uncrashed["returns"])
    assert effects(log).count("send ana") == 1, lines(log)


def test_an_external_tool_in_doubt_parks_the_run_for_review(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, "send")
    out = recovered(root, log)
    [o] = out["report"]["outcomes"]
    assert (o["outcome"], o["reason"]) == ("review_required", "in_doubt")
    assert effects(log).count("send ana") == 1  # the dead run's; never blindly re-run
    s = fsdurable.Store(root).load("chat")
    [call] = s.metadata["review_required"]["calls"]
    assert not s.in_progress and call["tool"] == "send"


def test_an_idempotent_tool_in_doubt_is_rerun_with_its_key(tmp_path: Path,
                                                          uncrashed: dict[str, Any]) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, "send", send_effect="idempotent")
    out = recovered(root, log, send_effect="idempotent")
    assert out["report"]["outcomes"][0]["status"] == "completed"
    sends = [x for x in lines(log) if x.startswith("send")]
    assert len(sends) == 2 and sends[0] == sends[1], sends  # the same idempotency key
    assert out["returns"] == uncrashed["returns"]


def test_a_resumed_run_refuses_a_tool_that_needs_approval(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, "model0", script="delete")
    out = recovered(root, log, script="delete")
    [o] = out["report"]["outcomes"]
    assert (o["outcome"], o["status"]) == ("resumed", "completed")
    assert not any(x.startswith("delete") for x in lines(log)), "an approval was granted"
    assert out["returns"][0].startswith("denied:")  # the model was told
    ev = [e for e in fsdurable.Store(root).events("chat") if e.code == "tool_refused"]
    assert [(e.reason, e.detail.get("tool")) for e in ev] == [("approval_denied", "delete")]


# ---------------------------------------------------------------------------------- in process


def durable(tmp_path: Path, script: str = "sums", **kw: Any) -> pai.FsDurableAgent:
    store = fsdurable.Store(tmp_path / "store",
                            config=fsdurable.Config().replace(checkpoint_debounce=0))
    return pai.FsDurableAgent(pai_agent.make_agent(), store, effects=pai_agent.EFFECTS, **kw)


def test_an_unattended_live_run_refuses_approvals(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAI_SCRIPT", "delete")
    monkeypatch.setenv("PAI_LOG", str(tmp_path / "log"))
    d = durable(tmp_path)
    out = d.run_sync("clean up", session_id="chat")
    assert out.status == "completed" and out.output.startswith("delete: denied:")
    assert lines(tmp_path / "log") == ["model 0", "model 1"]


def test_an_attended_run_paused_for_approval_is_not_interrupted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAI_SCRIPT", "delete")
    monkeypatch.setenv("PAI_LOG", str(tmp_path / "log"))
    d = durable(tmp_path)
    store = d.store
    out = d.run_sync("clean up", session_id="chat", attended=True)
    assert out.status == "paused" and store.interrupted() == []
    assert not store.load("chat").in_progress
    paused = pai.paused_calls(store.load("chat"))
    assert paused is not None and [c["tool_name"] for c in paused["approvals"]] == ["delete"]
    assert "turn_paused" in [e.code for e in store.events("chat")]
    # recovery finds nothing to resume
    assert asyncio.run(pai.recover(d)).outcomes == ()
    # later, the human approves; the run continues from the kept history
    ok = DeferredToolResults(approvals={paused["approvals"][0]["tool_call_id"]: True})
    out = d.run_sync(None, session_id="chat", attended=True, deferred_tool_results=ok)
    assert (out.status, out.output) == ("completed", "delete: deleted /tmp/x")
    assert lines(tmp_path / "log").count("delete /tmp/x") == 1
    assert pai.paused_calls(store.load("chat")) is None and store.interrupted() == []


def test_in_progress_with_marker_and_route_lock_before_the_first_model_request(
        tmp_path: Path) -> None:
    seen: list[Any] = []
    store = fsdurable.Store(tmp_path / "store")

    def model(messages: Any, info: Any) -> ModelResponse:
        s = store.load("chat")
        err: list[BaseException] = []

        def other() -> None:  # another thread (or process) cannot take the route now
            try:
                with store.lock(s.route_key, timeout=0):
                    pass
            except fsdurable.LockTimeout as e:
                err.append(e)

        th = threading.Thread(target=other)
        th.start()
        th.join()
        seen.append((s.in_progress, store.read_marker("chat") is not None, len(err)))
        return ModelResponse(parts=[TextPart("hello")])

    d = pai.FsDurableAgent(Agent(FunctionModel(model)), store)
    assert d.run_sync("hi", session_id="chat").output == "hello"
    assert seen == [(True, True, 1)]
    started = [e for e in store.events("chat") if e.code == "turn_started"]
    assert started[0].detail["driver"] == "pydantic-ai"
    with store.lock(store.load("chat").route_key, timeout=0):  # released at the end
        pass


def test_a_session_is_a_conversation_and_each_call_id_has_its_own_ledger_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAI_LOG", str(tmp_path / "log"))
    d = durable(tmp_path)
    d.run_sync("go", session_id="chat")
    assert effects(tmp_path / "log") == ["add 1", "send ana", "add 3"]  # c1 thrice: all ran
    n = len(pai.history(d.store, "chat"))
    seen: list[int] = []

    def model(messages: Any, info: Any) -> ModelResponse:
        seen.append(len(messages))
        return ModelResponse(parts=[TextPart("again")])

    again = pai.FsDurableAgent(Agent(FunctionModel(model)), d.store)
    assert again.run_sync("more", session_id="chat").output == "again"
    assert seen == [n + 1] and len(pai.history(d.store, "chat")) == n + 2
    assert [m.content for m in d.store.load("chat").messages] == [
        "go", pai_agent.FINAL, "more", "again"]


def test_recover_leaves_other_drivers_alone(tmp_path: Path) -> None:
    d = durable(tmp_path)
    d.store.create("other", source="desktop")
    d.store.begin_turn("other", "hi")  # the reference loop's turn
    report = asyncio.run(pai.recover(d))
    assert report.outcomes == ()
    assert [m.session_id for m in d.store.interrupted()] == ["other"]


def test_a_tool_call_in_a_model_reply_goes_through_the_ledger(tmp_path: Path) -> None:
    calls: list[str] = []

    def model(messages: Any, info: Any) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("pay", {"n": 5}, "p1")])
        return ModelResponse(parts=[TextPart("paid")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool_plain
    def pay(n: int) -> str:
        ctx = pai.tool_context()
        assert ctx is not None and not ctx.attended
        s = store.load("chat")
        assert s.turn is not None
        [entry] = s.turn.ledger  # the intent is on disk before the tool runs
        calls.append(entry.status)
        return "ok"

    store = fsdurable.Store(tmp_path / "store")
    d = pai.FsDurableAgent(agent, store, effects={"pay": "external"})
    assert d.run_sync("go", session_id="chat").output == "paid"
    assert calls == ["intent"]


def test_leaving_iter_early_leaves_the_turn_in_progress_for_recovery(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uncrashed: dict[str, Any]) -> None:
    monkeypatch.setenv("PAI_LOG", str(tmp_path / "log"))
    d = durable(tmp_path)

    async def main() -> Any:
        async with d.iter("go", session_id="chat") as run:
            async for node in run:
                if type(node).__name__ == "ModelRequestNode":
                    break  # after the first tool batch
        assert run.outcome is None
        with d.store.lock(d.store.load("chat").route_key, timeout=0):  # released
            pass
        assert [m.session_id for m in d.store.interrupted()] == ["chat"]
        return await pai.recover(d)

    [o] = asyncio.run(main()).outcomes
    assert (o.outcome, o.status) == ("resumed", "completed")
    returns = [str(p.content) for p in pai_agent.returns(pai.history(d.store, "chat"))]
    assert returns == uncrashed["returns"]
    assert effects(tmp_path / "log") == ["add 1", "send ana", "add 3"]


def test_a_new_prompt_on_a_paused_run_tells_the_model_the_call_never_ran(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAI_SCRIPT", "delete")
    monkeypatch.setenv("PAI_LOG", str(tmp_path / "log"))
    d = durable(tmp_path)
    assert d.run_sync("clean up", session_id="chat", attended=True).status == "paused"
    out = d.run_sync("never mind", session_id="chat", attended=True)
    assert out.status == "completed" and "waited for a human" in out.output
    assert pai.paused_calls(d.store.load("chat")) is None
    assert "delete /tmp/x" not in lines(tmp_path / "log")


def test_show_describes_a_durable_runs_conversation(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAI_LOG", str(tmp_path / "log"))
    d = durable(tmp_path)
    d.run_sync("go", session_id="chat")
    got = pai.describe(d.store, d.store.load("chat"))
    assert (got["kind"], got["messages"]) == ("pydantic-ai durable run", 8)
    assert got["last"][-1]["text"] == pai_agent.FINAL


@pytest.mark.parametrize("ran", [True, False])
def test_after_review_the_next_run_tells_the_model_what_the_human_answered(
        tmp_path: Path, ran: bool) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, "send")
    assert recovered(root, log)["report"]["outcomes"][0]["outcome"] == "review_required"
    store = fsdurable.Store(root)
    fsdurable.answer_review(store, "chat", ran=ran)
    told: list[str] = []

    def model(messages: Any, info: Any) -> ModelResponse:
        told[:] = [str(p.content) for p in pai_agent.returns(messages) if p.tool_name == "send"]
        return ModelResponse(parts=[TextPart("ok")])

    d = pai.FsDurableAgent(Agent(FunctionModel(model)), store)
    assert d.run_sync("and now?", session_id="chat", attended=True).status == "completed"
    assert len(told) == 1 and told[0].startswith("ran:" if ran else "not run:"), told
    assert effects(log).count("send ana") == 1
