"""Every request body is decoded in one place (memci_proxy.wire.validate.decode_json): bad bytes are a 400
``invalid_request_error``, never an exception of the decoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memci_proxy.wire.errors import ProxyError
from memci_proxy.wire.validate import parse_chat_body, parse_json_object, require_utf8, stored_text

NOT_UTF8 = [b'{"a":"caf\xe9"}', b'{"\xc3\x28":1}', b"\xff", b'{"messages":"\xed\xa0\x80"}', b'{"a":"\xf4\x90\x80\x80"}',
            b"\xef\xbb\xbf{}"[:2] + b"{}", b'{"messages":[{"role":"user","content":"\x80"}]}']


@pytest.mark.parametrize("body", NOT_UTF8)
@pytest.mark.parametrize("parse", [parse_json_object, parse_chat_body])
def test_bytes_that_are_not_utf8_are_a_400(parse, body):
    with pytest.raises(ProxyError) as info:
        parse(body)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"


@given(st.binary(max_size=64) | st.text(max_size=20).map(lambda t: t.encode("utf-16")))
@settings(max_examples=300, deadline=None)
def test_any_bytes_give_a_dict_or_a_400(body):
    for parse in (parse_json_object, parse_chat_body):
        try:
            parse(body)
        except ProxyError as exc:
            assert exc.status == 400


def test_forwarded_bodies_must_be_utf8_unless_they_are_uploads():
    for content_type in ("application/json", "", "text/plain", "application/json; charset=utf-16"):
        with pytest.raises(ProxyError) as info:
            require_utf8(b'{"input":"\xff"}', content_type)
        assert info.value.code == "invalid_encoding"
    require_utf8(b'{"input":"ok \xc3\xa9"}', "application/json")
    require_utf8(b"\xff\xd8\xff", "multipart/form-data; boundary=x")
    require_utf8(b"\xff\xd8\xff", "application/octet-stream")


def test_stored_text_refuses_nul_and_long_values():
    assert stored_text("c123", "id") == "c123"
    for value in ("a\x00b", "x" * 300, 5, None):
        with pytest.raises(ProxyError) as info:
            stored_text(value, "id", 256)
        assert info.value.status == 400 and info.value.param == "id"



@pytest.mark.parametrize("body", [b'{"model":"m","messages":[{"role":"user","content":"caf\xe9"}]}',
                                  b'{"messages":[],"stream":true,"x":"\xff\xfe"}', b'{"\xc3\x28":1}',
                                  b'{"query":"\xed\xa0\x80"}'])
def test_a_string_whose_bytes_are_not_utf8_is_invalid_encoding_on_every_parse(body):
    for parse in (parse_json_object, parse_chat_body):
        with pytest.raises(ProxyError) as info:
            parse(body)
        assert (info.value.status, info.value.code) == (400, "invalid_encoding")


def test_malformed_json_stays_invalid_json():
    for body in (b"\xff", b'{"a":', b'{"a" 1}'):
        with pytest.raises(ProxyError) as info:
            parse_json_object(body)
        assert info.value.code == "invalid_json"
