"""What a name in a store directory is: ours (``<id>.json``, a session or a marker), a temp file
(ours or a sync tool's), a sync tool's conflict copy of one of ours, or foreign.

Doctor, sync and watch classify every name they list; opening a store and listing its markers
never does (``_layout.own_id`` is that path's check), so the enum and the patterns below are not
loaded at startup.
"""

from __future__ import annotations

import enum
import re

from ._layout import own_id

# Conflict copies written by sync tools next to the file they could not merge (each tool keeps
# the ``.json`` extension last, so a copy of anything but a session or a marker never matches):
# Syncthing ``<id>.sync-conflict-<date>-<time>-<device>.json``; Dropbox
# ``<id> (<host>'s conflicted copy <date>).json``; Nextcloud
# ``<id> (conflicted copy <date> <time>).json``; Unison 2.52 (``copyonconflict``)
# ``<id> (conflict_on_<date>).json``; any ``<id> (...conflict...).json``.
_SYNCTHING = r"([A-Za-z0-9_-]{1,128})\.sync-conflict-[^/\\]*\.json"
_CONFLICT = r"([A-Za-z0-9_-]{1,128})(?:\.json)? ?[.(][^/\\]*conflict[^/\\]*\.json"
# In-flight files of sync tools that write beside the target and rename: rsync ``.<name>.XXXXXX``,
# Nextcloud ``.<name>.~<hex>``, Syncthing ``.syncthing.<name>.tmp`` / ``~syncthing~<name>.tmp``,
# Unison ``.unison.<name>.<hash>.unison.tmp``.
_TOOL_TEMP = r"\.[^/\\]+\.json\.(?:[A-Za-z0-9]{6}|~[0-9a-fA-F]+)"
# compiled on first use by classify()
_classifiers: list[re.Pattern[str]] = []


def _patterns() -> list[re.Pattern[str]]:
    if not _classifiers:
        _classifiers.extend((re.compile(_SYNCTHING), re.compile(_CONFLICT, re.IGNORECASE),
                             re.compile(_TOOL_TEMP)))
    return _classifiers


class NameKind(enum.Enum):
    OWN = "own"  # <id>.json: a session or a marker
    TEMP = "temp"  # ~<name>.<random>.tmp (ours) or a sync tool's temp file
    CONFLICT = "conflict"  # a sync tool's conflict copy of an own file
    FOREIGN = "foreign"  # anything else


def classify(name: str) -> tuple[NameKind, str | None]:
    """Classify one directory entry name; returns (kind, session id it concerns or None)."""
    sid = own_id(name)
    if sid is not None:
        return NameKind.OWN, sid
    syncthing_re, conflict_re, tool_temp_re = _patterns()
    for rx in (syncthing_re, conflict_re):
        c = rx.fullmatch(name)
        if c:
            return NameKind.CONFLICT, c.group(1)
    if (name.endswith(".tmp") and (
        name.startswith(("~", ".syncthing.", ".unison.")) or ".unison." in name
    )) or tool_temp_re.fullmatch(name):
        return NameKind.TEMP, None
    return NameKind.FOREIGN, None


__all__ = ["NameKind", "classify"]
