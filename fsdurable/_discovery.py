"""Discovery: every interrupted turn from ONE listing of ``markers/`` (stdlib only).

A fresh process that opens a store and lists its interrupted turns runs this and nothing heavier:
one ``scandir`` of ``markers/``, then each ``<id>.json`` read (bounded, never through a link) and
parsed by the stdlib marker codec. Sessions are never read here. What cannot be read is returned,
not raised, and not acted on: deciding what to do with a bad marker (quarantine, rebuild, report)
is the store's repair path, which may need the session codec; a listing itself changes nothing.
"""

from __future__ import annotations

import os

from . import _fsio
from ._errors import FsDurableError, StorageError, UnreadableState
from ._layout import Layout, own_id
from ._recordcodec import SESSION_FORMAT, loads_strict, parse_marker
from ._records import Marker

# A marker is a few hundred bytes. However large ``Config.max_file_bytes`` is, a marker over this
# is never read whole into memory at startup (a sync tool's garbage under a marker's name).
MARKER_MAX_BYTES = 1 << 20


def marker_cap(max_file_bytes: int) -> int:
    """The read bound of a marker under a store's ``max_file_bytes``."""
    return min(max_file_bytes, MARKER_MAX_BYTES)


def read_marker(layout: Layout, sid: str, max_bytes: int) -> tuple[Marker, os.stat_result] | None:
    """The marker of ``sid`` and the stat of the file it came from; None if there is none.
    Raises UnreadableState (a bad file) or StorageError (the disk refused: EACCES, EIO)."""
    path = layout.marker(sid)
    try:
        data, st = _fsio.read_bounded(path, max_bytes)
    except FileNotFoundError:
        return None
    return parse_marker(data, path=path, session_id=sid), st


class Listing:
    """What one listing of ``markers/`` found: ``markers`` (with the stat each was read at),
    oldest checkpoint first, and ``bad`` — the ids whose marker could not be read or parsed, each
    with its typed error (``UnreadableState`` or ``StorageError``)."""

    __slots__ = ("bad", "markers")

    def __init__(self, markers: list[tuple[Marker, os.stat_result]],
                 bad: list[tuple[str, FsDurableError]]) -> None:
        self.markers = markers
        self.bad = bad


def scan(layout: Layout, max_bytes: int) -> Listing:
    """One listing of ``markers/``; a name that is not ``<valid id>.json`` is not ours (a temp
    file, a sync tool's copy) and is skipped. A marker removed meanwhile is simply absent."""
    found: list[tuple[Marker, os.stat_result]] = []
    bad: list[tuple[str, FsDurableError]] = []
    for name in _fsio.list_names(layout.markers):
        sid = own_id(name)
        if sid is None:
            continue
        try:
            got = read_marker(layout, sid, max_bytes)
        except (UnreadableState, StorageError) as e:
            bad.append((sid, e))
            continue
        if got is not None:  # None: removed since the listing, no longer interrupted
            found.append(got)
    found.sort(key=lambda ms: (ms[0].checkpoint_at, ms[0].session_id))
    return Listing(found, bad)


class NeedsCodec(Exception):
    """``peek_turn`` cannot judge this session file with the stdlib alone (another format, a
    field out of shape, a file that must not be read): the full session codec must decide."""


_INT63 = 1 << 63  # the session codec's range for versions and attempts
_NUM, _STR, _OPT_STR = (int, float), (str,), (str, type(None))
# the shape of a session in SESSION_FORMAT as the session codec checks it, one level deep:
# (key, accepted types, required); values are never bools where numbers are asked for
_SESSION_SHAPE = (("id", _STR, True), ("version", (int,), True), ("commit_id", _STR, False),
                  ("created_at", _NUM, False), ("updated_at", _NUM, False),
                  ("source", _STR, False), ("route_key", _STR, False),
                  ("in_progress", (bool,), False), ("turn", (dict, type(None)), False),
                  ("history", (dict, type(None)), False), ("summary", _OPT_STR, False),
                  ("metadata", (dict,), False))
_TURN_SHAPE = (("id", _STR, True), ("started_at", _NUM, False), ("checkpoint_at", _NUM, True),
               ("phase", _STR, False), ("resume_attempts", (int,), False),
               ("ledger", (list,), False), ("node_id", _OPT_STR, False),
               ("route_key", _STR, False))


def _shaped(d: dict[str, object], shape: tuple[tuple[str, tuple[type, ...], bool], ...]
            ) -> bool:
    for name, types, required in shape:
        if name not in d:
            if required:
                return False
            continue
        v = d[name]
        if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
            return False
    return True


def peek_turn(layout: Layout, sid: str, max_bytes: int) -> tuple[str, float, int] | None:
    """The turn in progress of session ``sid`` as recovery gates it — (turn id, checkpoint time,
    resume attempts) — or None if the session has none or does not exist. Stdlib only, for
    ``recover --dry-run``: a session in the current format read as the store reads it (bounded,
    never through a link, strict JSON), its fields and its turn's checked for type and range as
    the session codec checks them. Raises NeedsCodec for anything else. Not checked here: the
    fields inside each message and ledger entry, which only the full parse (a real run) reads."""
    path = layout.session(sid)
    try:
        data, _ = _fsio.read_bounded(path, max_bytes)
        d = loads_strict(data, path=path)
    except FileNotFoundError:
        return None
    except (UnreadableState, StorageError) as e:
        raise NeedsCodec(str(e)) from e
    turn = d.get("turn")
    if d.get("format") != SESSION_FORMAT or d.get("id") != sid or not _shaped(d, _SESSION_SHAPE) \
            or bool(d.get("in_progress", False)) != isinstance(turn, dict) \
            or not 1 <= d["version"] < _INT63:
        raise NeedsCodec(f"{path}: not a session in {SESSION_FORMAT} as this node reads it")
    if not isinstance(turn, dict):
        return None
    attempts = turn.get("resume_attempts", 0)
    if not _shaped(turn, _TURN_SHAPE) or not 0 <= attempts < _INT63 \
            or not all(isinstance(x, dict) for x in turn.get("ledger", ())):
        raise NeedsCodec(f"{path}: its turn is not in the shape this node reads")
    return turn["id"], float(turn["checkpoint_at"]), attempts


__all__ = ["MARKER_MAX_BYTES", "Listing", "NeedsCodec", "marker_cap", "peek_turn", "read_marker",
           "scan"]
