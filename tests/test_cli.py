"""The CLI, in process: every command with --json, exit codes 0 / 1 / 2, root resolution."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fsdurable import Store
from fsdurable.cli import main

from .conftest import PYTHON, subprocess_env


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in argv else out


@pytest.fixture
def busy(root: Path) -> Store:
    st = Store(root)
    st.create("idle")
    st.create("busy", source="desktop")
    st.begin_turn("busy", "do the thing")
    return st


def test_every_command_speaks_json(busy: Store, root: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    r = str(root)
    code, data = run(capsys, "--root", r, "init", "--json")
    assert code == 0 and data["store_id"] == busy.manifest.store_id  # type: ignore[index]
    code, data = run(capsys, "sessions", "--root", r, "--json")
    assert code == 0 and data == {"sessions": ["busy", "idle"]}
    code, data = run(capsys, "--root", r, "show", "busy", "--json")
    assert code == 0 and data["in_progress"] is True  # type: ignore[index]
    code, data = run(capsys, "--root", r, "interrupted", "--json")
    assert code == 0
    [m] = data["interrupted"]  # type: ignore[index]
    assert m["session_id"] == "busy" and m["age_seconds"] >= 0
    code, data = run(capsys, "--root", r, "events", "--json")
    assert code == 0 and [e["code"] for e in data["events"]] == ["turn_started"]  # type: ignore
    code, data = run(capsys, "--root", r, "cancel", "busy", "--json")
    assert code == 0 and data["cancelled"] is True  # type: ignore[index]
    code, data = run(capsys, "--root", r, "cancel", "busy", "--json")
    assert code == 0 and data["cancelled"] is False  # type: ignore[index]
    code, data = run(capsys, "--root", r, "doctor", "--json")
    assert code == 0 and data["problems"] == 0  # type: ignore[index]


def test_text_output(busy: Store, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--root", str(root), "interrupted")
    assert code == 0 and "busy" in str(out)
    code, out = run(capsys, "--root", str(root), "show", "busy")
    assert "do the thing" in str(out)
    code, out = run(capsys, "--root", str(root), "doctor")
    assert code == 0 and "healthy" in str(out)


def test_doctor_exit_codes_and_repair(busy: Store, root: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    os.unlink(busy.layout.marker("busy"))  # in progress without a marker: recovery is blind
    with open(busy.layout.marker("ghost"), "w") as f:
        f.write("{}")
    with open(os.path.join(busy.layout.sessions, "busy.sync-conflict-20261129-101010-AB.json"),
              "w") as f:
        f.write("{}")
    code, data = run(capsys, "--root", str(root), "doctor", "--json")
    assert code == 1
    codes = sorted(f["code"] for f in data["findings"])  # type: ignore[index]
    # the ghost was written 0644 by hand: doctor wants 0600
    assert codes == ["conflict_copy", "missing_marker", "permissions", "unreadable_marker"]
    assert os.path.exists(busy.layout.marker("ghost"))  # repair=False touches nothing
    code, data = run(capsys, "--root", str(root), "doctor", "--repair", "--json")
    assert code == 1  # the conflict copy needs a human (fsdurable resolve)
    repaired = sorted(f["code"] for f in data["findings"] if f["repaired"])  # type: ignore
    assert repaired == ["missing_marker", "permissions", "unreadable_marker"]
    assert [m.session_id for m in busy.interrupted()] == ["busy"]
    assert any(e.code == "doctor_repaired" for e in busy.events())


def test_usage_errors_exit_2(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Store(root)
    assert main(["--root", str(root), "show", "../etc"]) == 2
    assert main(["--root", str(root), "no-such-command"]) == 2
    assert main([]) == 2
    assert main(["--root", str(root), "show", "missing"]) == 1
    code, data = run(capsys, "--root", str(root), "show", "missing", "--json")
    assert code == 1 and data["error"] == "SessionNotFound"  # type: ignore[index]


def test_root_from_environment(root: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FSDURABLE_ROOT", str(root))
    code, data = run(capsys, "init", "--json")
    assert code == 0 and data["root"] == str(root.resolve())  # type: ignore[index]


def test_default_root_is_the_user_data_dir(tmp_path: Path) -> None:
    env = subprocess_env(XDG_DATA_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path / "home"))
    env.pop("FSDURABLE_ROOT", None)
    r = subprocess.run([PYTHON, "-m", "fsdurable", "init", "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    where = json.loads(r.stdout)["root"]
    assert where.startswith(str(tmp_path)) and os.path.exists(os.path.join(where,
                                                                            "fsdurable.json"))


def test_a_closed_pipe_is_not_an_error(busy: Store, root: Path) -> None:
    from fsdurable import Config

    fast = Store(root, config=Config(fsync=False))
    for i in range(800):  # ~100 KB of ids: more than a pipe holds, so print meets the closed end
        fast.create(f"s{i:04d}" + "x" * 120)
    r = subprocess.run(f"{PYTHON} -m fsdurable --root {root} sessions | head -1", shell=True,
                       env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "busy" and "Traceback" not in r.stderr, r.stderr
