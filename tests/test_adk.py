"""Google ADK on fsdurable (``fsdurable.adk``): the session service, durable runs through the turn
protocol, and recovery — with an offline scripted ``BaseLlm`` (``tests.adk_agent``; ADK has no
offline test model) and real SIGKILLs of child processes, each recovered by a fresh process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.tools import FunctionTool
from google.genai import types

import fsdurable
from fsdurable import adk

from . import adk_agent
from .adk_agent import FINAL, Scripted
from .conftest import run_module, subprocess_env

# what tests/adk_agent.py's children import: once, in their fork server
ADK_WARM = ("google.adk.agents", "google.adk.models.base_llm", "google.adk.plugins.base_plugin",
            "google.genai.types", "fsdurable.adk", "fsdurable._adkrun")

# ---------------------------------------------------------------------------------- storage


def _event(author: str, text: str, delta: dict[str, Any] | None = None) -> Event:
    return Event(invocation_id="inv-1", author=author,
                 content=types.Content(role="user" if author == "user" else "model",
                                       parts=[types.Part(text=text)]),
                 actions=EventActions(state_delta=delta or {}))


def test_sessions_events_and_scoped_state_survive_a_new_service(tmp_path: Path) -> None:
    async def main() -> None:
        svc = adk.FileSessionService(tmp_path / "store")
        s = await svc.create_session(app_name="shop", user_id="ana", session_id="chat",
                                     state={"cart": 1, "user:lang": "pt", "app:tax": 0.2})
        assert s.state == {"cart": 1, "user:lang": "pt", "app:tax": 0.2}
        await svc.append_event(s, _event("user", "hi", {"cart": 2, "temp:scratch": "x",
                                                        "user:lang": "en"}))
        await svc.append_event(s, _event("model", "hello"))
        assert s.state["temp:scratch"] == "x"  # in memory for this invocation only
        fresh = adk.FileSessionService(fsdurable.Store(tmp_path / "store"))  # a new process
        got = await fresh.get_session(app_name="shop", user_id="ana", session_id="chat")
        assert got is not None
        assert [e.content.parts[0].text for e in got.events if e.content] == ["hi", "hello"]
        assert got.events[0].id == s.events[0].id
        assert got.state == {"cart": 2, "user:lang": "en", "app:tax": 0.2}
        assert await fresh.get_user_state(app_name="shop", user_id="ana") == {"lang": "en"}
        # another user's session of the same app sees the app state, not ana's user state
        bob = await fresh.create_session(app_name="shop", user_id="bob")
        assert bob.state == {"app:tax": 0.2} and len(bob.id) == 32
        last = await fresh.get_session(app_name="shop", user_id="ana", session_id="chat",
                                       config=GetSessionConfig(num_recent_events=1))
        assert last is not None and [e.content.parts[0].text for e in last.events] == ["hello"]
        # a session is (app, user, id): another app's or user's view of the id is empty
        assert await fresh.get_session(app_name="shop", user_id="bob",
                                       session_id="chat") is None
        assert await fresh.get_session(app_name="other", user_id="ana",
                                       session_id="chat") is None
        listed = await fresh.list_sessions(app_name="shop")
        assert sorted(x.id for x in listed.sessions) == sorted(["chat", bob.id])
        assert all(x.events == [] for x in listed.sessions)
        assert [x.id for x in (await fresh.list_sessions(app_name="shop",
                                                         user_id="ana")).sessions] == ["chat"]
        with pytest.raises(AlreadyExistsError):
            await fresh.create_session(app_name="shop", user_id="ana", session_id="chat")
        with pytest.raises(fsdurable.InvalidSessionId):
            await fresh.create_session(app_name="shop", user_id="ana", session_id="../x")
        await fresh.delete_session(app_name="shop", user_id="ana", session_id="chat")
        assert await svc.get_session(app_name="shop", user_id="ana", session_id="chat") is None

    asyncio.run(main())


def test_a_plain_adk_runner_on_the_service_persists_every_event(tmp_path: Path) -> None:
    """Not durable (no turn, no marker): ADK's own ``Runner`` writes through the service, each
    event one commit."""
    async def main() -> None:
        svc = adk.FileSessionService(tmp_path / "store")
        agent = LlmAgent(name="payer", model=Scripted(), tools=[adk_agent.lookup,
                                                                adk_agent.pay])
        await svc.create_session(app_name="shop", user_id="ana", session_id="chat")
        r = Runner(agent=agent, app_name="shop", session_service=svc)
        msg = types.Content(role="user", parts=[types.Part(text="pay")])
        with pytest.raises(AssertionError):  # pay asserts it runs in a durable run
            async for _ in r.run_async(user_id="ana", session_id="chat", new_message=msg):
                pass

    asyncio.run(main())
    store = fsdurable.Store(tmp_path / "store")
    s = store.load("chat")
    assert not s.in_progress and store.interrupted() == []
    assert len(adk.events_of(s)) >= 3 and s.version >= 4  # created, then one commit per event


def test_a_corrupt_session_file_raises_and_stays_where_it_is(tmp_path: Path) -> None:
    svc = adk.FileSessionService(tmp_path / "store")
    asyncio.run(svc.create_session(app_name="shop", user_id="ana", session_id="chat"))
    path = Path(svc.store.layout.session("chat"))
    path.write_bytes(b"{not json")
    with pytest.raises(fsdurable.UnreadableState):
        asyncio.run(svc.get_session(app_name="shop", user_id="ana", session_id="chat"))
    assert path.read_bytes() == b"{not json"


# ---------------------------------------------------------------------------------- live runs


def runner(tmp_path: Path, **kw: Any) -> adk.DurableRunner:
    return adk_agent.runner(str(tmp_path / "store"), **kw)


def test_a_durable_run_is_one_turn_with_the_ledger(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADK_LOG", str(tmp_path / "log"))
    r = runner(tmp_path)
    out = asyncio.run(r.run(user_id="ana", session_id="chat", new_message="pay order 7"))
    assert (out.status, out.reply) == ("completed", FINAL)
    s = r.store.load("chat")
    assert [(m.role, m.content) for m in s.messages] == [("user", "pay order 7"),
                                                         ("assistant", FINAL)]
    assert not s.in_progress and r.store.interrupted() == []
    log = (tmp_path / "log").read_text().splitlines()
    [pay] = [x for x in log if x.startswith("pay")]
    codes = [e.code for e in r.store.events("chat")]
    assert codes == ["turn_started", "turn_completed"]
    started = next(e for e in r.store.events("chat") if e.code == "turn_started")
    assert started.detail["driver"] == "adk"
    # the key the tool saw is the protocol's: <session>:<turn>:<call>
    turn_id = started.turn_id
    assert pay.split()[-1] == f"chat:{turn_id}:call-1"
    got = asyncio.run(r.session_service.get_session(app_name="shop", user_id="ana",
                                                    session_id="chat"))
    assert got is not None and got.events[-1].actions.end_of_agent


def test_in_progress_with_marker_and_route_lock_before_the_first_model_call(
        tmp_path: Path) -> None:
    store = fsdurable.Store(tmp_path / "store")
    seen: list[Any] = []

    class Probe(Scripted):
        async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
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
            m = store.read_marker("chat")
            seen.append((s.in_progress, m is not None and m.owner_driver, len(err)))
            async for x in super().generate_content_async(llm_request, stream):
                yield x

    agent = LlmAgent(name="chat", model=Probe(calls=(), reply="hello"))
    r = adk.DurableRunner(agent, app_name="shop", store=store)
    out = asyncio.run(r.run(user_id="ana", session_id="chat", new_message="hi"))
    assert (out.status, out.reply) == ("completed", "hello")
    assert seen == [(True, "adk", 1)]
    with store.lock(store.load("chat").route_key, timeout=0):  # released at the end
        pass


def _guarded(tmp_path: Path, ran: list[str]) -> adk.DurableRunner:
    def publish(post: str) -> str:
        """Publish a post."""
        ran.append(f"publish {post}")
        return "published"

    def shell(cmd: str) -> str:
        """Run a command."""
        ran.append(f"shell {cmd}")
        return "ok"

    calls = (("publish", {"post": "hi"}), ("shell", {"cmd": "rm -rf ~/build"}))
    agent = LlmAgent(name="ops", model=Scripted(calls=calls, reply="finished"),
                     tools=[FunctionTool(publish, require_confirmation=True), shell])
    return adk.DurableRunner(agent, app_name="ops", store=tmp_path / "store",
                             effects={"publish": "external", "shell": "external"})


def test_an_unattended_run_refuses_the_deny_list_and_every_approval(tmp_path: Path) -> None:
    ran: list[str] = []
    r = _guarded(tmp_path, ran)
    out = asyncio.run(r.run(user_id="ana", session_id="chat", new_message="go",
                            approve=lambda ctx, req: True))  # nobody present: never asked
    assert (out.status, out.reply, ran) == ("completed", "finished", [])
    refused = [(e.detail["tool"], e.reason) for e in r.store.events("chat")
               if e.code == "tool_refused"]
    assert refused == [("publish", "approval_denied"), ("shell", "unattended_deny")]
    responses = [p.function_response.response for e in out.events if e.content
                 for p in e.content.parts or () if p.function_response]
    assert all("error" in x for x in responses), responses


def test_an_attended_run_asks_the_live_approver(tmp_path: Path) -> None:
    ran: list[str] = []
    r = _guarded(tmp_path, ran)
    out = asyncio.run(r.run(user_id="ana", session_id="chat", new_message="go",
                            attended=True, approve=lambda ctx, req: req.name == "publish"))
    assert (out.status, ran) == ("completed", ["publish hi", "shell rm -rf ~/build"])
    assert [(e.detail["tool"], e.reason) for e in r.store.events("chat")
            if e.code == "tool_refused"] == []


def test_an_attended_run_without_an_approver_pauses_for_adk_confirmation(
        tmp_path: Path) -> None:
    """ADK asks the human to confirm ``publish``: the turn ends ``paused`` (not interrupted:
    nothing resumes it); the human's confirmation is the next durable run's message."""
    ran: list[str] = []
    r = _guarded(tmp_path, ran)
    out = asyncio.run(r.run(user_id="ana", session_id="chat", new_message="go",
                            attended=True))
    assert (out.status, ran) == ("paused", [])
    assert r.store.interrupted() == [] and not r.store.load("chat").in_progress
    asked = [p.function_call for e in out.events if e.content for p in e.content.parts or ()
             if p.function_call and p.function_call.name == "adk_request_confirmation"]
    assert len(asked) == 1
    yes = types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
        id=asked[0].id, name="adk_request_confirmation", response={"confirmed": True}))])
    out = asyncio.run(r.run(user_id="ana", session_id="chat", new_message=yes, attended=True,
                            approve=lambda ctx, req: True))
    assert (out.status, ran) == ("completed", ["publish hi", "shell rm -rf ~/build"])
    s = r.store.load("chat")
    assert s.messages[-1].content == "finished" and r.store.interrupted() == []


def test_cancelling_the_task_ends_the_turn_for_good(tmp_path: Path) -> None:
    started = asyncio.Event()

    async def slow(q: str) -> str:
        """A slow lookup."""
        started.set()
        await asyncio.sleep(30)
        return "never"

    agent = LlmAgent(name="payer", model=Scripted(calls=(("slow", {"q": "x"}),)), tools=[slow])
    r = adk.DurableRunner(agent, app_name="shop", store=tmp_path / "store",
                          effects={"slow": "none"})  # (an effectful one would go to review)

    async def main() -> None:
        task = asyncio.create_task(r.run(user_id="ana", session_id="chat", new_message="go"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert r.store.interrupted() == [] and not r.store.load("chat").in_progress
    assert [e.code for e in r.store.events("chat")][-1] == "turn_cancelled"
    assert asyncio.run(adk.recover(r)).outcomes == ()


def test_leaving_the_event_stream_early_cancels_the_turn(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADK_LOG", str(tmp_path / "log"))
    r = runner(tmp_path)

    async def main() -> None:
        async with aclosing(r.run_async(user_id="ana", session_id="chat",
                                        new_message="pay order 7")) as events:
            async for e in events:
                if e.get_function_calls():  # the lookup call: stop listening
                    break
        # closed now, not at garbage collection: the turn is over, its route lock free
        assert not r.store.load("chat").in_progress
        with r.store.lock(r.store.load("chat").route_key, timeout=0):
            pass

    asyncio.run(main())
    assert r.store.interrupted() == [] and not r.store.load("chat").in_progress
    assert [e.code for e in r.store.events("chat")] == ["turn_started", "turn_cancelled"]
    assert not any(x.startswith("pay ") for x in lines(tmp_path / "log"))


def test_recover_leaves_other_drivers_alone_and_the_loop_leaves_adk_runs(
        tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, "model1")
    st = fsdurable.Store(root)
    st.create("other", source="desktop")
    st.begin_turn("other", "hi")  # the reference loop's turn
    r = runner(tmp_path)
    report = asyncio.run(adk.recover(r, select=lambda m: m.session_id == "other"))
    assert report.outcomes == ()

    class Loop:  # the reference loop's host: never given an adk run
        driver = "loop"

        def tool_effect(self, name: str) -> str | None:
            return None

        def resume_claimed(self, s: Any) -> Any:
            raise AssertionError(f"the loop was handed {s.id}")

    rep = fsdurable.recover(st, Loop())  # type: ignore[arg-type]
    assert [(o.session_id, o.outcome) for o in rep.outcomes] == [("other", "failed")]
    [m] = [m for m in st.interrupted() if m.session_id == "chat"]  # never the adk run
    assert m.resume_attempts == 0 and m.owner_driver == "adk"
    [o] = asyncio.run(adk.recover(r, select=lambda m: m.session_id == "chat")).outcomes
    assert (o.outcome, o.status) == ("resumed", "completed")


# ---------------------------------------------------------------------------------- SIGKILL


def child(mode: str, root: Path, log: Path, kill: str = "", *, pay: str = "external",
          debounce: float = 0) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(ADK_LOG=str(log), ADK_KILL=kill, ADK_PAY=pay,
                         ADK_DEBOUNCE=str(debounce))
    return run_module("tests.adk_agent", [mode, str(root)], env, ADK_WARM, timeout=120)


def killed(root: Path, log: Path, kill: str, **kw: Any) -> None:
    p = child("run", root, log, kill, **kw)
    assert p.returncode == -9, (p.returncode, p.stderr)  # really SIGKILLed
    store = fsdurable.Store(root)
    [m] = store.interrupted()
    assert m.session_id == "chat" and m.owner_driver == "adk"


def recovered(root: Path, log: Path, **kw: Any) -> dict[str, Any]:
    r = child("recover", root, log, **kw)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout.splitlines()[-1])
    return out


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture(scope="module")
def uncrashed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("uncrashed")
    p = child("run", tmp / "store", tmp / "log")
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout.splitlines()[-1])
    assert (out["status"], out["reply"]) == ("completed", FINAL)
    return out


KILLS = ["event1", "event2", "event3", "event4", "event5", "event6", "model0", "model1",
         "model2", "lookup"]


@pytest.mark.parametrize("kill", KILLS)
def test_sigkill_anywhere_then_recovered_in_a_fresh_process(tmp_path: Path, kill: str,
                                                            uncrashed: dict[str, Any]) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, kill)
    out = recovered(root, log)
    [o] = out["report"]["outcomes"]
    assert (o["outcome"], o["status"], o["attempts"]) == ("resumed", "completed", 1), o
    # the conversation an uncrashed run leaves, the same call ids, and the payment made once
    for k in ("messages", "calls", "responses"):
        assert out[k] == uncrashed[k], k
    assert sum(x.startswith("pay ") for x in lines(log)) == 1, lines(log)
    store = fsdurable.Store(root)
    assert store.interrupted() == [] and not store.load("chat").in_progress
    codes = [e.code for e in store.events("chat")]
    assert "interrupted_turn_resuming" in codes and "interrupted_turn_resumed" in codes


def test_a_payment_in_doubt_is_parked_for_review_never_paid_twice(tmp_path: Path) -> None:
    """Killed inside ``pay`` after its effect: ADK would run it again on resume ("at least
    once"); the ledger has its intent without an outcome, so recovery parks the turn for a
    human, the arguments visible, and the payment is not repeated."""
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, "pay")
    out = recovered(root, log)
    [o] = out["report"]["outcomes"]
    assert (o["outcome"], o["reason"]) == ("review_required", "in_doubt")
    assert sum(x.startswith("pay ") for x in lines(log)) == 1
    [q] = fsdurable.review_queue(fsdurable.Store(root))
    assert (q["tool"], q["arguments"]) == ("pay", {"amount": 5, "to": "acme"})


def test_an_idempotent_payment_in_doubt_is_rerun_with_its_key(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, "pay", pay="idempotent")
    out = recovered(root, log, pay="idempotent")
    [o] = out["report"]["outcomes"]
    assert (o["outcome"], o["status"]) == ("resumed", "completed")
    keys = [x.split()[-1] for x in lines(log) if x.startswith("pay ")]
    assert len(keys) == 2 and keys[0] == keys[1]
    assert out["messages"][-1] == ["assistant", FINAL]


@pytest.mark.parametrize("kill", ["event4", "model2"])
def test_a_long_debounce_loses_checkpoints_never_the_ledger(tmp_path: Path, kill: str,
                                                          uncrashed: dict[str, Any]) -> None:
    """Debounce 1 h: the events after the payment's outcome were never checkpointed; ADK
    re-executes the call on resume and the ledger answers it — the payment is not repeated."""
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, kill, debounce=3600)
    out = recovered(root, log, debounce=3600)
    [o] = out["report"]["outcomes"]
    assert (o["outcome"], o["status"]) == ("resumed", "completed")
    assert sum(x.startswith("pay ") for x in lines(log)) == 1, lines(log)
    assert out["messages"] == uncrashed["messages"]


def test_show_describes_an_adk_session(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from fsdurable.cli import main

    r = runner(tmp_path)
    asyncio.run(r.run(user_id="ana", session_id="chat", new_message="pay order 7"))
    assert main(["show", "chat", "--root", str(tmp_path / "store"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["adapter"] == {"kind": "adk session", "app_name": "shop", "user_id": "ana",
                            "events": 7, "run": None}
    assert main(["show", "chat", "--root", str(tmp_path / "store")]) == 0
    assert "ADK session of app 'shop', user 'ana': 7 events" in capsys.readouterr().out


@pytest.mark.parametrize("ran", [True, False])
def test_after_review_the_next_run_tells_the_model_what_the_human_answered(
        tmp_path: Path, ran: bool) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    killed(root, log, "pay")
    [o] = recovered(root, log)["report"]["outcomes"]
    assert o["outcome"] == "review_required"
    store = fsdurable.Store(root)
    fsdurable.answer_review(store, "chat", ran=ran)
    seen: list[Any] = []

    class Probe(Scripted):
        async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
            seen.extend(p.function_response.response for c in llm_request.contents
                        for p in c.parts or () if p.function_response)
            async for x in super().generate_content_async(llm_request, stream):
                yield x

    agent = LlmAgent(name="payer", model=Probe(calls=(), reply="ok"),
                     tools=[adk_agent.lookup, adk_agent.pay])
    r = adk.DurableRunner(agent, app_name="shop", store=store)
    out = asyncio.run(r.run(user_id="ana", session_id="chat", new_message="and now?",
                            attended=True))
    assert (out.status, out.reply) == ("completed", "ok")
    assert seen[-1] == {"result": "ran: a human confirmed this call ran (its result was not "
                                  "recorded)" if ran else
                        "not run: a human confirmed this call did not run"}
    assert sum(x.startswith("pay ") for x in lines(log)) == 1  # never run again by itself
