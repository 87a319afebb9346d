"""The startup path is stdlib: a fresh process that imports fsdurable, opens a store (root given)
and lists its interrupted turns with their verdicts imports none of ``FORBIDDEN`` (issues 2, 13):
no attrs, cattrs, asyncio, ssl, portalocker, watchfiles, platformdirs, secrets, pathlib. When a
garbage marker is quarantined on the way, still neither cattrs nor watchfiles. Structural
(``sys.modules``), never timing; the timing lives in bench/startup.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import PYTHON, subprocess_env

FORBIDDEN = ("attrs", "attr", "cattrs", "asyncio", "ssl", "portalocker", "watchfiles",
             "platformdirs", "secrets", "pathlib")

# Only what fsdurable imports counts: an interpreter whose site-packages runs .pth files may
# import pathlib (or more) before any user code; those are subtracted (``before``).
CHILD = """
import json, sys
before = set(sys.modules)
import fsdurable
after_import = sorted(m for m in sys.modules if m == "attrs" or m.startswith("fsdurable."))
store = fsdurable.Store(sys.argv[1])
markers = store.interrupted()
policy = fsdurable.RecoveryPolicy.from_config(store.config)
from fsdurable._gates import verdict
verdicts = [verdict(m, node_id=m.node_id, now=m.checkpoint_at, policy=policy) for m in markers]
print(json.dumps({
    "verdicts": verdicts,
    "after_import": after_import,
    "found": [m.session_id for m in markers],
    "loaded": sorted(m for m in set(sys.modules) - before if m.split(".")[0] in %r),
}))
"""


def run_child(root: Path) -> dict[str, Any]:
    out = subprocess.run([PYTHON, "-c", CHILD % (FORBIDDEN,), str(root)], env=subprocess_env(),
                         capture_output=True, text=True, timeout=120, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_discovery_in_a_fresh_process_imports_none_of_the_heavy_modules(store: Any,
                                                                        root: Path) -> None:
    for sid in ("a", "b"):
        store.create(sid)
    store.begin_turn("a", "hello")  # the parent pays for cattrs and portalocker, not the child
    res = run_child(root)
    assert res["found"] == ["a"]
    assert res["verdicts"] == ["resume"]
    assert res["loaded"] == [], f"discovery imported {res['loaded']}"
    # ``import fsdurable`` alone loads no submodule and not attrs: every name is lazy
    assert res["after_import"] == []


def test_a_garbage_marker_is_skipped_without_cattrs_or_watchfiles(store: Any,
                                                                   root: Path) -> None:
    store.create("good")
    store.begin_turn("good", "hi")
    (root / "markers" / "bad.json").write_bytes(b"\x00 not json")
    res = run_child(root)
    assert res["found"] == ["good"]
    # moving a file aside may take that session's commit lock (portalocker): it is needed then;
    # decoding sessions (cattrs) and watching (watchfiles) never are
    loaded = {m.split(".")[0] for m in res["loaded"]}
    assert not loaded & {"cattrs", "watchfiles"}, f"discovery imported {res['loaded']}"
    # a listing never repairs: the bad marker stays for recovery / doctor --repair (issue 9.18)
    assert (root / "markers" / "bad.json").exists()
    assert list((root / "quarantine").iterdir()) == []


CLI_CHILD = """
import json, sys
before = set(sys.modules)
from fsdurable.cli import main
code = main(sys.argv[1:])
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in %r)),
      file=sys.stderr)
