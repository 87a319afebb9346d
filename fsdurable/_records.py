"""The small records of the startup path: ``Marker``, ``Event``, ``Manifest``, as plain classes.

Opening a store and listing its interrupted turns builds one ``Marker`` per marker file, and that
path imports only the standard library (tests/test_startup_imports.py): attrs costs 20-50 ms at
interpreter start, more than the whole listing. So these records are hand-written slotted classes
with what the attrs classes gave: keyword construction, validation, immutability, equality by
value, a hash, a repr, pickling, and ``replace(**changes)`` (the ``attrs.evolve`` of these
classes). Sessions, turns and the rest of the public model stay attrs classes (``_model``).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, TypeVar

    from typing_extensions import dataclass_transform

    from ._model import Session

    R = TypeVar("R", bound="Record")
    T = TypeVar("T", bound=type)
else:  # the decorator only informs type checkers

    def dataclass_transform(**_: object) -> Callable[[T], T]:
        return lambda f: f


class Record:
    """Base of a frozen, slotted record; ``_fields`` names its fields in order."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def _init(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: use .replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, n) for n in self._fields)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((self.__class__.__name__, *self._values()))

    def __repr__(self) -> str:
        body = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__name__}({body})"

    def __getstate__(self) -> tuple[Any, ...]:
        return self._values()

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self._init(**dict(zip(self._fields, state, strict=True)))

    def replace(self: R, **changes: Any) -> R:
        """A copy with ``changes`` applied (validated like a new instance)."""
        values = {n: getattr(self, n) for n in self._fields}
        unknown = changes.keys() - values.keys()
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        values.update(changes)
        return type(self)(**values)

    __replace__ = replace  # copy.replace (Python 3.13+)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict (a dict-valued field is copied)."""
        return {n: dict(v) if isinstance(v, dict) else v
                for n in self._fields for v in (getattr(self, n),)}


INF = float("inf")  # -INF < x < INF: math.isfinite(x) for a float, without loading math


def finite(name: str, value: float) -> float:
    """``value`` if it is a finite number (NaN and infinities cannot round-trip through JSON)."""
    if value.__class__ is not float or not -INF < value < INF:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
        import math  # an int or a float subclass (an int past a float's range: OverflowError)

        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


@dataclass_transform(kw_only_default=True, frozen_default=True)
def defaults(cls: T) -> T:
    """Make a ``Record`` subclass whose fields are its annotated class attributes, each with its
    default (``name: type = value``, the form of an attrs class body): keyword-only construction,
    unknown names refused, then ``cls._check()`` validates. Type checkers see the typed
    ``__init__`` through ``dataclass_transform``."""
    # not inspect.get_annotations: importing inspect costs more than the whole startup path
    annotations = cls.__dict__.get("__annotations__", {})  # noqa: RUF063
    names = tuple(n for n, t in annotations.items()
                  if not str(t).startswith(("ClassVar", "typing.ClassVar")))
    for n in names:
        if n not in cls.__dict__:
            raise TypeError(f"{cls.__name__}.{n} needs a default")

    def __init__(self: Record, **values: Any) -> None:
        unknown = values.keys() - set(names)
        if unknown:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument "
                            f"{sorted(unknown)[0]!r}")
        self._init(**{n: values.get(n, getattr(cls, n)) for n in names})
        check = getattr(self, "_check", None)
        if check is not None:
            check()

    cls._fields = names  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return cls


# The drivers of a turn: the reference AgentLoop ("loop") and the framework adapters. The session
# records which one owns its turn (Turn.driver, copied into the marker); recovery hands a turn to
# that driver's recover() alone. ``source`` is provenance only and never decides it.
DRIVERS = ("loop", "langgraph", "openai-agents", "pydantic-ai", "claude", "adk")
# Only for turns written before the driver was recorded (driver ""): each adapter then marked its
# sessions with its own source, so the source is the one trace of the owner such a file has.
_LEGACY_DRIVER = {"langgraph": "langgraph", "openai-agents": "openai-agents",
                  "pydantic-ai": "pydantic-ai", "claude": "claude"}


