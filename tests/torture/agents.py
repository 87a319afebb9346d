"""The agent loops the torture runs drive: the reference ``AgentLoop`` with a scripted model."""

from __future__ import annotations

from typing import Any

from fsdurable._store import Store


def recovery_loop(store: Store) -> Any:
    """A loop for startup recovery in a crash state: its model answers at once; ``send`` is an
    external tool (so an in-doubt call of it is parked, never re-run)."""
    from fsdurable._loop import AgentLoop
    from fsdurable._tools import ScriptedModel, Tool

    send = Tool("send", lambda ctx, **kw: "sent", effect="external")
    return AgentLoop(store, ScriptedModel([], final="recovered"), [send])
