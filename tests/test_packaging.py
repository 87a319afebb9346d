"""Packaging: floors that do not lie, one version, a license, schemas in the wheel, an sdist that
holds what pytest needs, and public names that mypy --strict users see as exported."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from .conftest import PYTHON, REPO, skip_or_fail

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["project"]


def _floors(reqs: list[str]) -> dict[str, str]:
    out = {}
    for r in reqs:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][0-9.]*)", r.split(";")[0].strip())
        assert m, f"every dependency declares a plain floor: {r}"
        out[m.group(1).lower()] = m.group(2)
    return out


def _pins(name: str) -> dict[str, str]:
    text = (REPO / ".ci" / name).read_text("utf-8")
    return {k.lower(): v for k, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


def _same_version(pin: str, floor: str) -> bool:
    """``2.1.0`` pins the floor ``2.1``; ``2.1.5`` does not."""
    n = max(len(pin.split(".")), len(floor.split(".")))
    a, b = (tuple(map(int, (v + ".0" * n).split(".")[:n])) for v in (pin, floor))
    return a == b


def test_the_constraints_file_pins_every_dependency_at_its_declared_floor() -> None:
    pins = _pins("constraints-floor.txt")
    declared = _floors(PROJECT["dependencies"])
    for name, floor in declared.items():
        assert name in pins, f"{name} has no floor pin in .ci/constraints-floor.txt"
        assert _same_version(pins[name], floor), (name, pins[name], floor)
    # the floors the code needs: Converter.get_structure_hook; orjson's nesting limit
    assert tuple(map(int, declared["cattrs"].split("."))) >= (24, 1)
    assert tuple(map(int, declared["orjson"].split("."))) >= (3, 9, 15)


def test_the_adapters_floor_file_pins_every_adapter_extra_at_its_declared_floor() -> None:
    """.ci/run installs the adapter extras held at these pins and runs the adapters' tests: a pin
    above its floor would test a version the extra does not promise, one missing would leave a
    framework to float to its newest release, and a pin no extra declares would be a guess."""
    pins = _pins("constraints-adapters-floor.txt")
    declared: dict[str, str] = {}
    for extra, reqs in PROJECT["optional-dependencies"].items():
        if extra != "test":
            declared.update(_floors(reqs))
    assert set(declared) == set(pins), (sorted(declared), sorted(pins))
    for name, floor in declared.items():
        assert _same_version(pins[name], floor), (name, pins[name], floor)
    # the floors the code needs: langgraph-prebuilt, as pip resolves it for langgraph below
    # 1.1.5, imports langgraph.runtime.ServerInfo, which langgraph adds in 1.1.5
    assert tuple(map(int, declared["langgraph"].split("."))) >= (1, 1, 5)
    # the test extra pulls the adapters in through their extras, never with a floor of its own
    for req in PROJECT["optional-dependencies"]["test"]:
        if not req.startswith("fsdurable["):
            assert _floors([req]).keys().isdisjoint(pins), req
    # and .ci/run installs every adapter extra under these pins
    ci = (REPO / ".ci" / "run").read_text("utf-8")
    installed = re.search(r"-c \.ci/constraints-adapters-floor\.txt\s*\\\s*-e '\.\[([a-z,-]+)\]'",
                          ci)
    assert installed, "the adapters' floor venv installs the checkout with its extras"
    assert set(installed.group(1).split(",")) == set(PROJECT["optional-dependencies"]) - {"test"}


def test_extras_name_only_what_the_wheel_ships() -> None:
    """Each extra but ``test`` is an adapter module's framework (``plot`` and ``bench`` named
    scripts of bench/, which the wheel does not ship)."""
    extras = PROJECT["optional-dependencies"]
    for name in extras:
        if name != "test":
            assert (REPO / "fsdurable" / f"{name.replace('-', '_')}.py").exists(), name
    assert (REPO / "bench" / "requirements.txt").exists()  # the benchmarks' own needs


def test_version_license_and_metadata() -> None:
    import fsdurable

    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", fsdurable.__version__)
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text("utf-8").startswith("MIT License")
    assert {"Homepage", "Source", "Issues"} <= set(PROJECT["urls"])
    assert "Typing :: Typed" in PROJECT["classifiers"]
    for v in ("3.10", "3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {v}" in PROJECT["classifiers"]


def test_schemas_have_one_source_the_top_level_directory() -> None:
    from fsdurable.cli._store import KINDS, schema_text

    top = {p.name.removesuffix(".schema.json") for p in (REPO / "schemas").glob("*.json")}
    assert top == set(KINDS)  # `fsdurable schema` names every one, and only those
    for kind in KINDS:
        assert schema_text(kind) == (REPO / "schemas" / f"{kind}.schema.json").read_text("utf-8")
    assert not (REPO / "fsdurable" / "schemas").exists()  # no second copy kept by hand


def _setuptools_ok() -> None:
    r = subprocess.run([PYTHON, "-c", "import setuptools; print(setuptools.__version__)"],
                       capture_output=True, text=True)
    version = r.stdout.strip()
    if r.returncode != 0 or int(version.split(".")[0]) < 77:
        skip_or_fail(f"building needs setuptools>=77 (the build-system requirement), "
                     f"this interpreter has {version or 'none'}")


def test_sdist_and_wheel_hold_what_users_and_pytest_need(tmp_path: Path) -> None:
    _setuptools_ok()
    out = tmp_path / "dist"
    build = ("import sys, setuptools.build_meta as b; "
             "print(getattr(b, sys.argv[1])(sys.argv[2]))")
    # as a user builds: bytecode on (PYTHONDONTWRITEBYTECODE makes setuptools say it skips it)
    quiet = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = subprocess.run([PYTHON, "-c", build, "build_sdist", str(out)], cwd=REPO, env=quiet,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "warn" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr  # a quiet build
    sdist = out / r.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as t:
        t.extractall(tmp_path, filter="data")
    src = tmp_path / sdist.name.removesuffix(".tar.gz")
    for needed in ("LICENSE", "tests/conftest.py", "tests/data/session_v1.json",
                   "tests/torture/faults.py", "schemas/session.schema.json",
                   "bench/__main__.py", ".ci/run"):
        assert (src / needed).exists(), needed
    tracked = subprocess.run(["git", "ls-files", "tests", "bench", "docs", "schemas"],
                             cwd=REPO, capture_output=True, text=True)
    if tracked.returncode == 0:  # a git checkout: every tracked file of these is shipped
        missing = [f for f in tracked.stdout.split() if (REPO / f).exists()
                   and not (src / f).exists()]
        assert missing == [], f"MANIFEST.in leaves out: {missing}"
    # pytest collects the unpacked sdist without an error (it had 20 collection errors)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([PYTHON, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p",
                        "no:cacheprovider"], cwd=src, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "error" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
    r = subprocess.run([PYTHON, "-c", build, "build_wheel", str(out)], cwd=src, env=quiet,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "warn" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    wheel = zipfile.ZipFile(out / r.stdout.strip().splitlines()[-1])
    names = wheel.namelist()
    # the shipped schemas are exactly the top-level set, byte for byte
    shipped = {n.removeprefix("fsdurable/schemas/"): wheel.read(n) for n in names
               if n.startswith("fsdurable/schemas/")}
    assert shipped == {p.name: p.read_bytes() for p in (REPO / "schemas").iterdir()}
    assert not any(n.startswith("schemas/") for n in names)  # inside the package only
    assert "fsdurable/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


USER_CODE = textwrap.dedent('''
    import threading
    from collections.abc import Iterator

    import fsdurable
    from fsdurable import (AgentLoop, Change, Config, Outcome, ScriptedModel, Session, Store,
                           adopt, recover, tool)

    store: Store = fsdurable.Store("x", config=Config())
    s: Session = store.create("a")
    changes: Iterator[Change] = store.watch(poll=True, stop_event=threading.Event())

    @tool(effect="none")
    def note(ctx: fsdurable.ToolContext, text: str) -> str:
        return text

    loop = AgentLoop(store, ScriptedModel([]), [note])
    out: Outcome = adopt(store, "a", loop)
    n: int = recover(store, loop).count("resumed")
    err: type[fsdurable.FsDurableError] = fsdurable.SessionNotFound
    version: str = fsdurable.__version__
    waiting = fsdurable.review_queue(store)
    done = fsdurable.answer_review(store, "a", ran=True)
''')


def test_mypy_strict_users_see_every_public_name_exported(tmp_path: Path) -> None:
    (tmp_path / "user.py").write_text(USER_CODE, "utf-8")
    # fsdurable as an installed package looks to mypy: found, followed silently (its own
    # internals are not the user's to check); the user's file under --strict
    (tmp_path / "mypy.ini").write_text("[mypy]\nstrict = True\n[mypy-fsdurable.*]\n"
                                       "follow_imports = silent\n", "utf-8")
    env = dict(os.environ, MYPYPATH=str(REPO))
    env.pop("PYTHONPATH", None)
    r = subprocess.run([PYTHON, "-m", "mypy", "--strict", "--no-incremental", "--config-file",
                        "mypy.ini", "--cache-dir", str(tmp_path / ".mypy"), "user.py"],
                       cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_an_environment_bug_never_quarantines_a_valid_session(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cattrs below the floor (no ``Converter.get_structure_hook``, as in 23.2) made every valid
    session "unreadable" and moved it to quarantine. Only the codec's own findings quarantine."""
    import cattrs

    from fsdurable import Store, _codec

    st = Store(root)
    st.create("a")
    st.begin_turn("a", "hello")  # a turn with messages: the tuple hooks run
    path = st.layout.session("a")
    monkeypatch.setattr(_codec, "_converter", None)  # rebuilt with the "old" cattrs
    owner = next(k for k in cattrs.Converter.__mro__ if "get_structure_hook" in vars(k))
    monkeypatch.delattr(owner, "get_structure_hook")
    with pytest.raises(AttributeError):
        Store(root).load("a")
    assert os.path.exists(path) and os.listdir(st.layout.quarantine) == []
    monkeypatch.undo()
    monkeypatch.setattr(_codec, "_converter", None)
    assert Store(root).load("a").in_progress
