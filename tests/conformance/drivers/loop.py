"""The conformance suite's driver for the reference ``AgentLoop`` (``ScriptedModel``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fsdurable
from fsdurable import AgentLoop, Message, Reply, Tool, ToolCall, ToolContext

from ..harness import CONTINUE, ModelFailure, Scenario, perform, step_of, store_for


def proceeding(transcript: Sequence[Message]) -> bool:
    last = next((m for m in reversed(transcript) if m.role == "user"), None)
    return last is not None and last.content == CONTINUE


DRIVER = "loop"


def _model(sc: Scenario, *, fail: bool = False) -> Any:
    def model(transcript: Sequence[Message], specs: Any) -> Reply:
        if fail:
            raise ModelFailure("the model is down")
        if proceeding(transcript):
            return Reply(sc.final)
        # the batches answered in this turn: assistant messages with tool calls since the turn's
        # last user message
        n = 0
        for m in reversed(transcript):
            if m.role == "user":
                break
            if m.role == "assistant" and m.tool_calls:
                n += 1
        batch = step_of(n, sc)
        if batch is None:
            return Reply(sc.final)
        return Reply("", [ToolCall(f"c{n}-{i}", name, dict(args))
                          for i, (name, args) in enumerate(batch)])

    return model


def _tools(sc: Scenario) -> list[Tool]:
    def body(name: str) -> Any:
        def fn(ctx: ToolContext, **args: Any) -> str:
            return perform(name, args, ctx.idempotency_key, ctx.attended)

        return fn

    return [Tool(t.name, body(t.name), effect=t.effect, needs_approval=t.needs_approval)
            for t in sc.tools]


def _loop(store: fsdurable.Store, sc: Scenario, *, approve: bool = False,
          fail: bool = False) -> AgentLoop:
    return AgentLoop(store, _model(sc, fail=fail), _tools(sc),
                     approve=lambda ctx, call: approve)


def live(root: str, sid: str, sc: Scenario, *, attended: bool, approve: bool) -> dict[str, Any]:
    store = store_for(root)
    if not store.exists(sid):
        store.create(sid, source="desktop")
    r = _loop(store, sc, approve=approve).run(sid, "go", attended=attended)
    return {"status": r.status, "reply": r.reply}


def recover(root: str, sc: Scenario, *, fail: bool) -> list[dict[str, Any]]:
    store = store_for(root)
    rep = fsdurable.recover(store, _loop(store, sc, fail=fail))
    return [o.to_dict() for o in rep.outcomes]


def proceed(root: str, sid: str, sc: Scenario) -> dict[str, Any]:
    store = store_for(root)
    r = _loop(store, sc).run(sid, CONTINUE, attended=True)
    return {"status": r.status, "reply": r.reply}
