"""The everyday surface: events --since/--code/--follow, ISO 8601 times with their offset,
tables that fit the terminal, progress on a terminal only (never with --json)."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fsdurable import Store
from fsdurable.cli import Progress, main, table

from .conftest import PYTHON, REPO, subprocess_env

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


def _store(root: Path) -> Store:
    clock = [time.time() - 7200]
    st = Store(root, clock=lambda: clock[0])
    st.create("a")
    st.begin_turn("a", "hi")  # two hours ago
    clock[0] = time.time() - 60
    st.cancel("a")  # a minute ago
    return st


def test_events_since_and_code(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store(root)
    r = str(root)

    def codes(*argv: str) -> list[str]:
        code, out = _run(capsys, "events", "--root", r, "--json", *argv)
        assert code == 0
        return [e["code"] for e in json.loads(out)["events"]]

    assert codes() == ["turn_started", "turn_cancelled"]
    assert codes("--since", "10m") == ["turn_cancelled"]
    assert codes("--since", "3h") == ["turn_started", "turn_cancelled"]
    an_hour_ago = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 3600))
    assert codes("--since", an_hour_ago) == ["turn_cancelled"]  # naive: local time
    utc = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 3600))
    assert codes("--since", utc) == ["turn_cancelled"]
    assert codes("--code", "turn_started") == ["turn_started"]
    assert codes("--code", "turn_started,turn_cancelled", "--since", "1h") == ["turn_cancelled"]
    assert codes("--code", "turn_started", "--code", "turn_cancelled") == [
        "turn_started", "turn_cancelled"]
    assert main(["events", "--root", r, "--since", "yesterday"]) == 2


def test_times_are_iso_8601_with_the_offset(root: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _store(root)
    _, out = _run(capsys, "events", "--root", str(root))
    stamps = [line.split()[0] for line in out.splitlines()[2:]]
    assert len(stamps) == 2 and all(ISO.fullmatch(s) for s in stamps), out


def test_events_follow_prints_new_events_until_ctrl_c(root: Path) -> None:
    st = _store(root)
    p = subprocess.Popen([PYTHON, "-m", "fsdurable", "events", "--follow", "--json",
                          "--code", "turn_started", "--root", str(root)],
                         env=subprocess_env(), cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stderr is not None
    assert json.loads(p.stdout.readline())["code"] == "turn_started"  # the one already there
    assert "following" in p.stderr.readline()
    st.create("b")
    st.begin_turn("b", "again")  # turn_started: shown; the cancel below is not asked for
    st.cancel("b")
    new = json.loads(p.stdout.readline())
    assert (new["code"], new["session_id"]) == ("turn_started", "b")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert [json.loads(line)["error"] for line in out.splitlines()] == ["Interrupted"]


def test_tables_fit_the_terminal_width(root: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    rows = [["problem", "unreadable_session", "x" * 20, "quarantine", "/a/very/long/path/" * 8,
             "the detail of the finding, which is long " * 3]]
    header = ["severity", "finding", "session", "repair", "path", "detail"]
    text = table(rows, header, width=80)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "…" in text and text.splitlines()[0].startswith("severity  finding")
    st = Store(root)
    for n in range(3):
        with open(os.path.join(st.layout.sessions, f"bad{n}.json"), "w") as f:
            f.write("{" * 300)
    monkeypatch.setenv("COLUMNS", "72")
    code, out = _run(capsys, "doctor", "--root", str(root))
    assert code == 1 and all(len(line) <= 72 for line in out.splitlines()), out
    monkeypatch.delenv("COLUMNS")
    code, out = _run(capsys, "doctor", "--root", str(root))  # piped: whole rows
    assert max(len(line) for line in out.splitlines()) > 72


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("as_json", [False, True])
def test_progress_only_on_a_terminal_and_never_with_json(
        as_json: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    err = _Tty()
    monkeypatch.setattr("sys.stderr", err)
    with Progress(argparse.Namespace(json=as_json), "doctor: scanning"):
        time.sleep(1.2)
    text = err.getvalue()
    if as_json:
        assert text == ""
    else:
        assert "doctor: scanning" in text and text.endswith("\r\x1b[2K")  # erased when done
    quick = _Tty()
    monkeypatch.setattr("sys.stderr", quick)
    with Progress(argparse.Namespace(json=False), "doctor: scanning"):
        pass  # a quick command shows nothing but the erase
    assert "doctor" not in quick.getvalue()


def test_no_progress_when_stderr_is_no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with Progress(argparse.Namespace(json=False), "doctor: scanning"):
        time.sleep(0.6)
    assert err.getvalue() == ""


def test_doctor_shows_progress_on_a_tty(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """doctor over a big store runs for seconds: on a terminal it says so (a slowed scan)."""
    import fsdurable._doctor as doctor_mod

    Store(root)
    real = doctor_mod.doctor

    def slow(*a: object, **kw: object) -> object:
        time.sleep(0.8)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(doctor_mod, "doctor", slow)
    err = _Tty()
    monkeypatch.setattr("sys.stderr", err)
    assert main(["doctor", "--root", str(root)]) == 0
    assert "doctor: scanning" in err.getvalue()
    err2 = _Tty()
    monkeypatch.setattr("sys.stderr", err2)
    capsys.readouterr()
    assert main(["doctor", "--root", str(root), "--json"]) == 0
    assert "scanning" not in err2.getvalue()
    json.loads(capsys.readouterr().out)  # stdout: exactly the document


@pytest.mark.parametrize("source", ["langgraph", "openai-agents", "pydantic-ai"])
def test_interrupted_and_recover_name_the_same_adapter_runs(
        source: str, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An adapter's interrupted run: `interrupted` listed it, `recover --dry-run` (and recover)
    left it out; now both name it, and recover says which driver's recover() resumes it."""
    st = Store(root)
    st.create("mine")
    st.begin_turn("mine", "hi")
    st.create("theirs", source=source)
    st.begin_turn("theirs", "hi")
    r = str(root)
    _, out = _run(capsys, "interrupted", "--root", r, "--json")
    listed = {d["session_id"]: d["driver"] for d in json.loads(out)["interrupted"]}
    assert listed == {"mine": "loop", "theirs": source}
    for argv, outcome in ((["recover", "--dry-run"], "would_leave"), (["recover"], "left")):
        code, out = _run(capsys, *argv, "--root", r, "--json")
        assert code == 0
        got = {d["session_id"]: d for d in json.loads(out)["outcomes"]}
        assert set(got) == set(listed), (argv, got)
        assert got["theirs"]["outcome"] == outcome and source in got["theirs"]["reason"]
    assert {m.session_id for m in st.interrupted()} == {"mine", "theirs"}  # nothing run


