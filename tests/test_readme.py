"""The README's examples run as tests: every ```python block, then every `$ fsdurable ...` line
of the console blocks (against the store the Python example made)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from fsdurable.cli import main

from .conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
PY_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
COMMANDS = [line[2:] for block in re.findall(r"```console\n(.*?)```", README, re.S)
            for line in block.splitlines() if line.startswith("$ fsdurable ")]
# Long-running or environment-changing commands are exercised by their own tests.
SKIP = ("fsdurable demo", "fsdurable watch", "fsdurable adopt", "fsdurable resolve")


def test_readme_has_examples() -> None:
    assert PY_BLOCKS and COMMANDS


def _says(block: str) -> list[str]:
    """What a block says it prints: the comment on each ``print(...)`` line, in order."""
    said = []
    for line in block.splitlines():
        if re.match(r"\s*print\(", line):
            m = re.search(r"\)\s+# (.+)$", line)
            assert m, f"README: a print without the output it gives as its comment: {line!r}"
            said.append(m.group(1))
    return said


def test_python_examples_run_twice_and_print_what_they_say(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block, twice in a row in one directory (a reader runs an example again: it said
    `ConflictError: session 'chat-1' already exists`), printing what its comments say."""
    monkeypatch.chdir(tmp_path)
    for run in (1, 2):
        for n, block in enumerate(PY_BLOCKS):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(block, "README.md", "exec"), {})
            assert out.getvalue().splitlines() == _says(block), (run, n, block)


def test_cli_examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for block in PY_BLOCKS:
        exec(compile(block, "README.md", "exec"), {})
    monkeypatch.setenv("FSDURABLE_ROOT", str(tmp_path / "demo-store"))
    for line in COMMANDS:
        if line.startswith(SKIP):
            continue
        argv = shlex.split(line, comments=True)[1:]
        assert "|" not in argv, line
        code = main(argv)
        assert code in (0, 1), f"{line!r} exited {code}"
        capsys.readouterr()
