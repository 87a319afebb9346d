"""A session's history in write-once segments (docs/storage.md).

The transcript of a session in format ``fsdurable.session/4`` and on lives in ``history/<id>/``, one
segment file per commit that added messages: ``<first>-<digest>.json``, never rewritten. Each
segment names and proves (SHA-256) the one before it, so the session document only names the
newest (``HistoryRef``). ``History`` is the lazy, immutable sequence of messages a loaded session
carries: its length comes from the document, its items from the segments on first use, newest
first, each one verified. A **lane** is another chain of the same session, of an adapter's JSON
values (its segments ``<lane>-<first>-<digest>.json``): the same code reads, writes and judges it.
A chain's end may be cut by its document's ``count`` (or the next segment's ``first``) inside a
segment: the values past the cut are not in the chain (``pop_item``, a trim; storage.md).
From format 6 a chain's newest values may be in no segment yet: the document carries them
inline after its head (``HistoryRef.inline``, each value's JSON bytes), up to a bound; the commit
writes them as one segment when it is passed (``_commit.appended``).
"""

from __future__ import annotations

import _thread
import os
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar, overload

from . import _fsio
from ._errors import HistoryUnavailable, UnreadableState
from ._segcodec import (
    LANE_RE,
    NAME_RE,
    HistoryRef,
    decode_values,
    encode_segment,
    encode_values,
    inline_size,
    lane_of,
    parse_segment,
    ref_from_dict,
    segment_name,
)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_T = TypeVar("_T")


