"""CLI command ``review``: the calls parked for a human, and the human's answers.

``fsdurable review`` lists every call waiting for an answer (exit 1 if there is one);
``fsdurable review ID`` shows one session's parked calls with their answers;
``fsdurable review ID --ran`` / ``--did-not-run`` records the answer (an event; ``--call`` picks
one call when several are parked); ``--did-not-run --rerun --host MODULE:FACTORY`` then runs the
call again — attended, with its original idempotency key — the only way a parked call runs again.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import Result, _age, command, open_store, table, usage


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id", nargs="?", default=None,
                   help="one session's parked calls (without it: every call waiting)")
    answer = p.add_mutually_exclusive_group()
    answer.add_argument("--ran", action="store_true",
                        help="record that the call DID run (it is never run again)")
    answer.add_argument("--did-not-run", action="store_true",
                        help="record that the call did NOT run (--rerun may then run it)")
    p.add_argument("--call", dest="tool_call_id", default=None, metavar="TOOL_CALL_ID",
                   help="which parked call (needed when the session has several unanswered)")
    p.add_argument("--note", default=None, help="why (kept with the answer and in its event)")
    p.add_argument("--rerun", action="store_true",
                   help="run a call answered 'did not run' again now: attended, same "
                        "idempotency key (needs --host)")
    p.add_argument("--host", metavar="MODULE:FACTORY", default=None,
                   help="build the host loop whose tools run the call (with --rerun)")


def _rows(calls: list[dict[str, Any]], now: float) -> list[list[str]]:
    rows = []
    for c in calls:
        args = json.dumps(c.get("arguments"), ensure_ascii=False, default=str)
        if len(args) > 60:
            args = args[:57] + "..."
        ans = c.get("answer")
        parked_at = c.get("parked_at")
        rows.append([c["session_id"], str(c.get("tool_call_id")), str(c.get("tool")), args,
                     str(c.get("idempotency_key")), str(c.get("reason")),
                     _age(now - parked_at) if isinstance(parked_at, (int, float)) else "",
                     ans["answer"] if isinstance(ans, dict) else "waiting"])
    return rows


HEADER = ["session", "call", "tool", "arguments", "idempotency key", "why", "age", "answer"]


@command("review", args=_args)
def _review(args: argparse.Namespace) -> Result:
    from .. import _review
    from .._errors import InvalidState

    st = open_store(args)
    now = st.clock()
    if args.rerun and not args.host:
        usage("--rerun needs --host MODULE:FACTORY (the host's tools run the call)")
    if args.session_id is None:
        if args.ran or args.did_not_run or args.rerun:
            usage("say which session: fsdurable review SESSION_ID --ran|--did-not-run")
        waiting = _review.review_queue(st)
        text = (table(_rows(waiting, now), HEADER) + "\nanswer with: fsdurable review SESSION_ID "
                "--ran | --did-not-run [--call TOOL_CALL_ID]") if waiting else \
            "(nothing waits for review)"
        return (1 if waiting else 0), {"review": waiting}, text
    data: dict[str, Any] = {"session_id": args.session_id}
    lines: list[str] = []
    try:
        if args.ran or args.did_not_run:
            done = _review.answer_review(st, args.session_id, ran=args.ran,
                                         tool_call_id=args.tool_call_id, note=args.note)
            data["answered"] = done
            lines += [f"recorded: {c['tool_call_id']} ({c.get('tool')}) "
                      f"{'ran' if args.ran else 'did not run'}" for c in done]
        if args.rerun:
            from ._sync import _host

            cid, which = _to_rerun(st, args.session_id, args.tool_call_id)
            result = _review.rerun_call(st, _host(args.host, st), args.session_id, which)
            data["rerun"] = {"tool_call_id": cid, "result": result}
            lines.append(f"ran {cid} again (attended, same idempotency key): {result}")
    except InvalidState as e:
        if e.reason == "call_required":  # which call is the human's to say
            usage(str(e))
        raise
    s = st.load(args.session_id)
    calls = _review.parked(s)
    data["review"] = calls
    if not lines:
        lines.append(table(_rows(calls, now), HEADER) if calls else
                     f"{args.session_id}: nothing parked for review")
    return 0, data, "\n".join(lines)


def _to_rerun(st: Any, session_id: str, given: str | None) -> tuple[str, str]:
    """The call to run again (its id, and what names it exactly: ``--call`` as given, else the
    idempotency key of the one call answered "did not run" and not yet re-run)."""
    if given is not None:
        return given, given
    from .._review import rerunnable

    s = st.load(session_id)
    # none left: the one already re-run (another process's re-run may just have ended) is
    # named, and the re-run's own check, under its lock, refuses it and says so
    calls = rerunnable(s) or rerunnable(s, rerun=True)
    if len(calls) != 1:
        usage("say which call to run again: --call TOOL_CALL_ID (answered 'did not run' and not "
              f"yet re-run: {', '.join(str(c['idempotency_key']) for c in calls) or 'none'})")
    return str(calls[0]["tool_call_id"]), str(calls[0]["idempotency_key"])
