"""The recovery gates: ``RecoveryPolicy`` and the ``verdict`` on one marker (stdlib only).

Listing interrupted turns and deciding what recovery would do with each is the startup path, so
this module imports no attrs and never the agent loop: ``fsdurable interrupted`` and
``recover --dry-run`` judge a marker without loading what runs a turn (``_recovery`` does that).

Gates, in order: ``disabled`` (recovery off), ``foreign`` (another node's turn), ``stale`` (older
than the window), ``exhausted`` (attempts at the cap), else ``resume``.

Times from the future. A marker's or a session's checkpoint time was written by a wall clock that
may have been wrong then (ahead, then corrected by NTP; an RTC reset). A time further in the future
than ``max_clock_skew`` proves nothing about a turn's age, so it is never used to judge staleness:
the gate uses the newest of the turn's known times that is not from the future (``trusted_time``).
Only if every known time is from the future is the turn judged stale (it cannot be shown fresh,
and a recovered turn runs unattended). Either way the step is reported (``clock_step`` event).
"""

from __future__ import annotations

from ._config import DEFAULT_CONFIG, Config
from ._records import Marker, Record, defaults

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Callable



def driven_by(driver: str) -> Callable[[Marker], bool]:
    """The markers whose turn that driver owns (``Marker.owner_driver``, recorded by the turn
    protocol — never inferred from ``source``): each driver's recover() claims those alone, so
    an agent loop never resumes a LangGraph thread as one of its own turns, nor the reverse."""
    return lambda m: m.owner_driver == driver


VERDICTS = ("resume", "stale", "exhausted", "foreign", "disabled")
# the verdicts recovery never claims a turn for, and the outcome each one reports
NOT_CLAIMED = {"disabled": "kept", "foreign": "listed"}


@defaults
class RecoveryPolicy(Record):
    """The gates. Defaults are Config's (whose comments name the failure each one prevents);
    ``RecoveryPolicy.from_config(config)`` takes a store's; ``policy.replace(...)`` changes one."""

    enabled: bool = DEFAULT_CONFIG.recovery_enabled
    stale_after: float = DEFAULT_CONFIG.stale_after
    max_attempts: int = DEFAULT_CONFIG.max_resume_attempts
    lock_timeout: float = DEFAULT_CONFIG.route_lock_timeout
    max_clock_skew: float = DEFAULT_CONFIG.max_clock_skew

    @classmethod
    def from_config(cls, config: Config) -> RecoveryPolicy:
        return cls(enabled=config.recovery_enabled, stale_after=config.stale_after,
                   max_attempts=config.max_resume_attempts,
                   lock_timeout=config.route_lock_timeout,
                   max_clock_skew=config.max_clock_skew)


def from_future(t: float, *, now: float, policy: RecoveryPolicy) -> bool:
    """Was ``t`` written by a clock that was ahead (further ahead than ``max_clock_skew``)?"""
    return t - now > policy.max_clock_skew


def trusted_time(*times: float, now: float, policy: RecoveryPolicy) -> float | None:
    """The newest of a turn's checkpoint ``times`` that is not from the future, or None."""
    ok = [t for t in times if not from_future(t, now=now, policy=policy)]
    return max(ok) if ok else None


class Judged:
    """What recovery gates a claimed turn on: ``marker`` (the marker with the session's exact
    attempt count and the checkpoint time to trust), ``ahead`` (how far the newest known time is
    ahead of now; over ``max_clock_skew`` it is a clock step to report) and ``trusted`` (the newest
    time not from the future, None if there is none: then the turn cannot be shown fresh)."""

    __slots__ = ("ahead", "marker", "trusted")

    def __init__(self, marker: Marker, ahead: float, trusted: float | None) -> None:
        self.marker, self.ahead, self.trusted = marker, ahead, trusted


def judged(fresh: Marker, session_checkpoint_at: float, resume_attempts: int, *, now: float,
           policy: RecoveryPolicy) -> Judged:
    """Combine the marker with its session: the checkpoint time is the newest of the two that is
    not from the future (the marker's may lag by ``Config.marker_refresh``, or carry a clock's
    error), else the newest of them (the turn is then stale)."""
    times = (fresh.checkpoint_at, session_checkpoint_at)
    trusted = trusted_time(*times, now=now, policy=policy)
    newest = max(times)
    m = fresh.replace(checkpoint_at=newest if trusted is None else trusted,
                      resume_attempts=resume_attempts)
    return Judged(m, newest - now, trusted)


def verdict(m: Marker, *, node_id: str, now: float, policy: RecoveryPolicy,
            adopt: bool = False) -> str:
    """The gates, in order, from the marker alone (no session read). A checkpoint time from the
    future cannot show the turn fresh: ``stale`` here; recovery re-judges it with the session's
    own times before acting (``trusted_time``)."""
    if not policy.enabled and not adopt:
        return "disabled"
    if m.node_id != node_id and not adopt:
        return "foreign"
    age = now - m.checkpoint_at
    if age > policy.stale_after or from_future(m.checkpoint_at, now=now, policy=policy):
        return "stale"
    if m.resume_attempts >= policy.max_attempts:
        return "exhausted"
    return "resume"


def plan(m: Marker, v: str, turn: tuple[str, float, int] | None, *, node_id: str, now: float,
         policy: RecoveryPolicy, resume: bool) -> tuple[str, str, str | None, Marker]:
    """What recovery does with a marker of verdict ``v`` that passed the ``disabled`` and
    ``foreign`` gates, once its session has been read: ``turn`` is the id, checkpoint time and
    resume attempts of the session's turn in progress (None: no session, or none in progress).
    Returns (verdict, the dry run's outcome, its reason, the marker judged with the session's
    exact figures). ``would_resume`` still waits on the in-doubt calls, which only the full
    session shows."""
    if turn is None:
        return v, "would_repair", "orphan", m
    turn_id, checkpoint_at, attempts = turn
    if turn_id != m.turn_id:
        return v, "would_supersede", "superseded", m
    exact = judged(m, checkpoint_at, attempts, now=now, policy=policy).marker
    v = verdict(exact, node_id=node_id, now=now, policy=policy)
    if v in ("stale", "exhausted"):
        return v, "would_abandon", v, exact
    if not resume:
        return v, "would_leave", "no_loop", exact
    return v, "would_resume", None, exact


__all__ = ["NOT_CLAIMED", "VERDICTS", "Judged", "RecoveryPolicy", "driven_by", "from_future",
           "judged", "plan", "trusted_time", "verdict"]
