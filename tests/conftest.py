"""Shared fixtures: every test gets a real temp store and a private machine-local state dir."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


def in_ci() -> bool:
    """``CI=true`` (GitHub Actions, .ci/run): a test that cannot run is a failure there."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_or_fail(reason: str) -> NoReturn:
    """The ONE way a test gives up for want of a system tool, root or a mount: it skips with its
    reason, except under ``CI=true``, where it fails, so CI can never pass by skipping."""
    if in_ci():
        pytest.fail(f"CI=true, so this may not skip: {reason}", pytrace=False)
    pytest.skip(reason)


def need_tools(*names: str, root: bool = False) -> None:
    """Skip (or, under ``CI=true``, fail) unless every command is on PATH (and, with
    ``root=True``, we are root). Tests never install anything: .ci/run does."""
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        skip_or_fail(f"{', '.join(missing)} not on PATH (.ci/run installs the system "
                     "packages the tests need)")
    if root and (os.name != "posix" or os.geteuid() != 0):
        skip_or_fail(f"needs root to use {', '.join(names)}")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the default, pyproject.toml): twice the cores, at most 8. The suite's wall
    time is mostly waits (children starting and being killed, fsyncs, a watcher's debounce),
    so more workers than cores overlap them; past 8 they only contend."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--torture", action="store_true",
                     help="also run the long torture runs (tests marked slow)")


# the files whose tests each take tens of seconds of CPU (tortures, the crash explorer, the
# bench smoke run, the package build): collected first, so the workers start them first and
# the run does not end waiting on one of them
HEAVY = ("test_bench_smoke.py", "test_crash_explorer.py", "test_powercut.py",
         "test_kill_torture.py", "test_packaging.py", "test_langgraph_crash.py",
         "test_exfat.py", "test_tooling.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in HEAVY)  # stable: file order kept
    if config.getoption("--torture"):
        return
    skip = pytest.mark.skip(reason="long torture run: enable with --torture")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Locks and node ids never leak into the user's real state dir; a fixed node id."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("FSDURABLE_STATE_DIR", str(state))
    monkeypatch.setenv("FSDURABLE_NODE", "node-test")
    monkeypatch.delenv("FSDURABLE_ROOT", raising=False)
    # tables render as for piped output unless a test sets a width: an xdist worker inherits
    # COLUMNS=80 from pytest's terminal, which would cut the rows tests read
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> Iterator[object]:
    import fsdurable

    yield fsdurable.Store(root)


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child Python process that imports this checkout's fsdurable."""
    env = dict(os.environ)
    # a child's tables are as piped output's (whole rows), whatever terminal width pytest or
    # an xdist worker (COLUMNS=80) left in the environment
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_module(module: str, args: list[str], env: dict[str, str], warm: tuple[str, ...],
               timeout: float) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([PYTHON, "-m", module, *args], env=env, cwd=REPO, capture_output=True,
    text=True, timeout=timeout)``, with the child forked from a server that imported ``warm``
    once (tests/conformance/forkserver.py): a real process that exits as ``python -m`` would
    (exit codes, atexit, -9 on SIGKILL), without paying its framework's import (1-3 s of CPU)
    every time. ``FSDC_EXEC=1`` execs instead."""
    from tests.conformance.forkclient import module_server

    srv = module_server(warm)
    if srv is None:
        return subprocess.run([PYTHON, "-m", module, *args], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=timeout)
    logs = Path(tempfile.mkdtemp(prefix="fsd-forked-"))
    try:
        child = srv.spawn([module, *args], env, logs)
        try:
            out, err = child.communicate(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(60)
            raise
        assert child.returncode is not None
        return subprocess.CompletedProcess([PYTHON, "-m", module, *args], child.returncode,
                                           out, err)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


PYTHON = sys.executable


@contextmanager
def io_log() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """Every ``_fsio`` operation, as the store's own recorder sees it (``(op, args)``)."""
    from fsdurable import _fsio

    ops: list[tuple[str, tuple[Any, ...]]] = []
    prev = _fsio.set_recorder(lambda op, args: ops.append((op, args)))
    try:
        yield ops
    finally:
        _fsio.set_recorder(prev)
