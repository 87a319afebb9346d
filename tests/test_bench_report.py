"""``bench.report``'s prose from result documents (no run): a missed target is never passed over,
and what its part measured beside it is named with it."""

from __future__ import annotations

from typing import Any

from bench import report


def _langgraph(flat: float, peers: dict[str, float]) -> dict[str, Any]:
    """The langgraph part's targets as ``bench.langgraph`` writes them: beside the chat's
    flatness, each peer's own chat (``chat_<peer>``)."""
    return {"targets": {"chat_last_vs_first_turns": {
        "value": flat, "target": "<= 1.5 (flat)", "met": flat <= 1.5,
        **{f"chat_{k}": v for k, v in peers.items()}}}}


def test_a_missed_chat_flatness_names_the_peers_growth_in_the_same_run() -> None:
    text = report.notes({"langgraph": _langgraph(1.54, {"sqlite_full": 1.78,
                                                        "async_sqlite_full": 1.86})})
    line = next(x for x in text.splitlines() if "**chat_last_vs_first_turns**" in x)
    assert "1.54x" in line
    assert "SqliteSaver's own chat (FULL) 1.78x" in line
    assert "AsyncSqliteSaver's (FULL) 1.86x" in line


def test_a_met_target_is_not_a_note() -> None:
    assert report.notes({"langgraph": _langgraph(1.2, {"sqlite_full": 1.78})}) == \
        "Every target was met in this run."


def test_each_missed_target_of_a_part_gets_its_own_reason() -> None:
    """A missed put is explained by its floor, not by the chat's paragraph."""
    part = _langgraph(1.2, {"sqlite_full": 1.78})
    part["targets"]["put_vs_sqlite_full"] = {"value": 1.51, "target": "<= 1.5", "met": False,
                                             "floor_append_vs_sqlite_full": 1.1}
    text = report.notes({"langgraph": part})
    line = next(x for x in text.splitlines() if "**put_vs_sqlite_full**" in x)
    assert "1.51x" in line and "1.10x" in line
    assert "fdatasync" in line
    assert "100-turn chat" not in line


def test_a_missed_cli_target_names_the_floor_as_an_installed_command() -> None:
    """The CLI rows' miss is read against ``floor_cli`` (the installed console script's wrapper
    around the floor's listing), measured in the same rounds, not against an argued cost of the
    wrapper."""
    over = {"python_alone": 0.0, "floor": 12.7, "fsdurable": 17.5, "cli": 20.6,
            "floor_cli": 13.1, "cli_recover_dry_run": 21.3}
    startup = {
        "targets": {
            "cold_start_vs_floor": {"value": 1.21, "target": "<= 1.3", "met": True},
            "cli_interrupted_vs_floor": {"value": 1.31, "target": "<= 1.3", "met": False},
            "cli_recover_dry_run_vs_floor": {"value": 1.29, "target": "<= 1.3", "met": True}},
        "cold_start": {"over_interpreter_ms": over,
                       "ratios": {"floor_cli_vs_floor": 1.02, "cli_vs_floor": 1.31},
                       "ratios_vs_floor_cli": {"cli_vs_floor_cli": 1.27,
                                               "cli_recover_dry_run_vs_floor_cli": 1.26}}}
    text = report.notes({"startup": startup})
    line = next(x for x in text.splitlines() if "`fsdurable interrupted --json`" in x)
    assert "1.31x the floor script" in line
    assert "adds 13.1 ms, 1.02x the floor script" in line and "the CLI is 1.27x" in line
    assert "recover --dry-run" not in text  # met: no note
