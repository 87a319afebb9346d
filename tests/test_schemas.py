"""schemas/ (their one source; the wheel ships them as fsdurable/schemas/): every file the store
writes validates; the schemas accept what the codec accepts."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

import fsdurable
from fsdurable import _codec, _fsio, _repair
from fsdurable._errors import HistoryUnavailable, UnreadableState
from fsdurable._history import parse_segment
from fsdurable._model import Event, LedgerEntry, Manifest, Marker, Message, Session, ToolCall
from fsdurable._recordcodec import SEGMENT_FORMAT

from .codec_strategies import (
    document,
    events,
    json_values,
    lane_maps,
    manifests,
    markers,
    segments,
    sessions,
)
from .conftest import DATA

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = ("session", "segment", "marker", "event", "manifest")
FORMATS = {"session": _codec.SESSION_FORMAT, "segment": SEGMENT_FORMAT,
           "marker": _codec.MARKER_FORMAT,
           "event": _codec.EVENT_FORMAT, "manifest": _codec.MANIFEST_FORMAT}
ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _load(kind: str) -> dict[str, Any]:
    from fsdurable.cli._store import schema_text  # the shipped copy, read as the CLI reads it

    schema: dict[str, Any] = json.loads(schema_text(kind))
    return schema


SCHEMAS = {kind: _load(kind) for kind in KINDS}
VALIDATORS = {kind: Draft202012Validator(schema) for kind, schema in SCHEMAS.items()}


def assert_valid(kind: str, data: bytes, where: str = "") -> None:
    obj = json.loads(data)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in VALIDATORS[kind].iter_errors(obj)]
    assert not errors, f"{where or kind} does not validate against {kind}.schema.json: {errors}"


# ---------------------------------------------------------------- the schemas themselves


@pytest.mark.parametrize("kind", KINDS)
def test_schema_is_valid_draft_2020_12_and_pins_the_current_format(kind: str) -> None:
    schema = SCHEMAS[kind]
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["format"] == {"const": FORMATS[kind]}
    assert "format" in schema["required"]
    assert schema.get("additionalProperties", True) is True  # readers ignore unknown keys


def test_only_the_current_session_format_validates() -> None:
    good = json.loads(_codec.encode_session(Session(id="s", version=1)))
    assert VALIDATORS["session"].is_valid(good)
    for fmt in ("fsdurable.session/1", "fsdurable.session/2", "fsdurable.session/3",
                "fsdurable.session/4", "fsdurable.session/5", "fsdurable.session/6",
                "fsdurable.session/8",
                "fsdurable.marker/1"):
        assert not VALIDATORS["session"].is_valid({**good, "format": fmt})


def test_v1_fixture_is_not_current_but_its_migration_is() -> None:
    raw = (DATA / "session_v1.json").read_bytes()
    assert not VALIDATORS["session"].is_valid(json.loads(raw))
    s, migrated = _codec.parse_session(raw)
    assert migrated
    assert_valid("session", document(s))


def test_v2_fixture_is_not_current_but_its_migration_is() -> None:
    raw = (DATA / "session_v2.json").read_bytes()
    assert not VALIDATORS["session"].is_valid(json.loads(raw))
    s, migrated = _codec.parse_session(raw)
    assert migrated
    assert_valid("session", document(s))


# ---------------------------------------------------------------- encoder output validates


@settings(SETTINGS, max_examples=50)
@given(sessions())
def test_every_encoded_session_validates(s: Session) -> None:
    assert_valid("session", document(s))


@settings(SETTINGS, max_examples=50)
@given(segments())
def test_every_encoded_segment_validates(data: bytes) -> None:
    assert_valid("segment", data)


@SETTINGS
@given(markers)
def test_every_encoded_marker_validates(m: Marker) -> None:
    assert_valid("marker", _codec.encode_marker(m))


@SETTINGS
@given(events)
def test_every_encoded_event_validates(e: Event) -> None:
    assert_valid("event", _codec.encode_event(e))


@SETTINGS
@given(manifests)
def test_every_encoded_manifest_validates(m: Manifest) -> None:
    assert_valid("manifest", _codec.encode_manifest(m))


# ---------------------------------------------------------------- schema == codec, differentially

FREE_FORM = frozenset({"metadata", "arguments", "detail"})  # any JSON object: not descended into
# Non-integral floats only: JSON Schema calls 3.0 an integer, the codec refuses it in an int
# field (documented in each schema's description); everything else must agree exactly.
REPLACEMENTS = json_values(st.floats(min_value=-1e15, max_value=1e15).map(
    lambda f: f + 0.25 if f.is_integer() else f))


def _segment(data: bytes) -> Any:
    """parse_segment as a reader that reached it through its chain reads it (the digest and the
    session id are the ones that named it)."""
    d = json.loads(data)
    sid, lane = d.get("session_id"), d.get("lane")
    if not isinstance(sid, str):
        raise UnreadableState("no session id", reason="wrong_type")
    try:  # a reader reaches a lane's segment through that lane's chain
        parse_segment(data, path="x", sid=sid, sha=hashlib.sha256(data).hexdigest(),
                      lane=lane if isinstance(lane, str) else None)
    except HistoryUnavailable as e:
        raise UnreadableState(e.message, reason=e.reason) from e
    return type("Seg", (), {"session_id": sid})()


def _codec_accepts(kind: str, data: bytes) -> bool:
    parse: Callable[[bytes], Any] = {"segment": _segment,
        "session": lambda b: _codec.parse_session(b)[0], "marker": _codec.parse_marker,
        "event": _codec.parse_event, "manifest": _codec.parse_manifest}[kind]
    try:
        obj = parse(data)
    except UnreadableState:
        return False
    if kind == "session":
        return ID_RE.fullmatch(obj.id) is not None  # the store's id rule
    if kind in ("marker", "segment"):
        return ID_RE.fullmatch(obj.session_id) is not None
    return True


DELETE = object()
# One probe of every JSON type (and the edge values the schemas constrain) tried at every slot.
PROBES: list[Any] = [DELETE, None, True, False, 0, 1, -1, 2**63 - 1, 2.5, "", "user", [], [{}],
                     {}, {"id": "t"}]


def _probe(d: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(d))
    node: Any = copy
    for k in path[:-1]:
        node = node[k]
    if value is DELETE:
        if isinstance(node, dict):
            del node[path[-1]]
        else:
            node.pop(path[-1])
    else:
        node[path[-1]] = value
    return copy


FILE_STRATEGIES: dict[str, Any] = {
    "session": st.tuples(sessions(), lane_maps()), "segment": segments(), "marker": markers,
    "event": events,
    "manifest": manifests}
ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "session": lambda t: document(*t), "segment": lambda b: b, "marker": _codec.encode_marker,
    "event": _codec.encode_event, "manifest": _codec.encode_manifest}


def _all_paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every value inside a file's structure, free-form objects not descended."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for k, v in items:
        yield (*prefix, k)
        if isinstance(v, (dict, list)) and k not in FREE_FORM:
            yield from _all_paths(v, (*prefix, k))


def _agree(kind: str, d: dict[str, Any], what: str) -> None:
    schema_ok = VALIDATORS[kind].is_valid(d)
    assert schema_ok == _codec_accepts(kind, json.dumps(d).encode()), (what, schema_ok, d)


@pytest.mark.parametrize("kind", KINDS)
@settings(deadline=None, max_examples=10, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_schema_accepts_exactly_what_the_codec_accepts(kind: str, data: st.DataObject) -> None:
    """Every slot of a written file, with a probe of every JSON type, an unknown key and a random
    value: the schema and the codec (with the store's id rule) say yes or no together."""
    d = orjson.loads(ENCODERS[kind](data.draw(FILE_STRATEGIES[kind])))
    randoms = data.draw(st.lists(REPLACEMENTS, min_size=7, max_size=7))
    _agree(kind, d, "unchanged")
    for i, path in enumerate(_all_paths(d)):
        for value in [*PROBES, randoms[i % 7]]:
            _agree(kind, _probe(d, path, value), f"{path} = {value!r}")
        parent: Any = d
        for k in path[:-1]:
            parent = parent[k]
        if isinstance(parent, dict):
            extra = _probe(d, (*path[:-1], "x_unknown"), randoms[(i + 3) % 7])
            _agree(kind, extra, f"unknown key beside {path}")


# ---------------------------------------------------------------- everything a real store writes

RecordedWrite = tuple[str, bytes]


@contextmanager
def recording() -> Iterator[list[RecordedWrite]]:
    """Every (target path, bytes) that goes to disk through _fsio: atomic writes and appends."""
    writes: list[RecordedWrite] = []
    pending: dict[str, bytes] = {}

    def recorder(op: str, args: tuple[Any, ...]) -> None:
        if op == "write":
            pending[args[0]] = args[1]
        elif op in ("rename", "link") and args[0] in pending:
            writes.append((args[1], pending.pop(args[0])))
        elif op == "append":
            writes.append((args[0], args[1]))

    previous = _fsio.set_recorder(recorder)
    try:
        yield writes
    finally:
        _fsio.set_recorder(previous)


def kind_of(root: Path, path: str) -> str | None:
    """The schema a file under the store root must satisfy; None if outside the root."""
    rel = os.path.relpath(path, root)
    if rel.startswith(".."):
        return None
    parts = Path(rel).parts
    if parts == ("fsdurable.json",):
        return "manifest"
    if len(parts) == 2 and parts[0] in ("sessions", "markers") and parts[1].endswith(".json"):
        return parts[0][:-1]
    if len(parts) == 3 and parts[0] == "history" and parts[2].endswith(".json"):
        return "segment"  # history/<session id>/<first>-<digest>.json
    if len(parts) == 4 and parts[0] == "events" and parts[3].endswith(".jsonl"):
        return "event"  # events/<node>/<session id or @store>/<day>.jsonl
    raise AssertionError(f"the store wrote a file no schema covers: {rel}")


def run_workload(store: fsdurable.Store, root: Path) -> None:
    """Every path that writes: create, turns with ledger and tool calls, checkpoint, end, patch,
    save, cancel, abandon, delete, marker repair, quarantine of bad files, migration, events."""
    meta = {"title": "w\u00e9rk", "tags": ["a", "b"], "n": {"x": [1, 2.5, None, True]}}
    s = store.create("alpha", source="cli", route_key="chat:1", metadata=meta)
    s = store.begin_turn("alpha", "book it")
    turn = s.turn
    assert turn is not None
    call = ToolCall("c1", "book", {"when": "09:40", "seats": 2})
    s = store.checkpoint(attrs.evolve(s, messages=(*s.messages, Message("assistant", "", (call,)))),
                         phase="model_replied")
    entry = LedgerEntry("c1", "book", "external", f"alpha:{turn.id}:c1", "intent", store.clock())
    s = store.checkpoint(attrs.evolve(s, turn=attrs.evolve(turn, ledger=(entry,))),
                         phase="tool_intent")
    done = attrs.evolve(entry, status="done", outcome_at=store.clock(), result="seat 42")
    assert s.turn is not None
    s = store.checkpoint(attrs.evolve(s, turn=attrs.evolve(s.turn, ledger=(done,)),
                                      messages=(*s.messages, Message("tool", "seat 42",
                                                                     tool_call_id="c1"))),
                         phase="tools_done")
    s = store.end_turn(s, "Booked: seat 42.")
    s = store.patch("alpha", lambda cur: attrs.evolve(cur, summary="booked a train"))
    store.save(attrs.evolve(s, metadata={**s.metadata, "rating": 5}))

    store.create("beta")
    store.begin_turn("beta", "never mind")
    store.cancel("beta")

    store.create("gamma")
    g = store.begin_turn("gamma", "left in progress: its marker stays")

    store.create("delta")
    d = store.begin_turn("delta", "too old")
    assert d.turn is not None
    store.abandon_turn("delta", d.turn.id, reason="stale", age_s=99999.5)

    store.create("eps")
    store.delete("eps")

    store.create("zeta")
    store.begin_turn("zeta", "lost its marker")
    os.remove(root / "markers" / "zeta.json")
    assert _repair.repair_marker(store, "zeta").action == "wrote_marker"
    store.create("eta")
    (root / "markers" / "eta.json").write_bytes(
        _codec.encode_marker(Marker.of(attrs.evolve(g, id="eta", version=1), "node-test")))
    assert _repair.repair_marker(store, "eta").action == "removed_orphan"

    (root / "sessions" / "bad.json").write_bytes(b'{"format": "fsdurable.session/2", "id": ')
    with pytest.raises(UnreadableState):
        store.load("bad")
    assert _repair.repair_session(store, "bad").action == "quarantined"
    (root / "markers" / "ghost.json").write_bytes(b"\x00garbage")
    assert {m.session_id for m in store.interrupted()} == {"gamma", "zeta"}
    assert _repair.repair_marker(store, "ghost").action == "quarantined"

    shutil.copyfile(DATA / "session_v1.json", root / "sessions" / "legacy-chat_01.json")
    assert _repair.repair_session(store, "legacy-chat_01").action == "migrated"
    store.emit("custom_host_event", session_id="alpha", reason="test", note=["any", {"json": 1}])


def test_every_file_the_store_writes_validates(root: Path) -> None:
    with recording() as writes:  # a small inline tail: documents with one, and segments
        store = fsdurable.Store(root, config=fsdurable.Config(inline_tail_bytes=120))
        run_workload(store, root)

    # 1. every write as it happened, including markers and versions since replaced or removed
    counts = dict.fromkeys(KINDS, 0)
    for path, data in writes:
        kind = kind_of(root, path)
        if kind is None:
            continue
        assert_valid(kind, data, where=path)
        counts[kind] += 1
    assert counts["manifest"] == 1
    assert counts["session"] == 22 and counts["marker"] >= 6 and counts["event"] >= 15, counts
    assert counts["segment"] >= 3, counts
    inline = [d for p, d in writes if kind_of(root, p) == "session"
              and b'"inline":[' in d]
    assert len(inline) >= 3, counts

    # 2. the store directory as it is now
    found = dict.fromkeys(KINDS, 0)
    assert_valid("manifest", (root / "fsdurable.json").read_bytes())
    for sub in ("sessions", "markers"):
        for p in sorted((root / sub).iterdir()):
            assert_valid(sub[:-1], p.read_bytes(), where=str(p))
            found[sub[:-1]] += 1
    for p in sorted((root / "history").glob("*/*.json")):
        assert_valid("segment", p.read_bytes(), where=str(p))
        found["segment"] += 1
    assert found["segment"] >= 3
    codes = set()
    for p in sorted((root / "events").glob("*/*/*.jsonl")):
        for line in p.read_bytes().splitlines():
            assert_valid("event", line, where=str(p))
            codes.add(json.loads(line)["code"])
            found["event"] += 1
    assert found["session"] == 7 and found["marker"] == 2  # alpha..eta minus eps, + legacy
    assert found["event"] == counts["event"]
    assert {"turn_started", "turn_completed", "turn_cancelled", "interrupted_turn_abandoned",
            "session_deleted", "marker_repaired", "session_quarantined", "session_migrated",
            "custom_host_event"} <= codes
    assert len(list((root / "quarantine").iterdir())) == 2  # bad.json and ghost.json, kept


SITECUSTOMIZE = '''
import os
_log = os.environ.get("FSDURABLE_TEST_WRITE_LOG")
if _log:
    import base64
    import json
    from fsdurable import _fsio
    _pending = {}

    def _out(path, data):
        with open(os.path.join(_log, "%d.jsonl" % os.getpid()), "a") as f:
            f.write(json.dumps({"path": path, "data": base64.b64encode(data).decode()}) + "\\n")

    def _record(op, args):
        if op == "write":
            _pending[args[0]] = args[1]
        elif op in ("rename", "link") and args[0] in _pending:
            _out(args[1], _pending.pop(args[0]))
        elif op == "append":
            _out(args[0], args[1])

    _fsio.set_recorder(_record)
'''


def test_every_file_the_demo_processes_write_validates(tmp_path: Path) -> None:
    """The demo's real processes (turns with tools and ledger, SIGKILLs, recovery, abandons,
    review, cancel): every write of every process, recorded in that process, validates."""
    import base64
    import subprocess

    from .conftest import PYTHON, subprocess_env

    hook, log, root = tmp_path / "hook", tmp_path / "writes", tmp_path / "store"
    hook.mkdir()
    log.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = subprocess_env(FSDURABLE_TEST_WRITE_LOG=str(log),
                         FSDURABLE_STATE_DIR=str(tmp_path / "state"))
    env["PYTHONPATH"] = str(hook) + os.pathsep + env["PYTHONPATH"]
    p = subprocess.run([PYTHON, "-m", "fsdurable", "demo", "--json", "--keep", "--root",
                        str(root)], env=env, capture_output=True, text=True, timeout=240,
                       check=False)
    assert p.returncode == 0, p.stdout + p.stderr

    counts = dict.fromkeys(KINDS, 0)
    processes = sorted(log.iterdir())
    assert len(processes) >= 3  # the demo itself and its turn / recovery children
    for proc in processes:
        for rec in proc.read_text().splitlines():
            r = json.loads(rec)
            kind = kind_of(root, r["path"])
            if kind is not None:
                assert_valid(kind, base64.b64decode(r["data"]), where=r["path"])
                counts[kind] += 1
    assert counts["session"] >= 10 and counts["marker"] >= 3 and counts["event"] >= 10, counts
    # the demo's turns are small: their messages stay in each document's inline tail
    assert counts["segment"] >= 0, counts
    for sub in ("sessions", "markers"):
        for f in (root / sub).iterdir():
            assert_valid(sub[:-1], f.read_bytes(), where=str(f))
    for f in (root / "events").glob("*/*/*.jsonl"):
        for line in f.read_bytes().splitlines():
            assert_valid("event", line, where=str(f))
