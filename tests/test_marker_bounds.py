"""Issue 9 item 10: every marker a commit writes is readable by discovery. A turn whose marker
would exceed what discovery reads (a huge ``source``, ``route_key`` or turn id) is refused at the
commit with InvalidState, and nothing is written. (Failed on fb3eed5: the marker was written,
never discovered, and re-quarantined at every start.)"""

from __future__ import annotations

from pathlib import Path

import pytest

import fsdurable
from fsdurable import InvalidState
from fsdurable._discovery import MARKER_MAX_BYTES as MAX_MARKER_BYTES

HUGE = "x" * (MAX_MARKER_BYTES + 1)


@pytest.mark.parametrize("field", ["source", "route_key", "turn_id"])
def test_a_marker_discovery_cannot_read_is_never_written(root: Path, field: str) -> None:
    store = fsdurable.Store(root)
    kw = {field: HUGE} if field != "turn_id" else {}
    store.create("big", **kw)  # idle: no marker yet, the session itself may hold it
    path = root / "sessions" / "big.json"
    before = path.read_bytes()
    with pytest.raises(InvalidState) as info:
        store.begin_turn("big", "hi", **({"turn_id": HUGE} if field == "turn_id" else {}))
    assert info.value.reason == "too_large" and info.value.session_id == "big"
    assert path.read_bytes() == before  # nothing written: still idle, same version
    assert list((root / "markers").iterdir()) == []
    assert not store.load("big").in_progress
    assert store.interrupted() == []


def test_the_largest_marker_a_commit_writes_is_discovered(root: Path) -> None:
    store = fsdurable.Store(root)
    store.create("edge", source="s" * (MAX_MARKER_BYTES - 1024))
    s = store.begin_turn("edge", "hi")
    assert (root / "markers" / "edge.json").stat().st_size <= MAX_MARKER_BYTES
    [m] = fsdurable.Store(root).interrupted()  # a fresh process's discovery finds it
    assert m.session_id == "edge" and s.turn is not None and m.turn_id == s.turn.id
    assert list((root / "quarantine").iterdir()) == []

