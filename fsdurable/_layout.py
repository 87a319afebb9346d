"""Where every file lives, which names belong to the store, and the machine-local state dir.

Pure path logic: nothing here reads or writes a file except ``node_id`` (its own tiny file). What
any other name in a store directory is (a temp file, a sync tool's conflict copy) is ``_names``'s.
"""

from __future__ import annotations

import errno
import os
import sys

from ._errors import InvalidRoot, InvalidSessionId

FORMAT = "fsdurable/1"
MANIFEST = "fsdurable.json"
SESSIONS = "sessions"
MARKERS = "markers"
EVENTS = "events"
QUARANTINE = "quarantine"
HISTORY = "history"  # write-once segments of each session's transcript: history/<id>/ (storage.md)
LANGGRAPH = "langgraph"  # fsdurable.langgraph: one directory of immutable records per thread
ENTRIES = "entries"  # immutable entry files of the framework adapters: entries/<kind>/<id>.json

# An id is 1-128 of [A-Za-z0-9_-] (a node id may hold dots too): checked by ``str.strip`` of these
# characters, which leaves nothing of a good id, instead of a regular expression compiled at
# import (the startup path checks the name of every marker and never needs ``re`` for it).
_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
# Windows device names: a file called CON.json cannot be created on Windows, and a synced store
# must open everywhere.
_RESERVED = frozenset(
    ["CON", "PRN", "AUX", "NUL"]
    + [f"COM{i}" for i in range(10)]
    + [f"LPT{i}" for i in range(10)]
)


def validate_session_id(session_id: object) -> str:
    """Return ``session_id`` if it can never escape its directory, else raise InvalidSessionId."""
    if not isinstance(session_id, str):
        raise InvalidSessionId(
            f"session id must be a string, got {type(session_id).__name__}", reason="type"
        )
    if not (0 < len(session_id) <= 128 and not session_id.strip(_ID_CHARS)):
        shown = session_id if len(session_id) <= 40 else session_id[:40] + "..."
        raise InvalidSessionId(
            f"invalid session id {shown!r}: use 1-128 of [A-Za-z0-9_-]",
            session_id=session_id[:128],
            reason="pattern",
        )
    if session_id.upper() in _RESERVED:
        raise InvalidSessionId(
            f"invalid session id {session_id!r}: reserved device name on Windows",
            session_id=session_id,
            reason="reserved",
        )
    return session_id


def new_id() -> str:
    """A fresh random id (sessions, turns, tool calls): 128 bits, valid by construction."""
    import secrets  # not at module top: off the startup path (bench/startup.py)

    return secrets.token_hex(16)


def own_id(name: str) -> str | None:
    """The session id if ``name`` is ``<valid id>.json``; the hot path of every listing."""
    if name.endswith(".json"):
        sid = name[:-5]
        if 0 < len(sid) <= 128 and not sid.strip(_ID_CHARS) and sid.upper() not in _RESERVED:
            return sid
    return None


def temp_prefix(target_name: str) -> str:
    """Prefix of a temp file beside ``target_name``: Dropbox/Nextcloud skip ``~*.tmp``."""
    return f"~{target_name}."


TEMP_SUFFIX = ".tmp"


class Layout:
    """Absolute paths of one store."""

    __slots__ = ("_marker_dir", "_session_dir", "events", "history", "langgraph", "manifest",
                 "markers", "quarantine", "root", "sessions")

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.manifest = os.path.join(self.root, MANIFEST)
        self.sessions = os.path.join(self.root, SESSIONS)
        self.markers = os.path.join(self.root, MARKERS)
        self.events = os.path.join(self.root, EVENTS)
        self.quarantine = os.path.join(self.root, QUARANTINE)
        self.langgraph = os.path.join(self.root, LANGGRAPH)
        self.history = os.path.join(self.root, HISTORY)
        # "<dir>/": a file's path is then one concatenation (os.path.join of a directory and an
        # id's file name gives the same string; discovery builds one per marker)
        self._session_dir = os.path.join(self.sessions, "")
        self._marker_dir = os.path.join(self.markers, "")

    def session(self, session_id: str) -> str:
        return self._session_dir + session_id + ".json"

    def marker(self, session_id: str) -> str:
        return self._marker_dir + session_id + ".json"

    def history_dir(self, session_id: str) -> str:
        """The directory of a session's history segments (created by its first segment)."""
        return os.path.join(self.history, session_id)

    def lg_thread(self, session_id: str) -> str:
        """The directory of a LangGraph thread's append-only records (``fsdurable.langgraph``)."""
        return os.path.join(self.langgraph, session_id)

    def lg_record(self, session_id: str, seq: int, kind: str) -> str:
        """One immutable record of a thread: ``<seq, 12 digits>.<ckpt|writes>``."""
        return os.path.join(self.langgraph, session_id, f"{seq:012d}.{kind}")

    def entry(self, kind: str, entry_id: str) -> str:
        """An adapter's immutable entry file (``kind``: the adapter, e.g. ``pydantic_ai``)."""
        return os.path.join(self.root, ENTRIES, kind, validate_session_id(entry_id) + ".json")

    def directories(self) -> tuple[str, ...]:
        return (self.root, self.sessions, self.markers, self.events, self.quarantine)


def real_root(root: str) -> str:
    """The store directory's real path (it may not exist yet: ``init`` creates it). A symlink
    loop on the way (ELOOP) is no directory at all: InvalidRoot, before anything is touched
    (else the first read of the manifest fails with a bare OSError)."""
    try:
        return os.path.realpath(root, strict=True)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InvalidRoot(f"store root {root} is a symlink loop, not a directory "
                              "(give the store's real directory)", path=root,
                              reason="symlink_loop") from None
    return os.path.realpath(root)  # missing (init creates it) or unreadable (the open says)


