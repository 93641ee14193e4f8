"""Lone surrogates through the proxy's internal form (memci_proxy.wire.unpaired): any JSON a client sends decodes with
msgspec after ``to_internal``, and msgspec's encoding of it, after ``to_wire``, is the same JSON value again."""

from __future__ import annotations

import json

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.wire.unpaired import ESCAPE, to_internal, to_wire

text = st.text(alphabet=st.one_of(st.characters(), st.sampled_from(["\ud800", "\udfff", ESCAPE, "\\", "u", "d", "8"])))


@given(value=st.recursive(text, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                          max_leaves=6),
       ascii_only=st.booleans())
def test_any_json_round_trips_through_the_internal_form(value, ascii_only):
    sent = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    if not ascii_only:
        try:
            sent.decode("utf-8")
        except UnicodeDecodeError:
            return  # raw surrogates are not UTF-8: not JSON a client can send
    internal = msgspec.json.decode(to_internal(sent))
    assert json.loads(to_wire(msgspec.json.encode(internal))) == json.loads(sent)


def test_ordinary_bodies_are_left_alone():
    body = '{"messages": [{"role": "user", "content": "héllo \\ud83d\\ude00 \\\\ud800"}]}'.encode()
    assert msgspec.json.decode(to_internal(body)) == json.loads(body)
    plain = b'{"a": "b"}'
    assert to_internal(plain) is plain and to_wire(plain) is plain


async def test_an_upstream_stream_is_rewritten_whole_escapes_at_a_time():
    """An escape cut between two reads of the upstream's stream is rewritten as if it had come in one piece."""
    from memci_proxy.upstream.unpaired_answer import InternalTextResponse

    events = b'data: {"choices": [{"delta": {"content": "a\\ud800 b"}}]}\n\ndata: [DONE]\n\n'

    class Content:
        async def iter_any(self):
            for i in range(0, len(events), 7):  # "\ud800" falls across two pieces
                yield events[i:i + 7]

    class Response:
        status, headers, content = 200, {}, Content()

    got = b"".join([piece async for piece in InternalTextResponse(Response()).content.iter_any()])
    assert got == to_internal(events) and got != events
