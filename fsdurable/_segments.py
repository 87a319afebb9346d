"""The repair gate's acts on history segments (docs/storage.md): unreferenced segments.

A segment no document refers to — a crash between the commit's segment and its document, a
history rewritten, a session deleted — is invisible to every read; only this module removes it,
under the session's commit lock, with a ``segment_removed`` event, and only if

- this node wrote it (its ``node_id``): another node's may belong to a document still in sync
  flight (reported ``waiting_for_sync``, never removed);
- neither the session's document nor any sync-conflict copy of it nor any copy of it kept in
  ``quarantine/`` (the losing side of a resolved conflict: nothing lost) refers to it, reading
  each one's whole chain (one that cannot be read — a segment not arrived, a newer format, a
  quarantined file that does not parse — leaves every segment of the session where it is);
- it is older than ``Config.segment_grace``.

Temp files of a segment write that died (``~<name>.<random>.tmp``) go by the same rules of age.
Nothing is listed or removed through a symlink (or a file) in place of ``history/`` or
``history/<id>/``: it is reported (``refused_dirs``, doctor's ``history_not_a_directory``).
A dry run (``doctor`` without ``--repair``) only says what would go.

The archive's retention (``prune_archive``, ``Config.archive_retention``) removes nothing
itself: it commits the document saying where its chain is kept from (``kept``), which makes the
oldest archived segments unreferenced; they then go by the rules above.
"""

from __future__ import annotations

import os
import re

from . import _events as ev
from . import _fsio
from ._errors import FsDurableError, HistoryUnavailable, StorageError, UnreadableState
from ._history import NAME_RE, History
from ._itemlog import LOG_RE, log_name, refs
from ._names import NameKind, classify
from ._repair import NOTHING, WAITING, Act, judge_session
from ._store import Store

REMOVED = "removed_segment"
WOULD_REMOVE = "would_remove_segment"
RELEASED = "released_archive"
WOULD_RELEASE = "would_release_archive"
_HEAD = 4096  # a segment's node_id sits in its first bytes (format, session_id, first, node_id)


def _chain_names(s: object) -> set[str]:
    """Every segment name a parsed session's history and lanes name, and the item logs it
    names (HistoryUnavailable if a chain does not read)."""
    out: set[str] = {log_name(r["n"]) for r in refs(s).values()}
    lanes = getattr(s, "lanes", None) or {}
    for seq in (getattr(s, "messages", None), *lanes.values()):
        if isinstance(seq, History) and seq.chain is not None:
            out |= set(seq.chain.segment_names())
    return out


def referenced(store: Store, sid: str) -> set[str] | None:
    """The segment names the session's document and its conflict copies refer to; None if any
    of them cannot be judged (unreadable, a newer format, a chain that does not read): then
    nothing of the session's history may go."""
    from ._codec import parse_session
    from ._quarantine import SESSION_KINDS, listing

    j, s, _ = judge_session(store, sid)
    if j.stat is not None and s is None:
        return None
    try:
        names = _chain_names(s) if s is not None else set()
        copies = [os.path.join(store.layout.sessions, n)
                  for n in _fsio.list_names(store.layout.sessions)
                  if classify(n)[0] is NameKind.CONFLICT and classify(n)[1] == sid]
        copies += [q.path for q in listing(store)  # its documents (an item log is none)
                   if q.kind in SESSION_KINDS and q.session_id == sid]
        for path in copies:
            data, _ = _fsio.read_bounded(path, store.config.max_file_bytes)
            copy, _ = parse_session(data, path=path,
                                    history_dir=store.layout.history_dir(sid),
                                    max_bytes=store.config.max_file_bytes)
            names |= _chain_names(copy)
    except (HistoryUnavailable, FsDurableError, OSError):
        return None
    return names


_NODE = re.compile(rb'"node_id":(?:"([^"\\]*)"|null)')


def _writer(path: str) -> str | None:
    """The node a segment names as its writer, from its first bytes (encode_segment writes
    ``node_id`` fourth); None if it names none or cannot be read."""
    try:
        m = _NODE.search(_fsio.read_prefix(path, _HEAD))
    except (OSError, FsDurableError):
        return None
    return m.group(1).decode("utf-8", "replace") if m is not None and m.group(1) else None


