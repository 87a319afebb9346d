"""Pydantic AI (``pydantic-ai-slim``) conversations on fsdurable: ``FileConversationStore``.

A ``pydantic_ai.conversation_store.ConversationStore`` whose records are fsdurable sessions and
whose entries are immutable files:

- a conversation's ``ConversationRecord`` (head, usage, the ``deferred_tool_requests`` of a paused
  run, scope, fork and branch links, revision) lives in the session ``<conversation_id>``
  (``metadata["pydantic_ai"]``, source ``pydantic-ai``) and changes only through the store's one
  commit function, under the session's commit lock: the revision check and the write are one
  step, across threads and processes;
- each ``ConversationEntry`` (one message, serialised with ``ModelMessagesTypeAdapter``) is its
  own file ``entries/pydantic_ai/<entry_id>.json``, written once (temp, fsync, rename; one
  directory fsync for all the entries of a save) BEFORE the record that points at it, never
  rewritten: a save costs the new messages, not the history — ``write_record`` with N new
  entries does N + 3 fsyncs (each entry, the entries' directory once, the record and its
  directory). A crash between leaves unreferenced entries, never a record pointing at a
  missing one;
- ``delete_record`` deletes the record (an event); entries are kept (a concurrent save or fork
  may be about to point at them; nothing a user wrote is deleted silently);
- every read is bounded; an entry or record this node cannot read raises ``UnreadableState``
  (``needs_newer`` when a newer fsdurable or pydantic-ai wrote it) and is left where it is — a
  read never moves a file; a missing entry raises ``LookupError`` (``SessionNotFound``).

All disk work runs off the event loop, shielded (``fsdurable._aio.run_sync``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import attrs
import orjson
import pydantic
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)
from pydantic_ai.messages import ModelMessagesTypeAdapter

from . import _fsio
from ._aio import run_sync
from ._async import StoreLike, as_store
from ._errors import ConflictError, SessionNotFound, StorageError, UnreadableState
from ._layout import validate_session_id
from ._model import Session
from ._pydantic_history import paused as paused_calls
from ._pydantic_run import DurableRun, FsDurableAgent, RunOutcome, recover, tool_context
from ._recordcodec import newer_format

KEY = "pydantic_ai"  # the session metadata key this adapter owns, and its entries' directory
SOURCE = "pydantic-ai"
ENTRY_FORMAT = "fsdurable.pydantic_ai.entry/1"

_RECORD: pydantic.TypeAdapter[ConversationRecord] = pydantic.TypeAdapter(ConversationRecord)


class FileConversationStore(ConversationStore):
    """Pydantic AI conversations in an fsdurable store (``store``: a ``Store``, an
    ``AsyncStore`` or a root path; default ``$FSDURABLE_ROOT``)."""

    def __init__(self, store: StoreLike = None) -> None:
        self.store = as_store(store)
        self._fs_entries_made = False

    def __repr__(self) -> str:
        return f"FileConversationStore({self.store.root!r})"

    # ------------------------------------------------------------------ the five primitives

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        return await run_sync(self._fs_record, conversation_id)

    async def read_records(self, *, scope: str | None = None,
                           limit: int | None = None) -> Sequence[ConversationRecord]:
        return await run_sync(self._fs_records, scope, limit)

    async def write_record(self, record: ConversationRecord, *,
                           new_entries: Sequence[ConversationEntry] = (),
                           expected_revision: str | None) -> None:
        await run_sync(self._fs_write, record, list(new_entries), expected_revision)

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        await run_sync(self._fs_delete, conversation_id, expected_revision)

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        return await run_sync(self._fs_entry, entry_id)

    async def read_history(self, head_id: str | None, *,
                           limit: int | None = None) -> list[ConversationEntry]:
        """The whole walk in one worker-thread call (not one await per entry)."""
        return await run_sync(self._fs_history, head_id, limit)

    # ------------------------------------------------------------------ records (worker thread)

    def _fs_session(self, sid: str) -> Session | None:
        try:
            return self.store.load(sid)
        except SessionNotFound:
            return None

    def _fs_record_of(self, s: Session | None) -> ConversationRecord | None:
        if s is None or s.source != SOURCE or KEY not in s.metadata:
            return None
        try:
            return _RECORD.validate_python(s.metadata[KEY])
        except pydantic.ValidationError as e:
            raise UnreadableState(f"session {s.id!r} holds no valid conversation record: {e}",
                                  session_id=s.id, path=self.store.layout.session(s.id),
                                  reason="bad_record") from e

    def _fs_record(self, conversation_id: str) -> ConversationRecord | None:
        return self._fs_record_of(self._fs_session(validate_session_id(conversation_id)))

    def _fs_records(self, scope: str | None, limit: int | None) -> list[ConversationRecord]:
        out = []
        for sid in self.store.sessions():
            try:
                rec = self._fs_record_of(self._fs_session(sid))
            except UnreadableState:
                continue  # a bad file (left in place) or not ours: a listing never stops on one
            if rec is not None and (scope is None or rec.scope == scope):
                out.append(rec)
        out.sort(key=lambda r: r.updated_at, reverse=True)
        return out if limit is None else out[:limit]

    def _fs_write(self, record: ConversationRecord, new_entries: list[ConversationEntry],
                      expected_revision: str | None) -> None:
        cid = record.conversation_id
        sid = validate_session_id(cid)
        with self.store.commit_lock(sid):
            s = self._fs_session(sid)
            cur = self._fs_record_of(s)
            if (cur.revision if cur is not None else None) != expected_revision or (
                    s is not None and cur is None):  # the id is another kind of session's
                raise ConversationConflict(cid)
            fresh = {e.id for e in new_entries}
            if (record.head_id is not None and record.head_id not in fresh
                    and _fsio.lstat(self._fs_entry_path(record.head_id)) is None):
                raise ConversationConflict(cid)  # a fork into history a delete released
            for e in new_entries:  # entries first: a record never points at a missing one
                self._fs_write_entry(e)
            if new_entries and self.store.config.fsync:  # their names durable, once for all
                where = os.path.dirname(self._fs_entry_path(new_entries[0].id))
                try:
                    _fsio.fsync_dir(where)
                except OSError as err:  # nothing names them yet: nothing is committed
                    raise StorageError(f"conversation {cid!r} was not saved: the fsync of "
                                       f"{where} failed: {err}", path=where,
                                       errno=err.errno) from err
            data = _RECORD.dump_python(record, mode="json")
            if s is None:
                self.store.create(sid, source=SOURCE, metadata={KEY: data})
            else:
                self.store.commit(attrs.evolve(s, metadata={**s.metadata, KEY: data}),
                                  s.version)

    def _fs_delete(self, conversation_id: str, expected_revision: str) -> None:
        sid = validate_session_id(conversation_id)
        with self.store.commit_lock(sid):
            s = self._fs_session(sid)
            cur = self._fs_record_of(s)
            if s is None or cur is None or cur.revision != expected_revision:
                raise ConversationConflict(conversation_id)
            self.store.delete(sid, base_version=s.version)

    # ------------------------------------------------------------------ entries (worker thread)

    def _fs_entry_path(self, entry_id: str) -> str:
        return self.store.layout.entry(KEY, entry_id)

    def _fs_write_entry(self, e: ConversationEntry) -> None:
        """Write one entry, fsynced, its directory not (the caller fsyncs it once for all the
        entries of a save, also one that was there already: its name may not be durable)."""
        path = self._fs_entry_path(e.id)
        data = orjson.dumps({
            "format": ENTRY_FORMAT, "id": e.id, "parent_id": e.parent_id, "kind": e.kind,
            "message": ModelMessagesTypeAdapter.dump_python([e.message], mode="json")[0]})
        if not self._fs_entries_made:
            _fsio.makedirs(os.path.dirname(path), durable=self.store.config.fsync)
            self._fs_entries_made = True
        try:
            _fsio.write_atomic(path, data, overwrite=False, durable=self.store.config.fsync,
                               dir_sync=False)
        except FileExistsError:
            old, _ = _fsio.read_bounded(path, self.store.config.max_file_bytes)
            if old != data:  # immutable: an id never names two different entries
                raise ConflictError(f"entry {e.id!r} exists with other content", path=path,
                                    reason="entry_exists") from None

    def _fs_entry(self, entry_id: str) -> ConversationEntry:
        """One entry, read and checked. A read never moves a file: an entry this node cannot
        read raises ``UnreadableState`` and stays where it is — ``needs_newer`` if a newer
        fsdurable or pydantic-ai wrote it (a newer format tag, entry kind or message part kind:
        another node's, which still reads it), else ``unreadable``."""
        path = self._fs_entry_path(entry_id)
        doc: object = None
        try:
            data, _ = _fsio.read_bounded(path, self.store.config.max_file_bytes)
            doc = orjson.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != ENTRY_FORMAT:
                raise ValueError("not a " + ENTRY_FORMAT + " file")
            if doc.get("id") != entry_id:
                raise ValueError(f"the file is about entry {doc.get('id')!r}")
            parent = doc.get("parent_id")
            if parent is not None and not isinstance(parent, str):
                raise ValueError("parent_id must be a string or null")
            if doc.get("kind", "message") != "message":
                raise _Newer(f"unknown entry kind {doc.get('kind')!r}")
            try:
                [message] = ModelMessagesTypeAdapter.validate_python([doc.get("message")])
            except pydantic.ValidationError as e:
                if any(x["type"] == "union_tag_invalid" for x in e.errors()):
                    raise _Newer(f"a message kind or part kind this pydantic-ai does not know: "
                                 f"{e}") from e
                raise
            return ConversationEntry(id=entry_id, parent_id=parent, message=message)
        except FileNotFoundError:
            raise SessionNotFound(f"no conversation entry {entry_id!r}", path=path,
                                  reason="no_entry") from None
        except (ValueError, UnreadableState) as e:  # bad JSON, format, id, kind or message
            newer = isinstance(e, _Newer) or newer_format(doc, ENTRY_FORMAT)
            raise UnreadableState(f"conversation entry {entry_id!r} is unreadable"
                                  f"{' (written by a newer fsdurable or pydantic-ai)' * newer}: "
                                  f"{e}", path=path,
                                  reason="needs_newer" if newer else "unreadable") from e

    def _fs_history(self, head_id: str | None, limit: int | None) -> list[ConversationEntry]:
        entries: list[ConversationEntry] = []
        entry_id = head_id
        while entry_id is not None and (limit is None or len(entries) < limit):
            entry = self._fs_entry(entry_id)
            entries.append(entry)
            entry_id = entry.parent_id
        entries.reverse()
        return entries


def history(store: StoreLike, session_id: str) -> list[Any]:
    """The message history (``ModelMessage`` list) a durable run keeps in session
    ``session_id`` ([] if it has none)."""
    from ._pydantic_history import messages

    st = as_store(store)
    try:
        return list(messages(st.load(validate_session_id(session_id))))
    except SessionNotFound:
        return []


class _Newer(ValueError):
    """An entry of a newer writer's vocabulary (entry kind, message or part kind)."""


def _brief(msg: Any) -> dict[str, Any]:
    text = " ".join(str(getattr(p, "content", "")) for p in msg.parts
                    if isinstance(getattr(p, "content", None), str))
    return {"kind": msg.kind, "parts": [p.part_kind for p in msg.parts], "text": text}


def describe(store: StoreLike, s: Session, *, last: int = 20) -> dict[str, Any]:
    """What ``fsdurable show`` says of a conversation: its message count (the history walked
    from its head, each entry one message) and its last ``last`` messages, in brief."""
    conversations = FileConversationStore(store)
    record = conversations._fs_record_of(s)
    if record is None:
        from ._pydantic_history import KEY as RUNS
        from ._pydantic_history import messages

        if RUNS in s.metadata or RUNS in s.lanes:  # a durable run's (FsDurableAgent)
            msgs = messages(s)
            return {"kind": "pydantic-ai durable run", "messages": len(msgs),
                    "last": [_brief(m) for m in msgs[-last:]]}
        return {"kind": "pydantic-ai conversation", "messages": 0, "last": []}
    entries = conversations._fs_history(record.head_id, None)
    shown = [_brief(entry.message) for entry in entries[-last:]]
    return {"kind": "pydantic-ai conversation", "conversation_id": record.conversation_id,
            "messages": len(entries), "requests": record.usage.requests,
            "revision": record.revision, "last": shown}


__all__ = ["DurableRun", "FileConversationStore", "FsDurableAgent", "RunOutcome", "describe",
           "history", "paused_calls", "recover", "tool_context"]
