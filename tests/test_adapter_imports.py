"""``import fsdurable`` imports none of the agent frameworks, whatever public name is used; each
adapter is a leaf module that pulls in its framework only when it needs it."""

from __future__ import annotations

import json
import subprocess

import pytest

from .conftest import PYTHON, subprocess_env

FRAMEWORKS = ("agents", "pydantic_ai", "pydantic", "claude_agent_sdk", "langgraph",
              "langchain_core", "openai", "anthropic", "google")


def loaded_after(code: str) -> list[str]:
    child = (f"import sys\n{code}\n"
             f"import json; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & "
             f"set({FRAMEWORKS!r}))))")
    out = subprocess.run([PYTHON, "-c", child], env=subprocess_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result: list[str] = json.loads(out.stdout)
    return result


def test_import_fsdurable_and_every_public_name_imports_no_framework() -> None:
    code = "import fsdurable\nfor n in fsdurable.__all__: getattr(fsdurable, n)"
    assert loaded_after(code) == []


@pytest.mark.parametrize(("module", "name"), [("openai_agents", "FileSession"),
                                              ("claude", "FileSessionStore")])
def test_structural_adapters_import_without_their_framework(module: str, name: str) -> None:
    assert loaded_after(f"from fsdurable.{module} import {name}") == []
