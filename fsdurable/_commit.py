"""THE commit function: every change to a session file goes through ``commit_locked``.

Invariant: on disk, ``session.in_progress`` is true  =>  ``markers/<id>.json`` exists, at every
crash point. The steps, in order: compare-and-swap on the commit's identity, the marker (when
the turn is in progress and the one on disk does not already say the same), the session, the
marker's removal (when not in progress). ``Store`` calls it under the session's commit lock
(``Store.commit``, ``Store.patch``); the repair gate and the quarantine restore too, and nothing
else writes a session file. It works over a narrow ``Context`` — the layout, the config, the
clock, the node, the store's ``FileCache`` and two reads — never over the ``Store`` itself.
"""

from __future__ import annotations

import contextlib
import operator
import os

from . import _discovery, _fsio
from ._errors import ConflictError, DurabilityUnknown, InvalidState, StorageError, UnreadableState
from ._layout import validate_session_id
from ._recordcodec import encode_marker
from ._records import Marker

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    from ._config import Config
    from ._filecache import FileCache
    from ._history import Chain
    from ._layout import Layout
    from ._model import Session, Turn

    _T = TypeVar("_T")


class Context:
    """What the commit function needs of a store, and nothing more: where the files are
    (``layout``), the limits and durability (``config``), the time of a commit (``clock``), the
    node a new turn belongs to (``node()``), what this process saw of each file (``cache``), the
    identity of the commit on disk (``ident(sid) -> (version, commit id)``, re-read only when
    its stat changed) and the marker on disk (``marker(sid)``, UnreadableState if bad)."""

    __slots__ = ("cache", "clock", "config", "ident", "layout", "marker", "node")

    def __init__(self, *, layout: Layout, config: Config, clock: Callable[[], float],
                 cache: FileCache, node: Callable[[], str],
                 ident: Callable[[str], tuple[int, str]],
                 marker: Callable[[str], Marker | None]) -> None:
        self.layout, self.config, self.clock, self.cache = layout, config, clock, cache
        self.node, self.ident, self.marker = node, ident, marker


def evolve(inst: _T, **changes: Any) -> _T:
    """``attrs.evolve``: a new instance of ``inst``'s class with ``changes`` (validators run),
    built from the class's init fields read in one ``attrgetter`` call and passed by position
    (``_INIT``: looked up once per class, not on every call — a checkpoint evolves twice), and
    attrs imported on first use (off the startup path: the store's sessions and turns are attrs
    classes, its startup path does not import attrs). A name that is no init field: TypeError,
    as ``attrs.evolve``'s."""
    cls: Any = inst.__class__
    spec = _INIT.get(cls)
    if spec is None:
        spec = _INIT[cls] = _init_spec(cls)
    get, pos = spec
    values = list(get(inst))
    for alias, value in changes.items():
        i = pos.get(alias)
        if i is None:
            raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument "
                            f"{alias!r}")
        values[i] = value
    new: _T = cls(*values)
    return new


def _init_spec(cls: Any) -> tuple[Callable[[Any], tuple[Any, ...]], dict[str, int]]:
    """(a getter of ``cls``'s init fields' values in order, each init alias's position).
    TypeError for a class with keyword-only fields (none of the store's: they are positional)."""
    import attrs

    fields = [a for a in attrs.fields(cls) if a.init]
    if any(a.kw_only for a in fields):
        raise TypeError(f"evolve: {cls.__name__} has keyword-only fields")
    one = operator.attrgetter(*[a.name for a in fields])
    get = one if len(fields) > 1 else (lambda inst: (one(inst),))  # one name: not a tuple
    return get, {a.alias: i for i, a in enumerate(fields)}


_INIT: dict[type, tuple[Callable[[Any], tuple[Any, ...]], dict[str, int]]] = {}
# a frozen instance's field set in place: only on an instance no one else holds yet
_set_field = object.__setattr__
_LAZY: list[Any] = []


def _lazy() -> tuple[Callable[..., bytes], Any]:
    """``encode_session`` and the ``_history`` module: imported by the first commit (with attrs
    and cattrs: off the startup path), then kept — not imported again by every commit (a
    ``from . import`` in a function costs every call about half a microsecond)."""
    if not _LAZY:
        from . import _history
        from ._codec import encode_session

        _LAZY[:] = [encode_session, _history]
    return _LAZY[0], _LAZY[1]


