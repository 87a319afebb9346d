"""The ``fsdurable`` command line: the dispatcher. In-process: ``main(argv=None) -> exit code``.

Exit codes: 0 ok, 1 problems found (or an operation refused), 2 usage (a bad argument, a path
without a store), 3 an internal error (a bug: ``--debug`` shows the traceback), 130 interrupted
(Ctrl-C: one line, no traceback).
Every command takes ``--json`` and then prints exactly one JSON document on stdout (``watch``:
JSON Lines, one object per change), errors included: an error is ``{"error": TYPE, "message":
..., "exit_code": N, ...}`` (an argparse error, a missing store, a bad id, Ctrl-C, a bug alike)
and its one line still goes to stderr. Store root: ``--root``, else ``FSDURABLE_ROOT``, else the
user data dir. Every command but ``init`` refuses a path that holds no store.

Start-up is a script's: the command table below names each command's module and help, and only
the chosen command's module is imported (``fsdurable interrupted --json`` loads no sync, loop,
asyncio or attrs); ``fsdurable --help`` lists the commands from the table alone. The usual
shapes of the start-up commands (``interrupted``, ``recover --dry-run``) are parsed without
argparse; anything else goes through it.
"""

from __future__ import annotations

import os
import sys

OK, PROBLEMS, USAGE, INTERNAL, INTERRUPTED = 0, 1, 2, 3, 130

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn

    from ._term import Progress as Progress  # re-exported: the command modules draw with them
    from ._term import table as table

    # A handler gets the parsed args and returns (exit code, data for --json, text for humans).
    Result = tuple[int, Any, str]
    Handler = Callable[[argparse.Namespace], Result]
    ArgsFn = Callable[[argparse.ArgumentParser], None]
else:
    Result = tuple  # the alias only informs type checkers

# name -> (module that registers it with @command, one-line help). Lazy: nothing else is imported.
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("._store", "create a store here (the only command that creates one)"),
    "sessions": ("._store", "list the session ids"),
    "show": ("._store", "print one session: its turn, parked calls and last messages"),
    "interrupted": ("._recovery", "list the interrupted turns with their verdict and age"),
    "recover": ("._recovery",
                "apply the recovery gates to every interrupted turn (--dry-run: only show)"),
    "review": ("._review",
               "list turns parked for a human (in-doubt calls); record whether a call ran"),
    "events": ("._store", "print the event log (every node's), oldest first"),
    "cancel": ("._store",
               "cancel a session's turn in progress (in-doubt calls go to review)"),
    "doctor": ("._store", "scan the whole store and report every problem"),
    "schema": ("._store", "print a shipped JSON Schema (session, marker, event, manifest)"),
    "demo": ("..demo", "crash a scripted agent mid-turn and recover it, in a store of its own"),
    "adopt": ("._sync",
              "take another node's interrupted turn over (an event) and resume it unattended"),
    "resolve": ("._sync", "resolve a session's sync-tool conflict copies (losers to "
                              "quarantine/)"),
    "conflicts": ("._sync", "list every sync-tool conflict copy with its version"),
    "watch": ("._sync", "report markers, sessions and conflict copies as they change "
                            "(--json: JSON Lines)"),
    "ignore-file": ("._sync", "print a shipped ignore file that keeps half-written files "
                                  "out of sync"),
    "node": ("._sync", "print this machine's node id and where its machine-local state is"),
    "timeline": ("._timeline", "draw the turns over time: checkpoints, crash gaps, recovery "
                               "decisions (--html FILE: a page)"),
    "quarantine": ("._quarantine", "list what sits in quarantine/ (what, why, when), "
                                       "restore a fixed session, or --purge"),
}
_HANDLERS: dict[str, tuple[Handler, str, ArgsFn]] = {}


