"""CLI commands of recovery: ``recover [--dry-run]`` and ``interrupted`` with each verdict.

``recover`` without ``--dry-run`` has no host loop to continue a turn with (the tools live in the
host), so it applies the gates that need none — stale and exhausted turns abandoned, orphan
markers repaired, each with its event — and leaves resumable turns (outcome ``left``) for the
host's ``fsdurable.recover(store, loop)``. ``--dry-run`` only computes the verdicts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errors import TurnStateError
from .cli import Result, _age, command, open_store, table

if TYPE_CHECKING:
    import argparse


def _judged(st: Any) -> list[dict[str, Any]]:
    """Every interrupted turn with its verdict, from one listing of markers/ (no session read,
    no agent loop, no attrs): what ``interrupted`` and ``recover --dry-run`` print."""
    from ._gates import RecoveryPolicy, verdict

    pol = RecoveryPolicy.from_config(st.config)
    now = st.clock()
    return [{"session_id": m.session_id, "turn_id": m.turn_id, "node_id": m.node_id,
             "verdict": verdict(m, node_id=st.node_id, now=now, policy=pol),
             "age_seconds": round(now - m.checkpoint_at, 3),
             "resume_attempts": m.resume_attempts, "route_key": m.route_key,
             "source": m.source, "checkpoint_at": m.checkpoint_at} for m in st.interrupted()]


def _rows(data: list[dict[str, Any]], *, outcome: bool = False) -> list[list[str]]:
    rows = []
    for d in data:
        row = [d["session_id"], d["verdict"], _age(d["age_seconds"]), str(d["resume_attempts"]),
               d["node_id"]]
        if outcome:
            row.append(d["outcome"] + (f" ({d['reason']})" if d.get("reason") else ""))
        rows.append(row)
    return rows


@command("interrupted")
def _interrupted(args: argparse.Namespace) -> Result:
    data = _judged(open_store(args))
    text = (table(_rows(data), ["session", "verdict", "age", "attempts", "node"]) if data
            else "(none)")
    return 0, {"interrupted": data}, text


class _NoLoop:
    """Recovery from the CLI: gates only. A turn that would resume is left for the host."""

    def tool_effect(self, name: str) -> str | None:
        return None  # unknown: an in-doubt call parks the turn, never a blind re-run

    def resume_claimed(self, session: Any) -> Any:
        raise TurnStateError("the CLI has no loop to resume a turn with", reason="no_loop")


def _recover_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="apply the gates and print the verdicts; run and change nothing")


@command("recover", args=_recover_args)
def _recover(args: argparse.Namespace) -> Result:
    st = open_store(args)
    if args.dry_run:  # the gates alone: as cheap as `interrupted` (recovery's `assess`)
        data = [{**d, "outcome": "planned", "reason": None, "error": None, "status": None}
                for d in _judged(st)]
    else:
        from ._recovery import recover

        data = [_outcome(o) for o in recover(st, _NoLoop(), resume=False).outcomes]
    header = ["session", "verdict", "age", "attempts", "node", "outcome"]
    text = table(_rows(data, outcome=True), header) if data else "(no interrupted turns)"
    return 0, {"dry_run": bool(args.dry_run), "outcomes": data}, text


def _outcome(o: Any) -> dict[str, Any]:
    """One vocabulary with ``interrupted``: ``age_seconds`` and ``resume_attempts``."""
    d: dict[str, Any] = o.to_dict()
    d["age_seconds"] = d.pop("age")
    d["resume_attempts"] = d.pop("attempts")
    return d

