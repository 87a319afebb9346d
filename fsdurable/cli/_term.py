"""What the command line draws for a person at a terminal: tables that fit its width, and the
progress line of a long command (``doctor``, ``recover``) on stderr.

Both change nothing for a script: a table is whole when stdout is piped, and progress is drawn
only when stderr is a terminal and ``--json`` is off, then erased, so stdout and a captured
stderr are byte for byte what they are without it. The progress line uses no colour (nothing
for ``NO_COLOR`` to turn off) and plain ASCII (any terminal encoding draws it).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up)
if TYPE_CHECKING:
    import argparse
    from typing import TextIO

ERASE = "\r\x1b[2K"  # back to the line's start, clear the line
FIRST_FRAME = 0.3  # a command that ends sooner never draws anything (seconds)
FRAME = 0.2  # a redraw every FRAME seconds: cheap for the scan, lively for a person
SPIN = "|/-\\"
HINT = "  (Ctrl-C stops)"


def table(rows: list[list[str]], header: list[str], width: int | None = None) -> str:
    """A plain text table (no dependency): columns padded to their widest cell, and, on a
    terminal (or with ``COLUMNS`` set), narrowed to its width: the widest columns give way
    first and their cells end in "…" (``--json`` has every value whole)."""
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    room = width if width is not None else _terminal_width()
    if room is not None:
        floor = [min(w, max(len(h), 8)) for w, h in zip(widths, header, strict=True)]
        while sum(widths) + 2 * (len(widths) - 1) > room:
            i = max(range(len(widths)), key=lambda k: widths[k] - floor[k])
            if widths[i] <= floor[i]:
                break  # as narrow as it gets: the terminal wraps the rest
            widths[i] -= 1
    lines = ["  ".join(_cut(c, w).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cut(text: str, width: int) -> str:  # a table's cell
    return text if len(text) <= width else text[:width - 1] + "…"


def _terminal_width() -> int | None:
    """The width tables fit: the terminal's, or ``COLUMNS``; None when piped (whole rows)."""
    if not (sys.stdout.isatty() or os.environ.get("COLUMNS")):
        return None
    import shutil

    return shutil.get_terminal_size((100, 24)).columns


def progress_line(what: str, stage: str | None, done: int, total: int, elapsed: float,
                  tick: int, width: int) -> str:
    """One frame, shorter than ``width`` (the last column wraps on some terminals):
    ``doctor: scanning /s  sessions 41,200/100,000   41% [####......]  3 s``; before the first
    count (or for a stage of no known size) a spinner stands for count and bar. When the
    terminal is narrow the hint goes first, then the bar narrows and goes, then ``what`` is
    shortened: the count is the last thing given up."""
    room = width - 1
    took = f"  {elapsed:.0f} s"
    counted = stage is not None and total > 0
    if counted:
        done = min(done, total)
        status = f"{stage} {done:,}/{total:,}  {100 * done // total:3d}%"
    else:
        status = SPIN[tick % 4]
    core = f"  {status}"
    if len(what + core + took + HINT) <= room and not counted:
        return what + core + took + HINT
    if counted:
        for inner in range(30, 9, -1):
            filled = inner * done // total
            bar = " [" + "#" * filled + "." * (inner - filled) + "]"
            for hint in (HINT, ""):
                if len(what + core + bar + took + hint) <= room:
                    return what + core + bar + took + hint
    if len(what + core + took) <= room:
        return what + core + took
    keep = room - len(core + took)
    if keep >= 8:
        return what[:keep - 3] + "..." + core + took
    return (status + took)[:max(room, 1)]


class Progress:
    """On a terminal, a line on stderr that says how far a long command has got: the stage,
    how many of how many, the percentage and a bar (a spinner until the command reports a
    count), and how long it has run; erased when done. Nothing without a terminal or with
    ``--json``. ``update(stage, done, total)`` is the callback a library scan reports to
    (``doctor(..., progress=p.update)``): it only stores the numbers; a drawing thread reads
    them every ``FRAME`` seconds, so a scan may call it once per file."""

    def __init__(self, args: argparse.Namespace, what: str,
                 stream: TextIO | None = None) -> None:
        import threading

        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.on = not args.json and self.stream.isatty()
        self.state: tuple[str | None, int, int] = (None, 0, 0)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True) if self.on else None

    def update(self, stage: str, done: int, total: int) -> None:
        self.state = (stage, done, total)  # one assignment: the drawing thread sees a whole one

    def __enter__(self) -> Progress:
        if self.thread is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.thread is not None:
            self.done.set()
            self.thread.join()
            self.stream.write(ERASE)
            self.stream.flush()

    def _width(self) -> int:
        """The terminal's width now (it may be resized while we draw); 80 if it says none."""
        try:
            cols = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):  # not a real terminal (a test's stream)
            cols = 0
        if cols > 0:
            return cols
        import shutil

        return shutil.get_terminal_size((80, 24)).columns or 80

    def _run(self) -> None:
        import time

        t0, tick = time.monotonic(), 0
        while not self.done.wait(FRAME if tick else FIRST_FRAME):
            stage, done, total = self.state
            line = progress_line(self.what, stage, done, total, time.monotonic() - t0, tick,
                                 self._width())
            self.stream.write(ERASE + line)
            self.stream.flush()
            tick += 1