def driver_of(driver: str, source: str) -> str:
    """The driver that owns a turn: the recorded one, else (a turn begun before drivers were
    recorded) the adapter its source names, else the reference loop."""
    return driver or _LEGACY_DRIVER.get(source, "loop")


class Marker(Record):
    """Index record of one interrupted turn (``markers/<session_id>.json``): enough to gate the
    turn (age, attempts, owner node, route) without reading its session. ``route_key`` is the
    TURN's route (``Turn.route_key``), the lock a resume must take."""

    _fields = ("session_id", "turn_id", "session_version", "node_id", "route_key", "source",
               "started_at", "checkpoint_at", "resume_attempts", "driver")
    __slots__ = _fields
    session_id: str
    turn_id: str
    session_version: int
    node_id: str
    route_key: str
    source: str
    started_at: float
    checkpoint_at: float
    resume_attempts: int
    driver: str

    def __init__(self, session_id: str, turn_id: str, session_version: int, node_id: str,
                 route_key: str, source: str, started_at: float, checkpoint_at: float,
                 resume_attempts: int = 0, driver: str = "") -> None:
        self._init(session_id=session_id, turn_id=turn_id, session_version=session_version,
                   node_id=node_id, route_key=route_key, source=source,
                   started_at=finite("started_at", started_at),
                   checkpoint_at=finite("checkpoint_at", checkpoint_at),
                   resume_attempts=resume_attempts, driver=driver)

    @property
    def owner_driver(self) -> str:
        """The driver that owns the turn (``driver_of``): recovery hands the turn to it alone."""
        return driver_of(self.driver, self.source)

    @classmethod
    def of(cls, session: Session, node_id: str) -> Marker:
        turn = session.turn
        if turn is None:
            raise ValueError("only a session in progress has a marker")
        return cls(session_id=session.id, turn_id=turn.id, session_version=session.version,
                   node_id=node_id, route_key=turn.route_key or session.route_key,
                   source=session.source,
                   started_at=turn.started_at, checkpoint_at=turn.checkpoint_at,
                   resume_attempts=turn.resume_attempts, driver=turn.driver)


_MARKER_SET = tuple(Marker.__dict__[n].__set__ for n in Marker._fields)  # its slots' setters


def checked_marker(session_id: str, turn_id: str, session_version: int, node_id: str,
                   route_key: str, source: str, started_at: float, checkpoint_at: float,
                   resume_attempts: int, driver: str) -> Marker:
    """A ``Marker`` of values the caller has checked as ``Marker()`` would (exact types, finite
    times), built without its keyword call and checks: the marker codec's fast path, which
    startup runs once per marker file (a third of the cost of ``Marker(...)``)."""
    m = object.__new__(Marker)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9 = _MARKER_SET
    s0(m, session_id)
    s1(m, turn_id)
    s2(m, session_version)
    s3(m, node_id)
    s4(m, route_key)
    s5(m, source)
    s6(m, started_at)
    s7(m, checkpoint_at)
    s8(m, resume_attempts)
    s9(m, driver)
    return m


class Event(Record):
    """One line of the event log."""

    _fields = ("at", "code", "session_id", "turn_id", "node_id", "reason", "detail")
    __slots__ = _fields
    at: float
    code: str
    session_id: str | None
    turn_id: str | None
    node_id: str | None
    reason: str | None
    detail: dict[str, Any]

    def __init__(self, at: float, code: str, session_id: str | None = None,
                 turn_id: str | None = None, node_id: str | None = None,
                 reason: str | None = None, detail: dict[str, Any] | None = None) -> None:
        self._init(at=at, code=code, session_id=session_id, turn_id=turn_id, node_id=node_id,
                   reason=reason, detail={} if detail is None else detail)


class Manifest(Record):
    """``fsdurable.json`` at the store root."""

    _fields = ("store_id", "created_at", "format")
    __slots__ = _fields
    store_id: str
    created_at: float
    format: str

    def __init__(self, store_id: str, created_at: float, format: str = "fsdurable/1") -> None:
        self._init(store_id=store_id, created_at=created_at, format=format)


__all__ = ["DRIVERS", "INF", "Event", "Manifest", "Marker", "Record", "checked_marker", "defaults",
           "driver_of", "finite"]
