"""The repair gate is the only mover and rewriter of a file the store did not just write: a
session of an older format met by recovery is migrated by the gate (``session_migrated``)
before any other commit of recovery; a read of an adapter's conversation never moves another
node's entry, and a newer format is left in place (``needs_newer``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fsdurable import Store, recover
from fsdurable import _events as ev
from fsdurable._codec import encode_marker
from fsdurable._model import Marker

from .conftest import DATA

V2_ID = "legacy-turn_02"
V2_CHECKPOINT = 1764403600.5


class ParkingHost:
    """A host that knows no tool: an in-doubt call parks the turn."""

    def tool_effect(self, name: str) -> str | None:
        return None

    def resume_claimed(self, session: Any) -> Any:
        raise AssertionError("an in-doubt call of an unknown tool is never resumed")


def _raw_format(root: Path, sid: str) -> str:
    return str(json.loads((root / "sessions" / f"{sid}.json").read_bytes())["format"])


@pytest.mark.parametrize(("after", "outcome"), [(60.0, "review_required"),
                                                (5 * 3600.0, "abandoned")])
def test_recovery_migrates_an_older_session_through_the_gate(
        root: Path, after: float, outcome: str) -> None:
    """Issue 17 item 20: recovery meets a format-2 session in progress (its in-doubt call parks
    it, or it is stale); the session is migrated by the repair gate with ``session_migrated``
    before recovery commits anything else — not rewritten silently by recovery's own commit."""
    st = Store(root, node_id="node-a", clock=lambda: V2_CHECKPOINT + after)
    shutil.copyfile(DATA / "session_v2.json", root / "sessions" / f"{V2_ID}.json")
    (root / "markers" / f"{V2_ID}.json").write_bytes(encode_marker(Marker(
        session_id=V2_ID, turn_id="turn-7", session_version=4, node_id="node-a",
        route_key="chat:42", source="telegram", started_at=1764403500.0,
        checkpoint_at=V2_CHECKPOINT, resume_attempts=1)))
    [o] = recover(st, ParkingHost()).outcomes
    assert o.outcome == outcome
    codes = [e.code for e in st.events(V2_ID)]
    assert ev.SESSION_MIGRATED in codes, codes
    then = ev.REVIEW_REQUIRED if outcome == "review_required" else ev.ABANDONED
    assert codes.index(ev.SESSION_MIGRATED) < codes.index(then)
    [migrated] = [e for e in st.events(V2_ID) if e.code == ev.SESSION_MIGRATED]
    assert migrated.detail["version"] == 5  # the gate's rewrite is the first commit after v4
    s = st.load(V2_ID)
    assert not s.in_progress and s.version == 6 and s.metadata["title"] == "Train"
    assert _raw_format(root, V2_ID) != "fsdurable.session/2"
    assert [c["tool_call_id"] for c in s.metadata["review_required"]["calls"]] == ["call_1"]
