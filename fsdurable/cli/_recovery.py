"""CLI commands of recovery: ``recover [--dry-run]`` and ``interrupted`` with each verdict.

``recover`` without ``--dry-run`` has no host loop to continue a turn with (the tools live in the
host), so it applies the gates that need none — stale and exhausted turns abandoned, orphan
markers repaired, each with its event — and leaves resumable turns (outcome ``left``) for the
host's ``fsdurable.recover(store, loop)``. ``--dry-run`` says what that would do and changes
nothing: the same outcomes as ``recover(store, loop, dry_run=True, resume=False)``.
"""

from __future__ import annotations

from .._errors import TurnStateError
from . import Result, _age, command, open_store

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up)
if TYPE_CHECKING:
    import argparse
    from typing import Any


def _judged(st: Any, markers: list[Any]) -> list[dict[str, Any]]:
    """Every interrupted turn with its verdict, from one listing of markers/ (no session read,
    no agent loop, no attrs): what ``interrupted`` prints."""
    from .._gates import RecoveryPolicy, verdict

    pol = RecoveryPolicy.from_config(st.config)
    now = st.clock()
    return [{"session_id": m.session_id, "turn_id": m.turn_id, "node_id": m.node_id,
             "verdict": verdict(m, node_id=st.node_id, now=now, policy=pol),
             "age_seconds": round(now - m.checkpoint_at, 3),
             "resume_attempts": m.resume_attempts, "route_key": m.route_key,
             "source": m.source, "driver": m.owner_driver, "checkpoint_at": m.checkpoint_at}
            for m in markers]


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
    st = open_store(args)
    # one listing; a marker that cannot be read is listed as bad, never moved: recover and
    # doctor --repair take it to the repair gate
    markers, bad = st.scan_markers()
    data = _judged(st, markers)
    doc = {"interrupted": data,
           "unreadable": [{"session_id": sid, "reason": why} for sid, why in bad]}
    if args.json:
        return 0, doc, ""  # only the document is printed: no table drawn (start-up)
    from . import table

    rows = [[*r, d["driver"]] for r, d in zip(_rows(data), data, strict=True)]
    rows += [[sid, f"unreadable ({why})", "", "", "", ""] for sid, why in bad]
    text = (table(rows, ["session", "verdict", "age", "attempts", "node", "driver"]) if rows
            else "(none)")
    return 0, doc, text


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
    data = _dry_run(st) if args.dry_run else None
    if data is None:
        from .._recovery import recover
        from . import Progress

        with Progress(args, f"recover: applying the gates in {st.root}") as shown:
            report = recover(st, _NoLoop(), resume=False, dry_run=bool(args.dry_run),
                             progress=shown.update)
        data = [_outcome(o) for o in report.outcomes]
        data += _left_to_drivers(st, st.scan_markers()[0], {d["session_id"] for d in data},
                                 dry_run=bool(args.dry_run))
    doc = {"dry_run": bool(args.dry_run), "outcomes": data}
    if args.json and args.dry_run:
        return 0, doc, ""  # only the document is printed: no table drawn (start-up)
    from . import table

    header = ["session", "verdict", "age", "attempts", "node", "outcome"]
    text = table(_rows(data, outcome=True), header) if data else "(no interrupted turns)"
    if not args.dry_run:
        text += _parked(st, data)
    return 0, doc, text


def _parked(st: Any, data: list[dict[str, Any]]) -> str:
    """A line for each abandoned turn whose in-doubt calls went to the review queue (they may
    have run: a human answers them with ``fsdurable review``)."""
    from .._errors import FsDurableError
    from .._review import parked

    lines = []
    for d in data:
        if d["outcome"] != "abandoned":
            continue
        try:
            calls = [c for c in parked(st.load(d["session_id"]))
                     if c.get("turn_id") == d["turn_id"] and c["answer"] is None]
        except FsDurableError:
            continue
        if calls:
            lines.append(f"\n{d['session_id']}: {len(calls)} call(s) of the abandoned turn may "
                         f"have run and wait for review (fsdurable review {d['session_id']})")
    return "".join(lines)


def _dry_run(st: Any) -> list[dict[str, Any]] | None:
    """What ``recover`` would do, as ``recover(store, loop, dry_run=True, resume=False)`` says
    it, at the cost of a listing: the stdlib gates, and each gated turn's session peeked at with
    the stdlib (``peek_turn``: a finished turn's marker is an orphan, a newer turn supersedes
    it). None when a marker or a session needs the full codec (the library's dry run decides)."""
    from .._discovery import NeedsCodec, peek_turn
    from .._gates import NOT_CLAIMED, RecoveryPolicy, plan, verdict

    markers, bad = st.scan_markers()
    if bad:
        return None  # the repair gate's plan for each bad marker reads its session
    pol = RecoveryPolicy.from_config(st.config)
    now = st.clock()
    out = []
    reason: str | None
    for m in markers:
        if m.owner_driver != "loop":
            continue  # left to the driver's own recover(), as a real run leaves them (below)
        v = verdict(m, node_id=st.node_id, now=now, policy=pol)
        exact, reason = m, v
        if v in NOT_CLAIMED:
            outcome = NOT_CLAIMED[v]
        else:
            try:
                turn = peek_turn(st.layout, m.session_id, st.config.max_file_bytes)
            except NeedsCodec:
                return None
            v, outcome, reason, exact = plan(m, v, turn, node_id=st.node_id, now=now,
                                             policy=pol, resume=False)
        out.append({"session_id": m.session_id, "turn_id": m.turn_id, "node_id": m.node_id,
                    "verdict": v, "age_seconds": round(now - exact.checkpoint_at, 3),
                    "resume_attempts": exact.resume_attempts, "outcome": outcome,
                    "reason": reason, "error": None, "status": None})
    return out + _left_to_drivers(st, markers, set(), dry_run=True)


def _left_to_drivers(st: Any, markers: list[Any], listed: set[str], *, dry_run: bool
                     ) -> list[dict[str, Any]]:
    """The interrupted turns another driver owns (a LangGraph thread, an Agents SDK or Pydantic
    AI run): the generic recover leaves each to that driver's own ``recover()``. Listed with
    that reason, so ``recover`` (and its dry run) and ``interrupted`` name the same turns."""
    from .._gates import RecoveryPolicy, verdict

    pol = RecoveryPolicy.from_config(st.config)
    now = st.clock()
    return [{"session_id": m.session_id, "turn_id": m.turn_id, "node_id": m.node_id,
             "verdict": verdict(m, node_id=st.node_id, now=now, policy=pol),
             "age_seconds": round(now - m.checkpoint_at, 3),
             "resume_attempts": m.resume_attempts,
             "outcome": "would_leave" if dry_run else "left",
             "reason": f"driver {m.owner_driver}: its own recover() resumes it", "error": None,
             "status": None} for m in markers
            if m.owner_driver != "loop" and m.session_id not in listed]


def _outcome(o: Any) -> dict[str, Any]:
    """One vocabulary with ``interrupted``: ``age_seconds`` and ``resume_attempts``."""
    d: dict[str, Any] = o.to_dict()
    d["age_seconds"] = d.pop("age")
    d["resume_attempts"] = d.pop("attempts")
    return d