def __getattr__(name: str) -> Any:
    """``Progress`` and ``table`` (``_term``), loaded when a command draws for a person: the
    start-up commands with ``--json`` never do."""
    if name in ("Progress", "table"):
        from . import _term

        return getattr(_term, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class UsageError(Exception):
    """A bad argument or path: one line on stderr (with the next step), exit 2."""


def command(name: str, help: str | None = None, args: ArgsFn | None = None
            ) -> Callable[[Handler], Handler]:
    """Register a subcommand's handler (its module is named in ``COMMANDS``; a command missing
    there is still found, by importing every command module: slower, never wrong)."""

    def register(fn: Handler) -> Handler:
        text = help or COMMANDS.get(name, ("", ""))[1]
        _HANDLERS[name] = (fn, text, args or (lambda p: None))
        return fn

    return register


def open_store(args: argparse.Namespace, *, create: bool = False) -> Any:
    """The store at ``--root``; only ``init`` creates one (every other command reads, and a
    typo must not make a store in a home directory)."""
    from .._layout import default_root
    from .._store import Store

    root = args.root if args.root is not None else default_root()
    real = os.path.realpath(root)
    if os.path.exists(real) and not os.path.isdir(real):
        raise UsageError(f"--root {root} is a file, not a store directory "
                         "(give the store's directory)")
    if os.path.isdir(real) and not os.access(real, os.R_OK | os.X_OK):
        raise UsageError(f"cannot read {root}: permission denied (run as the store's owner, or "
                         "fix its permissions)")
    try:
        return Store(root, create=create)
    except Exception as e:
        if getattr(e, "reason", None) == "no_store":
            raise UsageError(f"no fsdurable store at {real} (create one with `fsdurable init "
                             f"--root {root}`, or pass --root)") from e
        raise


def not_found(st: Any, session_id: str) -> Exception:
    """The one not-found of every command (``show`` and ``events --session`` alike)."""
    from .._errors import SessionNotFound

    return SessionNotFound(f"no session {session_id!r}", session_id=session_id,
                           path=st.layout.session(session_id), reason="missing")


def non_negative(text: str) -> int:
    """argparse type: an integer >= 0 (``events --limit -3`` is a usage error)."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {n}")
    return n


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def iso(at: float, tz: Any = None) -> str:
    """A time for people: ISO 8601 with its offset (``2026-12-01T22:03:04+01:00``), local unless
    ``tz`` (a ``datetime.tzinfo``) says otherwise."""
    import datetime

    return datetime.datetime.fromtimestamp(at, tz).astimezone(tz).isoformat(timespec="seconds")


# ---------------------------------------------------------------------- parsing


def _common() -> argparse.ArgumentParser:
    import argparse

    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument("--root", default=argparse.SUPPRESS, metavar="DIR",
                        help="store directory (default: $FSDURABLE_ROOT, else the user data dir)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print one JSON document on stdout (watch: JSON Lines)")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="on an error, also print the traceback")
    return common


def _version() -> str:
    from .. import __version__

    return f"fsdurable {__version__}"


def _parser(only: str | None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that command's arguments are built (its module loaded)."""
    import argparse

    common = _common()
    p = argparse.ArgumentParser(prog="fsdurable", parents=[common], allow_abbrev=False,
                                description="Crash-durable agent turns on plain files. Exit "
                                "codes: 0 ok, 1 problems found, 2 usage, 3 internal error.")
    p.add_argument("--version", action="version", version=_version(),
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND",
                           help="one of the commands below (`fsdurable COMMAND --help`)")
    names = dict.fromkeys([*COMMANDS, *_HANDLERS])
    for name in names:
        if only is not None and name != only:
            sub.add_parser(name, help=_help(name), add_help=False)  # listed, never parsed
            continue
        handler = _HANDLERS.get(name)
        sp = sub.add_parser(name, help=_help(name), parents=[common], description=_help(name),
                            allow_abbrev=False)
        if handler is not None:
            handler[2](sp)
    return p


def _help(name: str) -> str:
    return COMMANDS[name][1] if name in COMMANDS else _HANDLERS[name][1]


def _command_name(argv: Sequence[str]) -> str | None:
    """The first positional argument (``--root DIR`` is the only option with a value before it)."""
    it = iter(argv)
    for a in it:
        if a == "--root":
            next(it, None)
        elif not a.startswith("-"):
            return a
    return None


# Start-up commands: {name: {flag: attribute}} for the shapes ``_fast`` parses.
_FAST: dict[str, dict[str, str]] = {"interrupted": {}, "recover": {"--dry-run": "dry_run"}}


def _fast(argv: Sequence[str]) -> Any:
    """The start-up commands' usual shapes (the command, its flags, ``--root DIR``/``--root=DIR``,
    ``--json``, ``--debug``) parsed as argparse would, without importing or building it (that
    costs a visible share of a script's start); None for anything else (help, a typo, an
    unknown flag), which argparse then parses and reports."""
    ns: dict[str, Any] = {"command": None, "root": None, "json": False, "debug": False}
    flags: dict[str, str] | None = None
    it = iter(argv)
    for a in it:
        if a == "--root":
            value = next(it, None)
            if value is None or value.startswith("-"):
                return None
            ns["root"] = value
        elif a.startswith("--root="):
            ns["root"] = a[len("--root="):]
        elif a in ("--json", "--debug"):
            ns[a[2:]] = True
        elif flags is None and a in _FAST:
            flags = _FAST[a]
            ns["command"] = a
            ns.update(dict.fromkeys(flags.values(), False))
        elif flags is not None and a in flags:
            ns[flags[a]] = True
        else:
            return None
    if flags is None:
        return None
    import types

    return types.SimpleNamespace(**ns)


def _load(name: str | None) -> None:
    """Import the module of command ``name`` (every command module when it is unknown)."""
    if name in _HANDLERS:
        return
    modules = [COMMANDS[name][0]] if name in COMMANDS else dict.fromkeys(
        m for m, _ in COMMANDS.values())
    for mod in modules:
        # a name relative to this package (".x": fsdurable.cli.x, "..x": fsdurable.x)
        full = (__package__.rpartition(".")[0] + mod[1:] if mod.startswith("..")
                else __package__ + mod)
        try:
            __import__(full)  # importlib.import_module, without importlib
        except ModuleNotFoundError as e:  # a command module this install does not ship
            if e.name != full:
                raise


# ---------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (0 ok, 1 problems, 2 usage, 3 internal error,
    130 interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    as_json = "--json" in argv
    try:
        return _main(argv, debug, as_json)
    except KeyboardInterrupt as e:  # Ctrl-C: one line, the shell's code for SIGINT
        return _fail(as_json, debug, INTERRUPTED, "interrupted", e, kind="Interrupted")
    except Exception as e:  # a bug: never a bare traceback with exit 1 ("problems found")
        return _fail(as_json, debug, INTERNAL, f"internal error: {type(e).__name__}: {e} "
                     "(--debug shows the traceback; please report it)", e, kind="InternalError")


def _main(argv: list[str], debug: bool, as_json: bool) -> int:
    fast = _fast(argv)
    if fast is not None:
        _load(fast.command)
        return _run(fast)
    name = _command_name(argv)
    help_only = name is None or any(a in ("-h", "--help", "--version") for a in argv)
    if name is not None and (name in COMMANDS or not help_only):
        _load(name)
    p = _parser(name if name in _HANDLERS else None)
    args = _parse(p, argv, as_json)
    if isinstance(args, int):
        return args
    args.root = getattr(args, "root", None)
    args.json = getattr(args, "json", False)
    args.debug = debug
    if not args.command:
        if as_json:
            return _fail(True, False, USAGE, "say which command (fsdurable --help lists them)",
                         None, kind="UsageError")
        p.print_help(sys.stderr)
        return USAGE
    return _run(args)


def _parse(p: argparse.ArgumentParser, argv: list[str], as_json: bool
           ) -> argparse.Namespace | int:
    """argparse's answer, or the exit code of what it printed instead (help, version, an
    error). With ``--json`` that is one JSON document too: argparse's own text is caught."""
    if not as_json:
        try:
            return p.parse_args(argv)
        except SystemExit as e:
            return int(e.code) if isinstance(e.code, int) else USAGE
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return p.parse_args(argv)
    except SystemExit as e:
        code = int(e.code) if isinstance(e.code, int) else USAGE
    if code == OK:  # --help or --version
        text = out.getvalue().rstrip("\n")
        doc = {"version": text.split()[-1]} if text == _version() else {"help": text}
        _print_json({**doc, "exit_code": OK})
        return OK
    lines = err.getvalue().strip().splitlines() or ["bad arguments"]
    message = lines[-1].partition(": error: ")[2] or lines[-1]
    usage_text = " ".join(ln.strip() for ln in lines[:-1]).removeprefix("usage: ")
    return _fail(True, False, code, message, None, kind="UsageError",
                 extra={"usage": usage_text})


def _run(args: argparse.Namespace) -> int:
    from .._errors import FsDurableError, InvalidRoot, InvalidSessionId

    handler = _HANDLERS[args.command][0]
    try:
        try:
            code, data, text = handler(args)
        except UsageError as e:
            return _fail(args.json, args.debug, USAGE, str(e), e, kind="UsageError")
        except FsDurableError as e:
            bad_input = isinstance(e, (InvalidSessionId, InvalidRoot))
            return _fail(args.json, args.debug, USAGE if bad_input else PROBLEMS, str(e), e,
                         doc=e.to_dict())
        except PermissionError as e:
            return _fail(args.json, args.debug, USAGE, f"{e.strerror or e}: {e.filename} (run "
                         "as the store's owner, or fix its permissions)", e,
                         kind="PermissionError")
        if args.json and data is not None:  # None: the command streamed its own (JSON Lines)
            _print_json(data)
        elif text:
            print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `fsdurable events | head`: the reader left, which is no error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush stays quiet
        return OK
    return code


def _print_json(data: Any, indent: int | None = 2) -> None:
    import json

    print(json.dumps(data, indent=indent, default=str, ensure_ascii=False), flush=True)


def _fail(as_json: bool, debug: bool, code: int, message: str, exc: BaseException | None, *,
          kind: str | None = None, doc: dict[str, Any] | None = None,
          extra: dict[str, Any] | None = None) -> int:
    """Report an error: one line on stderr (``--debug``: the traceback first) and, with
    ``--json``, its document on stdout (``doc``, else ``{"error": kind, "message": ...}``) with
    the exit code in it. Returns the exit code."""
    if debug and exc is not None:
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"fsdurable: {message}", file=sys.stderr)
    if as_json:
        import contextlib

        body = dict(doc) if doc is not None else {"error": kind, "message": message}
        with contextlib.suppress(BrokenPipeError):  # the reader left: nobody to tell
            # one line: a document of its own, and a valid last line of `watch`'s JSON Lines
            _print_json({**body, **(extra or {}), "exit_code": code}, indent=None)
    return code


def usage(message: str) -> NoReturn:
    """Stop a command with a usage error (exit 2): ``message`` says what to do next."""
    raise UsageError(message)
