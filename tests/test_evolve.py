"""``_commit.evolve``: the commit path's copy-with-changes is ``attrs.evolve``'s, exactly."""

from __future__ import annotations

import math

import attrs
import pytest

from fsdurable._commit import evolve
from fsdurable._model import LedgerEntry, Message, Session, ToolCall, Turn
from fsdurable._segcodec import HistoryRef


def _samples() -> list[tuple[object, dict[str, object]]]:
    turn = Turn(id="t1", started_at=1.0, checkpoint_at=2.0, ledger=(
        LedgerEntry("c1", "send", "external", "k", "intent", 1.5),))
    s = Session(id="chat", version=3, commit_id="abc", in_progress=True, turn=turn,
                messages=(Message("user", "hi"),), metadata={"a": 1}, lanes={"x": (1, 2)})
    return [
        (turn, {"checkpoint_at": 9.0, "phase": "tool"}),
        (turn, {}),
        (s, {"version": 4, "updated_at": 5.0, "commit_id": "def", "turn": None,
             "in_progress": False}),
        (s, {"messages": (), "lanes": {}}),
        (HistoryRef(count=3, head=None, sha256=None, start=1), {"start": 2}),
        (ToolCall("c", "f"), {"arguments": {"x": 1}}),
        (Message("tool", "out", tool_call_id="c"), {"content": "new"}),
    ]


@pytest.mark.parametrize(("inst", "changes"), _samples())
def test_evolve_is_attrs_evolve(inst: object, changes: dict[str, object]) -> None:
    got = evolve(inst, **changes)
    want = attrs.evolve(inst, **changes)  # type: ignore[misc]
    assert type(got) is type(want)
    assert got == want
    assert got is not inst
    for name, value in changes.items():  # the changed values themselves, not copies
        assert getattr(got, name) is value


def test_evolve_runs_validators() -> None:
    s = Session(id="chat")
    with pytest.raises(ValueError, match="finite"):
        evolve(s, updated_at=math.nan)
    with pytest.raises(ValueError, match="role"):
        evolve(Message("user"), role="robot")


def test_evolve_refuses_unknown_names() -> None:
    with pytest.raises(TypeError, match="nope"):
        evolve(Session(id="chat"), nope=1)
    with pytest.raises(TypeError):
        attrs.evolve(Session(id="chat"), nope=1)  # type: ignore[call-arg]
