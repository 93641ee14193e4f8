"""Validation of chat completion requests: what an OpenAI server would reject with 400."""

from __future__ import annotations

from itertools import chain
from typing import Any

import msgspec

from memci_proxy.wire.errors import ProxyError, bad_request

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# Roles whose message may come without content (OpenAI's API accepts a null there): an assistant's (its tool calls,
# refusal or reasoning are the message) and a legacy function result. A user, system, developer or tool message
# without content is a 400.
_CONTENT_OPTIONAL = frozenset({"assistant", "function"})
_decoder = msgspec.json.Decoder()
_fields_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
# Deeper JSON is refused with a 400: nothing legitimate nests that deep (tool schemas stay far below), and
# Python's recursion limit (about 1000 frames, shared with the proxy's own calls) must never be reached.
MAX_JSON_DEPTH = 256


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests containers more than ``limit`` deep: one nesting level at a time, the level's children
    gathered by one comprehension over C iterators (no recursion, no Python call per container: a long chat's 1,200
    messages are one pass over their values)."""
    level = [value]
    for _ in range(limit):
        dicts = [item for item in level if type(item) is dict]
        children = chain.from_iterable(map(dict.values, dicts))
        if len(dicts) < len(level):  # and lists
            children = chain(children, chain.from_iterable([item for item in level if type(item) is list]))
        level = [c for c in children if type(c) is dict or type(c) is list]
        if not level:
            return False
    return True


_INVALID_UTF8 = "Invalid UTF-8"  # msgspec's DecodeError for a string whose bytes are not UTF-8


def decode_json(body: bytes, decoder: msgspec.json.Decoder = _decoder) -> Any:
    """The one place a request body is decoded: 400 ``invalid_request_error`` for an empty body, bytes that are
    not UTF-8, malformed JSON, JSON nested more than MAX_JSON_DEPTH levels, or (with a typed decoder) a body of
    another shape than the decoder's."""
    if not body:
        raise bad_request("request body is empty; expected a JSON object", code="invalid_json")
    try:
        return decoder.decode(body)
    except UnicodeDecodeError:
        raise not_utf8() from None
    except msgspec.ValidationError:
        raise bad_request("request body must be a JSON object", code="invalid_json") from None
    except msgspec.DecodeError as exc:
        if _INVALID_UTF8 in str(exc):  # msgspec's own check of a string's bytes: the same fault as the one above
            raise not_utf8() from None
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise _too_deep_error() from None


def not_utf8() -> ProxyError:
    return bad_request("request body is not valid UTF-8 (JSON is UTF-8: RFC 8259)", code="invalid_encoding")


def require_utf8(body: bytes, content_type: str) -> None:
    """400 for a body whose bytes are not UTF-8: what the proxy forwards without decoding (every /v1 body is JSON)
    is held to the rule of what it decodes. File uploads (multipart, octet-stream) pass as they are."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind.startswith("multipart/") or kind == "application/octet-stream":
        return
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        raise not_utf8() from None


def stored_text(value: object, param: str, limit: int = 4096) -> str:
    """A client's string that the proxy looks up or stores as text (an id, a name): 400 unless it is a string of at
    most ``limit`` characters without NUL (which PostgreSQL text cannot hold)."""
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise bad_request(f"'{param}' must be text of at most {limit} characters, without NUL", param=param)
    return value


def _too_deep_error() -> ProxyError:
    return bad_request(f"request body nests JSON more than {MAX_JSON_DEPTH} levels deep", code="invalid_json")


def _check_depth(body: bytes, data: Any) -> None:
    # Depth cannot exceed the number of brackets, nor half the body's bytes. Counting brackets costs more than the walk
    # on a large body (a millisecond for 1 MB against 0.3 ms to walk its 1,200 messages), so only the length is read.
    if len(body) > 2 * MAX_JSON_DEPTH and _too_deep(data, MAX_JSON_DEPTH):
        raise _too_deep_error()


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a dict; 400 for an empty, malformed, non-UTF-8, non-object or too deeply nested body."""
    data = decode_json(body)
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    _check_depth(body, data)
    return data


def parse_chat_body(body: bytes) -> tuple[dict[str, Any], dict[str, msgspec.Raw]]:
    """The body as a JSON object, and the bytes of each top-level value exactly as sent (``messages`` among them),
    in one parse: the top level is split into raw fields first, then each field is decoded once."""
    fields = decode_json(body, _fields_decoder)
    data = {name: decode_json(raw) for name, raw in fields.items()}
    _check_depth(body, data)
    return data, fields



def validate_chat_request(data: dict[str, Any]) -> None:
    """Raise ProxyError(400) for requests an OpenAI server rejects before running the model."""
    messages = data.get("messages")
    if messages is None:
        raise bad_request("'messages' is a required property", param="messages", code="missing_required_parameter")
    if not isinstance(messages, list):
        raise bad_request("'messages' must be an array", param="messages")
    if not messages:
        raise bad_request("'messages' must contain at least one message", param="messages")
    for i, message in enumerate(messages):  # the error's text is built only on an error: this loop is per message
        if type(message) is not dict and not isinstance(message, dict):
            raise bad_request(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_request(
                f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}; got {role!r}", param=f"messages[{i}].role"
            )
        content = message.get("content")
        if content is None:
            if role not in _CONTENT_OPTIONAL:
                raise bad_request(f"messages[{i}].content is required for role '{role}'",
                                  param=f"messages[{i}].content", code="missing_required_parameter")
        elif type(content) is not str and not isinstance(content, (str, list)):
            raise bad_request(f"messages[{i}].content must be a string or an array of parts",
                              param=f"messages[{i}].content")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise bad_request(f"messages[{i}].tool_call_id is required for role 'tool'",
                              param=f"messages[{i}].tool_call_id")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream")
    if data.get("stream_options") is not None and not stream:
        raise bad_request(
            "'stream_options' is only allowed when 'stream' is true", param="stream_options", code="invalid_value"
        )
    n = data.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise bad_request("'n' must be an integer >= 1", param="n")
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("'tools' must be an array", param="tools")


__all__ = ["ProxyError", "decode_json", "parse_chat_body", "parse_json_object", "require_utf8", "stored_text",
           "validate_chat_request", "ROLES"]
