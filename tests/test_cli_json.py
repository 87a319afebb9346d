"""One JSON contract: with --json EVERY command prints exactly one JSON document on stdout, for
good input and bad (a missing store, an argparse error, a bad id, a symlink-loop root, Ctrl-C, a
bug), and an error's document carries the exit code; ``watch --json`` is JSON Lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fsdurable import InvalidRoot, InvalidSessionId, Store, cli
from fsdurable.cli import main

from .conftest import PYTHON, REPO, subprocess_env

# every command with a good input; "{sid}" is a session with a turn in progress
GOOD: dict[str, list[list[str]]] = {
    "init": [["init"]],
    "sessions": [["sessions"]],
    "show": [["show", "{sid}"]],
    "interrupted": [["interrupted"]],
    "recover": [["recover", "--dry-run"], ["recover"]],
    "review": [["review"], ["review", "{sid}"]],
    "events": [["events"], ["events", "--session", "{sid}"]],
    "cancel": [["cancel", "{sid}"]],
    "doctor": [["doctor"]],
    "schema": [["schema"], ["schema", "session"]],
    "demo": [["demo"]],
    "adopt": [["adopt", "{sid}"]],
    "resolve": [["resolve", "{sid}"]],
    "conflicts": [["conflicts"]],
    "watch": [["watch", "--initial", "--count", "1"]],
    "ignore-file": [["ignore-file", "stignore"]],
    "node": [["node"]],
    "quarantine": [["quarantine"]],
    "timeline": [["timeline"], ["timeline", "{sid}"]],
}
# commands that need no store (the rest refuse a path without one)
NO_STORE = {"init", "schema", "demo", "ignore-file"}
# commands that take a session id
WITH_ID = {"show": [], "cancel": [], "adopt": [], "resolve": [], "review": [],
           "events": ["--session"], "timeline": []}


def _json_run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, Any, str]:
    """Run in process; stdout must be exactly one JSON document (whole, nothing around it)."""
    capsys.readouterr()
    code = main([*argv, "--json"])
    cap = capsys.readouterr()
    try:
        doc = json.loads(cap.out)
    except ValueError as e:
        raise AssertionError(f"{argv}: stdout is not one JSON document: {cap.out!r}") from e
    assert not isinstance(doc, dict) or doc.get("exit_code", code) == code, (argv, doc)
    if _is_error(doc):
        assert code != 0 and isinstance(doc["error"], str), (argv, doc)
        assert len(cap.err.strip().splitlines()) == 1, (argv, cap.err)  # one line on stderr
        assert "Traceback" not in cap.err
    return code, doc, cap.err


def _is_error(doc: Any) -> bool:
    """An error's document: its type in "error", its exit code in "exit_code" (an outcome's
    "error": null is no error document)."""
    return isinstance(doc, dict) and "exit_code" in doc and doc["exit_code"] != 0


def _store(root: Path) -> str:
    st = Store(root, node_id="laptop")  # another node's turn: `adopt` has one to take over
    st.create("a")
    st.begin_turn("a", "hi")
    return "a"


def test_the_tables_name_every_command() -> None:
    assert set(GOOD) == set(cli.COMMANDS)
    assert set(cli.COMMANDS) >= NO_STORE and set(WITH_ID) <= set(cli.COMMANDS)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_input_is_one_json_document(name: str, root: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sid = _store(root)
    for argv in GOOD[name]:
        argv = [a.format(sid=sid) for a in argv]
        where = ["--root", str(tmp_path / "demo")] if name == "demo" else ["--root", str(root)]
        if name == "watch":  # JSON Lines: one object per line
            capsys.readouterr()
            assert main([*argv, *where, "--json"]) == 0
            cap = capsys.readouterr()
            lines = cap.out.splitlines()
            assert len(lines) == 1 and json.loads(lines[0])["session_id"] == sid
            assert "watching" in cap.err  # it says it started (stderr: never the JSON channel)
            continue
        code, doc, _ = _json_run(capsys, [*argv, *where])
        assert code in (0, 1) and not _is_error(doc), (argv, doc)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_bad_input_is_one_json_document_with_its_exit_code(
        name: str, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sid = _store(root)
    first = [a.format(sid=sid) for a in GOOD[name][-1]]
    # an unknown flag: argparse's error, as a document
    code, doc, _ = _json_run(capsys, [*first, "--no-such-flag", "--root", str(root)])
    assert code == 2 and doc["error"] == "UsageError" and "--no-such-flag" in doc["message"]
    if name not in NO_STORE:  # a path that holds no store
        code, doc, _ = _json_run(capsys, [*first, "--root", str(tmp_path / "typo")])
        assert code == 2 and "no fsdurable store" in doc["message"], doc
        assert not (tmp_path / "typo").exists()
    if name in WITH_ID:  # a bad id, and one that names no session
        flag = WITH_ID[name]
        for bad in ("..", "../../etc/passwd", "a/b"):
            code, doc, _ = _json_run(capsys, [name, *flag, bad, "--root", str(root)])
            assert code == 2 and doc["error"] == "InvalidSessionId", doc
        code, doc, _ = _json_run(capsys, [name, *flag, "nope", "--root", str(root)])
        assert code == 1 and doc["error"] == "SessionNotFound", doc


def test_help_version_and_no_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = _json_run(capsys, ["--help"])
    assert code == 0 and "COMMAND" in doc["help"] and doc["exit_code"] == 0
    code, doc, _ = _json_run(capsys, ["show", "--help"])
    assert code == 0 and "session_id" in doc["help"]
    code, doc, _ = _json_run(capsys, ["--version"])
    import fsdurable

    assert code == 0 and doc["version"] == fsdurable.__version__
    code, doc, _ = _json_run(capsys, [])
    assert code == 2 and doc["error"] == "UsageError"
    code, doc, _ = _json_run(capsys, ["no-such-command"])
    assert code == 2 and "no-such-command" in doc["message"]


def test_not_found_is_one_answer(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`events --session nope` and `show nope` agree (it said `(no events)`, exit 0); a session
    that is gone but whose events remain still has them listed."""
    _store(root)
    _, show, _ = _json_run(capsys, ["show", "nope", "--root", str(root)])
    _, evs, _ = _json_run(capsys, ["events", "--session", "nope", "--root", str(root)])
    assert show == evs and show["error"] == "SessionNotFound"
    st = Store(root)
    st.create("gone")
    st.begin_turn("gone", "x")
    st.cancel("gone")
    st.delete("gone")
    code, doc, _ = _json_run(capsys, ["events", "--session", "gone", "--root", str(root)])
    assert code == 0 and doc["events"]


