"""The skip policy: a missing system tool skips with its reason, except under ``CI=true``, where
it fails; and no test installs system packages (.ci/run does, once)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import REPO, need_tools, skip_or_fail


@pytest.mark.parametrize("ci", ["", "false", "0"])
def test_outside_ci_a_missing_tool_skips_with_its_reason(
        ci: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="no-such-tool-xyz not on PATH"):
        need_tools("no-such-tool-xyz")


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_under_ci_a_skip_is_a_failure(ci: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=r"CI=true.*no-such-tool-xyz"):
        need_tools("no-such-tool-xyz")
    with pytest.raises(pytest.fail.Exception, match="cannot mount"):
        skip_or_fail("cannot mount")


def test_present_tools_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    need_tools("python3" if Path("/usr/bin/python3").exists() else "sh")


def test_no_test_installs_system_packages() -> None:
    pattern = re.compile(r"apt-get\"?,?\s*\"?install|brew install|\bdnf install|\byum install")
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("*.py")
                 if p.name != "test_ci_policy.py" and pattern.search(p.read_text("utf-8"))]
    assert offenders == []
    run = (REPO / ".ci" / "run").read_text("utf-8")
    assert "apt-get update" in run and "apt-get install" in run


def test_ci_names_readme_sections_that_exist_and_runs_their_command() -> None:
    """.ci/run said it ran the README's "Running the tests", a section the README does not
    have; the command it runs is the README's own."""
    ci = (REPO / ".ci" / "run").read_text("utf-8")
    readme = (REPO / "README.md").read_text("utf-8")
    headings = {h.strip() for h in re.findall(r"^#+ (.+)$", readme, re.M)}
    named = re.findall(r'README\.md "([^"]+)"', ci)
    assert named and set(named) <= headings, (named, sorted(headings))
    command = "python -m pip install -e '.[test]' && python -m pytest"
    assert command in ci and f"$ {command}" in readme
