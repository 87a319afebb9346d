"""The review queue across turns and drivers: a parked call shows its arguments from the ledger
(a driver whose transcript is not fsdurable's), a cancelled begin never comes back, a stale or
exhausted turn's in-doubt calls are parked (never dropped with the turn), answers belong to one
turn's call, and a re-run happens once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fsdurable import Store, recover
from fsdurable._turns import ToolRequest, TurnRun
from fsdurable.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


class SdkHost:
    """A recovery host of a driver whose transcript lives in its framework (not in
    ``Session.messages``): every tool has an external effect, so an in-doubt call is parked."""

    driver = "openai-agents"

    def tool_effect(self, name: str) -> str | None:
        return "external"

    def resume_claimed(self, session: Any) -> Any:
        raise AssertionError("an in-doubt external call must be parked, never resumed")


def died_in_call(st: Store, sid: str, call_id: str = "call_0", amount: int = 42) -> str:
    """A live run of the Agents SDK driver commits a charge's intent and dies inside the call
    (the route lock goes with the process; the turn stays in progress). Returns the turn id."""
    if sid not in st.sessions():
        st.create(sid, source="openai-agents")
    r = TurnRun.begin(st, sid, driver="openai-agents", attended=True)
    d = r.before_tool(ToolRequest(call_id, "charge_card", {"amount": amount},
                                  effect="external"))
    assert d.action == "run"
    r.release()  # the process is gone
    return r.turn_id


def test_a_parked_call_shows_its_arguments_from_the_ledger(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st = Store(root)
    tid = died_in_call(st, "sdk")
    assert st.load("sdk").messages == ()  # nothing of the call in fsdurable's transcript
    [o] = recover(st, SdkHost()).outcomes
    assert o.outcome == "review_required"
    [c] = st.load("sdk").metadata["review_required"]["calls"]
    assert (c["tool_call_id"], c["turn_id"], c["arguments"]) == ("call_0", tid, {"amount": 42})
    code, out = run(capsys, "review", "--root", str(root))
    assert code == 1
    [w] = out["review"]
    assert (w["tool"], w["arguments"]) == ("charge_card", {"amount": 42})
    code, out = run(capsys, "review", "sdk", "--root", str(root))
    assert code == 0 and out["review"][0]["arguments"] == {"amount": 42}
