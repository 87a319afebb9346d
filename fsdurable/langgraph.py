"""A LangGraph checkpointer on plain files whose graph runs are turns of the one turn protocol.

``FsDurableSaver(root)`` (or ``with FsDurableSaver.from_conn_string(root) as saver:``) is a
``BaseCheckpointSaver`` (sync and async methods, thread-safe): a thread is a session of the store
whose small head is committed by the store's one commit function, and the thread's history is
append-only immutable record files (``fsdurable._lgstore`` describes the layout; the serializer's
typed bytes are stored exactly).

A graph run is a TURN (``fsdurable._turns.TurnRun``, driver ``langgraph``; ``fsdurable._lgruns``
translates): the first checkpoint that leaves a node to run begins it in the process running the
graph — the route lock taken and HELD until the run ends, pauses or fails, the session in
progress with its marker (``turn_started``) — so a second process's ``recover`` finds the route
``busy`` and never runs the graph beside it. Tools go through the ledger when the graph's tool
node is ``tool_node(...)``. ``recover(graph, saver, config=..., context=...)`` resumes the runs
a crash cut short, unattended, through the store's gates; a failed resume costs one attempt.

When does a run end? The saver sees only checkpoints and writes: a root checkpoint with a node
still to run (its ``updated_channels`` name ``__start__``, a ``branch:to:<node>`` trigger or a
``Send``) is in flight; one without is the run's end. An ``__interrupt__`` write pauses the run
(waiting for a human: not interrupted), an ``__error__`` write fails it (the caller saw the
error; a resumed run's error is a failed resume instead, counted by recovery), a ``__resume__``
write (``Command(resume=...)``) starts it again. A subgraph's writes (its namespace) never end
the run: a ``RetryPolicy`` may run it again. ``saver.bind(graph)`` tells the saver the graph's
``interrupt_before`` nodes, so a run stopped before one is paused from the start.

Install with ``pip install 'fsdurable[langgraph]'``. Importing ``fsdurable`` never imports this
module (nor langgraph).
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, RESUME, TASKS

from . import _lgruns as runs
from . import _lgstore as lg
from ._aio import run_sync
from ._config import DEFAULT_CONFIG, Config
from ._lgrecover import RunResult, arecover, recover
from ._lgruns import (
    UNATTENDED,
    ExitDurabilityWarning,
    ToolLedger,
    attended,
    tool_context,
    tool_node,
)
from ._model import Session
from ._store import Store

Ref = list[Any]  # [record seq, channel version]: where a checkpoint's channel blob is


class FsDurableSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpointer storing each thread in an fsdurable store (see the module doc)."""

    def __init__(self, store: Store | str | os.PathLike[str] | None = None, *,
                 serde: SerializerProtocol | None = None, config: Config = DEFAULT_CONFIG,
                 session_ids: str = "hashed") -> None:
        super().__init__(serde=serde)
        if session_ids not in ("hashed", "thread"):
            raise ValueError(f"session_ids must be 'hashed' or 'thread', not {session_ids!r}")
        self.store = store if isinstance(store, Store) else Store(store, config=config)
        self.threads = lg.Threads(self.store, named=session_ids == "thread")
        self.breakpoints: frozenset[str] = frozenset()
        self.runs = runs.Runs()  # this saver's graph runs open in this process

    @classmethod
    @contextmanager
    def from_conn_string(cls, conn_string: str | os.PathLike[str], *,
                         serde: SerializerProtocol | None = None,
                         config: Config = DEFAULT_CONFIG,
                         session_ids: str = "hashed") -> Iterator[FsDurableSaver]:
        """``with FsDurableSaver.from_conn_string("graph-store") as saver:`` — shaped like
        ``SqliteSaver.from_conn_string``; the "connection string" is the store's directory. On
        exit, a live run of this process still open (its graph raised something LangGraph
        records no error for) lets go of its route lock and stays interrupted, for recover."""
        saver = cls(conn_string, serde=serde, config=config, session_ids=session_ids)
        try:
            yield saver
        finally:
            saver.close()

    def close(self) -> None:
        """Let go of the route locks of this store's live runs still open in this process (they
        stay interrupted: recover decides). The saver stays usable."""
        self.runs.release(lambda r: True)

    def bind(self, graph: Any) -> Any:
        """Tell the saver a compiled graph's ``interrupt_before`` nodes (returns the graph): a run
        stopped before one of them is paused for a human, not interrupted. (Breakpoints passed to
        ``invoke`` itself are not seen; ``recover`` still never runs past one.)"""
        self.breakpoints |= frozenset(getattr(graph, "interrupt_before_nodes", None) or ())
        return graph

    # ------------------------------------------------------------------ reading

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        c = config["configurable"]
        tid, ns = str(c["thread_id"]), c.get("checkpoint_ns", "")
        s = self.threads.session(self.threads.sid(tid))
        if s is None:
            return None
        got = self.threads.checkpoint(s, ns, get_checkpoint_id(config))
        return None if got is None else self._tuple(lg.head_of(s)["thread_id"], *got)

    def _tuple(self, tid: str, rec: lg.Record, blobs: dict[str, lg.Typed],
               writes: list[tuple[str, str, lg.Typed, str, int]]) -> CheckpointTuple:
        h = rec.header
        loads = self.serde.loads_typed
        ns = h["ns"]
        checkpoint = loads(rec.parts[0])
        checkpoint["channel_values"] = {ch: loads(t) for ch, t in blobs.items()}
        parent = h["parent"]
        return CheckpointTuple(
            config={"configurable": {"thread_id": tid, "checkpoint_ns": ns,
                                     "checkpoint_id": h["id"]}},
            checkpoint=checkpoint,
            metadata=loads(rec.parts[1]),
            parent_config={"configurable": {"thread_id": tid, "checkpoint_ns": ns,
                                            "checkpoint_id": parent}} if parent else None,
            pending_writes=[(task, ch, loads(t)) for task, ch, t, _p, _i in writes],
        )

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        if config is not None:
            tid = str(config["configurable"]["thread_id"])
            threads = [(self.threads.sid(tid), tid)]
            ns = config["configurable"].get("checkpoint_ns")
            only = get_checkpoint_id(config)
        else:
            threads, ns, only = self.threads.thread_ids(), None, None
        upto = get_checkpoint_id(before) if before else None
        for sid, _tid in threads:
            s = self.threads.session(sid)
            if s is None:
                continue
            idx = self.threads.index(s)
            for cns, ckid, _n in lg.visible(idx, ns):
                if (only and ckid != only) or (upto and ckid >= upto):
                    continue
                got = self.threads.checkpoint(s, cns, ckid)
                if got is None:
                    continue
                tup = self._tuple(lg.head_of(s)["thread_id"], *got)
                if filter and not all(tup.metadata.get(k) == v for k, v in filter.items()):
                    continue
                if limit is not None:
                    if limit <= 0:
                        return
                    limit -= 1
                yield tup

    # ------------------------------------------------------------------ writing

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        c = config["configurable"]
        tid, ns, parent = str(c["thread_id"]), c.get("checkpoint_ns", ""), c.get("checkpoint_id")
        dumps = self.serde.dumps_typed
        body = dict(checkpoint)
        values: dict[str, Any] = body.pop("channel_values")  # type: ignore[assignment]
        md = get_checkpoint_metadata(config, metadata)
        parts: list[tuple[list[Any], lg.Typed]] = [(["checkpoint"], dumps(body)),
                                                   (["metadata"], dumps(md))]
        for ch, ver in new_versions.items():
            parts.append((["blob", ch, ver], dumps(values[ch]) if ch in values else ("empty", b"")))
        ckid, versions = checkpoint["id"], checkpoint["channel_versions"]
        run_id = md.get("run_id")
        nodes = _next_nodes(checkpoint)
        state = None if ns else (
            lg.ENDED if not nodes else
            lg.PAUSED if "*" not in nodes and nodes <= self.breakpoints else lg.RUNNING)
        runs.check_durability(config)

        def run_state(s: Session | None, head: dict[str, Any]) -> str | None:
            came = _early(head, ns, ckid) if s is not None and state is not None else []
            if not came:
                return state
            assert s is not None  # writes saved before their put: an interrupt or an error?
            chans = {m[3] for n in came for m in self.threads.record(s, n, "writes")
                     .header["parts"]}
            return lg.PAUSED if INTERRUPT in chans else lg.FAILED if ERROR in chans else state

        reply = runs.final_reply(values) if state == lg.ENDED else None

        def build(s: Session | None, head: dict[str, Any], seq: int) -> Any:
            refs = self._refs(s, head, ns, parent, versions, new_versions, seq)
            rec = lg.new_record({"kind": "ckpt", "thread_id": head["thread_id"], "seq": seq,
                                 "ns": ns, "id": ckid, "parent": parent,
                                 "run_id": run_id if isinstance(run_id, str) else None,
                                 "refs": refs}, parts)
            ns_map = dict(head["ns"])
            cur = ns_map.get(ns)
            latest = cur is None or ckid >= cur["id"]
            head = {**head, "ns": ns_map}
            run: str | None = None
            if latest:
                keep = cur["writes"] if cur is not None and cur["id"] == ckid else []
                came = _early(head, ns, ckid)  # its writes saved before it (async durability)
                ns_map[ns] = {"id": ckid, "seq": seq, "writes": [*keep, *came]}
                head["early"] = [e for e in head.get("early", [])
                                 if e[0] != ns or e[1] > ckid]
                run = run_state(s, head)
            if not latest:  # only the thread's newest root checkpoint speaks for its run
                return [("ckpt", rec)], head, None
            if run is not None:  # why a paused run waits: a breakpoint, or an interrupt()
                why = "breakpoint" if run == lg.PAUSED and run == state else None
                head["run"] = {**head["run"], "why": why}
            if run == lg.RUNNING and isinstance(run_id, str):
                head["run"] = {**head["run"], "run_id": run_id}
            return [("ckpt", rec)], head, run

        # a graph run begins here, in this process (see _lgruns)
        with runs.turn(self, tid, run_state, reply=reply) as through:
            self.threads.mutate(tid, build, through)
        return {"configurable": {"thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": ckid}}

    def _refs(self, s: Session | None, head: dict[str, Any], ns: str, parent: str | None,
              versions: ChannelVersions, new_versions: ChannelVersions, seq: int
              ) -> dict[str, Ref]:
        """For each channel of the checkpoint, the record holding its blob at that version."""
        refs: dict[str, Ref] = {}
        prefs: dict[str, Ref] = {}
        if s is not None and parent:
            entry = head["ns"].get(ns)
            pseq = entry["seq"] if entry is not None and entry["id"] == parent \
                else self.threads.index(s).ckpts.get((ns, parent))
            if pseq is not None:
                prefs = self.threads.record(s, pseq, "ckpt").header["refs"]
        missing = []
        for ch, ver in versions.items():
            if ch in new_versions and new_versions[ch] == ver:
                refs[ch] = [seq, ver]
            elif ch in prefs and prefs[ch][1] == ver:
                refs[ch] = prefs[ch]
            else:
                missing.append((ch, ver))
        if missing and s is not None:  # a fork or a foreign parent: look through the history
            idx = self.threads.index(s)
            for _ns, _ck, n in lg.visible(idx, ns):
                if not missing:
                    break
                rec = self.threads.record(s, n, "ckpt")
                for ch, ver in list(missing):
                    if rec.blob(ch, ver) is not None:
                        refs[ch] = [n, ver]
                        missing.remove((ch, ver))
        return refs

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        c = config["configurable"]
        tid, ns, ckid = str(c["thread_id"]), c.get("checkpoint_ns", ""), c["checkpoint_id"]
        items = [(WRITES_IDX_MAP.get(ch, i), ch, v) for i, (ch, v) in enumerate(writes)]
        chans = {ch for _i, ch, _v in items}
        # a subgraph's writes (its namespace) never end the run: a RetryPolicy may rerun it
        state = None if ns else (lg.PAUSED if INTERRUPT in chans else lg.FAILED if ERROR in chans
                                 else lg.RUNNING if RESUME in chans else None)
        resumed = not ns and task_path != "" and state is None  # a node ran: see _writes_state
        error = next((v for _i, ch, v in items if ch == ERROR), None) if state else None
        dumps = self.serde.dumps_typed
        typed = [(i, ch, dumps(v)) for i, ch, v in items]

        def build(s: Session | None, head: dict[str, Any], seq: int) -> Any:
            entry = head["ns"].get(ns)
            latest = entry is not None and entry["id"] == ckid
            # durability="async" saves in the background: writes may come before their
            # checkpoint (kept in the head's "early" list until its put) or after a newer one
            early = entry is None or ckid > entry["id"]
            pending = _early(head, ns, ckid)
            if s is None:
                have: list[int] = []
            elif latest:
                have = entry["writes"]
            elif early:
                have = pending
            else:
                have = self.threads.index(s).writes.get((ns, ckid), [])
            seen = {(w[0], w[4]) for w in self.threads.writes_of(s, have)} if s else set()
            fresh = [(i, ch, t) for i, ch, t in typed if i < 0 or (task_id, i) not in seen]
            now = _writes_state(head, ns, ckid, state, resumed)
            if not fresh and now is None:
                return None
            if now is not None:
                head = {**head, "run": {**head["run"], "why": None}}
            records = []
            if fresh:
                records.append(("writes", lg.new_record(
                    {"kind": "writes", "thread_id": head["thread_id"], "seq": seq, "ns": ns,
                     "id": ckid, "task_id": task_id, "task_path": task_path},
                    [(["write", ch, i], t) for i, ch, t in fresh])))
                if latest:
                    head = {**head, "ns": {**head["ns"], ns: {**entry,
                                                                "writes": [*have, seq]}}}
                elif early:
                    rest = [e for e in head.get("early", []) if e[:2] != [ns, ckid]]
                    head = {**head, "early": [*rest, [ns, ckid, [*pending, seq]]]}
            return records, head, now

        with runs.turn(self, tid, lambda _s, head: _writes_state(head, ns, ckid, state, resumed),
                       error=error) as through:
            self.threads.mutate(tid, build, through)

    def delete_thread(self, thread_id: str) -> None:
        self.threads.delete(str(thread_id))
        self.runs.release(lambda r: r.session_id == self.threads.sid(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = set(run_ids)
        if not runs:
            return
        for _sid, tid in self.threads.thread_ids():
            def choose(head: dict[str, Any], idx: Any) -> set[int]:
                out = {n for n, r in idx.runs.items() if r in runs}
                for key, n in idx.ckpts.items():
                    if n in out:
                        out.update(idx.writes.get(key, []))
                return out

            self.threads.drop(tid, choose)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: only each namespace's latest checkpoint (and its writes) stays
        listed; records a kept checkpoint reads a blob from stay on disk. ``delete``: the
        threads are deleted. (A graph using ``DeltaChannel`` loses the history its delta
        channels replay: see ``BaseCheckpointSaver.prune``.)"""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}")
        for tid in thread_ids:
            if strategy == "delete":
                self.delete_thread(str(tid))
                continue

            def choose(head: dict[str, Any], idx: Any) -> set[int]:
                keep = set()
                for e in head["ns"].values():
                    keep.add(e["seq"])
                    keep.update(e["writes"])
                for e in head.get("early", []):  # writes waiting for their checkpoint's put
                    keep.update(e[2])
                every = set(idx.ckpts.values()) | {n for ws in idx.writes.values() for n in ws}
                return every - keep

            self.threads.drop(str(tid), choose)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every record of the source thread (payloads byte for byte) after the target's."""
        src = self.threads.session(self.threads.sid(source_thread_id))
        if src is None:
            return
        shead = self.threads.head(src)
        idx = self.threads.index(src)
        shown = set(idx.ckpts.values())
        reffed = {b for n in shown
                  for b, _v in self.threads.record(src, n, "ckpt").header["refs"].values()}
        olds = sorted(shown | reffed | {n for ws in idx.writes.values() for n in ws})
        kinds = {n: "ckpt" if n in shown or n in reffed else "writes" for n in olds}
        dst = str(target_thread_id)

        def build(s: Session | None, head: dict[str, Any], seq: int) -> Any:
            new = {old: seq + i for i, old in enumerate(olds)}
            records = []
            for old in olds:
                kind = kinds[old]
                rec = self.threads.record(src, old, kind)
                h = {k: v for k, v in rec.header.items()
                     if k not in ("format", "parts", "crc32")}
                h.update(thread_id=head["thread_id"], seq=new[old])
                if "refs" in h:
                    h["refs"] = {ch: [new[b], v] for ch, (b, v) in h["refs"].items()}
                parts = [([m[0], *m[3:]], t)
                         for m, t in zip(rec.header["parts"], rec.parts, strict=True)]
                records.append((kind, lg.new_record(h, parts)))
            ns_map = dict(head["ns"])
            for ns, e in shead["ns"].items():
                cur = ns_map.get(ns)
                if cur is None or e["id"] >= cur["id"]:
                    ns_map[ns] = {"id": e["id"], "seq": new[e["seq"]],
                                  "writes": [new[w] for w in e["writes"]]}
            gone = [*head["gone"], *(new[n] for n in sorted(reffed - shown))]
            return records, {**head, "ns": ns_map, "gone": gone}, None

        self.threads.mutate(dst, build)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Versions as InMemorySaver and SqliteSaver make them: a zero-padded counter (string
        order is numeric order) and a random fraction."""
        cur: Any = current  # LangGraph may hand back an int version from an older saver
        if cur is None:
            v = 0
        elif isinstance(cur, int):
            v = cur
        else:
            v = int(cur.split(".")[0])
        return f"{v + 1:032}.{random.random():016}"

    # ------------------------------------------------------------------ async twins

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await run_sync(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        items = await run_sync(lambda: [*self.list(config, filter=filter, before=before,
                                                   limit=limit)])
        for item in items:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        return await run_sync(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await run_sync(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await run_sync(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await run_sync(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await run_sync(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await run_sync(self.prune, thread_ids, strategy=strategy)


def _early(head: dict[str, Any], ns: str, ckid: str) -> list[int]:
    """The writes records saved for a checkpoint of ``ns`` before the checkpoint itself."""
    for e in head.get("early", []):
        if e[0] == ns and e[1] == ckid:
            seqs: list[int] = e[2]
            return seqs
    return []


def _next_nodes(checkpoint: Checkpoint) -> set[str]:
    """The nodes a root checkpoint leaves to run (see the module doc); ``"*"``: some unknown
    node (a ``Send``, or no ``updated_channels`` to tell)."""
    updated = checkpoint.get("updated_channels")
    if updated is None:
        return {"*"}
    out = set()
    for ch in updated:
        if ch == "__start__":
            out.add(ch)
        elif ch.startswith("branch:to:"):
            out.add(ch[len("branch:to:"):])
        elif ch == TASKS:
            out.add("*")
    return out


def _pending(checkpoint: Checkpoint) -> bool:
    """Does a root checkpoint leave a node to run? Unknown: yes."""
    return bool(_next_nodes(checkpoint))


def _writes_state(head: dict[str, Any], ns: str, ckid: str, state: str | None,
                  resumed: bool) -> str | None:
    """The run state a ``put_writes`` to checkpoint ``ckid`` of ``ns`` leaves: a late write to
    an older checkpoint never reopens or closes the run; a node's writes after a breakpoint
    (``invoke(None)`` went past it) put the run in flight again."""
    entry = head["ns"].get(ns)
    latest = entry is not None and entry["id"] == ckid
    if resumed and latest and head["run"].get("why") == "breakpoint":
        return lg.RUNNING
    return state if latest or entry is None or ckid > entry["id"] else None


__all__ = ["UNATTENDED", "ExitDurabilityWarning", "FsDurableSaver", "RunResult", "ToolLedger",
           "arecover", "attended", "recover", "tool_context", "tool_node"]
