"""fsdurable: crash-durable agent turns on plain files.

One versioned JSON file per session, one small marker file per interrupted turn, and a recovery
engine that finds every interrupted turn with one directory listing. See README.md.

The public names below are loaded on first use, so ``import fsdurable`` stays cheap at startup.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (startup path)
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Config": "._config",
    "DEFAULT_CONFIG": "._config",
    "ConflictError": "._errors",
    "DurabilityUnknown": "._errors",
    "FsDurableError": "._errors",
    "HistoryUnavailable": "._errors",
    "HostError": "._errors",
    "InvalidRoot": "._errors",
    "InvalidSessionId": "._errors",
    "InvalidState": "._errors",
    "LockTimeout": "._errors",
    "SessionNotFound": "._errors",
    "StorageError": "._errors",
    "TurnStateError": "._errors",
    "UnreadableState": "._errors",
    "Event": "._records",
    "LedgerEntry": "._model",
    "Marker": "._records",
    "Message": "._model",
    "Session": "._model",
    "ToolCall": "._model",
    "Turn": "._model",
    "Store": "._store",
    "AsyncStore": "._async",
    "default_root": "._layout",
    "validate_session_id": "._layout",
    "Finding": "._doctor",
    "doctor": "._doctor",
    "AgentLoop": "._loop",
    "TurnResult": "._loop",
    "Reply": "._tools",
    "ScriptedModel": "._tools",
    "Tool": "._tools",
    "ToolContext": "._tools",
    "tool": "._tools",
    "Host": "._recovery",
    "arecover": "._recovery",
    "Outcome": "._recovery",
    "RecoveryPolicy": "._gates",
    "RecoveryReport": "._recovery",
    "recover": "._recovery",
    "resume_one": "._recovery",
    "Resolution": "._sync",
    "adopt": "._sync",
    "conflict_copies": "._sync",
    "foreign_turns": "._sync",
    "resolve": "._sync",
    "take_over": "._sync",
    "answer_review": "._review",
    "rerun_call": "._review",
    "review_queue": "._review",
    "Change": "._watch",
    "watch": "._watch",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fsdurable' has no attribute {name!r}")
    value = getattr(__import__(__name__ + module, fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # explicit re-exports (`X as X`): mypy --strict users see them public
    from ._async import AsyncStore as AsyncStore
    from ._config import DEFAULT_CONFIG as DEFAULT_CONFIG
    from ._config import Config as Config
    from ._doctor import Finding as Finding
    from ._doctor import doctor as doctor
    from ._errors import ConflictError as ConflictError
    from ._errors import DurabilityUnknown as DurabilityUnknown
    from ._errors import FsDurableError as FsDurableError
    from ._errors import HistoryUnavailable as HistoryUnavailable
    from ._errors import HostError as HostError
    from ._errors import InvalidRoot as InvalidRoot
    from ._errors import InvalidSessionId as InvalidSessionId
    from ._errors import InvalidState as InvalidState
    from ._errors import LockTimeout as LockTimeout
    from ._errors import SessionNotFound as SessionNotFound
    from ._errors import StorageError as StorageError
    from ._errors import TurnStateError as TurnStateError
    from ._errors import UnreadableState as UnreadableState
    from ._gates import RecoveryPolicy as RecoveryPolicy
    from ._layout import default_root as default_root
    from ._layout import validate_session_id as validate_session_id
    from ._loop import AgentLoop as AgentLoop
    from ._loop import TurnResult as TurnResult
    from ._model import LedgerEntry as LedgerEntry
    from ._model import Message as Message
    from ._model import Session as Session
    from ._model import ToolCall as ToolCall
    from ._model import Turn as Turn
    from ._records import Event as Event
    from ._records import Marker as Marker
    from ._recovery import Host as Host
    from ._recovery import Outcome as Outcome
    from ._recovery import RecoveryReport as RecoveryReport
    from ._recovery import arecover as arecover
    from ._recovery import recover as recover
    from ._recovery import resume_one as resume_one
    from ._review import answer_review as answer_review
    from ._review import rerun_call as rerun_call
    from ._review import review_queue as review_queue
    from ._store import Store as Store
    from ._sync import Resolution as Resolution
    from ._sync import adopt as adopt
    from ._sync import conflict_copies as conflict_copies
    from ._sync import foreign_turns as foreign_turns
    from ._sync import resolve as resolve
    from ._sync import take_over as take_over
    from ._tools import Reply as Reply
    from ._tools import ScriptedModel as ScriptedModel
    from ._tools import Tool as Tool
    from ._tools import ToolContext as ToolContext
    from ._tools import tool as tool
    from ._watch import Change as Change
    from ._watch import watch as watch
