"""The hostile-input corpus (``tests/data/hostile/``) and the check that a store survives it.

The corpus is committed as files, laid out as they are dropped into a store (``sessions/``,
``markers/``, ``events/``, ``quarantine/``), with ``INDEX.json`` saying what each file is and what
must become of it:

* ``quarantined``: moved to ``quarantine/`` byte for byte, with an event naming it;
* ``skipped``: left where it is, untouched (listings skip it; doctor reports it);
* ``repaired``: an orphan marker removed, or a missing marker written, with an event.

Two kinds are made at test time instead of committed: the 100 MB file and the symlinks that point
outside the store. ``python -m tests.torture.hostile --regenerate`` rewrites the committed files.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parent.parent / "data" / "hostile"
NODE = "node-test"  # the node that wrote the corpus: its files are this run's own
T = 1_800_000_000.0  # a fixed instant; the check's clock is set near it


def _session(sid: str, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "format": "fsdurable.session/7", "id": sid, "version": 3, "commit_id": "c0ffee",
        "created_at": T, "updated_at": T, "source": "api", "route_key": f"session:{sid}",
        "in_progress": False, "turn": None, "history": None, "summary": None, "metadata": {},
    }
    d.update(over)
    return d


def _turn(sid: str, tid: str = "t1") -> dict[str, Any]:
    return {"id": tid, "started_at": T, "checkpoint_at": T, "phase": "model_reply",
            "resume_attempts": 0, "ledger": [], "node_id": NODE, "route_key": f"session:{sid}"}


def _marker(sid: str, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "format": "fsdurable.marker/1", "session_id": sid, "turn_id": "t1", "session_version": 3,
        "node_id": NODE, "route_key": f"session:{sid}", "source": "api", "started_at": T,
        "checkpoint_at": T, "resume_attempts": 0,
    }
    d.update(over)
    return d


def _j(d: Any) -> bytes:
    return json.dumps(d).encode()


def _deep(n: int) -> bytes:
    return (b'{"format": "fsdurable.session/3", "id": "h_deep", "metadata": ' + b"[" * n
            + b"]" * n + b"}")


# (relative path, what it is, expected fate, bytes)
def entries() -> list[tuple[str, str, str, bytes]]:
    good = _j(_session("h_x"))
    q, s, r = "quarantined", "skipped", "repaired"
    return [
        ("sessions/h_truncated.json", "truncated JSON", q, _j(_session("h_truncated"))[:57]),
        ("sessions/h_nul.json", "NUL bytes inside", q,
         _j(_session("h_nul")).replace(b'"api"', b'"a\x00pi"').replace(b"\x00", b"\x00\x00")),
        ("sessions/h_nulfill.json", "a file of NUL bytes (a torn page)", q, b"\0" * 4096),
        ("sessions/h_bom.json", "UTF-8 byte order mark", q,
         b"\xef\xbb\xbf" + _j(_session("h_bom"))),
        ("sessions/h_utf8.json", "invalid UTF-8", q,
         _j(_session("h_utf8")).replace(b'"api"', b'"\xff\xfe\xc3"')),
        ("sessions/h_utf16.json", "UTF-16 encoded JSON", q,
         json.dumps(_session("h_utf16")).encode("utf-16")),
        ("sessions/h_wrongtype.json", "version is a string", q,
         _j(_session("h_wrongtype", version="3"))),
        ("sessions/h_booltype.json", "a bool where an int belongs", q,
         _j(_session("h_booltype", version=True))),
        ("sessions/h_msgtype.json", "a format-3 session whose messages is an object", q,
         _j(_session("h_msgtype", format="fsdurable.session/3", messages={"role": "user"}))),
        ("sessions/h_histtype.json", "history is a list", q,
         _j(_session("h_histtype", history=[]))),
        ("sessions/h_inlinetype.json", "an inline tail that is an object", q,
         _j(_session("h_inlinetype", history={"count": 1, "head": None, "sha256": None,
                                              "inline": {"role": "user"}}))),
        ("sessions/h_inlinelong.json", "an inline tail longer than its count", q,
         _j(_session("h_inlinelong", history={"count": 1, "head": None, "sha256": None,
                                              "inline": [{"role": "user"}] * 2}))),
        ("sessions/h_inlinehead.json", "a head without its sha256", q,
         _j(_session("h_inlinehead", history={"count": 1, "head": "000000000000-"
                                              "0123456789abcdef.json", "sha256": None,
                                              "inline": [{"role": "user"}]}))),
        ("sessions/h_inlinemsg.json", "an inline message out of shape (the document reads, "
         "its history is corrupt: reported, left for a human)", s,
         _j(_session("h_inlinemsg", history={"count": 1, "head": None, "sha256": None,
                                             "inline": [{"role": 7}]}))),
        ("sessions/h_dupkeys.json", "duplicate keys", q,
         good.replace(b'"id": "h_x"', b'"id": "h_dupkeys", "id": "other"')),
        ("sessions/h_deep.json", "100000 levels of nesting", q, _deep(100_000)),
        ("sessions/h_hugeint.json", "a 5000-digit integer version", q,
         good.replace(b'"id": "h_x"', b'"id": "h_hugeint"')
             .replace(b'"version": 3', b'"version": ' + b"9" * 5000)),
        ("sessions/h_hugefloat.json", "a float that overflows (1e400)", q,
         good.replace(b'"id": "h_x"', b'"id": "h_hugefloat"')
             .replace(b'"created_at": ' + repr(T).encode(), b'"created_at": 1e400')),
        ("sessions/h_nan.json", "NaN", q,
         good.replace(b'"id": "h_x"', b'"id": "h_nan"')
             .replace(b'"updated_at": ' + repr(T).encode(), b'"updated_at": NaN')),
        ("sessions/h_negative.json", "a negative version", q,
         _j(_session("h_negative", version=-4))),
        ("sessions/h_future.json", "a future format version (left for a newer fsdurable)", s,
         _j(_session("h_future", format="fsdurable.session/99"))),
        ("sessions/h_kind.json", "an unknown kind", q,
         _j(_session("h_kind", format="fsdurable.invoice/1"))),
        ("sessions/h_noformat.json", "no format at all", q,
         _j({k: v for k, v in _session("h_noformat").items() if k != "format"})),
        ("sessions/h_array.json", "a JSON array, not an object", q, b"[1, 2, 3]\n"),
        ("sessions/h_empty.json", "an empty file", q, b""),
        ("sessions/h_otherid.json", "a session holding another id", q, _j(_session("h_else"))),
        ("sessions/h_turnflag.json", "a turn without in_progress", q,
         _j(_session("h_turnflag", turn=_turn("h_turnflag")))),
        ("sessions/h_nomarker.json", "a session in progress without a marker", r,
         _j(_session("h_nomarker", in_progress=True, turn=_turn("h_nomarker")))),
        ("sessions/h_x.sync-conflict-20261129-101010-ABCDEFG.json", "Syncthing conflict copy",
         s, good),
        ("sessions/h_x (laptop's conflicted copy 2026-11-29).json", "Dropbox conflict copy", s,
         good),
        ("sessions/~h_x.json.a1b2c3.tmp", "a temp file left by a crash", q, good[:40]),
        ("sessions/.syncthing.h_x.json.tmp", "a sync tool's temp file (its transfer)", s,
         good[:10]),
        ("sessions/notes.txt", "a foreign file", s, b"my notes\n"),
        ("sessions/h.dotted.json", "a name with a dot (never an id)", s, good),
        ("sessions/CON.json", "a Windows device name", s, good),
        ("markers/h_truncated2.json", "truncated marker", q, _j(_marker("h_truncated2"))[:30]),
        ("markers/h_orphan.json", "a marker without a session", r, _j(_marker("h_orphan"))),
        ("markers/h_idle.json", "a marker of a session not in progress", r,
         _j(_marker("h_idle", session_version=1))),
        ("markers/h_names_other.json", "a marker naming another session", q,
         _j(_marker("h_idle"))),
        ("markers/h_mfuture.json", "a future marker format (left for a newer fsdurable)", s,
         _j(_marker("h_mfuture", format="fsdurable.marker/42"))),
        ("markers/h_mtypes.json", "a marker with wrong types", q,
         _j(_marker("h_mtypes", resume_attempts="many"))),
        ("markers/h_mnul.json", "a marker of NUL bytes", q, b"\0" * 200),
        ("markers/h_mhuge.json", "a marker with a 1e400 checkpoint", q,
         _j(_marker("h_mhuge")).replace(b'"checkpoint_at": ' + repr(T).encode(),
                                        b'"checkpoint_at": 1e400')),
        ("markers/h_idle.sync-conflict-20261129-101010-ABCDEFG.json", "a marker conflict copy",
         s, _j(_marker("h_idle"))),
        ("events/node-hostile/2026-11-29.jsonl", "an event log with garbage and a torn line", s,
         b'{"format": "fsdurable.event/1", "at": 1.0, "code": "x"}\n\x00\x00garbage\n{"form'),
        ("events/node-hostile/notes.txt", "a foreign file in the event log", s, b"hello"),
        ("quarantine/20261129T000000-session-old.json", "an earlier quarantined file", s,
         b"kept forever"),
    ]


GOOD_IDS = ("h_idle", "g_one", "g_two", "h_x")
GENERATED = ("sessions/h_100mb.json", "sessions/h_link.json", "markers/h_link.json",
             "sessions/h_dirlink.json", "markers/h_fifo.json", "sessions/h_fifo.json",
             "sessions/h_isdir.json")


def regenerate() -> None:
    shutil.rmtree(CORPUS, ignore_errors=True)
    index = {}
    for rel, what, fate, data in entries():
        p = CORPUS / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        index[rel] = {"what": what, "expect": fate}
    (CORPUS / "INDEX.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")


def load_index() -> dict[str, dict[str, str]]:
    return json.loads((CORPUS / "INDEX.json").read_text())  # type: ignore[no-any-return]


def drop_into(root: str, outside: str, only: str | None = None) -> dict[str, dict[str, str]]:
    """Copy the corpus into the store at ``root`` and make the generated cases; returns the
    index (committed + generated). ``outside`` is a directory outside the store for link
    targets. ``only``: just that one file."""
    index = {k: v for k, v in load_index().items() if only is None or k == only}
    for rel in index:
        src, dst = CORPUS / rel, Path(root) / rel
        dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o600)
        if "tmp" in rel:  # a leftover of a crash long ago, not a write in flight
            old = time.time() - 3600
            os.utime(dst, (old, old))
    if only is not None and only not in GENERATED:
        return index
    index.update(_generate(root, outside))
    return {k: v for k, v in index.items() if only is None or k == only}


def _generate(root: str, outside: str) -> dict[str, dict[str, str]]:
    index = {}
    big = Path(root) / "sessions" / "h_100mb.json"
    with open(big, "wb") as f:  # 100 MB: over the 64 MiB read limit, never read whole
        f.write(b'{"format": "fsdurable.session/3", "id": "h_100mb", "pad": "')
        f.truncate(100 * 1024 * 1024)
    secret = Path(outside) / "secret.json"
    secret.write_bytes(_j(_session("h_link")))
    os.symlink(secret, Path(root) / "sessions" / "h_link.json")
    msecret = Path(outside) / "msecret.json"
    msecret.write_bytes(_j(_marker("h_link")))
    os.symlink(msecret, Path(root) / "markers" / "h_link.json")
    os.symlink(outside, Path(root) / "sessions" / "h_dirlink.json")
    index["sessions/h_100mb.json"] = {"what": "a 100 MB file", "expect": "quarantined"}
    index["sessions/h_link.json"] = {"what": "a symlink to a session outside", "expect":
                                     "quarantined"}
    index["markers/h_link.json"] = {"what": "a symlink to a marker outside", "expect":
                                    "quarantined"}
    index["sessions/h_dirlink.json"] = {"what": "a symlink to a directory outside", "expect":
                                        "quarantined"}
    # a FIFO would block a plain open() until a writer came: discovery would hang forever
    os.mkfifo(Path(root) / "markers" / "h_fifo.json", 0o600)
    os.mkfifo(Path(root) / "sessions" / "h_fifo.json", 0o600)
    os.mkdir(Path(root) / "sessions" / "h_isdir.json", 0o700)
    index["markers/h_fifo.json"] = {"what": "a FIFO under a marker name", "expect": "quarantined"}
    index["sessions/h_fifo.json"] = {"what": "a FIFO under a session name", "expect":
                                     "quarantined"}
    index["sessions/h_isdir.json"] = {"what": "a directory under a session name", "expect":
                                      "quarantined"}
    return index


def _good_store(root: str, clock: Any) -> Any:
    from fsdurable._store import Store

    st = Store(root, clock=clock, node_id=NODE)
    for sid in GOOD_IDS:
        st.create(sid, metadata={"good": True})
    return st


def survive(base: str, only: str | None = None) -> tuple[int, list[str]]:
    """Drop the corpus (or ``only`` one file of it) into a store with good sessions; run
    discovery, recovery, doctor and doctor --repair, then all of it again from a fresh start;
    returns (number of hostile files, violations)."""
    from fsdurable._doctor import doctor, problems
    from fsdurable._recovery import recover
    from fsdurable._store import Store

    from .agents import recovery_loop

    root, outside = os.path.join(base, "store"), os.path.join(base, "outside")
    os.makedirs(outside)
    now = [T + 60]

    def clock() -> float:
        now[0] += 1
        return now[0]

    _good_store(root, clock)
    good = {sid: Path(root, "sessions", f"{sid}.json").read_bytes() for sid in GOOD_IDS}
    index = drop_into(root, outside, only)
    originals = {rel: (CORPUS / rel).read_bytes() for rel in load_index()}
    out: list[str] = []
    outside_before = {p: Path(outside, p).read_bytes() for p in os.listdir(outside)}
    try:
        st = Store(root, clock=clock, node_id=NODE)
        st.interrupted()
        recover(st, recovery_loop(st))
        doctor(st)
        doctor(st, repair=True)
        st2 = Store(root, clock=clock, node_id=NODE)
        st2.interrupted()
        recover(st2, recovery_loop(st2))
        left = problems(doctor(st2, repair=True))
    except Exception as e:
        import traceback

        return len(index), [f"startup raised: {type(e).__name__}: {e}\n{traceback.format_exc()}"]
    left_paths = {f.path for f in left}
    events = st2.events()
    quarantined = set(os.listdir(Path(root, "quarantine")))
    for rel, meta in sorted(index.items()):
        full = str(Path(root, rel))
        fate = meta["expect"]
        here = os.path.lexists(full)
        if fate == "quarantined":
            if here:
                out.append(f"{rel} ({meta['what']}): not quarantined")
                continue
            moved = [q for q in quarantined if q.endswith("-" + os.path.basename(rel))
                     or ("-" + os.path.basename(rel) + ".") in q]
            if not moved:
                out.append(f"{rel} ({meta['what']}): gone, but not in quarantine/")
            elif rel in originals:
                qp = Path(root, "quarantine", moved[0])
                if not qp.is_symlink() and qp.read_bytes() != originals[rel]:
                    out.append(f"{rel}: quarantined copy differs from the original")
            if not any(e.detail.get("path") == full or e.detail.get("path") == rel
                       for e in events):
                out.append(f"{rel} ({meta['what']}): quarantined without an event")
        elif fate == "skipped":
            if not here or Path(full).read_bytes() != originals[rel]:
                out.append(f"{rel} ({meta['what']}): skipped file was touched")
        elif fate == "repaired":
            sid = Path(rel).stem
            codes = {e.code for e in events if e.session_id == sid}
            if "marker_repaired" not in codes:
                out.append(f"{rel} ({meta['what']}): no marker_repaired event")
        if full in left_paths and fate != "skipped":
            out.append(f"{rel}: doctor --repair left it a problem")
    for sid, data in good.items():
        cur = Path(root, "sessions", f"{sid}.json")
        if not cur.exists() or cur.read_bytes() != data:
            out.append(f"good session {sid} was touched")
    if {p: Path(outside, p).read_bytes() for p in os.listdir(outside)} != outside_before:
        out.append("a file outside the store was touched through a symlink")
    stray = [p for p in os.listdir(Path(root, "sessions")) if p.startswith("~")]
    out += [f"temp file left: sessions/{p}" for p in stray]
    return len(index), out


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        regenerate()
        print(f"{len(load_index())} files in {CORPUS}")
