"""fsdurable.openai_agents: the Session contract (run against FileSession AND the SDK's own
SQLiteSession in the same run), and durable runs with the SDK's ScriptedModel and a real SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no network, ever
if os.environ.get("CI") == "true":
    import agents  # noqa: F401  (CI installs the extra: a missing SDK is a failure there)
else:
    pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Runner
from agents.memory import Session as SessionProtocol
from agents.memory import SessionSettings, SQLiteSession

import fsdurable
from fsdurable import openai_agents as oa

from . import oa_agent
from .conftest import PYTHON, run_module, subprocess_env

# what tests/oa_agent.py's children import: once, in their fork server
OA_WARM = ("agents", "agents.testing", "fsdurable.openai_agents", "fsdurable._oarun")

KINDS = ("file", "sqlite")


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def make(kind: str, tmp: Path, sid: str = "s1", **kw: Any) -> Any:
    if kind == "file":
        return oa.FileSession(sid, fsdurable.Store(tmp / "store"), **kw)
    return SQLiteSession(sid, tmp / "sessions.db", **kw)


def msg(i: int | str) -> dict[str, Any]:
    return {"role": "user", "content": f"m{i}"}


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ---------------------------------------------------------------------------------- the contract


def test_is_a_session(kind: str, tmp_path: Path) -> None:
    s = make(kind, tmp_path)
    assert isinstance(s, SessionProtocol) and s.session_id == "s1"


def test_add_get_order_and_limits(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        s = make(kind, tmp_path)
        assert await s.get_items() == []
        await s.add_items([msg(1), msg(2)])
        await s.add_items([msg(3)])
        await s.add_items([])
        assert await s.get_items() == [msg(1), msg(2), msg(3)]
        assert await s.get_items(limit=2) == [msg(2), msg(3)]  # the latest, in order
        assert await s.get_items(limit=10) == [msg(1), msg(2), msg(3)]
        assert await s.get_items(limit=0) == []
        assert await s.get_items(limit=-1) == [msg(1), msg(2), msg(3)]

    run(main())


def test_session_settings_limit(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        s = make(kind, tmp_path, session_settings=SessionSettings(limit=2))
        await s.add_items([msg(i) for i in range(5)])
        assert await s.get_items() == [msg(3), msg(4)]
        assert await s.get_items(limit=3) == [msg(2), msg(3), msg(4)]

    run(main())


def test_pop_and_clear(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        s = make(kind, tmp_path)
        assert await s.pop_item() is None
        await s.add_items([msg(1), msg(2)])
        assert await s.pop_item() == msg(2)
        assert await s.get_items() == [msg(1)]
        await s.clear_session()
        assert await s.get_items() == []
        assert await s.pop_item() is None
        await s.add_items([msg(3)])
        assert await s.get_items() == [msg(3)]

    run(main())


def test_sessions_are_separate_and_persist(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        a, b = make(kind, tmp_path, "a"), make(kind, tmp_path, "b")
        await a.add_items([msg("a")])
        await b.add_items([msg("b")])
        assert await make(kind, tmp_path, "a").get_items() == [msg("a")]  # a fresh object
        assert await b.get_items() == [msg("b")]

    run(main())


def test_unicode_and_structured_items(kind: str, tmp_path: Path) -> None:
    items = [{"role": "user", "content": "héllo 🌍 \u2028 ‮ \x00 日本語"},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": [1, 2]}'},
             {"type": "function_call_output", "call_id": "c1", "output": "ok"}]

    async def main() -> None:
        s = make(kind, tmp_path)
        await s.add_items(items)
        assert await make(kind, tmp_path).get_items() == items

    run(main())


def test_many_items(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        s = make(kind, tmp_path)
        await s.add_items([msg(i) for i in range(500)])
        for i in range(500, 530):
            await s.add_items([msg(i)])
        got = await s.get_items()
        assert got == [msg(i) for i in range(530)]
        assert await s.get_items(limit=5) == [msg(i) for i in range(525, 530)]

    run(main())


def test_concurrent_add_items_from_two_tasks(kind: str, tmp_path: Path) -> None:
    async def main() -> list[Any]:
        s = make(kind, tmp_path)

        async def writer(tag: str) -> None:
            for i in range(15):
                await s.add_items([msg(f"{tag}{i}")])

        await asyncio.gather(writer("x"), writer("y"))
        return list(await s.get_items())

    got = [m["content"] for m in run(main())]
    assert sorted(got) == sorted([f"m{t}{i}" for t in "xy" for i in range(15)])
    for t in "xy":  # each task's items keep their order
        mine = [g for g in got if g.startswith(f"m{t}")]
        assert mine == [f"m{t}{i}" for i in range(15)]


CHILD_ADD = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from tests.test_openai_agents import make, msg
from pathlib import Path

async def main():
    s = make(sys.argv[2], Path(sys.argv[3]))
    for i in range(20):
        await s.add_items([msg(sys.argv[4] + str(i))])
asyncio.run(main())
"""


