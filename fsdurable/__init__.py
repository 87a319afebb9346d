"""fsdurable: crash-durable agent turns on plain files.

One versioned JSON file per session, one small marker file per interrupted turn, and a recovery
engine that finds every interrupted turn with one directory listing. See README.md.

The public names below are loaded on first use, so ``import fsdurable`` stays cheap at startup.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Config": "._config",
    "DEFAULT_CONFIG": "._config",
    "ConflictError": "._errors",
    "FsDurableError": "._errors",
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
    "default_root": "._store",
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
    "Change": "._watch",
    "watch": "._watch",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fsdurable' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from ._async import AsyncStore as AsyncStore
    from ._config import DEFAULT_CONFIG, Config
    from ._doctor import Finding, doctor
    from ._errors import (
        ConflictError,
        FsDurableError,
        InvalidSessionId,
        InvalidState,
        LockTimeout,
        SessionNotFound,
        StorageError,
        TurnStateError,
        UnreadableState,
    )
    from ._gates import RecoveryPolicy
    from ._layout import validate_session_id
    from ._loop import AgentLoop, TurnResult
    from ._model import LedgerEntry, Message, Session, ToolCall, Turn
    from ._records import Event, Marker
    from ._recovery import Host, Outcome, RecoveryReport, recover, resume_one
    from ._store import Store, default_root
    from ._sync import Resolution, adopt, conflict_copies, foreign_turns, resolve, take_over
    from ._tools import Reply, ScriptedModel, Tool, ToolContext, tool
    from ._watch import Change, watch
