"""Shared fixtures: every test gets a real temp store and a private machine-local state dir."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


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
