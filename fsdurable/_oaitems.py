"""The Agents SDK adapter's storage (``fsdurable.openai_agents``): how a session holds the SDK's
items and the adapter's run record. Nothing else knows the layout:

- the items: the session's item log (``_itemlog``; ``history/<id>/items-<n>.log``, named by
  ``metadata["openai_agents"]["items_log"]``): every ``add_items``, ``pop_item`` and
  ``clear_session`` is one frame appended and one fdatasync, under the session's commit lock;
  the document is committed only when the log is created, migrated to or rewritten;
- the run record under ``metadata["openai_agents"]["run"]``.

A session of an older fsdurable — its items in the lane ``openai_agents`` (segments), or inline
in the metadata — is read in place; its first write here copies its items into log 0 and
commits the document naming it (``session_migrated``, reason ``item_log``). The lane's segments
are then named by nothing and go through the repair gate like any other (``repair_history``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import _fsio
from ._errors import ConflictError, FsDurableError, InvalidState
from ._itemlog import (
    ENVELOPE,
    REF,
    ItemView,
    encode_frame,
    encode_header,
    log_name,
    named,
    read_items,
    ref_of,
    scan,
    short,
)
from ._jsoncopy import json_bytes, json_copy, typed
from ._model import Session, adapter_ns, with_adapter_ns

if TYPE_CHECKING:
    from ._store import Store

KEY = "openai_agents"  # the session metadata key (and the older layout's lane) this adapter owns
SOURCE = "openai-agents"  # the source of a session this adapter creates: provenance only

Item = Any  # agents.items.TResponseInputItem: a JSON object
_CHUNK = 1 << 20  # a log written whole is cut into frames of about this many bytes of items
# an operation on the items: fn(count, item) -> (cut to, items to append, result), or None for
# nothing to write (its result then None); ``item(i)`` reads item i
Op = Callable[[int, Callable[[int], Item]], "tuple[int, Sequence[Item], Any] | None"]


def _ns(s: Session | None) -> dict[str, Any]:
    return adapter_ns(s, KEY)


def legacy_items(s: Session | None) -> Sequence[Item]:
    """The items of a session of the older layout (its lane; lazy), else ()."""
    return s.lanes.get(KEY, ()) if s is not None else ()


def record(s: Session | None) -> dict[str, Any]:
    rec = _ns(s).get("run")
    return dict(rec) if isinstance(rec, dict) else {}


def with_record(s: Session, *, seen: dict[str, Any] | None = None, **changes: Any) -> Session:
    """``s`` with this adapter's metadata updated (a key set to None is removed; ``items_at``
    and ``state``/``answers`` go into the run record). ``seen``: the item log's reference as
    the caller counted ``items_at`` from it (``Items.mark``), recorded if it is of the log the
    document names and further on: a document never names a log end its run record's count
    is not in (a sync tool that delivers the document first makes the log short, never
    silently fewer items)."""
    run_keys: dict[str, Any] = {k: changes.pop(k) for k in ("state", "items_at", "answers")
                                if k in changes}
    if run_keys:  # an explicit run= given with them is applied after them, as before
        merged: dict[str, Any] = {**record(s), **run_keys}
        changes.setdefault("run", merged)
    if seen is not None:
        cur = _ns(s).get(REF)
        if isinstance(cur, dict) and cur.get("n") == seen["n"] \
                and cur.get("gen") == seen.get("gen") \
                and isinstance(cur.get("at"), int) and seen["at"] > cur["at"]:
            changes[REF] = dict(seen)
    return with_adapter_ns(s, KEY, **changes)


def _json(value: Any, what: str, sid: str) -> Any:
    """A JSON copy of ``value`` (what SQLiteSession stores: ``_jsoncopy``, the standard
    library's copy, by orjson where that is the same); InvalidState (``_jsoncopy.typed``)."""
    return typed(json_copy, value, f"{what} of session {sid!r}", sid)


def _encoded(items: Sequence[Item], sid: str) -> tuple[bytes, bool]:
    """The items' JSON array, as ``_json`` would copy them, and whether the standard library
    wrote it (``_jsoncopy.json_bytes``); InvalidState (``_jsoncopy.typed``)."""
    return typed(json_bytes, list(items), f"an item of session {sid!r}", sid)


class Items:
    """The items of one session of one store (``FileSession``'s storage). Reads take the
    document as the caller loaded it; writes (``change``) are made under the session's commit
    lock, which the caller holds."""

    def __init__(self, store: Store, sid: str) -> None:
        self.store, self.sid = store, sid
        self._dir = store.layout.history_dir(sid)
        self._max = store.config.max_file_bytes
        self._view: ItemView | None = None  # the log last parsed (scan reuses what it can)
        # a rewrite that failed is tried again from this (log, gen, end) on
        self._hold: tuple[int, str | None, int] | None = None

    def path(self, n: int) -> str:
        return f"{self._dir}/{log_name(n)}"

    def _own(self) -> bool:
        """The session's history directory, never through a symlink (UnreadableState)."""
        return _fsio.own_dirs(self.store.layout.history, self._dir)

    def view(self, s: Session | None) -> ItemView | None:
        """The item log ``s`` names, parsed up to its valid end; None if it names none (no
        items, or the older layout). UnreadableState: ``log_short`` if the log ends before what
        the document has seen (lost, or not delivered by a sync tool yet), ``corrupt`` if it
        is not a log."""
        if s is None or REF not in _ns(s):
            return None
        ref = ref_of(s, KEY)
        v = self._view
        if v is not None and (v.n != ref["n"] or v.gen != ref.get("gen", v.gen)):
            v = None
        path = self.path(ref["n"])
        v = scan(path, v, self._max) if self._own() else None
        if not named(v, ref):
            raise short(path, v, ref)
        self._view = v
        return v

    def count(self, s: Session | None) -> int:
        v = self.view(s)
        return v.count if v is not None else len(legacy_items(s))

    def mark(self, s: Session | None) -> tuple[int, dict[str, Any] | None]:
        """How many items there are, and the log reference that says so (``with_record``'s
        ``seen``; None for a session with no log)."""
        v = self.view(s)
        if v is None:
            return len(legacy_items(s)), None
        return v.count, {"n": v.n, "at": v.end, **({"gen": v.gen} if v.gen else {})}

    def read(self, s: Session | None, lo: int, hi: int | None = None, *,
             last: int | None = None) -> list[Item]:
        """Items ``lo`` .. ``hi - 1`` (None: to the end), parsed afresh; ``last``: the last
        that many instead (the log looked at once)."""
        v = self.view(s)
        if v is None:
            got = legacy_items(s)
            if last is not None:
                lo = max(0, len(got) - last)
            return list(got[lo:hi])
        if last is not None:
            lo = max(0, v.count - last)
        hi = v.count if hi is None else min(hi, v.count)
        if lo >= hi:
            return []
        return read_items(self.path(v.n), v, lo, hi, self._max)

    # ------------------------------------------------------------------ writing

    def change(self, s: Session | None, op: Op) -> tuple[Session | None, Any]:
        """Apply ``op`` to the items of ``s`` (the document as it is on disk, read under the
        commit lock); returns the document as it now is and ``op``'s result. A session with a
        log: one frame appended, one fdatasync (and a rewrite when its dead bytes pass
        ``Config.item_log_slack``). A new session, or one of the older layout: its log written
        whole, then the document naming it committed."""
        v = self.view(s)
        if v is None:
            return self._first(s, op)
        got = op(v.count, lambda i: read_items(self.path(v.n), v, i, i + 1, self._max)[0])
        if got is None:
            return s, None
        at, new, out = got
        data, stdlib = _encoded(new, self.sid) if new else (b"", False)
        frame = encode_frame(at, data, len(new), stdlib=stdlib)
        self._fits(len(frame))
        path = self.path(v.n)  # (its directory judged by view(), under the same lock)
        end = _fsio.append_at(path, v.end, frame, durable=self.store.config.fsync)
        v.wrote(end - len(frame), frame, at, len(new), stdlib)
        assert s is not None
        slack = max(self.store.config.item_log_slack, v.live)
        h = self._hold
        if v.end - v.base - v.live > slack and (h is None or h[:2] != (v.n, v.gen)
                                                or v.end >= h[2]):
            try:
                s = self._rewrite(s, v)
            except (FsDurableError, OSError) as e:  # the change is durable: never reported
                from . import _events as ev  # as failed (a caller's retry would repeat it);

                # tried again once as many bytes again are written, not at every change
                self._hold = (v.n, v.gen, v.end + slack)
                self._view = None
                self.store.emit(ev.ITEM_LOG_REWRITE_FAILED, session_id=self.sid,
                                reason=getattr(e, "reason", None) or "error",
                                error=f"{type(e).__name__}: {e}")
        return s, out

    def _fits(self, size: int) -> None:
        """A frame a reader would reject (its body past ``max_file_bytes``, the bound of every
        read) is refused before anything is written: InvalidState ``too_large``."""
        if size - ENVELOPE > self._max:
            raise InvalidState(f"items of session {self.sid!r} take {size} bytes, more than "
                               f"Config.max_file_bytes ({self._max})", session_id=self.sid,
                               reason="too_large")

    def _first(self, s: Session | None, op: Op) -> tuple[Session | None, Any]:
        """A session with no log: new (``s`` None), or of the older layout (its items read
        whole, once). Its items after ``op`` go into log 0, written whole; then the document
        naming it is committed — created, or migrated (``session_migrated``)."""
        old = list(legacy_items(s))
        got = op(len(old), old.__getitem__)
        if got is None:
            return s, None
        if s is None and _fsio.lstat(self.store.layout.session(self.sid)) is not None:
            raise ConflictError(f"session {self.sid!r} exists: its item log is never started "
                                "over", session_id=self.sid, reason="exists")
        at, new, out = got
        items = [*old[:at], *new]
        ref = self._whole(items, 0)
        if s is None:
            doc = self.store.create(self.sid, source=SOURCE, metadata={KEY: {REF: ref}})
            return doc, out
        lanes = {k: v for k, v in s.lanes.items() if k != KEY}
        import attrs

        doc = self.store._commit_locked(with_adapter_ns(attrs.evolve(s, lanes=lanes), KEY,
                                                        items=None, **{REF: ref}), s.version)
        if KEY in s.lanes:  # (a session a turn created has no items yet: nothing migrated)
            from . import _events as ev

            self.store.emit(ev.SESSION_MIGRATED, session_id=self.sid, version=doc.version,
                            reason="item_log", items=len(old))
        return doc, out

    def _whole(self, items: Sequence[Item], n: int) -> dict[str, Any]:
        """Log ``n`` written whole holding ``items`` (``encoded``, ``write_new_log``); the
        reference naming it."""
        data, ref = self.encoded(items, n)
        self.write_new_log(n, data)
        return ref

    def encoded(self, items: Sequence[Item], n: int) -> tuple[bytes, dict[str, Any]]:
        """The bytes of log ``n`` holding ``items`` — a header with a new ``gen``, then frames
        of about ``_CHUNK`` bytes of items each (a reader parses only the frames a
        ``get_items(limit)`` needs) — and the reference naming it."""
        from ._layout import new_id

        gen = new_id()
        out = [encode_header(self.sid, self.store.node_id, n, gen)]
        group: list[bytes] = []
        first = size = 0
        stdlib = False  # a group holding one item the standard library wrote is read by it

        def flush() -> None:
            out.append(encode_frame(first, b"[" + b",".join(group) + b"]", len(group),
                                    stdlib=stdlib))

        for i, item in enumerate(items):
            one, by_stdlib = _encoded([item], self.sid)
            if group and size + len(one) > _CHUNK:
                flush()
                group, first, size, stdlib = [], i, 0, False
            group.append(one[1:-1])
            size += len(one) - 1
            stdlib = stdlib or by_stdlib
        if group:
            flush()
        for frame in out[1:]:
            self._fits(len(frame))
        data = b"".join(out)
        return data, {"n": n, "at": len(data), "gen": gen}

    def write_new_log(self, n: int, data: bytes) -> None:
        """Log ``n`` written whole (temp, fsync, rename, directory fsync) before any document
        names it; a file there that no document names (a first write or rewrite a crash cut
        short, or another node's not delivered with its document) goes to ``quarantine/``
        first, through the repair gate: never overwritten."""
        from ._repair import quarantine

        store = self.store
        path = self.path(n)
        if not self._own():
            _fsio.makedirs(self._dir, durable=store.config.fsync)
            self._own()
        st = _fsio.lstat(path)
        if st is not None:
            quarantine(store, path, kind="item-log", reason="unnamed_log", expect=st,
                       session_id=self.sid)
        _fsio.write_atomic(path, data, durable=store.config.fsync)
        self._view = None

    def _rewrite(self, s: Session, v: ItemView) -> Session:
        """The live items copied into log ``n + 1``, the document naming it committed, then
        log ``n`` removed (named by nothing now: the store wrote it, and no reader of the new
        document reads it)."""
        items = read_items(self.path(v.n), v, 0, v.count, self._max)
        ref = self._whole(items, v.n + 1)
        doc = self.store._commit_locked(with_adapter_ns(s, KEY, **{REF: ref}), s.version)
        _fsio.unlink(self.path(v.n), durable=self.store.config.fsync)
        return doc


def add(new: Sequence[Item]) -> Op:
    return lambda count, _item: (count, new, None) if new else None


def pop(count: int, item: Callable[[int], Item]) -> tuple[int, Sequence[Item], Any] | None:
    return (count - 1, (), item(count - 1)) if count else None


def clear(count: int, _item: Callable[[int], Item]) -> tuple[int, Sequence[Item], Any] | None:
    return (0, (), None) if count else None


def cut_to(n: int) -> Op:
    """The first ``n`` items kept (what a dead run added after its last checkpoint goes: the
    resumed run adds it again)."""
    return lambda count, _item: (n, (), None) if 0 <= n < count else None


__all__ = ["KEY", "SOURCE", "Item", "Items", "Op", "add", "clear", "cut_to", "legacy_items",
           "pop", "record", "with_record"]
