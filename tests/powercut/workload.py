"""The workload whose power is cut: a child process driving fsdurable's public API on the mount.

At its start the child does what a host does after a reboot: opens the store, runs
``fsdurable.recover`` with the reference ``AgentLoop`` and ``python -m fsdurable doctor
--repair``. Then it loops at random over the store's API (create, begin_turn, checkpoint, patch,
save, end_turn, cancel, delete, ``AgentLoop`` turns) and the adapters (LangGraph
``FsDurableSaver.put``/``put_writes``, Agents SDK ``FileSession.add_items``, Pydantic AI
``FileConversationStore.save``, Claude ``FileSessionStore.append``) until it is killed.

Every call that RETURNED — an acknowledged commit — is appended to the ack log, which lives
outside the mount and is fsynced after each line, so what the log says was acknowledged survives
the cut that the mount does not. A delete notes its intent first (it may land without returning).

A chosen cut (``Cut``) is issued from inside this process, through ``_fsio``'s recorder (each
disk operation is announced to it just before it happens): after the Nth fsync, directory fsync
(between two steps of a commit), rename or unlink,
during an event append (a half line written and synced, then the cut: a torn append) and during
a marker removal (unlinked, not yet made durable). The process then writes ``C`` on its status
pipe and carries on — every call now fails with EIO, none may be acknowledged — until the driver
kills it. ``VARIANTS`` are the broken stores the harness must catch, installed here only.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import attrs

import fsdurable
from fsdurable import _fsio
from fsdurable._fsio import _base, _write

__all__ = ["CUT_KINDS", "VARIANTS", "Cut", "install_variant", "run"]

CUT_KINDS = ("fsync", "fsync_dir", "rename", "unlink", "append", "unmark")
VARIANTS = ("correct", "no_fsync", "no_dir_fsync", "marker_after_session", "no_file_fsync")


def _config() -> fsdurable.Config:
    # no debounce: many checkpoints, so cuts land between them; short lock waits (a lock file
    # of a killed workload is released by the kernel, but never wait long on one)
    return fsdurable.Config(checkpoint_debounce=0.0, route_lock_timeout=2.0,
                            commit_lock_timeout=5.0)


class AckLog:
    """One JSON line per acknowledged call, fsynced before the workload goes on."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def __call__(self, **rec: Any) -> None:
        os.write(self.fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
        os.fsync(self.fd)


@attrs.define
class Cut:
    """Cut the power after the ``n``-th disk operation of ``kind`` (``CUT_KINDS``), counted from
    the process's start, or (``after_restart``) from the end of its restart recovery."""

    kind: str
    n: int
    after_restart: bool = False


class _Cutter:
    """The ``_fsio`` recorder that issues a chosen cut."""

    def __init__(self, cut: Cut, mnt: str, status_fd: int, errors: AckLog) -> None:
        self.cut, self.mnt, self.status_fd, self.errors = cut, mnt, status_fd, errors
        self.seen = 0
        self.armed = False  # the Nth matching op has been announced: cut at the next one
        self.done = False
        self.counting = not cut.after_restart

    def _matches(self, op: str, args: tuple[Any, ...]) -> bool:
        kind = self.cut.kind
        path = str(args[0]) if args else ""
        if kind == "fsync":
            return op in ("fsync", "fsync_dir")
        if kind == "fsync_dir":  # the end of a step of a commit: a cut between two steps
            return op == "fsync_dir"
        if kind == "rename":
            return op == "rename"
        if kind == "unlink":
            return op == "unlink"
        if kind == "append":
            return op == "append"
        if kind == "unmark":
            return op == "unlink" and os.sep + "markers" + os.sep in path \
                and not os.path.basename(path).startswith("~")
        raise ValueError(kind)

    def fire(self) -> None:
        from .disk import shutdown

        self.done = True
        self.errors(t=time.monotonic(), cut=True)  # every error logged after this: the cut's
        shutdown(self.mnt)
        os.write(self.status_fd, b"C")

    def __call__(self, op: str, args: tuple[Any, ...]) -> None:
        if self.done or not self.counting:
            return
        if self.armed:  # the op after the Nth one: the Nth has fully happened
            self.fire()
            return
        if not self._matches(op, args):
            return
        self.seen += 1
        if self.seen < self.cut.n:
            return
        if self.cut.kind == "append":  # a torn append: half the line written and synced
            path, line = str(args[0]), bytes(args[1])
            with suppress(OSError):
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line[: max(1, len(line) // 2)])
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self.fire()
            return
        self.armed = True


# ---------------------------------------------------------------------- broken stores


def install_variant(name: str) -> None:
    """Break the store in THIS process only (the teeth of the harness)."""
    if name == "correct":
        return
    if name == "no_fsync":  # every fsync, file and directory, a no-op
        _write._fsync_fd = lambda fd: None  # type: ignore[assignment]
    elif name == "no_file_fsync":  # file fsyncs skipped, directory fsyncs kept

        def dirs_only(fd: int, real: Callable[[int], None] = _write._fsync_fd) -> None:
            import stat

            if stat.S_ISDIR(os.fstat(fd).st_mode):
                real(fd)

        _write._fsync_fd = dirs_only  # type: ignore[assignment]
    elif name == "no_dir_fsync":  # announced (so chosen cuts still count it), never done

        def announced(path: str) -> None:
            _base._rec("fsync_dir", path)

        # both lookups: the store's own calls (_fsio.fsync_dir) and _fsio's inside its writes
        _fsio.fsync_dir = _write.fsync_dir = announced
    elif name == "marker_after_session":  # the session written first, its marker second
        from fsdurable._store import Store
        from tests.torture.explorer import _commit_in_order

        impl = _commit_in_order(("session", "marker", "unmark"))

        def commit_locked(self: Store, new: Any, base: int, **kw: Any) -> Any:
            return impl(self, new, base, **kw)

        Store._commit_locked = commit_locked  # type: ignore[method-assign]
    else:
        raise ValueError(f"unknown variant {name!r}")


# ---------------------------------------------------------------------- the workload


def _loop(store: fsdurable.Store) -> fsdurable.AgentLoop:
    from fsdurable import AgentLoop, Reply, ScriptedModel, Tool, ToolCall

    def lookup(ctx: Any, q: str = "") -> str:
        return "42"

    def send(ctx: Any, to: str = "") -> str:  # idempotent: a provider dedupes by the key
        return "sent"

    model = ScriptedModel([
        Reply("", (ToolCall("c1", "lookup", {"q": "a"}),)),
        Reply("thinking", (ToolCall("c2", "send", {"to": "b"}),)),
    ], final="done")
    return AgentLoop(store, model, [Tool("lookup", lookup), Tool("send", send,
                                                                  effect="idempotent")])


def _commit_ack(ack: AckLog, s: Any, what: str) -> None:
    ack(k="s", op=what, sid=s.id, v=s.version, c=s.commit_id, ip=s.in_progress,
        t=s.turn.id if s.turn is not None else None)


def _restart(root: str, loop: fsdurable.AgentLoop, errors: AckLog) -> None:
    """What a host does at startup: recovery, then ``doctor --repair`` (the real CLI)."""
    fsdurable.recover(loop.store, loop)
    out = subprocess.run([sys.executable, "-m", "fsdurable", "--root", root, "--json", "doctor",
                          "--repair"], capture_output=True, text=True, timeout=120)
    if out.returncode not in (0, 1):
        errors(t=time.monotonic(), error=f"doctor --repair exit {out.returncode}: "
               f"{out.stderr.strip()[-300:]}")


def run(root: str, acks: str, errors_path: str, *, gen: int, seed: int, status_fd: int,
        mnt: str, cut: Cut | None, variant: str) -> None:
    """The child's body: never returns (the driver kills it)."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
    from pydantic_ai import Agent
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.models.test import TestModel

    from fsdurable import openai_agents as oa
    from fsdurable.claude import FileSessionStore
    from fsdurable.langgraph import FsDurableSaver
    from fsdurable.pydantic_ai import FileConversationStore

    rnd = random.Random(seed)
    ack, errors = AckLog(acks), AckLog(errors_path)
    install_variant(variant)
    cutter = None if cut is None else _Cutter(cut, mnt, status_fd, errors)
    _fsio.set_recorder(cutter)
    try:
        store = fsdurable.Store(root, config=_config())
        ack(k="store")  # opened (created, the first time): from here the store must be there
        loop = _loop(store)
        _restart(root, loop, errors)
    except Exception as e:  # after the cut (the disk gone): expected; before it: a violation
        errors(t=time.monotonic(), error=f"restart: {type(e).__name__}: {e}"[:500])
        while True:
            time.sleep(1)  # until the driver kills us
    if cutter is not None:
        cutter.counting = True

    g = f"g{gen}"
    counter = itertools.count()
    live: list[str] = []  # this run's idle sessions
    saver = FsDurableSaver(store)
    threads: dict[str, Any] = {}  # thread id -> config of its latest acknowledged checkpoint
    conversations = FileConversationStore(store)
    bot = Agent(TestModel())
    transcripts = FileSessionStore(store)

    def fresh() -> str:
        sid = f"{g}-s{next(counter)}"
        s = store.create(sid, metadata={"n": 0})
        _commit_ack(ack, s, "create")
        live.append(sid)
        return sid

    def manual_turn() -> None:
        sid = rnd.choice(live) if live else fresh()
        s = store.begin_turn(sid, "hello")
        _commit_ack(ack, s, "begin_turn")
        for i in range(rnd.randrange(3)):
            s = store.checkpoint(s, phase=f"step{i}")
            _commit_ack(ack, s, "checkpoint")
        r = rnd.random()
        if r < 0.6:
            _commit_ack(ack, store.end_turn(s, "bye"), "end_turn")
        elif r < 0.8:
            _commit_ack(ack, store.cancel(sid), "cancel")
        else:  # left in progress: an interrupted turn for the next restart's recovery
            live.remove(sid)

    def patch() -> None:
        sid = rnd.choice(live) if live else fresh()
        s = store.patch(sid, lambda cur: attrs.evolve(
            cur, metadata={**cur.metadata, "n": cur.metadata.get("n", 0) + 1}))
        _commit_ack(ack, s, "patch")

    def save() -> None:
        sid = rnd.choice(live) if live else fresh()
        s = store.load(sid)
        s = store.save(attrs.evolve(s, metadata={**s.metadata, "saved": rnd.random()}))
        _commit_ack(ack, s, "save")

    def delete() -> None:
        if len(live) < 2:
            fresh()
            return
        sid = live.pop(rnd.randrange(len(live)))
        ack(k="deleting", sid=sid)
        store.delete(sid)
        ack(k="deleted", sid=sid)

    def agent_turn() -> None:
        sid = rnd.choice(live) if live else fresh()
        res = loop.run(sid, "go", attended=rnd.random() < 0.5)
        if res.session is not None:
            _commit_ack(ack, res.session, f"loop_{res.status}")

    def lg_put() -> None:
        tid = f"{g}-t{rnd.randrange(2)}"
        parent = threads.get(tid)
        cfg: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
        step = 0
        if parent is not None:
            cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
            step = parent["step"] + 1
        cp = generate_checkpoint(channel_values={"n": step}, channel_versions={"n": step + 1})
        md: Any = {"source": "loop", "step": step, "parents": {}, "run_id": f"{g}-r"}
        out = saver.put(cfg, cp, md, {"n": step + 1})
        ckid = out["configurable"]["checkpoint_id"]
        ack(k="lg_put", thread=tid, ckid=ckid)
        threads[tid] = {**out, "step": step}
        if rnd.random() < 0.6:
            task = f"task{next(counter)}"
            saver.put_writes(out, [("n", step), ("log", f"w{step}")], task)
            ack(k="lg_writes", thread=tid, ckid=ckid, task=task)

    def oa_items() -> None:
        sid = f"{g}-oa"
        item = f"item-{next(counter)}"
        asyncio.run(oa.FileSession(sid, store).add_items([{"role": "user", "content": item}]))
        ack(k="oa", sid=sid, item=item)

    def pa_save() -> None:
        cid = f"{g}-pa"

        async def turn() -> int:
            conv = await conversations.load(cid) or Conversation(conversation_id=cid)
            result = await bot.run(f"p{next(counter)}", conversation=conv)
            await conversations.save(result)
            return len(result.all_messages())

        ack(k="pa", cid=cid, n=asyncio.run(turn()))

    def claude_append() -> None:
        key = {"project_key": "powercut", "session_id": f"{g}-cl"}
        uid = f"u{gen}-{next(counter)}"
        line = {"type": "user", "uuid": uid, "message": {"role": "user", "content": uid}}
        asyncio.run(transcripts.append(key, [line]))
        ack(k="claude", key=key, uuid=uid)

    ops: list[tuple[Callable[[], None], float]] = [
        (fresh, 1), (manual_turn, 4), (patch, 2), (save, 1), (delete, 1), (agent_turn, 3),
        (lg_put, 3), (oa_items, 1), (pa_save, 1), (claude_append, 1)]
    fns, weights = [f for f, _ in ops], [w for _, w in ops]
    while True:
        fn = rnd.choices(fns, weights)[0]
        try:
            fn()
        except fsdurable.FsDurableError:
            pass  # a conflict, a turn in progress, or the disk gone (StorageError): not acked
        except Exception as e:  # the driver decides: an error before the cut is a violation
            errors(t=time.monotonic(), error=f"{fn.__name__}: {type(e).__name__}: {e}"[:500])
