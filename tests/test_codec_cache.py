"""The session encoder's message cache (``_codec._MessageCache``) never changes a byte.

Every encoding through the cache must equal the plain encoding of the same session
(``orjson.dumps(session_to_dict(s))``), whatever happened before: messages appended, replaced,
reordered, the same objects in another session, and a tool call's ``arguments`` dict mutated in
place after it was encoded (the one mutable thing a frozen message can hold).
"""

from __future__ import annotations

import attrs
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from fsdurable import _codec
from fsdurable._model import Message, Session, ToolCall

from .codec_strategies import messages, sessions


def plain(s: Session) -> bytes:
    return orjson.dumps(_codec.session_to_dict(s), option=orjson.OPT_APPEND_NEWLINE)


def check(s: Session) -> None:
    assert _codec.encode_session(s) == plain(s)


@settings(max_examples=50, deadline=None)
@given(sessions(), st.lists(st.lists(messages, max_size=4), max_size=5), st.data())
def test_growing_and_edited_transcripts_encode_like_the_plain_path(
    s: Session, batches: list[list[Message]], data: st.DataObject
) -> None:
    _codec._message_cache.clear()
    check(s)
    for batch in batches:
        op = data.draw(st.sampled_from(["append", "replace", "drop", "reverse", "other_id"]))
        msgs = s.messages
        if op == "append":
            msgs = msgs + tuple(batch)
        elif op == "replace" and msgs:
            i = data.draw(st.integers(0, len(msgs) - 1))
            msgs = msgs[:i] + tuple(batch) + msgs[i + 1:]
        elif op == "drop":
            msgs = msgs[: len(msgs) // 2]
        elif op == "reverse":
            msgs = msgs[::-1]
        else:
            s = attrs.evolve(s, id=s.id + "x")
        s = attrs.evolve(s, messages=msgs, version=s.version + 1)
        check(s)
        check(s)  # the second time comes from the cache


def test_mutated_tool_call_arguments_are_re_encoded() -> None:
    _codec._message_cache.clear()
    call = ToolCall(id="c1", name="read_file", arguments={"path": "a"})
    s = Session(id="s", version=1, messages=(Message("user", "hi"),
                                             Message("assistant", "", tool_calls=(call,))))
    check(s)
    call.arguments["path"] = "b"  # frozen message, mutable dict inside
    assert b'"path":"b"' in _codec.encode_session(s)
    check(s)


def test_cache_is_bounded() -> None:
    _codec._message_cache.clear()
    cache = _codec._message_cache
    msgs = (Message("user", "x" * 1000),)
    for i in range(cache.MAX_SESSIONS * 3):
        check(Session(id=f"s{i}", version=1, messages=msgs))
    assert len(cache._entries) == cache.MAX_SESSIONS
    assert cache._bytes == sum(len(e[1]) for e in cache._entries.values())
    assert cache._bytes <= cache.MAX_BYTES
    last = f"s{cache.MAX_SESSIONS * 3 - 1}"
    cache.discard(last)
    assert last not in cache._entries
    assert cache._bytes == sum(len(e[1]) for e in cache._entries.values())
    _codec._message_cache.clear()
    assert cache._bytes == 0 and not cache._entries


def test_threads_encoding_one_session_keep_the_accounting_exact() -> None:
    """Two threads encoding one session race between taking its entry and putting theirs back;
    the loser's entry must not stay counted. A tiny switch interval makes the race likely."""
    import sys
    import threading

    cache = _codec._message_cache
    base = tuple(Message("user", f"m{i}" * 50) for i in range(50))

    def work(k: int) -> None:
        msgs = base
        for j in range(30):
            msgs = (*msgs, Message("assistant", f"{k}-{j}"))
            _codec.encode_session(Session(id="shared", version=j + 1, messages=msgs))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(8):
            cache.clear()
            threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert cache._bytes == sum(len(e[1]) for e in cache._entries.values())
    finally:
        sys.setswitchinterval(interval)
        cache.clear()