def test_show_understands_adapter_sessions(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`show` said `0 messages` of a Pydantic AI conversation, knew no LangGraph thread by its
    thread id, and no Agents SDK item count; each adapter's describe() now tells."""
    import asyncio
    from typing import TypedDict

    from agents import Agent, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message
    from langgraph.graph import START, StateGraph
    from pydantic_ai import Agent as PAgent
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.models.test import TestModel

    from fsdurable import openai_agents as oa
    from fsdurable.langgraph import FsDurableSaver
    from fsdurable.pydantic_ai import FileConversationStore

    root = tmp_path / "store"
    st = Store(root)

    class State(TypedDict):
        n: int

    builder = StateGraph(State)
    builder.add_node("double", lambda s: {"n": s["n"] * 2})
    builder.add_edge(START, "double")
    graph = builder.compile(checkpointer=FsDurableSaver(st))
    assert graph.invoke({"n": 2}, {"configurable": {"thread_id": "user-42/chat 1"}}) == {"n": 4}

    set_tracing_disabled(True)
    agent = Agent(name="a", model=ScriptedModel([[assistant_message("hi")]]))
    asyncio.run(oa.run(agent, "hello", session=oa.FileSession("chat-oa", st)))

    conversations = FileConversationStore(st)
    bot = PAgent(TestModel(custom_output_text="pong"))

    async def turn(prompt: str) -> None:
        conv = await conversations.load("chat-p") or Conversation(conversation_id="chat-p")
        await conversations.save(await bot.run(prompt, conversation=conv))

    asyncio.run(turn("ping"))
    asyncio.run(turn("ping again"))
    r = str(root)
    code, out = _run(capsys, "show", "user-42/chat 1", "--root", r, "--json")
    a = json.loads(out)["langgraph"]
    assert code == 0 and a["thread_id"] == "user-42/chat 1"
    assert a["run"] == "ended" and a["checkpoints"][""]
    code, out = _run(capsys, "show", "user-42/chat 1", "--root", r)
    assert "LangGraph thread 'user-42/chat 1'" in out
    code, out = _run(capsys, "show", "chat-oa", "--root", r, "--json")
    a = json.loads(out)["adapter"]
    assert a["kind"] == "openai-agents session" and a["items"] == 2  # the input, the reply
    code, out = _run(capsys, "show", "chat-p", "--root", r, "--json")
    a = json.loads(out)["adapter"]
    assert a["kind"] == "pydantic-ai conversation" and a["messages"] == 4
    assert [m["text"] for m in a["last"]] == ["ping", "pong", "ping again", "pong"]
    code, out = _run(capsys, "show", "chat-p", "--root", r)
    assert "Pydantic AI conversation: 4 messages" in out and "0 messages" not in out
    assert main(["show", "no/such thread", "--root", r]) == 2  # still a bad id, not found
