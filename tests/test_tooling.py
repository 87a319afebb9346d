"""Strict tooling as tests: ruff over the repo, mypy --strict over the package and bench/, the
public surface sorted and importable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import REPO


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *cmd], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def test_ruff_clean() -> None:
    r = _run("ruff", "check", "fsdurable", "tests", "bench")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_clean() -> None:
    r = _run("mypy")
    assert r.returncode == 0, r.stdout + r.stderr


def test_public_surface_is_sorted_and_resolves() -> None:
    import fsdurable

    assert fsdurable.__all__ == sorted(fsdurable.__all__)
    for name in fsdurable.__all__:
        assert getattr(fsdurable, name) is not None, name
    with pytest.raises(AttributeError):
        fsdurable.no_such_name  # noqa: B018
