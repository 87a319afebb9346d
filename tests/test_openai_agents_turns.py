"""The Agents SDK driver on the one turn protocol (issue 17, items 10-14): the unattended
deny-list, stored approvals, the driver recorded in the turn (never the source), in-doubt calls
parked with their arguments and continued after a human's answer, a corrupt session read.
Real child processes, a real SIGKILL, the SDK's offline ScriptedModel."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no network, ever
if os.environ.get("CI") == "true":
    import agents  # noqa: F401
else:
    pytest.importorskip("agents", reason="the openai-agents extra is not installed")

import fsdurable
from fsdurable import openai_agents as oa

from . import oa_agent
from .conftest import PYTHON, subprocess_env
from .test_openai_agents import child, lines


def events(root: Path, code: str) -> list[Any]:
    return [e for e in fsdurable.Store(root).events("chat") if e.code == code]


def outcome(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert p.returncode == 0, p.stderr
    [o] = json.loads(p.stdout)["report"]["outcomes"]
    return dict(o)


def cli(root: Path, *argv: str) -> tuple[int, Any]:
    p = subprocess.run([PYTHON, "-m", "fsdurable", "--root", str(root), *argv, "--json"],
                       env=subprocess_env(), capture_output=True, text=True, timeout=60)
    return p.returncode, json.loads(p.stdout)


def test_a_recovered_run_refuses_a_deny_listed_tool(tmp_path: Path) -> None:
    """Item 10: on ac1847b the recovered run executed shell("rm -rf ~/build"), no event."""
    root, log = tmp_path / "store", tmp_path / "log"
    assert child("run", root, log, "model0", script="shell").returncode == -9
    o = outcome(child("recover", root, log, script="shell"))
    assert (o["outcome"], o["status"]) == ("resumed", "completed")
    assert not any(x.startswith("shell") for x in lines(log)), "a deny-listed tool ran"
    [ev] = events(root, "tool_refused")
    assert ev.reason == "unattended_deny" and ev.detail["tool"] == "shell"
    out = [i for i in oa_items(root) if i.get("type") == "function_call_output"]
    assert [i["call_id"] for i in out] == ["s1"] and "refused" in json.dumps(out)


def test_a_live_unattended_run_refuses_a_deny_listed_tool(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    p = child("run", root, log, script="shell")
    assert p.returncode == 0, p.stderr
    assert not any(x.startswith("shell") for x in lines(log))  # run() is unattended by default
    assert [e.reason for e in events(root, "tool_refused")] == ["unattended_deny"]


def test_a_stored_approval_is_not_honoured_by_an_unattended_resume(tmp_path: Path) -> None:
    """Item 11: on ac1847b the resume ran the approved delete again with nobody present."""
    root, log = tmp_path / "store", tmp_path / "log"
    assert child("approve", root, log, "delete", script="delete").returncode == -9
    assert fsdurable.Store(root).load("chat").in_progress  # killed inside the approved call
    o = outcome(child("recover", root, log, script="delete"))
    assert (o["outcome"], o["status"]) == ("resumed", "completed")
    assert not any(x.startswith("delete") for x in lines(log)), "a stored approval was honoured"
    assert "approval_denied" in [e.reason for e in events(root, "tool_refused")]


def test_an_effectful_approved_call_in_doubt_is_parked(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    eff = json.dumps({"delete": "external"})
    assert child("approve", root, log, "delete", script="delete", effects=eff).returncode == -9
    s = fsdurable.Store(root).load("chat")
    assert s.in_progress and s.turn is not None
    [entry] = s.turn.ledger  # the intent, with its arguments, before the call
    assert (entry.name, entry.status, entry.arguments) == ("delete", "intent", {"path": "/tmp/x"})
    o = outcome(child("recover", root, log, script="delete", effects=eff))
    assert (o["outcome"], o["reason"]) == ("review_required", "in_doubt")
    assert not any(x.startswith("delete") for x in lines(log))


def oa_items(root: Path) -> list[Any]:
    from fsdurable.openai_agents import FileSession

    return list(asyncio.run(FileSession("chat", fsdurable.Store(root)).get_items()))


@pytest.mark.parametrize("source", ["desktop", "api"])
def test_the_driver_owns_the_run_whatever_the_source(tmp_path: Path, source: str) -> None:
    """Item 12: on ac1847b oa.recover did not see a run on a session of another source, and
    fsdurable.recover with an AgentLoop took it over and ended it with its own reply."""
    root, log = tmp_path / "store", tmp_path / "log"
    assert child("run", root, log, "model1", source=source).returncode == -9
    p = child("recover_loop", root, log)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["report"]["outcomes"] == []
    s = fsdurable.Store(root).load("chat")
    assert s.in_progress and s.turn is not None and s.turn.driver == "openai-agents"
    assert s.source == source  # the loop wrote no reply (the run's own input may be there)
    assert [m for m in s.messages if m.role == "assistant"] == []
    o = outcome(child("recover", root, log))
    assert (o["outcome"], o["status"]) == ("resumed", "completed")
    [started] = events(root, "turn_started")
    assert started.detail["driver"] == "openai-agents"


def test_a_parked_call_shows_its_arguments_and_the_run_continues(tmp_path: Path) -> None:
    """Item 13: on ac1847b `fsdurable review` showed "arguments": null for the parked send,
    and after --did-not-run the Agents SDK run could not be continued."""
    root, log = tmp_path / "store", tmp_path / "log"
    assert child("run", root, log, "send").returncode == -9
    assert outcome(child("recover", root, log))["outcome"] == "review_required"
    _, doc = cli(root, "review", "chat")
    [c] = doc["review"]
    assert (c["tool"], c["arguments"]) == ("send", {"to": "ana"})
    assert cli(root, "review", "chat", "--did-not-run")[0] == 0
    p = child("continue", root, log)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["final"] == oa_agent.FINAL
    assert lines(log).count("send ana") == 1  # it had not run: it ran now, once
    s = fsdurable.Store(root).load("chat")
    assert not s.in_progress and fsdurable.Store(root).interrupted() == []
    p = child("continue", root, log)  # nothing left to continue
    assert p.returncode != 0 and "TurnStateError" in p.stderr


def test_a_call_answered_ran_is_not_run_again_when_the_run_continues(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    assert child("run", root, log, "send").returncode == -9
    assert outcome(child("recover", root, log))["outcome"] == "review_required"
    assert cli(root, "review", "chat", "--ran")[0] == 0
    p = child("continue", root, log)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["final"] == oa_agent.FINAL
    assert "send ana" not in lines(log)
    out = [i for i in oa_items(root) if i.get("type") == "function_call_output"
           and i["call_id"] == "c3"]
    assert len(out) == 1 and "ran" in json.dumps(out)


def test_continue_refuses_while_a_call_waits_for_its_answer(tmp_path: Path) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    assert child("run", root, log, "send").returncode == -9
    assert outcome(child("recover", root, log))["outcome"] == "review_required"
    p = child("continue", root, log)
    assert p.returncode != 0 and "review" in p.stderr
    assert "send ana" not in lines(log)


def test_a_read_of_a_corrupt_session_raises_and_moves_nothing(tmp_path: Path) -> None:
    """Item 14: on ac1847b get_items returned [] with no error and no event."""
    store = fsdurable.Store(tmp_path / "store")
    fs = oa.FileSession("s1", store)
    asyncio.run(fs.add_items([{"role": "user", "content": "hi"}]))
    path = tmp_path / "store" / "sessions" / "s1.json"
    path.write_bytes(b'{"format": "fsdurable.ses')
    with pytest.raises(fsdurable.UnreadableState):
        asyncio.run(oa.FileSession("s1", store).get_items())
    assert path.read_bytes() == b'{"format": "fsdurable.ses'  # a read never moves a file
    assert not (tmp_path / "store" / "quarantine").exists() or not any(
        (tmp_path / "store" / "quarantine").iterdir())
    # a write goes through the repair gate: quarantined with an event, the session starts over
    asyncio.run(fs.add_items([{"role": "user", "content": "again"}]))
    assert asyncio.run(fs.get_items()) == [{"role": "user", "content": "again"}]
    assert "session_quarantined" in [e.code for e in store.events("s1")]


def test_user_hooks_compose_with_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19: on ac1847b oa.run(..., hooks=...) raised TypeError."""
    from agents import RunHooks

    monkeypatch.setenv("OA_LOG", str(tmp_path / "log"))
    seen: list[str] = []

    class Mine(RunHooks[Any]):
        async def on_llm_start(self, *a: Any) -> None:
            seen.append("llm")

        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
            seen.append(f"tool {tool.name}")

    store = fsdurable.Store(tmp_path / "store")

    async def main() -> Any:
        fs = oa.FileSession("chat", store)
        return await oa.run(oa_agent.make_agent(), "add", session=fs, effects=oa_agent.EFFECTS,
                            hooks=Mine(), debounce=0)

    assert asyncio.run(main()).final_output == oa_agent.FINAL
    assert seen == ["llm", "tool add", "llm", "tool add", "llm", "tool send", "llm"]
    codes = [e.code for e in store.events("chat")]
    assert codes.count("turn_started") == 1 and "turn_completed" in codes


