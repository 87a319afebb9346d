"""Tools, the model protocol and a deterministic scripted model.

A ``Tool`` declares its *effect* — what a repeat of the call would do in the world:

- ``none``: no effect outside the session (a lookup, a computation); re-running it is harmless.
- ``idempotent``: an effect, but the tool takes an idempotency key and a repeat with the same key
  is a no-op at the provider (an email API with dedup keys, a PUT of the same content).
- ``external``: an effect without a key (charging a card through an API without dedup). A repeat
  may do it twice, so a call whose outcome is unknown is never re-run blindly.

and whether it ``needs_approval`` (a human must say yes; in an unattended run nobody can).

A model is any callable ``model(transcript, tool_specs) -> Reply`` (or an awaitable of one):
``AgentLoop.arun`` awaits an async model on the caller's event loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from ._errors import HostError
from ._model import EFFECTS, Message, ToolCall


def _effect(inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in EFFECTS:
        raise ValueError(f"effect must be one of {EFFECTS}, got {value!r}")


@attrs.frozen
class ToolContext:
    """What a running tool may know about the moment it runs in.

    ``attended`` is decided by the loop at execution time: True only for a live turn whose
    caller said a human is present; ALWAYS False for a recovered turn, whatever the session's
    stored ``source`` says. ``idempotency_key`` is ``<session>:<turn>:<tool_call_id>``: a re-run
    of an in-doubt call gets the same key, so an ``idempotent`` provider drops the repeat.
    """

    session_id: str
    turn_id: str
    tool_call_id: str
    idempotency_key: str
    attended: bool
    resumed: bool
    _is_cancelled: Callable[[], bool] = attrs.field(alias="is_cancelled", repr=False)

    def cancelled(self) -> bool:
        """True once the turn was cancelled; a long tool should check it and return early."""
        return self._is_cancelled()


ToolFn = Callable[..., Any]


@attrs.frozen
class Tool:
    """A tool the model may call: ``fn(ctx, **arguments) -> result`` (the result is str()-ed).
    ``fn`` may be ``async def``: ``arun`` awaits it on the caller's loop (``run`` runs it on a
    fresh loop); a sync ``fn`` under ``arun`` runs in a worker thread."""

    name: str
    fn: ToolFn = attrs.field(repr=False)
    effect: str = attrs.field(default="none", validator=_effect)
    needs_approval: bool = False
    description: str = ""
    parameters: Mapping[str, Any] = attrs.field(factory=dict)

    def spec(self) -> dict[str, Any]:
        """What the model is shown about this tool."""
        return {"name": self.name, "description": self.description, "effect": self.effect,
                "needs_approval": self.needs_approval, "parameters": dict(self.parameters)}


def tool(name: str | None = None, *, effect: str = "none", needs_approval: bool = False,
         description: str = "") -> Callable[[ToolFn], Tool]:
    """Decorator: ``@tool(effect="idempotent") def send(ctx, to, body): ...``."""

    def wrap(fn: ToolFn) -> Tool:
        return Tool(name or fn.__name__, fn, effect=effect, needs_approval=needs_approval,
                    description=description or (fn.__doc__ or "").strip())

    return wrap


def _calls(calls: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(calls)


@attrs.frozen
class Reply:
    """A model's answer: text, and tool calls to run before the model is asked again."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)


ModelResult = Reply | Awaitable[Reply]


class Model(Protocol):
    """``model(transcript, tool_specs) -> Reply`` — sync or async."""

    def __call__(self, transcript: Sequence[Message],
                 tool_specs: Sequence[Mapping[str, Any]], /) -> ModelResult: ...


def is_async(fn: Callable[..., Any]) -> bool:
    """Is ``fn`` an ``async def`` function (or an object whose ``__call__`` is one)?"""
    call = type(fn).__call__ if not inspect.isroutine(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def settle(out: Any, what: str) -> Any:
    """The value of a sync call's result: an awaitable is run to completion on a fresh event
    loop. Inside a running event loop that is impossible (``asyncio.run`` refuses, and blocking
    the loop until the awaitable finishes would deadlock): ``HostError`` — ``arun`` is the way."""
    if not inspect.isawaitable(out):
        return out
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        aw = out

        async def wait() -> Any:
            return await aw

        return asyncio.run(wait())
    if inspect.iscoroutine(out):
        out.close()  # never awaited: no "coroutine was never awaited" warning
    raise HostError(f"{what} is async and the sync run() was called inside a running event "
                    "loop: use `await loop.arun(...)`", reason="async_in_running_loop")


def as_reply(out: Any) -> Reply:
    """The model's answer, checked: anything but a ``Reply`` is the host's programming error."""
    if not isinstance(out, Reply):
        raise HostError(f"the model returned {type(out).__name__}, not a Reply",
                        reason="bad_model_reply")
    return out


def call_model(model: Model, transcript: Sequence[Message],
               specs: Sequence[Mapping[str, Any]]) -> Reply:
    """Call a sync or async model from sync code and return its Reply."""
    return as_reply(settle(model(transcript, specs), "the model"))


Step = Reply | Callable[[Sequence[Message]], Reply]


class ScriptedModel:
    """A deterministic model for tests and the demo.

    Step *n* answers the *n*-th model call of the current turn, where *n* is the number of
    assistant messages after the last user message. The choice depends on the transcript only,
    so a resumed turn (a fresh process, a fresh ScriptedModel) continues with the right step.
    A step is a ``Reply`` or a callable ``step(transcript) -> Reply`` (which may also crash the
    process: the demo kills itself inside a model call that way). Past the script: ``final``.
    """

    def __init__(self, steps: Sequence[Step], *, final: str = "done") -> None:
        self.steps = list(steps)
        self.final = final
        self.calls = 0

    @staticmethod
    def step_index(transcript: Sequence[Message]) -> int:
        n = 0
        for m in reversed(transcript):
            if m.role == "user":
                break
            if m.role == "assistant":
                n += 1
        return n

    def __call__(self, transcript: Sequence[Message],
                 tool_specs: Sequence[Mapping[str, Any]]) -> Reply:
        self.calls += 1
        i = self.step_index(transcript)
        if i >= len(self.steps):
            return Reply(self.final)
        step = self.steps[i]
        return step if isinstance(step, Reply) else step(transcript)


def call(name: str, call_id: str, /, **arguments: Any) -> ToolCall:
    """Shorthand for a ToolCall in a script."""
    return ToolCall(id=call_id, name=name, arguments=dict(arguments))


__all__ = ["Model", "Reply", "ScriptedModel", "Tool", "ToolContext", "as_reply", "call",
           "call_model", "is_async", "settle", "tool"]