def commit_locked(ctx: Context, new: Session, base: int, *, at_least: int = 0,
                  owner: str | None = None, base_commit_id: str | None = None,
                  turn: Turn | None = None) -> Session:
    """THE commit: every change to a session file goes through here, under its commit lock.

    0. (after 1) the messages not stored yet, kept in the document's inline tail while it
       stays within ``Config.inline_tail_bytes``/``inline_tail_values``, else written with it
       as one write-once segment of ``history/<id>/`` (``plan_history``, ``appended``,
       ``write_segment``), and so each lane's values (``plan_lanes``), durable before the
       document names them;
    1. compare-and-swap on the commit's identity: the file on disk must be the commit
       ``new`` was derived from — version ``base`` (0 = absent) and commit id
       ``base_commit_id`` (default ``new.commit_id``) — else ConflictError: a file a sync
       tool replaced with another node's commit of the same version is told apart;
    2. entering or staying in progress: write the marker first (fsync, rename, dir fsync)
       unless the one on disk already says the same (``Config.marker_refresh``);
    3. write the session (temp, fsync, rename, dir fsync);
    4. not in progress: remove the marker if one exists (unlink, dir fsync).
    A crash between any two steps leaves "in progress => marker exists" true; the reverse gap
    (a marker without an in-progress session) is repaired by recovery and doctor.
    Returns the session at its new version: ``base + 1``, or ``at_least`` if that is higher
    (resolving a sync conflict keeps versions increasing across every copy that was seen).
    The marker's node is ``owner`` if given (a claim, an adoption), else the node that owns
    the turn already, else (a new turn) this node: a commit never moves a turn silently.
    Raises InvalidState (nothing written) if the file would exceed ``max_file_bytes``.
    ``turn``: the turn of ``new`` replaced by it (``checkpoint``: one copy of the session, made
    with its new version, instead of two).
    """
    encode_session, h = _lazy()
    History = h.History
    sid = validate_session_id(new.id)
    disk, disk_commit = ctx.ident(sid)
    want = new.commit_id if base_commit_id is None else base_commit_id
    if disk != base:
        raise ConflictError(
            f"session {sid!r} is at version {disk} on disk, not {base}",
            session_id=sid, path=ctx.layout.session(sid), reason="version_mismatch",
            expected=base, actual=disk,
        )
    if disk and disk_commit != want:
        raise ConflictError(
            f"session {sid!r} on disk is another commit of version {disk} (commit "
            f"{disk_commit or '-'}, not {want or '-'}): replaced, e.g. by a sync tool",
            session_id=sid, path=ctx.layout.session(sid), reason="commit_mismatch",
            expected=base, actual=disk,
        )
    s = evolve(new, version=max(base + 1, at_least), updated_at=ctx.clock(),
               commit_id=os.urandom(8).hex(), **({} if turn is None else {"turn": turn}))
    m: Marker | None = None
    mpath = ctx.layout.marker(sid)
    if s.turn is not None:
        m, s = marker_due(ctx, sid, s, owner)
    chain, segment = plan_history(ctx, sid, s)
    lanes, segments = plan_lanes(ctx, sid, s)
    if segment is not None:
        segments.insert(0, segment)
    data = encode_session(s, chain.ref if chain is not None else None,
                          {k: c.ref for k, c in lanes.items()} if lanes else {})
    size = max(len(data), *[len(seg[1]) for seg in segments]) if segments else len(data)
    if size > ctx.config.max_file_bytes:  # it could never be read back
        raise InvalidState(
            f"session {sid!r} would write a file of {size} bytes, over max_file_bytes "
            f"({ctx.config.max_file_bytes}): compact it", session_id=sid, reason="too_large")
    mdata = b""
    if m is not None:  # every marker a commit writes is one discovery reads: checked first
        mdata = encode_marker(m)
        cap = _discovery.marker_cap(ctx.config.max_file_bytes)
        if len(mdata) > cap:
            raise InvalidState(
                f"the marker of session {sid!r} would be {len(mdata)} bytes, over the {cap} "
                f"discovery reads (source {len(m.source)}, route_key {len(m.route_key)}, "
                f"turn id {len(m.turn_id)} characters)", session_id=sid, reason="too_large")
    for seg in segments:  # step 0: the new values, durable before anything names them
        write_segment(ctx, sid, *seg)
    if chain is not None or lanes or s.lanes:
        # the history the document names, as the session's. ``s`` is this call's own new
        # instance (made by the evolve above; nothing else holds it yet): its two history
        # fields, which no validator checks, are set in place instead of a third copy
        msgs = s.messages
        if chain is not None and not (isinstance(msgs, History) and msgs.chain is chain
                                      and not msgs.tail):  # else it is that already
            _set_field(s, "messages", History(chain))
        if s.lanes.keys() != lanes.keys() or (lanes and not all(
                isinstance(v, History) and v.chain is lanes[k] and not v.tail
                for k, v in s.lanes.items())):
            _set_field(s, "lanes", {k: History(c) for k, c in lanes.items()})
    if m is not None:
        try:
            mst = _fsio.write_atomic(mpath, mdata, durable=ctx.config.fsync)
        except DurabilityUnknown as e:  # the marker is in place; the session is not written
            ctx.cache.saw_marker(sid, e.stat, m)
            raise StorageError(f"session {sid!r} was not committed: {e.message}",
                               path=mpath, session_id=sid, reason=e.reason,
                               errno=e.errno) from e
        ctx.cache.saw_marker(sid, mst, m)
    try:
        st = _fsio.write_atomic(ctx.layout.session(sid), data, durable=ctx.config.fsync)
    except DurabilityUnknown as e:  # renamed: committed, say so (the caller never retries)
        ctx.cache.saw_session(sid, e.stat, s)
        e.session, e.session_id = s, sid
        e.message = (f"session {sid!r} was committed at version {s.version} (err.session), "
                     f"but {e.message}")
        raise
    ctx.cache.saw_session(sid, st, s)
    # committed (the session's rename and its directory fsync are done): from here nothing
    # raises as if it had not. A marker the disk refuses to remove is an orphan, the harmless
    # reverse gap recovery and doctor repair; so is one the disk will not even lstat (EIO).
    if not s.in_progress:
        with contextlib.suppress(OSError):
            if _fsio.lstat(mpath) is not None:
                _fsio.unlink(mpath, durable=ctx.config.fsync)
        ctx.cache.forget_marker(sid)
    return s


