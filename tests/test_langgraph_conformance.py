"""The LangGraph conformance suite (langgraph-checkpoint-conformance), run by the test suite:
FsDurableSaver through its async methods, and through a shim routing the async methods to the
sync ones (the suite only calls ``a*``); InMemorySaver in the same run for comparison."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.checkpoint.memory import InMemorySaver

from fsdurable.langgraph import FsDurableSaver

BASE = 58
OPTIONAL = 23


class SyncRouted(FsDurableSaver):
    """The conformance suite calls only the async methods: this routes them to the sync ones."""

    async def aget_tuple(self, config: Any) -> Any:
        return self.get_tuple(config)

    async def alist(self, config: Any, *, filter: Any = None, before: Any = None,
                    limit: Any = None) -> AsyncIterator[Any]:
        for t in self.list(config, filter=filter, before=before, limit=limit):
            yield t

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: Any, writes: Any, task_id: str,
                          task_path: str = "") -> None:
        self.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.prune(thread_ids, strategy=strategy)


def _counts(report: CapabilityReport) -> tuple[int, int, list[str]]:
    base = ("put", "put_writes", "get_tuple", "list", "delete_thread")
    passed_base = sum(report.results[c].tests_passed for c in base)
    passed_opt = sum(r.tests_passed for k, r in report.results.items() if k not in base)
    failures = [f for r in report.results.values() for f in r.failures]
    return passed_base, passed_opt, failures


def _run(name: str, factory: Any) -> CapabilityReport:
    return asyncio.run(validate(checkpointer_test(name=name)(factory)))


@pytest.mark.parametrize("cls", [FsDurableSaver, SyncRouted], ids=["async", "sync"])
def test_conformance_all_base_and_optional(tmp_path: Path, cls: type[FsDurableSaver]) -> None:
    n = itertools.count()

    async def factory() -> AsyncIterator[FsDurableSaver]:
        yield cls(tmp_path / f"store{next(n)}")

    report = _run(f"fsdurable-{cls.__name__}", factory)
    base, optional, failures = _counts(report)
    assert failures == []
    assert report.passed_all_base() and report.passed_all()
    assert (base, optional) == (BASE, OPTIONAL)

    async def memory() -> AsyncIterator[InMemorySaver]:
        yield InMemorySaver()

    ref = _run("InMemorySaver", memory)
    assert ref.passed_all_base() and _counts(ref)[0] == BASE