class Chain:
    """The stored values of one chain (the messages, or lane ``lane``): its inline tail (the
    document's, format 6) and its segments, read lazily from the newest backwards, shared by
    every ``History`` derived from it. Thread-safe."""

    __slots__ = ("__weakref__", "_firsts", "_inl", "_low", "_mu", "_names", "_next", "_segs",
                 "_shas", "dir", "lane", "max_bytes", "ref", "sid")

    def __init__(self, sid: str, directory: str | None, ref: HistoryRef,
                 max_bytes: int = DEFAULT_MAX_BYTES, lane: str | None = None) -> None:
        self.sid, self.dir, self.ref, self.max_bytes = sid, directory, ref, max_bytes
        self.lane = lane
        self._mu = _thread.allocate_lock()
        self._segs: list[tuple[Any, ...]] = []  # newest first, each cut where the next begins
        self._firsts: list[int] = []  # the first index of each
        self._names: list[str] = []  # the file name of each
        self._shas: list[str] = []  # the SHA-256 of each
        self._low = ref.segmented  # the lowest index read so far (the inline tail is held)
        self._next: tuple[str, str] | None = (
            (ref.head, ref.sha256) if ref.head is not None and ref.sha256 is not None else None)
        self._inl: tuple[Any, ...] | None = None if ref.inline else ()  # decoded inline values

    def _like(self, ref: HistoryRef) -> Chain:
        return Chain(self.sid, self.dir, ref, self.max_bytes, self.lane)

    def _copy_segments(self, new: Chain) -> None:
        with self._mu:
            new._segs, new._firsts, new._names, new._shas = list(self._segs), \
                list(self._firsts), list(self._names), list(self._shas)
            new._low, new._next = self._low, self._next

    def derived(self, ref: HistoryRef, tail: tuple[Any, ...] = (), *,
                segment: bool = False) -> Chain:
        """The chain ``ref`` names, sharing what was read of this one: this one with ``tail``
        appended — stored inline (``ref.inline`` is this one's and ``tail``'s), or, ``segment``,
        with this one's inline tail and ``tail`` written as segment ``ref.head`` — or (no tail)
        this one with another ``start``."""
        new = self._like(ref)
        self._copy_segments(new)
        if segment:  # the segment just written is the newest one read
            values = self.inline_values() + tail
            new._segs.insert(0, values)
            new._firsts.insert(0, ref.count - len(values))
            assert ref.head is not None and ref.sha256 is not None
            new._names.insert(0, ref.head)
            new._shas.insert(0, ref.sha256)  # (what was read below it, and what is next,
            # stay: it begins where this one's segments end)
        elif self._inl is not None and len(ref.inline) == len(self.ref.inline) + len(tail):
            new._inl = self._inl + tail
        return new

    @classmethod
    def started(cls, sid: str, directory: str | None, ref: HistoryRef,
                tail: tuple[Any, ...], max_bytes: int = DEFAULT_MAX_BYTES,
                lane: str | None = None) -> Chain:
        """The new chain ``ref`` names, holding ``tail`` (just stored: inline, or written as its
        one segment ``ref.head``)."""
        new = cls(sid, directory, ref, max_bytes, lane)
        if ref.inline:
            new._inl = tail
        else:
            assert ref.head is not None and ref.sha256 is not None
            new._segs, new._firsts, new._names, new._shas = [tail], [0], [ref.head], \
                [ref.sha256]
            new._low, new._next = 0, None
        return new

    def inline_values(self) -> tuple[Any, ...]:
        """The values of the inline tail, decoded on first use (a message structured)."""
        with self._mu:
            if self._inl is None:
                self._inl = decode_values(self.ref.inline, sid=self.sid, lane=self.lane,
                                          first=self.ref.segmented)
            return self._inl

    def truncated(self, count: int) -> Chain | None:
        """This chain cut after its first ``count`` values (None: nothing left), writing
        nothing: the inline tail shortened, or (a cut below it) the new document names the
        segment that holds value ``count - 1`` with ``count`` (storage.md, "Cutting the end of
        a chain"). Reads the segments cut away."""
        if count >= self.ref.count:
            return self
        if count <= 0:
            return None
        seg = self.ref.segmented
        if count > seg:  # within the inline tail
            import attrs

            new = self._like(attrs.evolve(self.ref, count=count,
                                          inline=self.ref.inline[: count - seg],
                                          start=min(self.ref.start, count),
                                          kept=min(self.ref.kept, count)))
            self._copy_segments(new)
            with self._mu:
                if self._inl is not None:
                    new._inl = self._inl[: count - seg]
            return new
        self.read_down_to(count - 1)
        with self._mu:
            k = next(i for i, f in enumerate(self._firsts) if f <= count - 1)
            first = self._firsts[k]
            new = self._like(HistoryRef(count=count, head=self._names[k],
                                        sha256=self._shas[k],
                                        start=min(self.ref.start, count),
                                        kept=min(self.ref.kept, count)))
            new._segs = [self._segs[k][: count - first], *self._segs[k + 1:]]
            new._firsts, new._names, new._shas = self._firsts[k:], self._names[k:], \
                self._shas[k:]
            new._low, new._next = self._low, self._next
        return new

    def check_start(self) -> None:
        if self.ref.start > self.ref.count:  # a summary naming a range that is not there
            raise HistoryUnavailable(
                f"session {self.sid}: its summary replaces {self.ref.start} messages of a "
                f"history of {self.ref.count}", session_id=self.sid, reason="history_short")

    def read_down_to(self, index: int) -> None:
        """Read segments until index ``index`` (absolute, in the chain) is held."""
        self.check_start()
        with self._mu:
            if self._low > index and self.dir is not None:
                self._own_dirs(self.dir)  # once per read, not per segment
            while self._low > index:
                self._read_one()

    def _own_dirs(self, directory: str) -> None:
        """``history/`` and ``history/<id>/`` themselves: a symlink (or a file) in place of
        either is never read through (storage.md): HistoryUnavailable (``not_a_directory``),
        nothing moved."""
        try:
            _fsio.own_dirs(os.path.dirname(directory), directory)
        except UnreadableState as e:
            raise HistoryUnavailable(f"session {self.sid}: {e.message}", path=e.path,
                                     session_id=self.sid, reason="not_a_directory") from e

    def _read_one(self) -> None:
        if self._next is None:
            raise HistoryUnavailable(
                f"session {self.sid}: its history chain ends at message {self._low}, before "
                f"what its document names", session_id=self.sid, reason="history_short")
        name, sha = self._next
        if self.dir is None:
            raise HistoryUnavailable(f"session {self.sid}: no history directory to read "
                                     "(a copy outside its store)", session_id=self.sid,
                                     reason="waiting_for_sync")
        path = os.path.join(self.dir, name)
        try:
            data, _ = _fsio.read_bounded(path, self.max_bytes)
        except FileNotFoundError as e:
            raise HistoryUnavailable(
                f"session {self.sid}: history segment {name} is not on disk yet (a sync tool "
                "may still be delivering it)", path=path, session_id=self.sid,
                reason="waiting_for_sync") from e
        except UnreadableState as e:
            raise HistoryUnavailable(f"{path}: {e.message}", path=path, session_id=self.sid,
                                     reason="history_corrupt") from e
        first, prev, prev_sha, msgs = parse_segment(data, path=path, sid=self.sid, sha=sha,
                                                    lane=self.lane)
        m = NAME_RE.fullmatch(name)
        # it must hold the value before the cut (its successor's first, the inline tail's, or
        # the document's count); what it holds past the cut is not in the chain
        if (m is None or m.group(1) != self.lane or m.group(3) != sha[:16]
                or int(m.group(2)) != first or not first < self._low <= first + len(msgs)):
            raise HistoryUnavailable(f"{path}: holds values {first}..{first + len(msgs)}, "
                                     f"not ..{self._low} as its chain says", path=path,
                                     session_id=self.sid, reason="history_corrupt")
        self._segs.append(msgs[: self._low - first])
        self._firsts.append(first)
        self._names.append(name)
        self._shas.append(sha)
        self._low = first
        self._next = (prev, prev_sha) if prev is not None and prev_sha is not None else None

    def at(self, index: int) -> Any:
        """Value ``index`` (absolute, in the chain), reading segments as needed."""
        seg = self.ref.segmented
        if index >= seg:
            self.check_start()
            return self.inline_values()[index - seg]
        self.read_down_to(index)
        with self._mu:
            for first, part in zip(self._firsts, self._segs, strict=True):  # newest first
                if index >= first:
                    return part[index - first]
        raise IndexError(index)  # not reached: read_down_to held it

    def messages(self, lo: int) -> tuple[Any, ...]:
        """Values ``lo`` .. ``count - 1`` of the chain (read as needed)."""
        seg = self.ref.segmented
        self.check_start()
        inl = self.inline_values()
        if lo >= seg:
            return inl[lo - seg:]
        self.read_down_to(lo)
        with self._mu:
            out = [m for part in reversed(self._segs) for m in part]
            return tuple(out[lo - self._low:]) + inl

    def check_kept(self) -> None:
        """``kept`` (where the stored chain begins, format 7) within the archive: at most
        ``start``, else HistoryUnavailable (``history_short``) — never a chain read as if it
        began later than its summary's range (the segments below would look unreferenced)."""
        self.check_start()
        if self.ref.kept > self.ref.start:
            raise HistoryUnavailable(
                f"session {self.sid}: its history is said to be kept from value "
                f"{self.ref.kept}, past its summary's {self.ref.start}", session_id=self.sid,
                reason="history_short")

    def archive(self) -> tuple[Any, ...]:
        """The values a compaction summary replaced that are still kept: ``kept .. start - 1``
        (read and verified as any read)."""
        self.check_kept()
        ref = self.ref
        return self.messages(ref.kept)[: ref.start - ref.kept] if ref.start > ref.kept else ()

    def segments(self) -> list[tuple[int, str]]:
        """(first index, name) of each segment of the stored chain, newest first (reads it
        whole from ``kept``, as ``segment_names``)."""
        self.segment_names()
        with self._mu:
            return list(zip(self._firsts, self._names, strict=True))

    def segment_names(self) -> list[str]:
        """Every segment name of the stored chain (from ``kept``), newest first (reads it
        whole, the archive included)."""
        self.check_kept()
        self.read_down_to(self.ref.kept)
        with self._mu:
            return list(self._names)