def default_root() -> str:
    """``FSDURABLE_ROOT``, else ``<user data dir>/fsdurable/store``."""
    env = os.environ.get("FSDURABLE_ROOT")
    if env:
        return env
    data = _xdg("XDG_DATA_HOME", "~/.local/share")
    if data is None:
        import platformdirs

        data = platformdirs.user_data_dir("fsdurable", appauthor=False)
    return os.path.join(data, "store")


def state_dir(root: str, *, real: bool = False) -> str:
    """Machine-local state of one store (locks, node id): outside ROOT, never synced.

    ``FSDURABLE_STATE_DIR`` overrides the base (tests, sandboxes). The store directory's identity
    (device and inode) keys it, not its path: the same store reached through a symlink, a bind
    mount or a second mount point shares one set of locks (else a recovery and a live turn could
    run one route at once), while a copy of the store (rsync) gets its own. ``real``: ``root``
    is a real path already (``Store.root``, resolved at open), not resolved again.
    """
    base = _state_base()
    import hashlib  # not at module top: loading OpenSSL costs milliseconds at startup

    real_root = _outside(base, root, real=real)
    try:
        st = os.stat(real_root)
        ident = f"{st.st_dev}:{st.st_ino}"
    except FileNotFoundError:  # not created yet: nothing can hold its locks
        ident = real_root
    key = hashlib.sha256(ident.encode()).hexdigest()[:24]
    return os.path.join(base, "stores", key)


def _state_base() -> str:
    base = os.environ.get("FSDURABLE_STATE_DIR")
    if not base:
        base = _xdg("XDG_STATE_HOME", "~/.local/state") or _platform_state()
    return base


def _xdg(var: str, default: str) -> str | None:
    """platformdirs' ``user_state_dir`` / ``user_data_dir`` of "fsdurable" on Linux, without
    importing platformdirs (5-10 ms that every CLI command needing the node id or the default
    store paid); None elsewhere (and on Android), where platformdirs decides.
    tests/test_sync.py checks both agree."""
    if not sys.platform.startswith("linux") or (os.environ.get("ANDROID_DATA") == "/data"
                                                and os.environ.get("ANDROID_ROOT") == "/system"):
        return None
    return os.path.join(os.environ.get(var, "").strip() or os.path.expanduser(default),
                        "fsdurable")


def _platform_state() -> str:
    import platformdirs

    return platformdirs.user_state_dir("fsdurable", appauthor=False)


def _outside(base: str, root: str, *, real: bool = False) -> str:
    """``realpath(root)`` (``root`` itself if ``real``), once sure machine-local state under
    ``base`` is not inside the store: a sync tool would carry the locks and the node id to the
    other machines (two nodes with one id would both resume the same turn; a node id written
    inside the store makes the store's own turns look foreign on the machine it came from)."""
    real_root = root if real else os.path.realpath(root)
    real_base = os.path.realpath(base)
    if real_base == real_root or real_base.startswith(real_root.rstrip(os.sep) + os.sep):
        from ._errors import InvalidState

        raise InvalidState(f"the machine-local state dir {base} is inside the store {root}: "
                           "set FSDURABLE_STATE_DIR to a directory outside it", path=base,
                           reason="state_dir_in_store")
    return real_root


def _node_shaped(value: str) -> bool:
    """1-128 of [A-Za-z0-9_.-], not starting or ending with a dot."""
    return (0 < len(value) <= 128 and not value.strip(_ID_CHARS + ".") and value[0] != "."
            and value[-1] != ".")


def validate_node_id(node_id: object) -> str:
    """A node id: a session id's characters plus dots, so a host name (``laptop.local``) works;
    no leading or trailing dot (``.``/``..`` never; Windows drops a trailing dot)."""
    if (isinstance(node_id, str) and _node_shaped(node_id) and ".." not in node_id
            and node_id.split(".")[0].upper() not in _RESERVED):  # CON.local is CON on Windows
        return node_id
    shown = repr(node_id)[:60]
    raise InvalidSessionId(f"invalid node id {shown}: use 1-128 of A-Z a-z 0-9 _ - and dots "
                           "(a host name such as laptop.local works), not starting or ending "
                           "with a dot", reason="node_id")


def node_id(root: str | None = None) -> str:
    """This machine's node id: ``FSDURABLE_NODE`` if set, else a random id kept in the user
    state dir (created once, never inside a store — ``root`` is checked — so a sync tool never
    carries it)."""
    env = os.environ.get("FSDURABLE_NODE")
    if env:
        return validate_node_id(env)
    base = _state_base()
    if root is not None:
        _outside(base, root)
    path = os.path.join(base, "node_id")
    try:
        with open(path, "rb") as f:  # bytes, decoded here: no text layer, no codec to load
            value = f.read(200).decode("ascii").strip()
        if _node_shaped(value):
            return value
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    import secrets

    from . import _fsio

    value = "n" + secrets.token_hex(8)
    _fsio.makedirs(base)
    try:
        _fsio.write_atomic(path, value.encode() + b"\n", overwrite=False)
    except FileExistsError:  # another process created it first: theirs wins
        import time

        for _ in range(50):
            with open(path, encoding="ascii", errors="replace") as f:
                theirs = f.read(200).strip()
            if 0 < len(theirs) <= 128 and not theirs.strip(_ID_CHARS):
                return theirs
            time.sleep(0.02)  # an empty claim (no hard links): its writer renames it in soon
        # still empty or garbage: the leftover of a crash, not a live writer: replace it
        _fsio.write_atomic(path, value.encode() + b"\n")
    return value