def test_a_streamed_run_yields_events_as_they_come_and_is_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19: a durable run_streamed — the turn is in progress (its marker on disk) while
    the caller reads the events, and ends with the stream."""
    monkeypatch.setenv("OA_LOG", str(tmp_path / "log"))
    store = fsdurable.Store(tmp_path / "store")
    live: list[bool] = []

    async def main() -> Any:
        fs = oa.FileSession("chat", store)
        stream = oa.run_streamed(oa_agent.make_agent(), "add", session=fs,
                                 effects=oa_agent.EFFECTS, debounce=0)
        kinds = []
        async for e in stream:
            kinds.append(type(e).__name__)
            live.append(store.read_marker("chat") is not None)
        assert stream.status == "completed" and stream.final_output == oa_agent.FINAL
        return kinds

    kinds = asyncio.run(main())
    assert "RunItemStreamEvent" in kinds and all(live)  # durable while streaming
    assert store.interrupted() == [] and not store.load("chat").in_progress


def test_leaving_a_stream_early_cancels_the_turn(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OA_LOG", str(tmp_path / "log"))
    store = fsdurable.Store(tmp_path / "store")

    async def main() -> None:
        fs = oa.FileSession("chat", store)
        stream = oa.run_streamed(oa_agent.make_agent(), "add", session=fs,
                                 effects=oa_agent.EFFECTS)
        gen = stream.stream_events()
        async for _ in gen:
            break
        await gen.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())
    assert store.interrupted() == [] and not store.load("chat").in_progress
    assert "turn_cancelled" in [e.code for e in store.events("chat")]


@pytest.mark.parametrize("kill", ["model1", "model3"])
def test_a_killed_streamed_run_recovers_to_the_uncrashed_end(tmp_path: Path, kill: str) -> None:
    root, log = tmp_path / "store", tmp_path / "log"
    assert child("stream", root, log, kill).returncode == -9
    p = child("recover", root, log)
    o = outcome(p)
    assert (o["outcome"], o["status"]) == ("resumed", "completed")
    assert [x for x in lines(log) if not x.startswith("model")] == [
        "add 1 2", "add 3 4", "send ana"]
