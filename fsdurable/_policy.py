"""The unattended policy, decided at execution time: what a driver asks before a tool call.

A call is described by a ``ToolRequest`` (its declared effect — undeclared is ``external``, the
worst — and whether it needs a human's approval) and answered by a ``ToolDecision`` (run,
answered from the ledger, refused). Attendance is the live caller's word at the moment of
execution (``TurnRun.attended``: never read from disk, always false on a resume): unattended, the
deny-list and every approval are refused; an in-doubt call is re-run only if a repeat with the
same idempotency key is a no-op and the resume would run it (``rerun_safe``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._tools import ToolContext

Approver = Callable[[ToolContext, "ToolRequest"], bool]


@attrs.frozen
class ToolRequest:
    """One tool call a driver is about to make: its call id (unique in the turn), the tool's
    name and arguments, its declared effect (undeclared: ``external``, the worst) and whether it
    needs a human's approval."""

    call_id: str
    name: str
    arguments: Mapping[str, Any] = attrs.field(factory=dict)
    effect: str = "external"
    needs_approval: bool = False


@attrs.frozen
class ToolDecision:
    """What the protocol decided for a ``ToolRequest``: ``run`` it (``context`` carries the
    idempotency key; ``rerun``: an in-doubt idempotent call run again with its original key),
    ``answered`` from the ledger (``text``: the recorded result; never run again) or
    ``refused`` (``text`` for the model, ``reason``: unattended_deny, approval_denied,
    not_approved)."""

    action: str
    request: ToolRequest
    context: ToolContext
    text: str | None = None
    reason: str | None = None
    rerun: bool = False


def refusal_of(req: ToolRequest, *, attended: bool, ctx: ToolContext, approve: Approver | None,
               denied: frozenset[str]) -> tuple[str, str] | None:
    """Why the call is refused NOW — ``(reason, text for the model)`` — or None: an unattended
    run refuses the deny-list and every approval (a stored approval is not a human present); an
    attended run asks the live caller's ``approve`` (none: not approved)."""
    if not attended and req.name in denied:
        return ("unattended_deny",
                f"refused: {req.name} is not allowed in an unattended run (nobody is present)")
    if req.needs_approval:
        if not attended:
            return ("approval_denied",
                    f"denied: {req.name} needs approval and no human is present")
        if approve is None or not approve(ctx, req):
            return ("not_approved", f"denied: {req.name} was not approved")
    return None


def rerun_safe(effect: str | None, needs_approval: bool, denied: bool) -> bool:
    """May an in-doubt call be re-run on an unattended resume? Only if a repeat with the same
    idempotency key is a no-op (``idempotent``) AND the resume would run it: a call that needs
    approval or is deny-listed would be refused, and "refused" for a call that may have run is a
    lie — such a turn is parked for review."""
    return effect == "idempotent" and not needs_approval and not denied


__all__ = ["Approver", "ToolDecision", "ToolRequest", "refusal_of", "rerun_safe"]