def test_concurrent_add_items_from_two_processes(kind: str, tmp_path: Path) -> None:
    if kind == "file":
        fsdurable.Store(tmp_path / "store")  # created once, before the race
    else:
        SQLiteSession("s1", tmp_path / "sessions.db").close()
    from .conftest import REPO

    procs = [subprocess.Popen([PYTHON, "-c", CHILD_ADD, str(REPO), kind, str(tmp_path), tag],
                              env=subprocess_env()) for tag in "pq"]
    assert [p.wait(120) for p in procs] == [0, 0]
    got = [m["content"] for m in run(make(kind, tmp_path).get_items())]
    assert sorted(got) == sorted(f"m{t}{i}" for t in "pq" for i in range(20))


def test_a_cancelled_add_happened_whole_or_not(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        s = make(kind, tmp_path)
        await s.add_items([msg(0)])
        for i in range(1, 6):
            batch = [msg(f"{i}a"), msg(f"{i}b")]
            task = asyncio.create_task(s.add_items(batch))
            await asyncio.sleep(0)  # started: the mutation is in a worker thread
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            got = await s.get_items()
            assert got[-2:] == batch, "a cancelled, started mutation must finish whole"
        # and nothing half-written: every item is whole and in order
        assert [m["content"] for m in await s.get_items()] == ["m0"] + [
            f"m{i}{x}" for i in range(1, 6) for x in "ab"]

    run(main())


def corrupt(kind: str, tmp_path: Path) -> None:
    if kind == "file":
        (tmp_path / "store" / "sessions" / "s1.json").write_bytes(b'{"format": "fsdurable.ses')
    else:
        import sqlite3

        db = sqlite3.connect(tmp_path / "sessions.db")
        db.execute("UPDATE agent_messages SET message_data = '{not json' WHERE id = 1")
        db.commit()
        db.close()


def test_a_corrupt_store_never_breaks_the_session(kind: str, tmp_path: Path) -> None:
    """Both keep working after corruption; what is lost differs (a row vs the file) and is
    checked per kind below. A FileSession read of a corrupt file raises UnreadableState; the
    next write has the repair gate quarantine it (an event) and starts the session over."""

    async def main() -> None:
        s = make(kind, tmp_path)
        await s.add_items([msg(1), msg(2)])
        corrupt(kind, tmp_path)
        if kind == "file":  # a read says so (a typed error) and moves nothing
            with pytest.raises(fsdurable.UnreadableState):
                await make(kind, tmp_path).get_items()
        else:  # SQLiteSession skips the bad row
            assert msg(1) not in await make(kind, tmp_path).get_items()
        s = make(kind, tmp_path)
        await s.add_items([msg(3)])
        assert (await s.get_items())[-1] == msg(3)

    run(main())
    if kind == "file":  # moved aside, never deleted, with an event: the document, and the
        # item log it named (named by nothing once the session started over)
        q = sorted((tmp_path / "store" / "quarantine").iterdir(),
                   key=lambda p: p.name.endswith(".log"))
        assert len(q) == 2 and q[0].read_bytes() == b'{"format": "fsdurable.ses'
        assert q[1].name.endswith("items-000000.log") and b"m2" in q[1].read_bytes()
        codes = [e.code for e in fsdurable.Store(tmp_path / "store").events("s1")]
        assert "session_quarantined" in codes


def test_non_json_items_are_refused_and_nothing_is_lost(tmp_path: Path) -> None:
    async def main() -> None:
        s = make("file", tmp_path)
        await s.add_items([msg(1)])
        with pytest.raises(fsdurable.InvalidState):
            await s.add_items([{"x": object()}])
        for bad in ({"x": [float("nan")]}, {"x": {"y": float("-inf")}}):
            with pytest.raises(fsdurable.InvalidState):  # never stored changed (as null):
                await s.add_items([msg(2), bad])         # refused whole
        assert await s.get_items() == [msg(1)]
        await s.add_items([{"n": 2**70}, {"s": "\ud800"}])  # as SQLiteSession's json.dumps:
        assert await make("file", tmp_path).get_items() == [  # read back exactly
            msg(1), {"n": 2**70}, {"s": "\ud800"}]

    run(main())


def test_an_item_nested_deeper_than_python_can_walk_is_a_typed_error(tmp_path: Path) -> None:
    deep: Any = "x"
    for _ in range(5000):
        deep = [deep]

    async def main() -> None:
        s = make("file", tmp_path)
        await s.add_items([msg(1)])
        with pytest.raises(fsdurable.InvalidState) as info:  # was a raw RecursionError
            await s.add_items([msg(2), {"role": "user", "content": deep}])
        assert info.value.reason == "too_deep" and info.value.session_id == "s1"
        assert await make("file", tmp_path).get_items() == [msg(1)]  # refused whole

    run(main())


def test_the_module_imports_without_agents(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['agents'] = None\n"  # an import of agents now fails
            "from fsdurable.openai_agents import FileSession\n"
            "import asyncio\n"
            "s = FileSession('x', sys.argv[1])\n"
            "asyncio.run(s.add_items([{'role': 'user', 'content': 'hi'}]))\n"
            "print(asyncio.run(s.get_items()))")
    out = subprocess.run([PYTHON, "-c", code, str(tmp_path / "st")], env=subprocess_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "'hi'" in out.stdout


def test_a_runner_uses_file_session_as_memory(tmp_path: Path) -> None:
    from agents import Agent
    from agents.testing import ScriptedModel, assistant_message

    async def main() -> list[Any]:
        s = oa.FileSession("mem", fsdurable.Store(tmp_path / "store"))
        agent = Agent(name="a", model=ScriptedModel([[assistant_message("one")],
                                                     [assistant_message("two")]]))
        await Runner.run(agent, "hi", session=s)
        await Runner.run(agent, "again", session=s)
        return list(await s.get_items())

    items = run(main())
    assert [i.get("content") if i.get("role") == "user" else i["content"][0]["text"]
            for i in items] == ["hi", "one", "again", "two"]


# ---------------------------------------------------------------------------------- durable runs


def child(mode: str, root: Path, log: Path, kill: str = "", script: str = "sums",
          debounce: float = 0, source: str = "", effects: str = ""
          ) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(OA_LOG=str(log), OA_KILL=kill, OA_SCRIPT=script,
                         OA_DEBOUNCE=str(debounce), OA_SOURCE=source, OA_EFFECTS=effects)
    return run_module("tests.oa_agent", [mode, str(root)], env, OA_WARM, timeout=120)


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture(scope="module")
def uncrashed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("uncrashed")
    p = child("run", tmp / "store", tmp / "log")
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    assert out["final"] == oa_agent.FINAL
    return out


@pytest.mark.parametrize("kill", ["model0", "add1", "model1", "add3", "model2", "model3"])
def test_sigkill_mid_run_then_recovered_in_a_fresh_process(tmp_path: Path, kill: str,
                                                           uncrashed: dict[str, Any]) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    p = child("run", root, log, kill)
    assert p.returncode == -9, p.stderr  # really SIGKILLed
    before = lines(log)
    store = fsdurable.Store(root)
    assert [m.session_id for m in store.interrupted()] == ["chat"]
    assert store.read_marker("chat") is not None and store.load("chat").in_progress
    r = child("recover", root, log)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    [o] = out["report"]["outcomes"]
    assert (o["outcome"], o["status"], o["attempts"]) == ("resumed", "completed", 1)
    # the conversation is the one an uncrashed run leaves
    assert out["items"] == uncrashed["items"]
    assert fsdurable.Store(root).interrupted() == []
    # no completed tool call ran twice: each ran once overall (the one killed mid-call, of an
    # effect-free tool, ran once to completion)
    done = [x for x in lines(log) if not x.startswith("model")]
    assert done == ["add 1 2", "add 3 4", "send ana"], (before, lines(log))
    codes = [e.code for e in fsdurable.Store(root).events("chat")]
    assert "interrupted_turn_resuming" in codes and "interrupted_turn_resumed" in codes


def test_items_written_after_the_last_checkpoint_are_not_duplicated(
        tmp_path: Path, uncrashed: dict[str, Any]) -> None:
    """A long debounce: no checkpoint since the start when the process dies after two
    effect-free tool calls, but the SDK had saved their items to the session. The resume
    restarts from the run's input; the session is back where the checkpoint said it was."""
    root, log = tmp_path / "store", tmp_path / "log"
    assert child("run", root, log, "model2", debounce=3600).returncode == -9
    r = child("recover", root, log)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["report"]["outcomes"][0]["status"] == "completed"
    assert out["items"] == uncrashed["items"]
    assert lines(log).count("send ana") == 1  # effect-free adds may repeat; the send never


def test_an_external_tool_in_doubt_parks_the_run_for_review(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    assert child("run", root, log, "send").returncode == -9
    r = child("recover", root, log)
    assert r.returncode == 0, r.stderr
    [o] = json.loads(r.stdout)["report"]["outcomes"]
    assert (o["outcome"], o["reason"]) == ("review_required", "in_doubt")
    assert "send ana" not in lines(log)  # never blindly re-run
    s = fsdurable.Store(root).load("chat")
    assert not s.in_progress and s.metadata["review_required"]["calls"][0]["tool"] == "send"


def test_a_resumed_run_rejects_tools_that_need_approval(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    assert child("run", root, log, "model0", script="delete").returncode == -9
    r = child("recover", root, log, script="delete")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    [o] = out["report"]["outcomes"]
    assert (o["outcome"], o["status"]) == ("resumed", "completed")
    assert not any(x.startswith("delete") for x in lines(log)), "an approval was granted"
    outputs = [i for i in out["items"] if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["d1"]  # the model was told: rejected
    assert "deleted /tmp/x" not in json.dumps(outputs)
    ev = [e for e in fsdurable.Store(root).events("chat") if e.code == "tool_refused"]
    assert ev and ev[0].reason == "approval_denied"  # the protocol's one reason, every driver


def test_an_attended_run_paused_for_approval_is_not_interrupted(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.setenv("OA_SCRIPT", "delete")
    monkeypatch.setenv("OA_LOG", str(tmp_path / "log"))
    store = fsdurable.Store(tmp_path / "store")

    async def main() -> Any:
        fs = oa.FileSession("chat", store)
        agent = oa_agent.make_agent()
        r = await oa.run(agent, "clean up", session=fs, attended=True, effects=oa_agent.EFFECTS)
        assert r.interruptions and store.interrupted() == []  # paused: not an interrupted turn
        assert not store.load("chat").in_progress
        # later, the human approves; the run continues from its kept state
        state = await oa.paused_state(agent, fs)
        assert state is not None
        [item] = state.get_interruptions()
        state.approve(item)
        r = await oa.run(agent, state, session=fs, attended=True, effects=oa_agent.EFFECTS)
        assert await oa.paused_state(agent, fs) is None
        return r.final_output

    assert run(main()) == "delete: done"
    assert lines(tmp_path / "log").count("delete /tmp/x") == 1
    assert store.interrupted() == []


def test_recover_leaves_other_sources_alone(tmp_path: Path) -> None:
    store = fsdurable.Store(tmp_path / "store")
    store.create("other", source="desktop")
    store.begin_turn("other", "hi")

    async def main() -> Any:
        return await oa.recover(oa_agent.make_agent(), store)

    assert run(main()).outcomes == ()
    assert [m.session_id for m in store.interrupted()] == ["other"]


def test_run_refuses_a_second_turn_and_bad_arguments(tmp_path: Path) -> None:
    store = fsdurable.Store(tmp_path / "store")
    store.create("busy", source="openai-agents")
    store.begin_turn("busy")

    async def main() -> None:
        fs = oa.FileSession("busy", store)
        with pytest.raises(fsdurable.TurnStateError):
            await oa.run(oa_agent.make_agent(), "x", session=fs)
        with pytest.raises(TypeError):
            await oa.run(oa_agent.make_agent(), "x", session=fs, **{"session": fs})
        with pytest.raises(fsdurable.InvalidState):
            await oa.run(oa_agent.make_agent(), "x", session=fs, effects={"add": "maybe"})

    run(main())
    assert store.load("busy").metadata == {}  # the interrupted turn's record was not touched