class History(Sequence[_T]):
    """The messages of a session (``History[Message]``), or the values of one of its lanes:
    ``chain`` (stored, read lazily) from ``start``, then ``tail`` (not stored yet: the next
    commit writes them as one segment). Immutable; ``+ tuple`` gives a new History with a
    longer tail, reading nothing; ``prefix(n)`` one cut after ``n`` values, writing nothing."""

    __slots__ = ("_all", "chain", "tail")

    def __init__(self, chain: Chain | None, tail: tuple[_T, ...] = ()) -> None:
        self.chain = chain
        self.tail = tail
        self._all: tuple[_T, ...] | None = None

    @property
    def stored(self) -> int:
        """How many of the messages are in the chain (the rest is the tail). HistoryUnavailable
        (``history_short``) if its summary names more than the chain holds: never a history
        shorter than its document says, not even an empty one (``len``, truth, indexing)."""
        chain = self.chain
        if chain is None:
            return 0
        ref = chain.ref
        if ref.start > ref.count:
            chain.check_start()
        return ref.count - ref.start

    def __len__(self) -> int:
        return self.stored + len(self.tail)

    def materialise(self) -> tuple[_T, ...]:
        if self._all is None:
            base = self.chain.messages(self.chain.ref.start) if self.chain is not None else ()
            self._all = base + self.tail
        return self._all

    @overload
    def __getitem__(self, i: int) -> _T: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[_T, ...]: ...

    def __getitem__(self, i: int | slice) -> _T | tuple[_T, ...]:
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1 or self._all is not None:
                return self.materialise()[i]
            if lo >= hi:
                return ()
            stored = self.stored  # read only the segments the slice spans
            head: tuple[_T, ...] = ()
            if lo < stored:
                assert self.chain is not None
                head = self.chain.messages(self.chain.ref.start + lo)[: min(hi, stored) - lo]
            return head + self.tail[max(0, lo - stored): max(0, hi - stored)]
        n = len(self)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError("history index out of range")
        stored = self.stored
        if j >= stored:
            return self.tail[j - stored]
        if self._all is not None:
            return self._all[j]
        assert self.chain is not None
        got: _T = self.chain.at(self.chain.ref.start + j)
        return got

    def __iter__(self) -> Iterator[_T]:
        return iter(self.materialise())

    def __reversed__(self) -> Iterator[_T]:
        for j in range(len(self) - 1, -1, -1):
            yield self[j]

    def __contains__(self, x: object) -> bool:
        return x in self.materialise()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, History):
            return len(self) == len(other) and self.materialise() == other.materialise()
        if isinstance(other, tuple):
            return len(self) == len(other) and self.materialise() == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(self.materialise())

    def extended(self, more: Sequence[_T]) -> History[_T]:
        return History(self.chain, self.tail + tuple(more))

    def prefix(self, n: int) -> History[_T]:
        """The first ``n`` values, writing nothing: a cut of the tail, or of the chain (its
        document names the segment holding value ``n - 1`` with count ``n``; storage.md)."""
        n = max(0, n)
        stored = self.stored
        if n >= len(self):
            return self
        if n >= stored:
            return History(self.chain, self.tail[: n - stored])
        assert self.chain is not None
        return History(self.chain.truncated(self.chain.ref.start + n))

    def __add__(self, other: object) -> History[_T]:
        if isinstance(other, (tuple, list, History)):
            return History(self.chain, self.tail + tuple(other))
        return NotImplemented

    def __radd__(self, other: object) -> tuple[_T, ...]:
        if isinstance(other, tuple):
            return other + self.materialise()
        return NotImplemented

    def __repr__(self) -> str:
        try:
            return f"History({len(self)} messages, {self.stored} stored)"
        except HistoryUnavailable as e:  # a repr never raises: it says why
            return f"History(unreadable: {e.reason}, {len(self.tail)} not stored)"


def extend(seq: Sequence[_T], more: Sequence[_T]) -> Sequence[_T]:
    """``seq`` and then ``more``: a ``History`` keeps what it stores (the commit writes only
    ``more``); any other sequence becomes a tuple."""
    if isinstance(seq, History):
        return seq.extended(more)
    return (*seq, *more)


__all__ = ["DEFAULT_MAX_BYTES", "LANE_RE", "NAME_RE", "Chain", "History", "HistoryRef",
           "decode_values", "encode_segment", "encode_values", "extend", "inline_size", "lane_of",
           "parse_segment", "ref_from_dict", "segment_name"]
