"""Every tool call of a durable Pydantic AI run through the turn protocol's ledger.

``Ledger`` is a Pydantic AI capability around tool EXECUTION (``wrap_tool_execute``): it sees
every tool of the run, whichever toolset holds it (the agent's own tools, toolsets given at run
time, MCP servers), after the arguments are validated and before the tool runs. Pydantic AI 2.68
offers ``WrapperToolset`` too, but wrapping the agent's own function toolset means overriding
the agent's tools; a capability passed to ``agent.iter`` wraps them all without touching it.

For each call it asks ``TurnRun.before_tool`` (the unattended policy; an effectful call's intent
committed BEFORE the tool runs), then runs the tool or answers it (an outcome on record: never
run again; a refusal: the model gets the refusal text), and records the outcome
(``after_tool``). The ledger's call id is ``<tool_call_id>@<n>`` (``n``: the model responses in
the history so far), so a model that numbers its calls per response never has a new call
answered from an old one. A tool reads its idempotency key from ``tool_context()``.

A recorded outcome is JSON: ``{"return": value}``, ``{"retry": message}`` (the tool raised
``ModelRetry``), ``{"deferred": "call"|"approval"}`` (it raised ``CallDeferred`` /
``ApprovalRequired``) or ``{"error": text}``; answering it replays the same thing, so a resume
sees what the live run saw (a returned object comes back as its JSON form).
"""

from __future__ import annotations

import contextvars
import json
from dataclasses import dataclass
from typing import Any

import pydantic_core
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry
from pydantic_ai.messages import ModelResponse

from ._tools import ToolContext
from ._turns import ToolRequest

_CONTEXT: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "fsdurable_pydantic_ai_tool", default=None)
_KINDS = ("return", "retry", "deferred", "error")


def tool_context() -> ToolContext | None:
    """Inside a tool of a durable run: its ``ToolContext`` (``idempotency_key``: the same on a
    re-run of an in-doubt call; ``attended``; ``resumed``; ``cancelled()``). None elsewhere."""
    return _CONTEXT.get()


def call_key(tool_call_id: str | None, responses: int) -> str:
    return f"{tool_call_id or 'call'}@{responses}"


def _encode(kind: str, value: Any) -> str:
    return json.dumps({kind: pydantic_core.to_jsonable_python(value, fallback=repr)},
                      ensure_ascii=False)


def _replay(text: str) -> Any:
    """The recorded outcome, as the live run saw it (a refusal text is returned as is)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    if not (isinstance(doc, dict) and len(doc) == 1 and next(iter(doc)) in _KINDS):
        return text
    kind, value = next(iter(doc.items()))
    if kind == "retry":
        raise ModelRetry(str(value))
    if kind == "deferred":
        raise ApprovalRequired() if value == "approval" else CallDeferred()
    if kind == "error":
        raise RuntimeError(f"the tool failed on an earlier attempt of this turn: {value}")
    return value


@dataclass
class Ledger(AbstractCapability[Any]):
    """The capability a ``DurableRun`` passes to ``agent.iter`` (see the module doc)."""

    run: Any  # the DurableRun: its turn, its serialised disk calls, the declared effects

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any,
                                handler: Any) -> Any:
        run, owner = self.run, self.run.owner
        t = run.turn
        n = sum(1 for m in ctx.messages if isinstance(m, ModelResponse))
        req = ToolRequest(call_key(call.tool_call_id, n), call.tool_name, call.args_as_dict(),
                          owner.effect(call.tool_name),
                          needs_approval=tool_def.kind == "unapproved")
        approved = bool(ctx.tool_call_approved)
        d = await run.disk(t.before_tool, req, approve=lambda c, r: approved)
        if d.action == "answered":
            return _replay(d.text or "")
        if d.action == "refused":
            return d.text
        token = _CONTEXT.set(d.context)
        try:
            value = await handler(args)
        except ModelRetry as e:
            await run.disk(t.after_tool, d, ok=False, result=_encode("retry", e.message))
            raise
        except ApprovalRequired:
            await run.disk(t.after_tool, d, ok=True, result=_encode("deferred", "approval"))
            raise
        except CallDeferred:
            await run.disk(t.after_tool, d, ok=True, result=_encode("deferred", "call"))
            raise
        except Exception as e:
            await run.disk(t.after_tool, d, ok=False,
                           result=_encode("error", f"{type(e).__name__}: {e}"))
            raise
        finally:
            _CONTEXT.reset(token)
        await run.disk(t.after_tool, d, ok=True, result=_encode("return", value))
        return value


__all__ = ["Ledger", "call_key", "tool_context"]
