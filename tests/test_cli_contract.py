"""The CLI never misleads: no store is made by a read, exit codes mean one thing each, errors are
one line with a next step, one --json vocabulary, help for every argument, lazy start-up."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fsdurable import Store, cli
from fsdurable.cli import main

from .conftest import PYTHON, REPO, subprocess_env

READS = [["sessions"], ["show", "a"], ["interrupted"], ["recover", "--dry-run"], ["recover"],
         ["events"], ["cancel", "a"], ["doctor"], ["doctor", "--repair"], ["conflicts"],
         ["node"], ["adopt", "a"], ["resolve", "a"], ["review"], ["review", "a", "--ran"],
         ["watch", "--timeout", "0.1"]]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    capsys.readouterr()
    code = main(list(argv))
    cap = capsys.readouterr()
    out: Any = cap.out
    if "--json" in argv and cap.out.strip():
        out = json.loads(cap.out)
    return code, out, cap.err


@pytest.mark.parametrize("argv", READS, ids=lambda a: " ".join(a))
def test_no_command_but_init_creates_a_store(argv: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    typo = tmp_path / "typo"
    code, _, err = run(capsys, *argv, "--root", str(typo))
    assert code == 2 and "no fsdurable store at" in err and "fsdurable init" in err, err
    assert not typo.exists()
    home = tmp_path / "home"  # an existing folder: nothing is added to it
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    code, _, err = run(capsys, *argv, "--root", str(home))
    assert code == 2 and "no fsdurable store" in err
    assert sorted(os.listdir(home)) == ["notes.txt"]
    assert "Traceback" not in err


def test_init_creates_and_says_when_it_already_exists(root: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "init", "--root", str(root), "--json")
    assert code == 0 and out["created"] is True
    code, out, _ = run(capsys, "init", "--root", str(root))
    assert code == 0 and "already exists" in out


def test_root_that_is_a_file_or_unreadable_is_one_line(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    code, _, err = run(capsys, "doctor", "--root", str(f))
    assert code == 2 and "is a file" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "init", "--root", str(f))
    assert code == 2 and "is a file" in err


def test_an_unreadable_root_is_one_line(root: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    Store(root)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **kw: False if str(p) == str(root)
                        else real(p, m, **kw))  # as a non-root user would see a 0000 directory
    code, _, err = run(capsys, "sessions", "--root", str(root))
    assert code == 2 and "permission denied" in err and len(err.strip().splitlines()) == 1


def test_internal_error_has_its_own_exit_code(root: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    Store(root)

    def boom(args: argparse.Namespace) -> cli.Result:
        raise KeyError("a bug")

    main(["sessions", "--root", str(root)])  # loads the handler
    _fn, text, add = cli._HANDLERS["sessions"]
    monkeypatch.setitem(cli._HANDLERS, "sessions", (boom, text, add))
    code, _, err = run(capsys, "sessions", "--root", str(root))
    assert code == cli.INTERNAL == 3 and "internal error" in err and "Traceback" not in err
    code, _, err = run(capsys, "sessions", "--root", str(root), "--debug")
    assert code == 3 and "Traceback" in err and "a bug" in err


def test_host_the_console_script_cannot_import(root: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    st = Store(root)
    st.create("a")
    for spec, want in (("no_such_mod_xyz:build", "PYTHONPATH"), ("nocolon", "MODULE:FACTORY"),
                       ("os:no_such_factory", "has no")):
        code, _, err = run(capsys, "adopt", "a", "--root", str(root), "--host", spec)
        assert code == 2 and want in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1


def test_negative_limits_are_usage_errors(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Store(root)
    code, _, err = run(capsys, "events", "--limit", "-3", "--root", str(root))
    assert code == 2 and "must be 0 or more" in err
    code, _, err = run(capsys, "watch", "--count", "-1", "--root", str(root))
    assert code == 2


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import fsdurable

    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"fsdurable {fsdurable.__version__}"


def test_every_argument_has_help() -> None:
    for name in cli.COMMANDS:
        cli._load(name)
    p = cli._parser(None)
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) >= set(cli.COMMANDS)
    missing = []
    for name, sp in [("fsdurable", p), *sub.choices.items()]:
        for a in sp._actions:
            if not a.help or a.help == argparse.SUPPRESS:
                missing.append(f"{name} {a.dest}")
    assert missing == []


def test_one_vocabulary(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st = Store(root)
    st.create("a")
    st.begin_turn("a", "hi")
    _, show, _ = run(capsys, "show", "a", "--root", str(root), "--json")
    assert show["session_id"] == "a" and "id" not in show
    _, intr, _ = run(capsys, "interrupted", "--root", str(root), "--json")
    _, rec, _ = run(capsys, "recover", "--dry-run", "--root", str(root), "--json")
    [i], [o] = intr["interrupted"], rec["outcomes"]
    shared = {"session_id", "turn_id", "node_id", "verdict", "age_seconds", "resume_attempts"}
    assert shared <= set(i) and shared <= set(o)
    assert isinstance(intr["interrupted"], list) and isinstance(rec["outcomes"], list)


def test_schema_command_prints_the_shipped_schemas(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schema", "--json")
    shipped_kinds = sorted(p.name.removesuffix(".schema.json")
                           for p in (REPO / "schemas").glob("*.schema.json"))
    assert code == 0 and out["schemas"][:5] == ["session", "segment", "marker", "event",
                                                "manifest"]
    assert sorted(out["schemas"]) == shipped_kinds  # every shipped schema can be printed
    for kind in out["schemas"]:
        code, doc, _ = run(capsys, "schema", kind, "--json")
        shipped = REPO / "schemas" / f"{kind}.schema.json"
        assert code == 0 and doc == json.loads(shipped.read_text("utf-8"))
    assert main(["schema", "nope"]) == 2


@pytest.mark.parametrize("argv", [["interrupted", "--json"], ["recover", "--dry-run", "--json"]],
                         ids=lambda a: " ".join(a))
def test_the_startup_commands_import_only_what_they_need(argv: list[str], root: Path) -> None:
    """Lazy sub-commands: listing interrupted turns (or their dry-run verdicts) loads no other
    command's module, no agent loop, no attrs, no asyncio."""
    st = Store(root)
    st.create("a")
    st.begin_turn("a", "hi")
    code = ("import sys, io, contextlib\nfrom fsdurable.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = main({[*argv, '--root', str(root)]!r})\n"
            "print(rc, ' '.join(sorted(sys.modules)))")
    r = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), capture_output=True,
                       text=True, timeout=60)
    rc, mods = r.stdout.split(" ", 1)
    assert rc == "0", r.stderr
    loaded = set(mods.split())
    for heavy in ("fsdurable._sync", "fsdurable.cli._sync", "fsdurable.demo", "fsdurable._watch",
                  "fsdurable.cli._store", "fsdurable._doctor", "fsdurable._recovery",
                  "fsdurable._loop", "watchfiles", "attrs", "cattrs", "asyncio", "ssl"):
        assert heavy not in loaded, heavy