sys.exit(code)
"""


def test_cli_interrupted_and_dry_run_import_none_and_agree_with_the_library(
        store: Any, root: Path) -> None:
    """``fsdurable interrupted --json`` and ``recover --dry-run --json`` take the stdlib path,
    and the dry run reports exactly what ``recover(store, loop, dry_run=True)`` does."""
    from fsdurable import AgentLoop, ScriptedModel, recover

    for sid in ("a", "b"):
        store.create(sid)
        store.begin_turn(sid, "go")
    for argv in (["interrupted"], ["recover", "--dry-run"]):
        p = subprocess.run([PYTHON, "-c", CLI_CHILD % (FORBIDDEN,), "--root", str(root), *argv,
                            "--json"], env=subprocess_env(), capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        loaded = json.loads(p.stderr.strip().splitlines()[-1])
        assert loaded == [], f"{' '.join(argv)} imported {loaded}"
        if argv[0] == "recover":
            got = json.loads(p.stdout)
            want = recover(store, AgentLoop(store, ScriptedModel([]), []), dry_run=True,
                           resume=False).to_dict()  # the CLI has no loop: it leaves them
            keys = ("session_id", "turn_id", "node_id", "verdict", "outcome", "reason")
            assert got["dry_run"] is True
            assert [{k: o[k] for k in keys} for o in got["outcomes"]] == \
                [{k: o[k] for k in keys} for o in want["outcomes"]]
            assert [o["resume_attempts"] for o in got["outcomes"]] == \
                [o["attempts"] for o in want["outcomes"]]


def _cli_json(root: Path, *argv: str) -> tuple[dict[str, Any], list[str]]:
    p = subprocess.run([PYTHON, "-c", CLI_CHILD % (FORBIDDEN,), "--root", str(root), *argv,
                        "--json"], env=subprocess_env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), json.loads(p.stderr.strip().splitlines()[-1])


def test_cli_dry_run_foresees_orphans_superseded_turns_and_adapter_runs(store: Any,
                                                                        root: Path) -> None:
    """Issue 9 item 18 at the CLI: ``recover --dry-run`` says what ``recover`` would do, where
    the marker alone is not enough — a turn finished after its marker was written (an orphan:
    the crash between the session commit and the marker's unlink), a newer turn than the
    marker's, an adapter's run (a real run leaves it to the adapter) — still without attrs.
    On b85e63c it said ``would_leave`` for all three."""
    from fsdurable import AgentLoop, ScriptedModel, recover

    def marker_bytes(sid: str) -> bytes:
        return Path(store.layout.marker(sid)).read_bytes()

    store.create("live")
    store.begin_turn("live", "go")
    store.create("orphan")
    s = store.begin_turn("orphan", "go")
    old = marker_bytes("orphan")
    store.end_turn(s, "done")
    Path(store.layout.marker("orphan")).write_bytes(old)
    store.create("newer")
    s = store.begin_turn("newer", "one")
    old = marker_bytes("newer")
    store.end_turn(s, "done")
    store.begin_turn("newer", "two")
    Path(store.layout.marker("newer")).write_bytes(old)
    store.create("graph", source="langgraph")
    store.begin_turn("graph", "go")

    got, loaded = _cli_json(root, "recover", "--dry-run")
    assert loaded == [], f"recover --dry-run imported {loaded}"
    want = recover(store, AgentLoop(store, ScriptedModel([]), []), dry_run=True,
                   resume=False).to_dict()
    keys = ("session_id", "turn_id", "verdict", "outcome", "reason")
    # the adapter's run is named too (as `interrupted` names it), left to its driver's recover
    assert sorted((o["session_id"], o["outcome"]) for o in got["outcomes"]) == [
        ("graph", "would_leave"), ("live", "would_leave"), ("newer", "would_supersede"),
        ("orphan", "would_repair")]
    [graph] = [o for o in got["outcomes"] if o["session_id"] == "graph"]
    assert "driver langgraph" in graph["reason"]
    assert [{k: o[k] for k in keys} for o in got["outcomes"] if o is not graph] == \
        [{k: o[k] for k in keys} for o in want["outcomes"]]
    # and the real run does what the dry run said
    real, _ = _cli_json(root, "recover")
    assert sorted((o["session_id"], o["outcome"]) for o in real["outcomes"]) == [
        ("graph", "left"), ("live", "left"), ("newer", "superseded"), ("orphan", "repaired")]


def test_cli_dry_run_hands_a_session_it_cannot_peek_to_the_library(store: Any,
                                                                   root: Path) -> None:
    """A session the stdlib peek cannot judge (here a malformed turn field) is planned by the
    library's dry run: the outcome is the library's, whatever it costs to import."""
    store.create("odd")
    store.begin_turn("odd", "go")
    path = Path(store.layout.session("odd"))
    doc = json.loads(path.read_text("utf-8"))
    doc["turn"]["resume_attempts"] = "two"
    path.write_text(json.dumps(doc), "utf-8")
    got, _ = _cli_json(root, "recover", "--dry-run")
    [o] = got["outcomes"]
    assert (o["session_id"], o["outcome"], o["reason"]) == ("odd", "would_abandon", "unreadable")


# What opening a store and listing its markers loads, beyond the forbidden set: none of the
# modules that change a session (the commit function, the turn API, the locks, the event log, the
# model and its codec) and none of the stdlib modules the floor script (``json``, ``os``,
# ``sys``) does not load either. Each cost a fresh process 0.1-0.6 ms (bench/startup.py).
NOT_ON_THE_LISTING_PATH = ("fsdurable._commit", "fsdurable._storeturns", "fsdurable._storelocks",
                           "fsdurable._events", "fsdurable._model", "fsdurable._codec",
                           "fsdurable._locks", "fsdurable._fsio._write", "fsdurable._fsio._atomic",
                           "fsdurable._names",
                           "contextlib", "weakref", "math", "fcntl", "argparse",
                           "fsdurable.cli._term")

LISTING_CHILD = """
import json, sys
before = set(sys.modules)
if sys.argv[1] == "library":
    import fsdurable
    fsdurable.Store(sys.argv[2]).interrupted()
else:
    from fsdurable.cli import main
    import io, contextlib
    out = io.StringIO()
    sys.stdout, real = out, sys.stdout
    code = main(["--root", sys.argv[2], *sys.argv[3:]])
    sys.stdout = real
    assert code == 0, out.getvalue()
print(json.dumps(sorted(m for m in set(sys.modules) - before if m in %r)))
"""


@pytest.mark.parametrize("argv", [["library"], ["cli", "interrupted", "--json"],
                                  ["cli", "recover", "--dry-run", "--json"]])
def test_the_listing_path_loads_nothing_that_changes_a_session(store: Any, root: Path,
                                                               argv: list[str]) -> None:
    """On 4ad072b each loaded ``_commit``, ``_storeturns``, ``_events`` and fcntl (the CLI its
    table module too), and contextlib, weakref and math where the interpreter had not loaded
    them itself (a clean venv: bench/startup.py)."""
    store.create("a")
    store.begin_turn("a", "go")
    p = subprocess.run([PYTHON, "-c", LISTING_CHILD % (NOT_ON_THE_LISTING_PATH,), argv[0],
                        str(root), *argv[1:]], env=subprocess_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [], f"{' '.join(argv)} loaded {p.stdout}"