def test_events_session_id_is_validated(root: Path, tmp_path: Path) -> None:
    """`events --session ..` read `*.jsonl` files outside the store's session directories."""
    st = Store(root)
    with pytest.raises(InvalidSessionId):
        st.events("..")
    with pytest.raises(InvalidSessionId):
        st.events("../../x")


def test_a_symlink_loop_root_is_a_usage_error(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """It was `internal error: OSError: [Errno 40] ... please report it`, exit 3."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for root in (tmp_path / "a", tmp_path / "a" / "deeper"):
        with pytest.raises(InvalidRoot) as info:
            Store(root)
        assert isinstance(info.value, ValueError) and info.value.reason == "symlink_loop"
        with pytest.raises(InvalidRoot):
            Store(root, create=True)
        for argv in (["sessions"], ["init"], ["interrupted"], ["recover", "--dry-run"]):
            code, doc, _ = _json_run(capsys, [*argv, "--root", str(root)])
            assert code == 2 and doc["error"] == "InvalidRoot", doc
            capsys.readouterr()
            assert main([*argv, "--root", str(root)]) == 2
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1 and "symlink loop" in err


def test_ctrl_c_is_one_line_and_exit_130(root: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _store(root)
    main(["sessions", "--root", str(root)])  # loads the handler

    def interrupted(args: Any) -> cli.Result:
        raise KeyboardInterrupt

    _fn, text, add = cli._HANDLERS["sessions"]
    monkeypatch.setitem(cli._HANDLERS, "sessions", (interrupted, text, add))
    capsys.readouterr()
    assert main(["sessions", "--root", str(root)]) == 130
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.strip() == "fsdurable: interrupted"
    code, doc, _ = _json_run(capsys, ["sessions", "--root", str(root)])
    assert code == 130 and doc["error"] == "Interrupted"


@pytest.mark.parametrize("argv", [["watch"], ["watch", "--json"], ["watch", "--poll"]])
def test_ctrl_c_in_a_real_process(argv: list[str], root: Path) -> None:
    """SIGINT to a running `fsdurable watch`: one line, exit 130, no traceback (it was exit 0,
    and a Ctrl-C elsewhere a traceback)."""
    _store(root)
    p = subprocess.Popen([PYTHON, "-m", "fsdurable", *argv, "--root", str(root)],
                         env=subprocess_env(), cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    started = p.stderr.readline()  # it says it started: then it is in the watch loop
    assert "watching" in started, started
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (out, err)
    assert err.strip() == "fsdurable: interrupted" and "Traceback" not in err
    if "--json" in argv:
        assert [json.loads(line)["exit_code"] for line in out.splitlines()] == [130]


def test_interrupt_during_import_or_parse_is_clean(root: Path) -> None:
    """Ctrl-C while a command is still starting (here: raised by a signal mid-run of a slow
    handler in a real process) is the same one line."""
    _store(root)
    code = ("import os, signal, sys\nfrom fsdurable import cli\n"
            "cli._load('doctor')\nfn, t, a = cli._HANDLERS['doctor']\n"
            "def slow(args):\n    os.kill(os.getpid(), signal.SIGINT)\n    return fn(args)\n"
            "cli._HANDLERS['doctor'] = (slow, t, a)\n"
            f"sys.exit(cli.main(['doctor', '--root', {str(root)!r}]))\n")
    r = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 130 and r.stderr.strip() == "fsdurable: interrupted", r.stderr
    assert os.path.exists(root / "fsdurable.json")