def test_demo_runs_in_a_temporary_store_of_its_own(tmp_path: Path) -> None:
    real = tmp_path / "users-real-store"
    env = subprocess_env(FSDURABLE_ROOT=str(real), TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    p = subprocess.run([PYTHON, "-m", "fsdurable", "demo", "--json"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["ok"] and data["temporary"] is True
    assert not real.exists()  # the user's store was never touched
    assert not os.path.exists(data["root"])  # the temporary store is gone
    assert os.listdir(tmp_path / "tmp") == []


FAST_SHAPES = [
    ["interrupted"], ["interrupted", "--json"], ["--root", "R", "interrupted", "--json"],
    ["interrupted", "--root", "R"], ["--root=R", "interrupted"], ["interrupted", "--root="],
    ["--json", "--root", "A", "interrupted", "--root", "B", "--debug"],
    ["recover", "--dry-run", "--json"], ["--root", "R", "recover", "--json", "--dry-run"],
    ["recover"], ["recover", "--dry-run", "--dry-run"],
    # not fast: argparse parses (or reports) these
    ["--dry-run", "recover"], ["interrupted", "--dry-run"], ["interrupted", "-h"],
    ["interrupted", "--root"], ["interrupted", "--root", "--json"], ["interrupted", "x"],
    ["recover", "--dry"], ["--version"], [], ["sessions"], ["interrupted", "interrupted"],
    ["interrupted", "--"],
]


@pytest.mark.parametrize("argv", FAST_SHAPES, ids=lambda a: " ".join(a) or "(none)")
def test_the_fast_parser_agrees_with_argparse(argv: list[str]) -> None:
    fast = cli._fast(argv)
    if fast is None:
        return  # argparse's business
    for name in cli._FAST:
        cli._load(name)
    args = cli._parser(fast.command).parse_args(argv)
    want = {"root": None, "json": False, "debug": False, **vars(args)}
    assert vars(fast) == want


def test_the_fast_path_never_imports_argparse(root: Path) -> None:
    Store(root)
    code = ("import sys, io, contextlib\nfrom fsdurable.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    a = main(['interrupted', '--json', '--root', {str(root)!r}])\n"
            f"    b = main(['--root={root}', 'recover', '--dry-run'])\n"
            "print(a, b, 'argparse' in sys.modules)")
    r = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.split() == ["0", "0", "False"], r.stderr


def _walk(x: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(x, dict):
        out.append((path, x))
        for k, v in x.items():
            if k != "messages":  # the transcript is the file format (tool calls carry an id)
                out += _walk(v, f"{path}.{k}")
    elif isinstance(x, list):
        for v in x:
            out += _walk(v, f"{path}[]")
    return out


def test_every_json_output_speaks_one_vocabulary(root: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    st = Store(root)
    for sid in ("idle", "busy"):
        st.create(sid)
    st.begin_turn("busy", "go")
    r = str(root)
    for argv in (["init"], ["sessions"], ["show", "busy"], ["interrupted"],
                 ["recover", "--dry-run"], ["events"], ["doctor"], ["conflicts"], ["node"],
                 ["review"], ["cancel", "busy"], ["recover"]):
        code, out, err = run(capsys, *argv, "--root", r, "--json")
        assert code in (0, 1), (argv, err)
        for where, d in _walk(out):
            assert "id" not in d, (argv, where)  # always session_id / turn_id / node_id ...
            assert not {"idle", "busy"} & set(d), (argv, where)  # lists, not maps by id
