"""Every default in one frozen object. Each comment names the failure the value prevents.

``Config`` is on the startup path (a store is opened with one), which imports only the standard
library: it is a plain frozen record (``_records.defaults``), not an attrs class. Change a value
with ``config.replace(name=value)`` (or ``copy.replace`` on Python 3.13+).
"""

from __future__ import annotations

from ._records import Record, defaults

HOUR = 3600.0
DAY = 24 * HOUR


@defaults
class Config(Record):
    """Tunables for a store, a loop and recovery. Change them with ``config.replace(...)``."""

    # Default on: a host that crashed mid-turn gets the turn back without a human noticing.
    # Off means "find them but don't run them" (an operator during an incident): markers stay.
    recovery_enabled: bool = True

    # Default 4 h covers crash/upgrade restarts within a work session; anything older executes a
    # stale user intent with nobody present (a months-old interrupted destructive turn must never
    # fire on upgrade). When it binds, the turn is abandoned with an interrupted_turn_abandoned
    # event (reason "stale") instead of resumed.
    stale_after: float = 4 * HOUR

    # Default 5 min: a checkpoint time further in the future than this (a clock that was ahead
    # when it was written, an RTC reset) would otherwise keep the turn "fresh" for the whole skew
    # plus the window — a months-stale turn resumed. Such a turn is treated as stale.
    max_clock_skew: float = 300.0

    # Default 3: a turn whose model call kills the process every time would otherwise be resumed
    # at every start — a boot loop. The count is committed BEFORE the model call, so a crash inside
    # the call still counts.
    max_resume_attempts: int = 3

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

    # Default 90 days: the event log is append-only, so without a bound it grows with every turn
    # for ever (a busy host writes megabytes a day) until a full disk refuses commits, and every
    # read of the whole log gets slower. Shorter would lose the trail of why a turn was abandoned,
    # refused or quarantined before anyone looked. `doctor --repair` (or `store.prune_events()`)
    # removes this node's day files older than this, with an events_pruned event; another node's
    # log is that node's to prune.
    event_retention: float = 90 * DAY

    # Default 30 s: a routine line of the event log (turn_started, and turn_completed of a
    # turn that completed: each restates a commit already durable in its session) is appended
    # without an fsync of its own; the next decision's event fsyncs it, and so does the next
    # routine line once the oldest one waiting is this old (no timer: an idle process leaves
    # its last lines to the kernel's writeback, on Linux dirty pages older than 30 s). A power
    # cut may take those routine lines, never a turn or a decision. Shorter fsyncs the log once
    # a turn again: its page written to storage each turn (an SD card's wear, a chat's time;
    # docs/events.md). 0 fsyncs every line.
    event_note_fsync_after: float = 30.0

    # Default 1 h: an unreferenced history segment (docs/storage.md) younger than this is never
    # removed by `doctor --repair`: a commit of this node may have written it and be about to
    # rename the document that names it (a removal then would leave that document short).
    # Longer only keeps a crash's leftovers on disk a little longer.
    segment_grace: float = HOUR

    # Default None (kept for ever): the messages a compaction summary replaced stay readable as
    # its archive (`Store.archive`) until a retention rule removes them, and nothing a user wrote
    # is removed unless they asked. Set (seconds), `doctor --repair` releases the oldest
    # archived segments written longer ago than this (the document records where its history
    # is kept from, with an archive_pruned event), and this node's released segments then go
    # as unreferenced ones, each with a segment_removed event: without it a long-lived,
    # often-compacted session keeps every word of its past on disk (and in every synced copy)
    # for ever.
    archive_retention: float | None = None

    # Default 4 KiB (about a page): a chain's newest values (the messages, each lane) are kept
    # inline in the session document up to this many bytes of JSON (docs/storage.md, "The inline
    # tail"), then written as one segment. Without it every commit that adds a message writes a
    # new file (four fsyncs where the document alone costs two, one file per message for a sync
    # tool to list); without a bound the document would grow with the history and every commit
    # would cost the history again. Larger means fewer segments and fsyncs but more bytes
    # rewritten per commit (16 KiB: a chat of 2 KB messages writes 1.4x the bytes; storage.md
    # has the figures). 0: every value goes to a segment (format 5's cost).
    inline_tail_bytes: int = 4 * 1024

    # Default 256: the same bound in values, so a document of many tiny values never makes a
    # `load` (which parses the inline tail's JSON with the document) cost more than that many.
    inline_tail_values: int = 256

    # Default 64 KiB: an adapter's item log (docs/storage.md, "Item logs") is rewritten, its
    # live items copied into a new log, once the bytes its pops and clears left behind pass this
    # and the live items' bytes. Without it a session that pops and adds (the Agents SDK's
    # correction loop) grows its log without bound, on disk and in what a fresh reader scans;
    # with a smaller one a rewrite (the live items written whole) comes more often.
    item_log_slack: int = 64 * 1024

    # Tools refused in an unattended run (every recovered turn is unattended): a destructive call
    # resumed with nobody present cannot be undone. Hosts extend this with their own names.
    unattended_deny: frozenset[str] = frozenset(
        {"delete_files", "rm", "shell", "run_shell", "git_push", "force_push", "drop_table",
         "transfer_funds", "format_disk"}
    )

    def _check(self) -> None:
        if self.stale_after <= 0:
            raise ValueError(f"stale_after must be > 0, got {self.stale_after!r}")
        if self.archive_retention is not None and self.archive_retention <= 0:
            raise ValueError(f"archive_retention must be > 0 or None, got "
                             f"{self.archive_retention!r}")
        if self.event_retention <= 0:
            raise ValueError(f"event_retention must be > 0, got {self.event_retention!r}")
        if not self.event_note_fsync_after >= 0:  # NaN too
            raise ValueError(f"event_note_fsync_after must be >= 0, got "
                             f"{self.event_note_fsync_after!r}")
        if self.inline_tail_bytes < 0 or self.inline_tail_values < 0:
            raise ValueError("inline_tail_bytes and inline_tail_values must be >= 0, got "
                             f"{self.inline_tail_bytes!r}, {self.inline_tail_values!r}")
        if self.item_log_slack < 0:
            raise ValueError(f"item_log_slack must be >= 0, got {self.item_log_slack!r}")
        if self.max_resume_attempts < 1:
            raise ValueError(f"max_resume_attempts must be >= 1, got {self.max_resume_attempts!r}")


DEFAULT_CONFIG = Config()

__all__ = ["DAY", "DEFAULT_CONFIG", "HOUR", "Config"]
