"""``python -m bench --quick`` runs to the end and writes valid result files.

A smoke test of the benchmark code (it must not rot): it asserts the structure of the JSON, never
a timing — the numbers of a CI machine mean nothing. Results and data sets go to a temp dir, so
the committed bench/results/ are never touched.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import PYTHON, REPO, subprocess_env

PARTS = ("startup", "discovery", "commit", "growth", "memory", "looplag", "adapters",
         "events", "langgraph", "pydantic_ai")


def stats_ok(r: dict[str, Any]) -> bool:
    return {"median", "p90", "p99", "min", "n"} <= set(r) and r["n"] >= 1


@pytest.mark.timeout(660)  # ten parts, each in its own processes: minutes on a loaded machine
def test_quick_bench_completes_and_writes_valid_json(tmp_path: Path) -> None:
    out = tmp_path / "results"
    env = subprocess_env(FSDURABLE_BENCH_CACHE=str(tmp_path / "cache"))
    env.pop("FSDURABLE_STATE_DIR", None)  # each bench part sets up its own
    p = subprocess.run([PYTHON, "-m", "bench", "--quick", "--out", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert sorted(os.listdir(out)) == sorted(f"{n}.json" for n in PARTS)
    # bench/README.md renders from them (every part's section and note; plots if matplotlib is)
    readme = tmp_path / "README.md"
    r = subprocess.run([PYTHON, "-m", "bench.report", "--results", str(out), "--readme",
                        str(readme)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "## LangGraph checkpointer" in readme.read_text()
    docs = {n: json.loads((out / f"{n}.json").read_text()) for n in PARTS}
    for name, doc in docs.items():
        assert doc["schema"] == "fsdurable.bench/1" and doc["bench"] == name and doc["quick"]
        env_ = doc["environment"]
        assert env_["python"] and env_["os"] and env_["filesystem"]
        assert stats_ok(env_["fsync_latency"])
        for t in doc.get("targets", {}).values():
            assert isinstance(t["met"], bool) and "target" in t
    disc = docs["discovery"]
    assert disc["rows"] and all(stats_ok(r["results"][k]) for r in disc["rows"]
                                for k in ("fsdurable", "floor", "sqlite", "full_scan"))
    assert docs["startup"]["imports"]["ok"], docs["startup"]["imports"]
    assert all(stats_ok(v) for v in docs["startup"]["cold_start"]["results"].values())
    assert {r["size"] for r in docs["commit"]["rows"]} >= {1024, 65536}
    assert docs["growth"]["checkpoint_growth"] and docs["growth"]["throughput"]
    assert docs["memory"]["rows"][0]["fsdurable"]["found"] == 10
    assert set(docs["memory"]["load"]["peak_rss_kb"]) == {"fsdurable", "json_loads", "interpreter"}
    lag = docs["looplag"]["results"]
    assert all(stats_ok(lag[m]["lag"]) for m in ("async", "sync"))
    ad = docs["adapters"]
    assert stats_ok(ad["results"]["interpreter"]) and stats_ok(ad["results"]["openai_agents"])
    lg = docs["langgraph"]
    assert all(stats_ok(v) for part in ("put", "get_tuple") for v in lg["put_get"][part].values())
    assert lg["chat"]["results"]["fsdurable"]["bytes_on_disk"] > 0
    assert stats_ok(lg["discovery"]["results"]["fsdurable"])
    pai = docs["pydantic_ai"]
    assert set(pai["steps"]["per_step_ms"]) == {"plain", "fsdurable", "fsdurable_every",
                                                "fsdurable_ledger", "dbos"}
    assert all(stats_ok(v) for v in pai["steps"]["results"].values())
    assert set(pai["startup"]) == {"fsdurable", "fsdurable_ledger", "dbos"}
    assert all(stats_ok(v) for v in pai["startup"].values())
    assert pai["startup"]["fsdurable_ledger"]["tool_reruns"] == 0  # answered from the ledger
    assert stats_ok(ad["results"]["pydantic_ai_durable"])
    assert stats_ok(ad["results"]["pydantic_ai_dbos"])
    assert all(stats_ok(ad["results"][k]) for k in ("adk", "adk_memory", "adk_database"))
    # the quick run never rewrites the committed README or results
    assert not (out / "README.md").exists()
