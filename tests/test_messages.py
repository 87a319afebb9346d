"""Node ids and error messages a user can act on: host-name node ids work, the node id file never
lands inside a store, an existing id and a turn in progress say what to do next."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsdurable import (
    AgentLoop,
    ConflictError,
    InvalidSessionId,
    InvalidState,
    ScriptedModel,
    Store,
    TurnStateError,
)
from fsdurable.cli import main


@pytest.mark.parametrize("node", ["laptop.local", "edge-box.lan.example", "n_1", "a"])
def test_a_host_name_is_a_node_id(node: str, root: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    st = Store(root, node_id=node)
    st.create("s")
    st.begin_turn("s", "hi")
    [m] = st.interrupted()
    assert m.node_id == node
    monkeypatch.setenv("FSDURABLE_NODE", node)
    assert Store(root).node_id == node
    capsys.readouterr()
    assert main(["interrupted", "--root", str(root)]) == 0
    assert "resume" in capsys.readouterr().out  # its own turn, not "foreign"
    assert [e.code for e in Store(root).events("s")] == ["turn_started"]


@pytest.mark.parametrize("node", ["..", ".", ".hidden", "trailing.", "a..b", "a/b", "a b",
                                  "CON", "con.local", "", "x" * 129])
def test_a_bad_node_id_says_what_is_allowed(node: str, root: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidSessionId, match=r"laptop\.local works"):
        Store(root, node_id=node)
    if node:
        monkeypatch.setenv("FSDURABLE_NODE", node)
        with pytest.raises(InvalidSessionId, match="A-Z a-z 0-9 _ - and dots"):
            _ = Store(root).node_id


def test_the_node_id_file_is_never_written_inside_the_store(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(root)
    monkeypatch.delenv("FSDURABLE_NODE")
    monkeypatch.setenv("FSDURABLE_STATE_DIR", str(root / "state"))
    with pytest.raises(InvalidState) as e:
        _ = Store(root).node_id
    assert e.value.reason == "state_dir_in_store"
    assert not os.path.exists(root / "state")
    assert st.sessions() == []


def test_creating_an_existing_id_says_it_exists(store: Store) -> None:
    store.create("a")
    with pytest.raises(ConflictError, match="already exists") as e:
        store.create("a")
    assert e.value.reason == "exists" and e.value.session_id == "a"


def test_a_second_run_names_cancel_and_recover(store: Store) -> None:
    store.create("a")
    store.begin_turn("a", "first")  # a turn in progress (its process may have died)
    loop = AgentLoop(store, ScriptedModel([], final="done"))
    with pytest.raises(TurnStateError) as e:
        loop.run("a", "second")
    assert "fsdurable cancel a" in str(e.value) and "fsdurable recover" in str(e.value)
