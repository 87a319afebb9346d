"""A dry run says what the real run would do (issue 9 item 18), in the CLI and in the library,
where the session is bad, newer, or refused by the disk. Each case compares three answers: the
CLI's ``recover --dry-run`` (stdlib peek, or the library's dry run when the peek cannot judge),
``recover(store, loop, dry_run=True, resume=False)``, and what ``fsdurable recover`` then does.
On 75f1263 the CLI said ``would_leave`` for the malformed sessions (the library: unreadable),
both dry runs said ``would_abandon`` for a newer format (the real run: ``needs_newer``), and a
session the disk refused made ``recover --dry-run`` exit 1."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from fsdurable import AgentLoop, ScriptedModel, Store, _fsio, recover
from fsdurable._errors import StorageError
from fsdurable.cli import main

# the real run's outcome for each dry-run outcome
REAL = {"would_leave": "left", "would_abandon": "abandoned", "would_repair": "repaired",
        "would_supersede": "superseded", "needs_newer": "needs_newer", "error": "error"}


def cli(root: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["--root", str(root), *argv, "--json"])
    return code, json.loads(out.getvalue())


def outcomes(doc: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {o["session_id"]: (o["outcome"], o["reason"]) for o in doc["outcomes"]}


def edit_session(st: Store, sid: str, fn: Any) -> None:
    path = Path(st.layout.session(sid))
    doc = json.loads(path.read_bytes())
    fn(doc)
    path.write_text(json.dumps(doc), "utf-8")


MALFORMED = {
    "no_version": lambda d: d.pop("version"),
    "negative_attempts": lambda d: d["turn"].update(resume_attempts=-1),
    "huge_attempts": lambda d: d["turn"].update(resume_attempts=2**64),
    "created_at_text": lambda d: d.update(created_at="yesterday"),
    "history_text": lambda d: d.update(history="x"),
    "checkpoint_bool": lambda d: d["turn"].update(checkpoint_at=True),
    "turn_without_flag": lambda d: d.update(in_progress=False),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_session_is_planned_as_the_real_run_treats_it(root: Path, case: str) -> None:
    st = Store(root)
    st.create("ok")
    st.begin_turn("ok", "go")
    st.create("bad")
    st.begin_turn("bad", "go")
    edit_session(st, "bad", MALFORMED[case])
    code, dry = cli(root, "recover", "--dry-run")
    lib = recover(st, AgentLoop(st, ScriptedModel([]), []), dry_run=True, resume=False)
    assert code == 0
    assert outcomes(dry) == outcomes(lib.to_dict())
    assert outcomes(dry)["bad"] == ("would_abandon", "unreadable")
    assert outcomes(dry)["ok"] == ("would_leave", "no_loop")
    _, real = cli(root, "recover")
    assert {k: o for k, (o, _) in outcomes(real).items()} == \
        {k: REAL[o] for k, (o, _) in outcomes(dry).items()}


def test_a_newer_session_format_is_left_by_both_dry_runs_and_the_real_run(root: Path) -> None:
    st = Store(root)
    st.create("new")
    st.begin_turn("new", "go")
    edit_session(st, "new", lambda d: d.update(format="fsdurable.session/99"))
    code, dry = cli(root, "recover", "--dry-run")
    lib = recover(st, AgentLoop(st, ScriptedModel([]), []), dry_run=True, resume=False)
    assert code == 0
    assert outcomes(dry)["new"][0] == outcomes(lib.to_dict())["new"][0] == "needs_newer"
    _, real = cli(root, "recover")
    assert outcomes(real)["new"][0] == "needs_newer"
    assert Path(st.layout.session("new")).exists() and Path(st.layout.marker("new")).exists()


def test_a_session_the_disk_refuses_is_an_error_outcome_not_a_crash(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(root)
    for sid in ("a", "b"):
        st.create(sid)
        st.begin_turn(sid, "go")
    real_read = _fsio.read_bounded

    def refusing(path: str, max_bytes: int) -> Any:
        if path == st.layout.session("a"):
            raise StorageError("EIO", path=path, reason="io")
        return real_read(path, max_bytes)

    monkeypatch.setattr(_fsio, "read_bounded", refusing)
    code, dry = cli(root, "recover", "--dry-run")
    assert code == 0
    assert outcomes(dry) == {"a": ("error", "error"), "b": ("would_leave", "no_loop")}
    _, real = cli(root, "recover")
    assert {k: o for k, (o, _) in outcomes(real).items()} == {"a": "error", "b": "left"}


def test_would_resume_has_no_reason_as_before(store: Any) -> None:
    store.create("a")
    store.begin_turn("a", "go")
    rep = recover(store, AgentLoop(store, ScriptedModel([]), []), dry_run=True)
    [o] = rep.outcomes
    assert (o.outcome, o.reason) == ("would_resume", None)