def repair_history(store: Store, sid: str, *, dry_run: bool = False) -> list[Act]:
    """Remove (``dry_run``: say) the unreferenced segments of session ``sid`` that this node
    wrote and that are older than ``Config.segment_grace``; one ``segment_removed`` event per
    segment removed. Another node's are reported ``waiting_for_sync``. A symlink or a file in
    place of ``history/`` or ``history/<sid>/`` is one act of nothing (reason
    ``not_a_directory``): nothing is listed or removed through it."""
    directory = store.layout.history_dir(sid)
    refused = _refused(store, sid)
    if refused is not None:  # a symlink or a file in its place: never listed or removed through
        return [refused]
    if _fsio.lstat(directory) is None:
        return []
    out: list[Act] = []
    with store.commit_lock(sid):
        refused = _refused(store, sid)  # again, under the lock
        if refused is not None:
            return [refused]
        try:
            names = _fsio.list_names(directory, follow=False)
        except (OSError, StorageError, UnreadableState):
            return []
        if not names:
            return []
        keep = referenced(store, sid)
        if keep is None:
            return []
        now = store.clock()
        for name in sorted(names):
            path = os.path.join(directory, name)
            is_temp = classify(name)[0] is NameKind.TEMP
            if name in keep or not (is_temp or NAME_RE.fullmatch(name)
                                    or LOG_RE.fullmatch(name)):
                continue  # named by a document, or not a file of ours
            st = _fsio.lstat(path)
            if st is None or now - st.st_mtime < store.config.segment_grace:
                continue  # a commit of this node may be about to name it
            if not is_temp:
                node = _writer(path)
                if node != store.node_id:
                    out.append(Act(WAITING, path, sid, reason="another_node", detail=node))
                    continue
            if dry_run:
                out.append(Act(WOULD_REMOVE, path, sid, reason="unreferenced"))
                continue
            now_st = _fsio.lstat(path)
            if now_st is None or (now_st.st_ino, now_st.st_size, now_st.st_mtime_ns) != (
                    st.st_ino, st.st_size, st.st_mtime_ns):
                out.append(Act(NOTHING, path, sid, reason="changed"))
                continue
            try:
                _fsio.unlink(path, durable=store.config.fsync)
            except StorageError as e:
                out.append(Act("failed", path, sid, reason=e.reason, detail=e.message))
                continue
            store.emit(ev.SEGMENT_REMOVED, session_id=sid, reason="unreferenced",
                       segment=name, temp=is_temp)
            out.append(Act(REMOVED, path, sid, reason="unreferenced"))
        if not dry_run and not _fsio.list_names(directory, follow=False):
            _fsio.rmdir(directory, durable=store.config.fsync)
    return out


def prune_archive(store: Store, sid: str, *, dry_run: bool = False) -> Act | None:
    """Apply ``Config.archive_retention`` to session ``sid`` (storage.md, "Compaction and its
    archive"): release the oldest segments that hold archived values only (before the summary's
    ``start``) and were written longer ago than the retention — the document, committed through
    the commit function, says its chain is kept from the first value after them (``kept``),
    with an ``archive_pruned`` event; they are then unreferenced (``repair_history`` removes
    this node's). None: nothing to release — no retention set, a turn in progress (never a
    commit under a running turn), or a chain that does not read (left as it is: doctor reports
    it). ``dry_run``: say what would be released."""
    from ._commit import evolve
    from ._errors import SessionNotFound, UnreadableState

    retention = store.config.archive_retention
    if retention is None:
        return None
    with store.commit_lock(sid):
        try:
            s = store.load(sid)
        except (SessionNotFound, UnreadableState):
            return None
        chain = s.messages.chain if isinstance(s.messages, History) else None
        if chain is None or s.in_progress or chain.ref.start <= chain.ref.kept:
            return None
        ref = chain.ref
        try:
            segs = chain.segments()
        except HistoryUnavailable:
            return None
        now, kept, released = store.clock(), ref.kept, 0
        for i in range(len(segs) - 1, -1, -1):  # the oldest first
            end = segs[i - 1][0] if i else ref.segmented  # where the next values begin
            st = _fsio.lstat(os.path.join(store.layout.history_dir(sid), segs[i][1]))
            if end > ref.start or st is None or now - st.st_mtime < retention:
                break  # holds a value after the summary's range, or is not old enough
            kept, released = end, released + 1
        if not released:
            return None
        path = store.layout.session(sid)
        detail = f"{released} segment(s), values {ref.kept}..{kept - 1}"
        if dry_run:
            return Act(WOULD_RELEASE, path, sid, reason="archive_retention", detail=detail)
        store._commit_locked(evolve(s, messages=History(chain.derived(evolve(ref, kept=kept)))),
                             s.version)
        store.emit(ev.ARCHIVE_PRUNED, session_id=sid, kept_from=ref.kept, kept=kept,
                   segments=released, retention=retention)
    return Act(RELEASED, path, sid, reason="archive_retention", detail=detail)


def _refused(store: Store, sid: str) -> Act | None:
    """An act of nothing (reason ``not_a_directory``) if a symlink or a file is in place of
    ``history/`` or ``history/<sid>/``: the gate never lists or removes through it; None if
    both are directories or missing."""
    try:
        _fsio.own_dirs(store.layout.history, store.layout.history_dir(sid))
    except UnreadableState as e:
        return Act(NOTHING, e.path or store.layout.history_dir(sid), sid,
                   reason="not_a_directory", detail=e.message)
    except (OSError, StorageError):
        return None  # the disk refused the lstat: the listing below says nothing either
    return None


def refused_dirs(store: Store) -> list[Act]:
    """``history/`` or any ``history/<id>`` that is a symlink or a file where a directory of
    the store belongs (doctor's ``history_not_a_directory``): never followed."""
    try:
        _fsio.own_dirs(store.layout.history)
    except UnreadableState as e:
        return [Act(NOTHING, e.path or store.layout.history, None, reason="not_a_directory",
                    detail=e.message)]
    except (OSError, StorageError):
        return []
    return [a for a in map(lambda sid: _refused(store, sid), history_sessions(store))
            if a is not None]


def history_sessions(store: Store) -> list[str]:
    """The session ids that have a history directory (one listing of ``history/``)."""
    from ._layout import own_id

    try:
        names = _fsio.list_names(store.layout.history, follow=False)
    except (OSError, StorageError, UnreadableState):  # a symlink: refused_dirs reports it
        return []
    return sorted(n for n in names if own_id(n + ".json") is not None)


__all__ = ["RELEASED", "REMOVED", "WOULD_RELEASE", "WOULD_REMOVE", "history_sessions",
           "prune_archive", "referenced", "refused_dirs", "repair_history"]
