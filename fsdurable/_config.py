"""Every default in one frozen object. Each comment names the failure the value prevents."""

from __future__ import annotations

import attrs

HOUR = 3600.0


@attrs.frozen(kw_only=True)
class Config:
    """Tunables for a store, a loop and recovery. Change them with ``attrs.evolve``."""

    # Default on: a host that crashed mid-turn gets the turn back without a human noticing.
    # Off means "find them but don't run them" (an operator during an incident): markers stay.
    recovery_enabled: bool = True

    # Default 4 h covers crash/upgrade restarts within a work session; anything older executes a
    # stale user intent with nobody present (a months-old interrupted destructive turn must never
    # fire on upgrade). When it binds, the turn is abandoned with an interrupted_turn_abandoned
    # event (reason "stale") instead of resumed.
    stale_after: float = attrs.field(default=4 * HOUR)

    # Default 5 min: a checkpoint time further in the future than this (a clock that was ahead
    # when it was written, an RTC reset) would otherwise keep the turn "fresh" for the whole skew
    # plus the window — a months-stale turn resumed. Such a turn is treated as stale.
    max_clock_skew: float = 300.0

    # Default 3: a turn whose model call kills the process every time would otherwise be resumed
    # at every start — a boot loop. The count is committed BEFORE the model call, so a crash inside
    # the call still counts.
    max_resume_attempts: int = attrs.field(default=3)

    # Default 2 s: a burst of fast phase boundaries (tiny tool calls) would otherwise become a
    # burst of fsyncs on the hot path. A pending checkpoint is always flushed before an effectful
    # tool, before a resumed model call, at turn end and on cancel, so the debounce never skips one.
    checkpoint_debounce: float = 2.0

    # Default 5 min: while a turn checkpoints, its marker is rewritten only when the marker's own
    # checkpoint time is older than this. Rewriting it on every checkpoint would double the fsyncs
    # of the hot path; never rewriting it would make a long turn look stale to the gate.
    # The staleness gate can therefore fire at most this much early, never late.
    marker_refresh: float = 300.0

    # Default 64 MiB: a runaway or hostile file (a sync tool's garbage, a 100 MB blob) would
    # otherwise be read whole into memory at startup. Larger files are quarantined unread.
    max_file_bytes: int = 64 * 1024 * 1024

    # Default 30 s: a route lock held by a hung live turn would otherwise block recovery (or a new
    # turn) forever; past this a LockTimeout is raised and the marker stays for the next start.
    route_lock_timeout: float = 30.0

    # Default 10 s: the short per-session commit lock is held for one commit only; waiting longer
    # means something is wedged, and a LockTimeout beats a silent hang.
    commit_lock_timeout: float = 10.0

    # Default on: without fsync a power cut can lose an acknowledged commit or leave a torn file.
    # Turn it off only for throwaway stores in tests; the durability contract no longer holds then.
    fsync: bool = True

    # Default 0.2 s: `watch` waits this long for a burst of file events to settle, so one commit
    # (temp write, rename, directory fsync) is reported once, not as three half-states; longer
    # would make a live view lag.
    watch_debounce: float = 0.2

    # Default 1 s: with `watch --poll` (network filesystems, where inotify never hears of a remote
    # change) the directories are re-listed this often; a shorter interval costs a stat of every
    # session per tick, a longer one reports changes late.
    watch_poll_interval: float = 1.0

    # Tools refused in an unattended run (every recovered turn is unattended): a destructive call
    # resumed with nobody present cannot be undone. Hosts extend this with their own names.
    unattended_deny: frozenset[str] = frozenset(
        {"delete_files", "rm", "shell", "run_shell", "git_push", "force_push", "drop_table",
         "transfer_funds", "format_disk"}
    )

    @stale_after.validator
    def _positive_window(self, attribute: attrs.Attribute[float], value: float) -> None:
        if value <= 0:
            raise ValueError(f"{attribute.name} must be > 0, got {value!r}")

    @max_resume_attempts.validator
    def _positive_cap(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value < 1:
            raise ValueError(f"{attribute.name} must be >= 1, got {value!r}")


DEFAULT_CONFIG = Config()
