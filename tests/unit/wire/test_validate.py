import pytest
from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.wire.errors import ProxyError
from memci_proxy.wire.validate import parse_json_object, validate_chat_request


def ok(**kw):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}


def test_valid_request_passes():
    validate_chat_request(ok())
    validate_chat_request(ok(stream=True, stream_options={"include_usage": True}, n=2, tools=[], unknown_field=1))


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m"}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [1]}, "messages[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": [], "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": {"a": 1}, "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        (ok(stream_options={"include_usage": True}), "stream_options"),
        (ok(stream=False, stream_options={"include_usage": True}), "stream_options"),
        (ok(stream="yes"), "stream"),
        (ok(n=0), "n"),
        (ok(tools={}), "tools"),
    ],
)
def test_invalid_requests_are_400_with_param(body, param):
    with pytest.raises(ProxyError) as err:
        validate_chat_request(body)
    assert err.value.status == 400
    assert err.value.param == param


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,2]", b"nul", b'"text"'])
def test_bad_json_is_400(raw):
    with pytest.raises(ProxyError) as err:
        parse_json_object(raw)
    assert err.value.status == 400
    assert err.value.code == "invalid_json"


@pytest.mark.parametrize("depth", [10, 256, 257, 900, 5000, 200_000])
def test_deeply_nested_bodies_are_a_400_at_any_depth(depth):
    from memci_proxy.wire.validate import MAX_JSON_DEPTH

    body = b'{"messages": [{"role": "user", "content": "hi"}], "metadata": ' + b"[" * depth + b"]" * depth + b"}"
    if depth + 1 <= MAX_JSON_DEPTH:
        assert parse_json_object(body)["metadata"]
        return
    with pytest.raises(ProxyError) as info:
        parse_json_object(body)
    assert info.value.status == 400 and "levels deep" in info.value.message


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=3),
                            lambda children: st.lists(children, max_size=3)
                            | st.dictionaries(st.text(max_size=2), children, max_size=3), max_leaves=40)


@given(value=_json_values, limit=st.integers(min_value=1, max_value=8))
def test_the_depth_check_agrees_with_the_nesting_depth(value, limit):
    from memci_proxy.wire.validate import _too_deep

    if isinstance(value, (dict, list)):
        assert _too_deep(value, limit) == (_depth(value) > limit)
