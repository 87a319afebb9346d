"""A session whose items live in a LANE of the session document (segments and the inline tail;
docs/storage.md, "Lanes"): the Agents SDK's ``FileSession`` as it was before the item log, kept
as a test driver of the lane machinery (the commit function's ``plan_lanes``, the chains, the
inline tail, pops cutting a chain in the document, the repair gate's migration of inline
values), which a durable Pydantic AI run and ``Store.create(lanes=)`` still use. It is the
former production code, unchanged but for its name: the store does the work under test."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fsdurable._aio import run_sync
from fsdurable._async import AsyncStore, StoreLike, as_store
from fsdurable._commit import evolve
from fsdurable._errors import ConflictError, SessionNotFound, UnreadableState
from fsdurable._layout import validate_session_id
from fsdurable._model import Session, adapter_ns, extended, with_adapter_ns
from fsdurable._oaitems import _json
from fsdurable.openai_agents import FileSession

KEY = "openai_agents"
SOURCE = "openai-agents"
Item = Any


def _ns(s: Session | None) -> dict[str, Any]:
    return adapter_ns(s, KEY)


def items(s: Session | None) -> Sequence[Item]:
    """The session's items: a lazy sequence (read from the lane's segments as used)."""
    return s.lanes.get(KEY, ()) if s is not None else ()


def with_items(s: Session, new: Sequence[Item]) -> Session:
    """``s`` holding ``new`` as its items: ``items(s) + tuple(more)`` or ``prefix(items(s), n)``
    keep what is stored (the commit writes only the new items); empty: the lane is removed."""
    return evolve(s, lanes={**s.lanes, KEY: new})  # attrs.evolve, its fields looked up once


def prefix(got: Sequence[Item], n: int) -> Sequence[Item]:
    """The first ``n`` items, cutting a stored lane in its document (nothing rewritten)."""
    from fsdurable._history import History

    return got.prefix(n) if isinstance(got, History) else tuple(got)[: max(0, n)]


def record(s: Session | None) -> dict[str, Any]:
    rec = _ns(s).get("run")
    return dict(rec) if isinstance(rec, dict) else {}


def with_record(s: Session, **changes: Any) -> Session:
    """``s`` with this adapter's metadata updated (a key set to None is removed; ``items_at``
    and ``state``/``answers`` go into the run record; ``items``: ``with_items``)."""
    if "items" in changes:
        s = with_items(s, changes.pop("items"))
    run_keys: dict[str, Any] = {k: changes.pop(k) for k in ("state", "items_at", "answers")
                                if k in changes}
    if run_keys:  # an explicit run= given with them is applied after them, as before
        merged: dict[str, Any] = {**record(s), **run_keys}
        changes.setdefault("run", merged)
    return with_adapter_ns(s, KEY, **changes)


def trimmed(s: Session) -> Session:
    """``s`` with the items its run record accounts for (what a dead run added after its last
    checkpoint goes: the resumed run adds it again)."""
    at = record(s).get("items_at")
    if not isinstance(at, int):
        return s
    return with_items(s, prefix(items(s), at))





class LaneSession:
    """An Agents SDK ``Session`` stored in an fsdurable store (``store``: a ``Store``, an
    ``AsyncStore`` or a root path; default ``$FSDURABLE_ROOT``)."""

    def __init__(self, session_id: str, store: StoreLike = None, *,
                 session_settings: Any = None) -> None:
        self.session_id = validate_session_id(session_id)
        self.session_settings = session_settings
        self.astore = store if isinstance(store, AsyncStore) else AsyncStore(as_store(store))
        self.store = self.astore.store
        # the document this session last read or committed in ``_mutate`` (under the commit
        # lock): reused while the file on disk is still that commit (``_mutate``)
        self._doc: Session | None = None
        # another writer changed the file under ``_doc`` at the last mutation: the next one
        # asks the file first (a changed file is parsed once, not by the compare-and-swap and
        # then again)
        self._shared = False

    def __repr__(self) -> str:
        return f"LaneSession({self.session_id!r}, {self.store.root!r})"

    async def get_items(self, limit: int | None = None) -> list[Item]:
        """The latest ``limit`` items in chronological order (None: the session settings'
        limit, else all; 0: none; negative: all, as ``SQLiteSession``). ``UnreadableState`` if
        the file is corrupt (left where it is: ``fsdurable doctor`` reports it)."""
        if limit is None:
            limit = getattr(self.session_settings, "limit", None)
        if limit == 0:
            return []
        out: list[Item] = await run_sync(self._read, limit)
        return out

    async def add_items(self, new: list[Item]) -> None:
        if not new:
            return
        add = tuple(_json(list(new), "an item", self.session_id))
        await run_sync(self._mutate, lambda cur: (extended(cur, *add), None))

    async def pop_item(self) -> Item | None:
        def pop(cur: Sequence[Item]) -> tuple[Sequence[Item], Item | None]:
            n = len(cur)
            return (prefix(cur, n - 1), cur[n - 1]) if n else (cur, None)

        out: Item | None = await run_sync(self._mutate, pop)
        return out

    async def clear_session(self) -> None:
        await run_sync(self._mutate, lambda cur: ((), None) if len(cur) else (cur, None))

    def _read(self, limit: int | None) -> list[Item]:
        """The last ``limit`` items (None or negative: all), reading only the segments that
        hold them; each read parses them afresh (the caller may change what it gets)."""
        got = items(self._load())
        return list(got if limit is None or limit < 0 else got[-limit:])

    def _load(self, *, held: bool = False) -> Session | None:
        """The session (None if missing); a bad file raises and stays where it is. ``held``:
        the document last committed here while the file is that commit (to count, never to
        hand values out: the caller may change them)."""
        try:
            return self.store._load_known(self.session_id, self._doc if held else None)
        except SessionNotFound:
            return None

    def _mutate(self, fn: Callable[[Sequence[Item]], tuple[Sequence[Item], Any]]) -> Any:
        """``fn(items) -> (new items, result)`` committed (nothing if it returns the same
        sequence). A write: a bad file is quarantined and an older session migrated by the
        repair gate first (each an event). The document held from the last mutation is used
        as it is, the file judged by the commit's compare-and-swap (``_apply``); after another
        writer was met, by ``Store._load_known`` first (an ``lstat``), until the file is found
        as this session left it."""
        sid = self.session_id  # validated once, by __init__
        with self.store._commit_lock(sid):
            doc, self._doc = self._doc, None  # set again only once this mutation succeeded
            if doc is not None and not self._shared:
                return self._apply(sid, doc, fn, held=True)
            s = self._current(sid, doc)
            if doc is not None:
                self._shared = s is not doc
            return self._apply(sid, s, fn, held=s is not None and s is doc)

    def _apply(self, sid: str, s: Session | None,
               fn: Callable[[Sequence[Item]], tuple[Sequence[Item], Any]], *, held: bool) -> Any:
        """``fn`` applied to ``s``'s items and committed. ``held``: ``s`` is the document
        committed or read here last, not checked against the file: a mutation that writes
        leaves that to the commit's compare-and-swap, which judges the file as ``_current``
        would (by stat, a recent one confirmed from its first bytes) before anything is
        written — another commit there (ConflictError) or a file it cannot read
        (UnreadableState) is read again through ``_current`` (quarantined if bad, migrated if
        old) and ``fn`` applied to that; one that writes nothing confirms it here."""
        cur = items(s)
        new, out = fn(cur)
        if new is cur:
            if held:
                got = self._current(sid, s)
                if got is not s:
                    self._shared = True
                    return self._apply(sid, got, fn, held=False)
            self._doc = s
        elif s is None:
            self._doc = self.store.create(sid, source=SOURCE, lanes={KEY: new})
        else:
            try:
                self._doc = self.store._commit_locked(with_items(s, new), s.version)
            except (ConflictError, UnreadableState):
                if not held:
                    raise
                self._shared = True
                return self._apply(sid, self._current(sid, None), fn, held=False)
        return out

    _current = FileSession._current  # the same reading of the file under a write

__all__ = ["KEY", "LaneSession", "items", "prefix", "record", "trimmed", "with_items",
           "with_record"]