def plan_history(ctx: Context, sid: str, s: Session
                 ) -> tuple[Chain | None, tuple[str, bytes] | None]:
    """(the chain the new document names, (name, bytes) of the segment to write first or None).

    A ``History`` of this session keeps its chain: its tail (the messages appended since it was
    read) is what is new (``appended``: inline, or a segment). A plain sequence is compared
    with the chain of the document on disk (the commit it was derived from): that chain a
    prefix of it, the rest is new; it a suffix of that chain (a compaction keeping the last
    messages), ``start`` moves forward and nothing is written; anything else is appended whole
    and ``start`` moves past what it replaced (the old messages stay in the chain as archive:
    never lost silently)."""
    h = _lazy()[1]
    History, Chain = h.History, h.Chain
    msgs = s.messages
    if isinstance(msgs, History) and (msgs.chain is None or msgs.chain.sid == sid):
        base, tail = msgs.chain, msgs.tail
    else:
        ref, base = ctx.cache.chain(sid)
        if base is None and ref is not None:  # no longer in memory: read it again
            base = Chain(sid, ctx.layout.history_dir(sid), ref, ctx.config.max_file_bytes)
        tail = tuple(msgs)
        if base is not None:
            stored = base.messages(base.ref.start)
            k, n = len(stored), len(tail)
            if n >= k and (all(map(operator.is_, stored, tail[:k])) or tail[:k] == stored):
                tail = tail[k:]
            elif n < k and stored[k - n:] == tail:
                return base.derived(evolve(base.ref, start=base.ref.start + k - n)), None
            else:
                base = base.derived(evolve(base.ref, start=base.ref.count))
    if not tail:
        return base, None
    return appended(ctx, sid, s, base, tail)


def plan_lanes(ctx: Context, sid: str, s: Session
               ) -> tuple[dict[str, Chain], list[tuple[str, bytes]]]:
    """(the chain of each non-empty lane the new document names, the segments to write first).

    A lane that is a ``History`` of this session's lane keeps its chain (cut or not: a
    ``prefix`` writes nothing) and its tail is its new segment; any other sequence is written
    whole as a new chain (the old one's segments are then unreferenced: the repair gate's)."""
    chains: dict[str, Chain] = {}
    segments: list[tuple[str, bytes]] = []
    if not s.lanes:
        return chains, segments
    h = _lazy()[1]
    History = h.History
    for lane in sorted(s.lanes):
        values = s.lanes[lane]
        if h.LANE_RE.fullmatch(lane) is None:
            raise InvalidState(f"session {sid}: lane name {lane!r} is not "
                               "[a-z][a-z0-9_]{0,31}", session_id=sid, reason="bad_lane")
        base: Chain | None = None
        if isinstance(values, History) and (values.chain is None or (
                values.chain.sid == sid and values.chain.lane == lane)):
            base, tail = values.chain, values.tail
        else:
            tail = tuple(values)
        if tail:
            base, seg = appended(ctx, sid, s, base, tail, lane)
            if seg is not None:
                segments.append(seg)
        if base is not None:
            chains[lane] = base
    return chains, segments


