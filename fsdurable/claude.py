"""Claude Agent SDK (``claude-agent-sdk``) transcripts on fsdurable: ``FileSessionStore``.

The SDK's ``SessionStore`` protocol (``append``, ``load`` and every optional method:
``list_sessions``, ``list_session_summaries``, ``delete`` cascading to subkeys, ``list_subkeys``),
duck-typed: this module imports ``claude_agent_sdk`` only to fold a session summary.

- one fsdurable session per ``(project_key, session_id)`` (id ``claude-<h(project)>-<h(session)>``,
  source ``claude``) holds the index: per transcript (the main one and each ``subpath``) the
  ordered list of its batch files and the ``uuid``s seen, plus the summary sidecar. It changes
  only through the store's one commit function, under the session's commit lock, so appends from
  threads and processes are serialised and the summary's read-fold-write is one step;
- each appended batch is an immutable file ``entries/claude/<batch_id>.json`` written (temp,
  fsync, rename, directory fsync) BEFORE the index commit that lists it: an append costs its own
  entries, never the transcript; a crash between leaves an unreferenced batch, never a hole;
- an entry whose ``uuid`` the transcript already has is dropped (the SDK retries a batch after a
  timeout: the idempotency key the protocol asks adapters to honour);
- ``mtime`` (list and summaries alike) is the index commit's time, in epoch milliseconds;
- ``delete`` is explicit: the index goes (a ``session_deleted`` event), then its batch files.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import attrs
import orjson

from . import _fsio
from ._aio import run_sync
from ._async import StoreLike, as_store
from ._errors import SessionNotFound, UnreadableState
from ._jsoncopy import json_bytes, json_copy, json_loads, typed
from ._layout import new_id
from ._model import Session
from ._recordcodec import newer_format

KEY = "claude"  # the session metadata key this adapter owns, and its entries' directory
SOURCE = "claude"
BATCH_FORMAT = "fsdurable.claude.batch/1"
MAIN = ""  # the main transcript's key in the index (a subpath is never empty)


def _h(text: str, n: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def _prefix(project_key: str) -> str:
    return f"claude-{_h(project_key, 16)}-"


def _sid(project_key: str, session_id: str) -> str:
    return _prefix(project_key) + _h(session_id, 32)


class FileSessionStore:
    """Claude Agent SDK session transcripts in an fsdurable store (``store``: a ``Store``, an
    ``AsyncStore`` or a root path; default ``$FSDURABLE_ROOT``). Pass it as
    ``ClaudeAgentOptions(session_store=FileSessionStore(...))``."""

    def __init__(self, store: StoreLike = None) -> None:
        self.store = as_store(store)
        self._made = False

    def __repr__(self) -> str:
        return f"FileSessionStore({self.store.root!r})"

    # ------------------------------------------------------------------ the protocol

    async def append(self, key: Any, entries: list[Any]) -> None:
        if not entries:
            return
        copy = typed(json_copy, list(entries), "a transcript entry")  # (_jsoncopy)
        await run_sync(self._append, dict(key), copy)

    async def load(self, key: Any) -> list[Any] | None:
        out: list[Any] | None = await run_sync(self._load_transcript, dict(key))
        return out

    async def list_sessions(self, project_key: str) -> list[dict[str, Any]]:
        return [{"session_id": ns["session_id"], "mtime": _ms(s)}
                for s, ns in await run_sync(self._project, project_key)
                if MAIN in ns["transcripts"]]

    async def list_session_summaries(self, project_key: str) -> list[dict[str, Any]]:
        return [{**ns["summary"], "session_id": ns["session_id"], "mtime": _ms(s)}
                for s, ns in await run_sync(self._project, project_key)
                if isinstance(ns.get("summary"), dict)]

    async def delete(self, key: Any) -> None:
        await run_sync(self._delete, dict(key))

    async def list_subkeys(self, key: Any) -> list[str]:
        got = await run_sync(self._index, dict(key))
        return [] if got is None else [k for k in got[1]["transcripts"] if k != MAIN]

    # ------------------------------------------------------------------ worker thread

    def _index(self, key: dict[str, Any]) -> tuple[Session, dict[str, Any]] | None:
        sid = _sid(key["project_key"], key["session_id"])
        try:
            s = self.store.load(sid)
        except SessionNotFound:
            return None
        ns = s.metadata.get(KEY)
        if s.source != SOURCE or not isinstance(ns, dict) or not isinstance(
                ns.get("transcripts"), dict):
            raise UnreadableState(f"session {sid!r} is not a Claude transcript index",
                                  session_id=sid, reason="not_an_index")
        return s, ns

    def _project(self, project_key: str) -> list[tuple[Session, dict[str, Any]]]:
        pre = _prefix(project_key)
        out = []
        for sid in self.store.sessions():
            if not sid.startswith(pre):
                continue
            try:
                s = self.store.load(sid)
            except (SessionNotFound, UnreadableState):
                continue  # gone, or unreadable (left in place): a listing never stops on one
            ns = s.metadata.get(KEY)
            if (s.source == SOURCE and isinstance(ns, dict)
                    and ns.get("project_key") == project_key):
                out.append((s, ns))
        return out

    def _append(self, key: dict[str, Any], entries: list[Any]) -> None:
        sub = key.get("subpath") or MAIN
        sid = _sid(key["project_key"], key["session_id"])
        with self.store.commit_lock(sid):
            got = self._index(key)
            ns: dict[str, Any] = dict(got[1]) if got else {
                "project_key": key["project_key"], "session_id": key["session_id"],
                "transcripts": {}}
            transcripts = dict(ns["transcripts"])
            t = transcripts.get(sub) or {"batches": [], "uuids": []}
            seen = set(t["uuids"])
            fresh = []
            for e in entries:
                u = e.get("uuid") if isinstance(e, dict) else None
                if isinstance(u, str):
                    if u in seen:
                        continue  # a retried batch: the uuid is the idempotency key
                    seen.add(u)
                fresh.append(e)
            if not fresh:
                return
            batch = new_id()
            self._write_batch(batch, fresh)
            transcripts[sub] = {"batches": [*t["batches"], batch], "uuids": [
                *t["uuids"], *(e["uuid"] for e in fresh
                               if isinstance(e, dict) and isinstance(e.get("uuid"), str))]}
            ns["transcripts"] = transcripts
            if sub == MAIN:  # subagent transcripts never feed the main session's summary
                from claude_agent_sdk import fold_session_summary

                prev = ns.get("summary")
                s0 = got[0] if got else None
                before: Any = {**prev, "mtime": _ms(s0)} if isinstance(prev, dict) else None
                folded = fold_session_summary(before, key, fresh)  # type: ignore[arg-type]
                ns["summary"] = {k: v for k, v in folded.items() if k != "mtime"}
            if got is None:
                self.store.create(sid, source=SOURCE, metadata={KEY: ns})
            else:
                s = got[0]
                self.store.commit(attrs.evolve(s, metadata={**s.metadata, KEY: ns}), s.version)

    def _load_transcript(self, key: dict[str, Any]) -> list[Any] | None:
        got = self._index(key)
        t = got[1]["transcripts"].get(key.get("subpath") or MAIN) if got else None
        if not t:
            return None
        out: list[Any] = []
        for b in t["batches"]:
            out.extend(self._read_batch(b))
        return out

    def _delete(self, key: dict[str, Any]) -> None:
        sub = key.get("subpath")
        sid = _sid(key["project_key"], key["session_id"])
        with self.store.commit_lock(sid):
            got = self._index(key)
            if got is None:
                return
            s, ns = got
            transcripts = dict(ns["transcripts"])
            if sub is None:  # the main key: the whole session, every subkey with it
                gone = [b for t in transcripts.values() for b in t["batches"]]
                self.store.delete(sid, base_version=s.version)
            else:
                t = transcripts.pop(sub, None)
                if t is None:
                    return
                gone = list(t["batches"])
                self.store.commit(attrs.evolve(s, metadata={
                    **s.metadata, KEY: {**ns, "transcripts": transcripts}}), s.version)
        for b in gone:  # after the index no longer lists them
            _fsio.unlink(self.store.layout.entry(KEY, b), durable=self.store.config.fsync)

    def _write_batch(self, batch: str, entries: list[Any]) -> None:
        """One batch file: its entries as ``_jsoncopy.json_bytes`` writes them (orjson's, or
        where orjson would not write what the standard library reads back — an integer past
        64 bits, a lone surrogate, nesting past orjson's limit — the standard library's,
        marked ``"stdlib": true`` so a reader parses it with the standard library too)."""
        path = self.store.layout.entry(KEY, batch)
        data, stdlib = typed(json_bytes, entries, "a transcript entry")
        doc: dict[str, Any] = {"format": BATCH_FORMAT, "id": batch}
        if stdlib:
            doc["stdlib"] = True
        doc["entries"] = orjson.Fragment(data)
        if not self._made:
            _fsio.makedirs(os.path.dirname(path), durable=self.store.config.fsync)
            self._made = True
        _fsio.write_atomic(path, orjson.dumps(doc), overwrite=False,
                           durable=self.store.config.fsync)

    def _read_batch(self, batch: str) -> list[Any]:
        """One batch's entries. A read never moves a file: a batch this node cannot read raises
        ``UnreadableState`` and stays where it is — ``needs_newer`` if a newer fsdurable wrote
        it (a newer batch format: another node's, which still reads it), else ``unreadable``."""
        path = self.store.layout.entry(KEY, batch)
        doc: object = None
        try:
            data, _ = _fsio.read_bounded(path, self.store.config.max_file_bytes)
            try:
                doc = orjson.loads(data)
                stdlib = isinstance(doc, dict) and doc.get("stdlib") is True  # _write_batch
            except orjson.JSONDecodeError:  # a lone surrogate: only the standard library's
                stdlib = True               # parser reads it (ValueError if nothing does)
            if stdlib:
                doc = json_loads(data, stdlib=True)
            if (not isinstance(doc, dict) or doc.get("format") != BATCH_FORMAT
                    or doc.get("id") != batch or not isinstance(doc.get("entries"), list)):
                raise ValueError(f"not a {BATCH_FORMAT} file for batch {batch!r}")
            entries: list[Any] = doc["entries"]
            return entries
        except FileNotFoundError:
            raise UnreadableState(f"transcript batch {batch!r} is missing", path=path,
                                  reason="missing_batch") from None
        except (ValueError, UnreadableState, RecursionError) as e:
            newer = newer_format(doc, BATCH_FORMAT)
            raise UnreadableState(f"transcript batch {batch!r} is unreadable"
                                  f"{' (written by a newer fsdurable)' * newer}: {e}", path=path,
                                  reason="needs_newer" if newer else "unreadable") from e


def _ms(s: Session | None) -> int:
    """The index commit's time in epoch milliseconds (the clock list and summaries share)."""
    return int(s.updated_at * 1000) if s is not None else 0


__all__ = ["FileSessionStore"]
