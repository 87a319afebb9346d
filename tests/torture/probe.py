"""A child process that tries each store operation and prints what happened, as JSON lines.

Run it under reduced privileges (tests/test_faults.py drops every capability with ``setpriv`` so
root meets EACCES like any user) or against a read-only mount.
``python -m tests.torture.probe ROOT``
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import attrs


def main(root: str) -> int:
    from fsdurable._doctor import doctor
    from fsdurable._errors import FsDurableError
    from fsdurable._store import Store

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        try:
            out = fn()
            rec = {"op": name, "ok": True, "value": repr(out)[:200]}
        except FsDurableError as e:
            rec = {"op": name, "ok": False, "typed": True, "type": type(e).__name__,
                   "errno": getattr(e, "errno", None), "reason": e.reason, "msg": str(e)}
        except Exception as e:
            rec = {"op": name, "ok": False, "typed": False, "type": type(e).__name__,
                   "msg": str(e)}
        print(json.dumps(rec), flush=True)

    holder: list[Store] = []
    attempt("open", lambda: holder.append(Store(root)))
    if not holder:
        return 0
    st = holder[0]
    attempt("load", lambda: st.load("a").version)
    attempt("interrupted", lambda: [m.session_id for m in st.interrupted()])
    attempt("sessions", st.sessions)
    attempt("doctor", lambda: [f.code for f in doctor(st)])
    attempt("patch", lambda: st.patch("a", lambda s: attrs.evolve(s, metadata={"x": 1})))
    attempt("begin_turn", lambda: st.begin_turn("a", "hi"))
    attempt("checkpoint", lambda: st.checkpoint(st.load("b"), phase="p"))
    attempt("end_turn", lambda: st.end_turn(st.load("b"), "bye"))
    attempt("create", lambda: st.create("new"))
    attempt("delete", lambda: st.delete("a"))
    attempt("doctor_repair", lambda: [f.code for f in doctor(st, repair=True)])
    attempt("recover", lambda: _recover(st))
    return 0


def _recover(st: Any) -> Any:
    from fsdurable._recovery import recover

    from .agents import recovery_loop

    return [o.outcome for o in recover(st, recovery_loop(st)).outcomes]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