def appended(ctx: Context, sid: str, s: Session, base: Chain | None, tail: tuple[Any, ...],
             lane: str | None = None) -> tuple[Chain, tuple[str, bytes] | None]:
    """(the chain ``base`` + ``tail``, (name, bytes) of the segment to write first or None).

    ``tail`` joins the chain's inline tail in the document (format 6) while that stays within
    ``Config.inline_tail_bytes`` and ``inline_tail_values``; past the bound, the inline tail and
    ``tail`` are written as one segment after the chain's head and the document names it with
    no inline tail (storage.md, "The inline tail")."""
    h = _lazy()[1]
    Chain, HistoryRef = h.Chain, h.HistoryRef
    if base is not None and base.ref.start > base.ref.count:
        base.check_start()  # a summary naming a range that is not there: the values appended
        # would be invisible (never silently short); HistoryUnavailable, nothing written
    count = base.ref.count if base is not None else 0
    old = base.ref.inline if base is not None else ()
    inline = old + h.encode_values(sid, count, tail, lane)
    start = base.ref.start if base is not None else 0
    kept = base.ref.kept if base is not None else 0  # the archive retention removed stays so
    cfg = ctx.config
    seg: tuple[str, bytes] | None = None
    if len(inline) <= cfg.inline_tail_values and h.inline_size(inline) <= cfg.inline_tail_bytes:
        ref = HistoryRef(count=count + len(tail), start=start, inline=inline,
                         head=base.ref.head if base is not None else None,
                         sha256=base.ref.sha256 if base is not None else None, kept=kept)
    else:
        name, sha, data = h.encode_segment(sid, count - len(old),
                                         base.ref if base is not None else None,
                                         (s.turn.node_id if s.turn is not None else None)
                                         or ctx.node(), (), lane, encoded=inline)
        ref = HistoryRef(count=count + len(tail), head=name, sha256=sha, start=start, kept=kept)
        seg = (name, data)
    chain = (base.derived(ref, tail, segment=seg is not None) if base is not None else
             Chain.started(sid, ctx.layout.history_dir(sid), ref, tail, cfg.max_file_bytes,
                           lane))
    return chain, seg


def write_segment(ctx: Context, sid: str, name: str, data: bytes) -> None:
    """Write one segment durably (temp, fsync, rename, fsync of ``history/<id>/``, the directory
    created durably the first time). Nothing names it yet: a failure here commits nothing."""
    directory = ctx.layout.history_dir(sid)
    durable = ctx.config.fsync
    try:
        # a symlink (or a file) in place of history/ or history/<id>/ is never written through
        if not _fsio.own_dirs(ctx.layout.history, directory):
            _fsio.makedirs(directory, durable=durable)
        _fsio.write_atomic(os.path.join(directory, name), data, durable=durable)
    except (DurabilityUnknown, UnreadableState) as e:  # not written, or not proven durable:
        # nothing may name it yet
        raise StorageError(f"session {sid!r} was not committed: {e.message}", path=e.path,
                           session_id=sid, reason=e.reason,
                           errno=getattr(e, "errno", None)) from e


def marker_due(ctx: Context, sid: str, s: Session, owner: str | None
               ) -> tuple[Marker | None, Session]:
    """For in-progress ``s``: (the marker to write, or None if the one on disk says the same —
    same turn, node, route, source and attempts, checkpoint within ``marker_refresh``; ``s``
    with its turn's owner node and route filled in).

    The owner is ``owner`` if given (a claim, an adoption), else the one the session names,
    else the one the marker of the same turn names (a session of format 2), else this node.
    The turn's route is the one it started under (the session's if not yet set)."""
    turn = s.turn
    assert turn is not None
    st = _fsio.lstat(ctx.layout.marker(sid))
    cur: Marker | None = None
    if st is not None:
        cur = ctx.cache.marker(sid, st)
        if cur is None:
            try:
                cur = ctx.marker(sid)
            except UnreadableState as e:
                if e.reason == "unknown_version":
                    raise  # a newer fsdurable's marker: never written over
                cur = None  # ours, and corrupt: the rewrite below replaces it
    same_turn = cur is not None and cur.turn_id == turn.id
    node = (owner or turn.node_id or (cur.node_id if cur is not None and same_turn else None)
            or ctx.node())
    route = turn.route_key or s.route_key
    if node != turn.node_id or route != turn.route_key:
        s = evolve(s, turn=evolve(turn, node_id=node, route_key=route))
        turn = s.turn
        assert turn is not None
    if (cur is not None and same_turn and cur.node_id == node
            and cur.route_key == route and cur.source == s.source
            and cur.resume_attempts == turn.resume_attempts
            # a marker time ahead of the turn's (the clock stepped back since) is rewritten:
            # else the gate would judge the turn by a time from the future
            and 0 <= turn.checkpoint_at - cur.checkpoint_at < ctx.config.marker_refresh):
        return None, s
    return Marker.of(s, node), s


__all__ = ["Context", "appended", "commit_locked", "evolve", "marker_due", "plan_history",
           "plan_lanes", "write_segment"]
