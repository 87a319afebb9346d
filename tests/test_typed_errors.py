"""Issue 9 item 15: no untyped exception escapes. Each case is a typed FsDurableError with a
reason, and nothing is written. (Failed on 08efd9e: IsADirectoryError from begin_turn,
PermissionError from interrupted()/sessions()/doctor, RecursionError from a commit.)

Mode 0000 binds nobody who is root: those cases run in a child process with every capability
dropped (``setpriv --inh-caps=-all --bounding-set=-all``), so root meets the mode bits like any
user; without setpriv (and as root) they skip with the reason, except under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import fsdurable
from fsdurable import FsDurableError, InvalidState, StorageError
from tests.conftest import PYTHON, REPO, skip_or_fail, subprocess_env
from tests.torture.faults import no_caps_prefix


def _deep(n: int, leaf: Any = 1, *, lists: bool = False) -> Any:
    v = leaf
    for _ in range(n):
        v = [v] if lists else {"a": v}
    return v


def test_a_directory_at_the_marker_path_is_a_typed_error(root: Path) -> None:
    store = fsdurable.Store(root)
    before = store.create("m")
    (root / "markers" / "m.json").mkdir()
    with pytest.raises(FsDurableError) as info:
        store.begin_turn("m", "hi")
    assert isinstance(info.value, StorageError) and info.value.reason == "EISDIR"
    assert info.value.path and "m.json" in info.value.path
    assert store.load("m") == before  # nothing written
    assert os.listdir(root / "markers") == ["m.json"]  # no temp left beside it


@pytest.mark.parametrize("shape", ["dicts", "lists"])
def test_metadata_nested_5000_deep_is_invalid_state(root: Path, shape: str) -> None:
    store = fsdurable.Store(root)
    deep = _deep(5000, lists=shape == "lists")
    with pytest.raises(InvalidState) as info:
        store.create("deep", metadata={"x": deep})
    assert info.value.reason in ("not_json", "too_deep")
    assert not (root / "sessions" / "deep.json").exists()
    s = store.create("ok")
    with pytest.raises(InvalidState):
        store.save(fsdurable.Session(id="ok", version=s.version, commit_id=s.commit_id,
                                     metadata={"x": deep}))
    assert store.load("ok") == s
    # an event detail that deep never turns a decision into a crash either
    assert store.emit("test_event", deep=_deep(5000)) is None


CHILD = """
import json, sys
from fsdurable import Store
from fsdurable._doctor import doctor
from fsdurable._errors import FsDurableError
st = Store(sys.argv[1], create=False)
for name, fn in (("interrupted", st.interrupted), ("sessions", st.sessions),
                 ("doctor", lambda: doctor(st))):
    try:
        fn()
        rec = {"op": name, "ok": True}
    except FsDurableError as e:
        rec = {"op": name, "typed": True, "type": type(e).__name__, "reason": e.reason,
               "path": e.path}
    except Exception as e:
        rec = {"op": name, "typed": False, "type": type(e).__name__, "msg": str(e)}
    print(json.dumps(rec))
"""


@pytest.mark.parametrize("sub", ["markers", "sessions"])
def test_an_unreadable_directory_is_a_typed_error(root: Path, sub: str) -> None:
    prefix = no_caps_prefix()
    if prefix is None:
        skip_or_fail("mode 0000 does not bind root and setpriv is missing")
    store = fsdurable.Store(root)
    store.begin_turn(store.create("a").id, "hi")
    before = {p: p.read_bytes() for p in root.rglob("*.json")}
    os.chmod(root / sub, 0)
    try:
        out = subprocess.run([*prefix, PYTHON, "-c", CHILD, str(root)], env=subprocess_env(),
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(root / sub, 0o700)
    assert out.returncode == 0, out.stderr
    recs = {r["op"]: r for r in map(json.loads, out.stdout.splitlines())}
    touched = ["interrupted", "doctor"] if sub == "markers" else ["sessions", "doctor"]
    for op in touched:
        assert recs[op].get("typed") is True, recs[op]
        assert recs[op]["type"] == "StorageError" and recs[op]["reason"] == "EACCES"
        assert recs[op]["path"].endswith(sub)
    assert {p: p.read_bytes() for p in root.rglob("*.json")} == before  # nothing written
