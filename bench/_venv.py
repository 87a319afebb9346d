"""A clean virtualenv holding only fsdurable (installed from a wheel built from this checkout) and
its dependencies: the interpreter a user of the library starts, not the crowded development one.

Why: in an environment where many packages are installed, every ``.pth`` file and import finder
runs at interpreter start (``python -c pass`` at 40-70 ms), which hides fsdurable's own cost behind
the floor's and flatters every startup ratio. In a clean venv ``python -c pass`` is ~15-20 ms.

How (no network needed when the dependencies' wheels are in pip's cache or the wheelhouse; else
pip fetches them from PyPI once): ``pip wheel`` builds fsdurable's wheel and its dependencies'
into ``bench/results/tmp/wheelhouse``; ``python -m venv --without-pip`` makes the venv under
``bench/results/tmp/venv``; the outer pip installs into it (``--python``) from the wheelhouse only
(``--no-index``). The venv is reused while the wheel's sources are unchanged (a hash of
``fsdurable/`` and ``pyproject.toml`` is kept beside it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

from ._harness import REPO, RESULTS, log

TMP = os.path.join(RESULTS, "tmp")
VENV = os.path.join(TMP, "venv")
WHEELHOUSE = os.path.join(TMP, "wheelhouse")


def _source_hash() -> str:
    h = hashlib.sha256()
    files = [os.path.join(REPO, "pyproject.toml")]
    for tree in ("fsdurable", "schemas"):
        for dirpath, dirnames, names in os.walk(os.path.join(REPO, tree)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            files += [os.path.join(dirpath, n) for n in sorted(names) if not n.endswith(".pyc")]
    for f in files:
        h.update(os.path.relpath(f, REPO).encode())
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:16]


def python(venv: str = VENV) -> str:
    return os.path.join(venv, "Scripts" if os.name == "nt" else "bin",
                        "python.exe" if os.name == "nt" else "python")


def script(name: str, venv: str = VENV) -> str:
    return os.path.join(venv, "Scripts" if os.name == "nt" else "bin", name)


def _run(cmd: list[str]) -> None:
    # never where the checkout is on the path (the cwd, PYTHONPATH — the test suite's children
    # have it): its fsdurable.egg-info made pip answer "already satisfied" and install nothing
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=TMP, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")


def clean_venv() -> str:
    """The path of the clean venv's python, built (or reused) as described above."""
    stamp = os.path.join(VENV, "fsdurable-source.hash")
    want = _source_hash()
    if os.path.exists(stamp):
        with open(stamp) as f:
            if f.read().strip() == want and os.path.exists(python()):
                return python()
    log(f"bench: building a clean venv in {VENV} (fsdurable from a wheel, deps only) ...")
    shutil.rmtree(VENV, ignore_errors=True)
    os.makedirs(TMP, exist_ok=True)
    os.makedirs(WHEELHOUSE, exist_ok=True)
    for old in os.listdir(WHEELHOUSE):  # the previous build of fsdurable itself
        if old.startswith("fsdurable-"):
            os.unlink(os.path.join(WHEELHOUSE, old))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    with tempfile.TemporaryDirectory() as src:  # setuptools writes build/ beside its sources
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if os.path.exists(os.path.join(REPO, name)):
                shutil.copy(os.path.join(REPO, name), src)
        for tree in ("fsdurable", "schemas"):  # the wheel maps schemas/ in (pyproject.toml)
            shutil.copytree(os.path.join(REPO, tree), os.path.join(src, tree),
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        _run([*pip, "wheel", "-w", WHEELHOUSE, src])
    _run([sys.executable, "-m", "venv", "--without-pip", VENV])
    _run([*pip, "--python", python(), "install", "--no-index", "--find-links", WHEELHOUSE,
          "fsdurable"])
    got = subprocess.run([python(), "-I", "-c", "import fsdurable; print(fsdurable.__file__)"],
                         capture_output=True, text=True, timeout=60, cwd=TMP)
    if got.returncode != 0 or not os.path.realpath(got.stdout.strip()).startswith(
            os.path.realpath(VENV)):
        raise RuntimeError(f"the clean venv does not import its own fsdurable: "
                           f"{got.stdout.strip() or got.stderr[-2000:]}")
    with open(stamp, "w") as f:
        f.write(want + "\n")
    return python()


def describe(py: str) -> dict[str, object]:
    """What the venv holds (distribution names and versions) and its interpreter."""
    code = ("import importlib.metadata as m, json, sys; print(json.dumps({'python': sys.version"
            ".split()[0], 'executable': sys.executable, 'distributions': sorted("
            "f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions())}))")
    # -I: the venv alone (python -c would put the cwd, a checkout's egg-info, on sys.path)
    out = subprocess.run([py, "-I", "-c", code], capture_output=True, text=True, check=True,
                         timeout=60)
    import json

    result: dict[str, object] = json.loads(out.stdout)
    return result


__all__ = ["VENV", "clean_venv", "describe", "python", "script"]
