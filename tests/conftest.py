"""Shared fixtures: every test gets a real temp store and a private machine-local state dir."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--torture", action="store_true",
                     help="also run the long torture runs (tests marked slow)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


PYTHON = sys.executable
