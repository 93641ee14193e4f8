from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.wire.sse import SSESplitter, event_data
from memci_proxy.upstream.relay import usage_of_event

events = st.lists(
    st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), min_size=1, max_size=40),
    min_size=1,
    max_size=20,
)


@given(events, st.lists(st.integers(min_value=1, max_value=17), min_size=1, max_size=50))
def test_splitter_recovers_events_whatever_the_chunking(payloads, cuts):
    raw = b"".join(b"data: " + p.encode() + b"\n\n" for p in payloads)
    splitter = SSESplitter()
    got: list[bytes] = []
    pos = 0
    i = 0
    while pos < len(raw):
        step = cuts[i % len(cuts)]
        got.extend(splitter.feed(raw[pos : pos + step]))
        pos += step
        i += 1
    assert splitter.rest() == b""
    assert [event_data(e) for e in got] == [p.encode() for p in payloads]


def test_crlf_and_comments():
    s = SSESplitter()
    out = s.feed(b": keep-alive\r\n\r\ndata: {\"a\":1}\r\n\r\ndata: [DONE]\r\n\r\n")
    assert [event_data(e) for e in out] == [None, b'{"a":1}', b"[DONE]"]


def test_usage_of_event():
    ev = b'data: {"choices":[],"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}}\n\n'
    assert usage_of_event(ev) == {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}
    assert usage_of_event(b'data: {"choices":[]}\n\n') is None
    assert usage_of_event(b'data: {"usage": null}\n\n') is None
    assert usage_of_event(b'data: not json "usage"\n\n') is None
