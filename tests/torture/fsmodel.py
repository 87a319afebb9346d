"""A conservative persistence model of a POSIX file system, fed by ``_fsio``'s recorder.

Every operation the store makes (create, write, fsync, rename, link, unlink, mkdir, rmdir,
fsync_dir, append, truncate) is replayed into this model. At any crash point the model
enumerates the on-disk states a power cut may leave:

* data written to a file since its last fsync may be lost: any prefix of it may survive, and the
  last write may be torn (full length, tail replaced by zeros); a truncate not fsynced yet may
  be lost;
* a create, rename, link, unlink or mkdir is durable only after an fsync of its directory; before
  that each pending one may be lost, and they may become durable in any order;
* nothing after the crash point happened.

The number of subsets of pending directory operations is bounded: all of them while there are at
most ``max_subset_ops`` pending, else every prefix, every leave-one-out and "only this one".

Files with data not fsynced vary one at a time (the others whole or empty) when there are more
than two. Files under a ``together`` prefix (the explorer's: ``events/``, whose lines a note
leaves to a later fsync, and no invariant ties one day file to another) vary jointly instead:
each variant (lines lost, cut, torn with zeros) in every such file at once, the other files
whole; and the other files' variants with those whole. Their own per-file variation adds no
state an invariant can tell apart, and one file each per session would multiply the states.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import attrs


@attrs.define
class Inode:
    durable: bytes = b""
    pending: bytes = b""  # written since the last fsync
    before: bytes | None = None  # what a truncate not yet fsynced cut: it may still be there

    @property
    def current(self) -> bytes:
        return self.durable + self.pending


@attrs.frozen
class DirOp:
    kind: str  # "link" (create/link), "rename", "unlink", "mkdir", "rmdir"
    dirs: tuple[str, ...]  # directories whose fsync makes this op durable
    path: str
    src: str | None = None
    ino: int | None = None


def _apply(ns: dict[str, int], dirs: set[str], op: DirOp) -> None:
    if op.kind == "link":
        assert op.ino is not None
        ns[op.path] = op.ino
    elif op.kind == "rename":
        assert op.ino is not None and op.src is not None
        ns.pop(op.src, None)
        ns[op.path] = op.ino
    elif op.kind == "unlink":
        ns.pop(op.path, None)
    elif op.kind == "mkdir":
        dirs.add(op.path)
    elif op.kind == "rmdir":  # only an empty directory goes: its entries went with it
        dirs.discard(op.path)
        for p in [p for p in ns if p.startswith(op.path + os.sep)]:
            del ns[p]


@attrs.define
class CrashState:
    """One on-disk state a crash may leave: relative path -> bytes, plus the directories."""

    files: dict[str, bytes]
    dirs: frozenset[str]
    note: str

    def key(self) -> str:
        h = hashlib.sha256()
        for d in sorted(self.dirs):
            h.update(b"D" + d.encode() + b"\0")
        for p in sorted(self.files):
            h.update(b"F" + p.encode() + b"\0" + hashlib.sha256(self.files[p]).digest())
        return h.hexdigest()

    def materialise(self, root: str) -> None:
        """Write this state under ``root`` (removed first)."""
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root, mode=0o700)
        for d in sorted(self.dirs, key=len):
            os.makedirs(os.path.join(root, d), mode=0o700, exist_ok=True)
        for p, data in self.files.items():
            full = os.path.join(root, p)
            parent = os.path.dirname(full)
            if not os.path.isdir(parent):
                continue  # its directory's mkdir was lost: so is the file
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)


def content_variants(ino: Inode, exhaustive: bool) -> list[tuple[str, bytes]]:
    """What a file with un-fsynced data may hold after a crash."""
    if ino.before is not None:  # a truncate not fsynced yet (nothing is written after it)
        return [("truncated", ino.durable + ino.pending), ("untruncated", ino.before)]
    if not ino.pending:
        return [("synced", ino.durable)]
    p = ino.pending
    n = len(p)
    cuts = {0, n // 2, n - 1, n} if not exhaustive else {0, 1, n // 4, n // 2, 3 * n // 4, n - 1, n}
    out = [(f"prefix{c}/{n}", ino.durable + p[:c]) for c in sorted(cuts) if 0 <= c <= n]
    half = n // 2
    out.append(("torn-zeros", ino.durable + p[:half] + b"\0" * (n - half)))
    return out


Snapshot = tuple[dict[str, bytes], set[str]]


def snapshot(root: str) -> Snapshot:
    """Every file and directory below ``root`` (relative paths), read now."""
    files: dict[str, bytes] = {}
    dirs: set[str] = set()
    for dirpath, _dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir != ".":
            dirs.add(rel_dir)
        for f in filenames:
            full = os.path.join(dirpath, f)
            with open(full, "rb") as fh:
                files[os.path.relpath(full, root)] = fh.read()
    return files, dirs


class FsModel:
    """Replays recorded operations below ``root``; ignores everything outside it."""

    def __init__(self, root: str, snap: Snapshot | None = None, *,
                 together: tuple[str, ...] = ()) -> None:
        self.root = os.path.realpath(root)
        self.together = together  # relative path prefixes whose files vary jointly
        self.inodes: dict[int, Inode] = {}
        self.live: dict[str, int] = {}  # the namespace the running process sees
        self.durable: dict[str, int] = {}  # the namespace that survives a crash for sure
        self.durable_dirs: set[str] = set()
        self.live_dirs: set[str] = set()
        self.pending_ops: list[DirOp] = []
        self.ops = 0
        self._next = 0
        files, dirs = snap if snap is not None else snapshot(self.root)
        self.durable_dirs |= dirs
        self.live_dirs |= dirs
        for rel, data in files.items():
            ino = self._new_inode(data, durable=True)
            self.live[rel] = ino
            self.durable[rel] = ino

    # ------------------------------------------------------------------ setup

    def _new_inode(self, data: bytes = b"", durable: bool = False) -> int:
        self._next += 1
        self.inodes[self._next] = Inode(durable=data if durable else b"",
                                        pending=b"" if durable else data)
        return self._next

    def rel(self, path: str) -> str | None:
        p = os.path.abspath(path)
        if p == self.root:
            return "."
        if p.startswith(self.root + os.sep):
            return os.path.relpath(p, self.root)
        return None

    @staticmethod
    def _dir(rel: str) -> str:
        return os.path.dirname(rel) or "."

    # ------------------------------------------------------------------ replay

    def record(self, op: str, args: tuple[Any, ...]) -> None:
        """The ``_fsio`` recorder: apply one operation to the model (before it happens)."""
        self.ops += 1
        rels = [self.rel(a) if isinstance(a, str) else None for a in args]
        if not args or rels[0] is None:
            return
        r = rels[0]
        assert r is not None
        if op == "create":
            ino = self._new_inode()
            self.live[r] = ino
            self.pending_ops.append(DirOp("link", (self._dir(r),), r, ino=ino))
        elif op == "write":
            self.inodes[self.live[r]].pending += args[1]
        elif op == "append":
            if r not in self.live:
                ino = self._new_inode()
                self.live[r] = ino
                self.pending_ops.append(DirOp("link", (self._dir(r),), r, ino=ino))
            self.inodes[self.live[r]].pending += args[1]
        elif op == "fsync":
            ino_ = self.inodes[self.live[r]]
            ino_.durable, ino_.pending, ino_.before = ino_.current, b"", None
        elif op == "truncate":  # ftruncate to args[1] bytes
            ino_ = self.inodes[self.live[r]]
            size = args[1]
            if size < len(ino_.durable):
                if ino_.before is None:
                    ino_.before = ino_.durable + ino_.pending
                ino_.durable, ino_.pending = ino_.durable[:size], b""
            else:
                ino_.pending = ino_.current[len(ino_.durable):size]
        elif op in ("rename", "link"):
            dst = rels[1]
            assert dst is not None
            ino = self.live[r]
            if op == "rename":
                del self.live[r]
            self.live[dst] = ino
            dirs = tuple(dict.fromkeys((self._dir(dst), self._dir(r))))
            kind = "rename" if op == "rename" else "link"
            self.pending_ops.append(DirOp(kind, dirs, dst, src=r if op == "rename" else None,
                                          ino=ino))
        elif op == "unlink":
            if r in self.live:
                del self.live[r]
                self.pending_ops.append(DirOp("unlink", (self._dir(r),), r))
        elif op == "mkdir":
            self.live_dirs.add(r)
            self.pending_ops.append(DirOp("mkdir", (self._dir(r),), r))
        elif op == "rmdir":
            self.live_dirs.discard(r)
            self.pending_ops.append(DirOp("rmdir", (self._dir(r),), r))
        elif op == "fsync_dir":
            keep = []
            for o in self.pending_ops:
                if r in o.dirs:
                    _apply(self.durable, self.durable_dirs, o)
                else:
                    keep.append(o)
            self.pending_ops = keep
        elif op == "chmod":
            pass
        else:  # pragma: no cover - a new _fsio operation the model must learn
            raise AssertionError(f"unknown fsio operation {op!r}")

    # ------------------------------------------------------------------ crash states

    def subsets(self, max_subset_ops: int) -> Iterator[tuple[str, tuple[DirOp, ...]]]:
        ops = self.pending_ops
        n = len(ops)
        if n <= max_subset_ops:
            for mask in range(1 << n):
                yield f"subset{mask:b}", tuple(o for i, o in enumerate(ops) if mask >> i & 1)
            return
        seen: set[tuple[int, ...]] = set()

        def emit(name: str, idx: tuple[int, ...]) -> Iterator[tuple[str, tuple[DirOp, ...]]]:
            if idx not in seen:
                seen.add(idx)
                yield name, tuple(ops[i] for i in idx)

        for k in range(n + 1):
            yield from emit(f"prefix{k}", tuple(range(k)))
        for k in range(n):
            yield from emit(f"all-but{k}", tuple(i for i in range(n) if i != k))
            yield from emit(f"only{k}", (k,))

    def crash_states(self, *, exhaustive: bool = False) -> Iterator[CrashState]:
        """Every state a crash right now may leave (bounded as the module docstring says)."""
        for name, applied in self.subsets(6 if exhaustive else 3):
            ns = dict(self.durable)
            dirs = set(self.durable_dirs)
            for o in applied:
                _apply(ns, dirs, o)
            dirty = sorted({ino for ino in ns.values() if self.inodes[ino].pending
                            or self.inodes[ino].before is not None})
            joint = {ino for p, ino in ns.items() if ino in dirty and p.startswith(self.together)
                     } if self.together else set()
            unsynced = [i for i in dirty if i not in joint]
            per_file = [[(str(i), v) for v in content_variants(self.inodes[i], exhaustive)]
                        for i in unsynced]
            combos: list[tuple[tuple[str, tuple[str, bytes]], ...]]
            if len(unsynced) <= 2 or exhaustive:
                combos = list(itertools.product(*per_file))
            else:  # vary one file at a time, the others fully written or empty
                combos = []
                for j in range(len(unsynced)):
                    for v in per_file[j]:
                        combos.append(tuple(v if i == j else per_file[i][-2]
                                            for i in range(len(unsynced))))
                combos.append(tuple(pf[0] for pf in per_file))
            if joint:  # the joint files whole beside each combo, then each of their variants
                logs = [[(str(i), v) for v in content_variants(self.inodes[i], exhaustive)]
                        for i in sorted(joint)]
                whole = tuple(vs[-2] if len(vs) > 1 else vs[0] for vs in logs)
                rest = tuple(pf[-2] if len(pf) > 1 else pf[0] for pf in per_file)
                combos = [c + whole for c in combos] + [
                    rest + tuple(vs[min(k, len(vs) - 1)] for vs in logs)
                    for k in range(max(len(vs) for vs in logs))]
            for combo in combos:
                chosen = {int(i): data for i, (_, data) in combo}
                files = {p: chosen.get(ino, self.inodes[ino].durable) for p, ino in ns.items()}
                label = name + "".join(f" ino{i}:{v[0]}" for i, v in combo)
                yield CrashState(files=files, dirs=frozenset(dirs), note=label)


def distinct_crash_states(model: FsModel, ops: list[Any], acked: Callable[[int], int], *,
                          exhaustive: bool = False
                          ) -> Iterator[tuple[int, int, CrashState]]:
    """Replay ``ops`` on ``model`` and yield ``(k, acknowledged, state)`` for every crash state
    after the first ``k`` ops (k = 0 .. len(ops)), each distinct state once per number of
    acknowledged operations (``acked(k)``): the same files with more acknowledged commits must
    satisfy more, so they are checked again."""
    seen: set[tuple[str, int]] = set()
    for k in range(len(ops) + 1):
        n = acked(k)
        for state in model.crash_states(exhaustive=exhaustive):
            key = (state.key(), n)
            if key not in seen:
                seen.add(key)
                yield k, n, state
        if k < len(ops):
            model.record(*ops[k])


def states_on_disk(root: str, snap: Any, ops: list[Any], acked: Callable[[int], int], *,
                   exhaustive: bool, where: str | None, prefix: str
                   ) -> Iterator[tuple[int, CrashState, str]]:
    """``distinct_crash_states`` of ``ops`` replayed from ``snap``, each materialised in turn
    under one temporary directory (in ``where``): ``(k, state, its root)`` — the loop the
    adapters' explorers (LangGraph's log, the item log) share."""
    model = FsModel(root, snap)
    with tempfile.TemporaryDirectory(dir=where, prefix=prefix) as tmp:
        state_root = os.path.join(tmp, "state")
        for k, _, state in distinct_crash_states(model, ops, acked, exhaustive=exhaustive):
            state.materialise(state_root)
            yield k, state, state_root
