"""Requests the proxy refuses itself, through the running app: each a 4xx naming the client's own param, in the
shape of the client's API (Anthropic's on /v1/messages, also for what the middleware answers), never a 5xx."""

from __future__ import annotations

import httpx
import pytest

ADMIN = "admin-key-request-checks"
MAX_MESSAGES = 50
MAX_BODY = 200_000
KEY = {"Authorization": "Bearer sk-checks"}


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(4096, env={"MEMCI_ADMIN_KEY": ADMIN, "MEMCI_MAX_MESSAGES": str(MAX_MESSAGES),
                                         "MEMCI_MAX_BODY_BYTES": str(MAX_BODY)})


def post(proxy, path: str, body: dict | None = None, headers: dict | None = None, content: bytes | None = None
         ) -> httpx.Response:
    return httpx.post(proxy.url + path, json=body, content=content, headers=headers or KEY, timeout=30)


def openai_error(r: httpx.Response, status: int, param: str | None) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["param"] == param, error
    return error["message"]


def anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return body["error"]["message"]


@pytest.mark.parametrize("item, param", [
    ({"type": "reasoning", "summary": 7}, "input[0].summary"),
    ({"type": "reasoning", "summary": [7]}, "input[0].summary[0]"),
    ({"type": "reasoning", "content": [{"type": "reasoning_text", "text": 7}]}, "input[0].content[0].text"),
    ({"type": "function_call", "call_id": "c1", "name": 5, "arguments": "{}"}, "input[0].name"),
    ({"type": "function_call", "call_id": ["c1"], "name": "f", "arguments": "{}"}, "input[0].call_id"),
    ({"type": "function_call", "call_id": "c1", "name": "f", "arguments": {"a": 1}}, "input[0].arguments"),
    ({"type": "custom_tool_call", "call_id": "c1", "name": "f", "input": 3}, "input[0].input"),
    ({"type": "function_call_output", "call_id": 9, "output": "ok"}, "input[0].call_id"),
    ({"role": "user", "content": [{"type": "input_text", "text": 5}]}, "input[0].content[0].text"),
    ({"role": "user", "content": [5]}, "input[0].content[0]"),
    ({"role": "assistant", "content": [{"type": "output_text", "text": {"t": 1}}]}, "input[0].content[0].text"),
])
def test_responses_items_of_the_wrong_type_are_a_400_naming_the_param(proxy, item, param):
    r = post(proxy, "/v1/responses", {"model": "m", "input": [item]})
    assert param in openai_error(r, 400, param)


def test_responses_errors_name_responses_params(proxy):
    message = openai_error(post(proxy, "/v1/responses", {"model": "m", "input": []}), 400, "input")
    assert "'input'" in message and "messages" not in message
    many = [{"role": "user", "content": f"m{i}"} for i in range(MAX_MESSAGES + 1)]
    message = openai_error(post(proxy, "/v1/responses", {"model": "m", "input": many}), 400, "input")
    assert f"at most {MAX_MESSAGES}" in message


def test_chat_messages_need_content_unless_they_call_tools(proxy):
    for role, extra in (("user", {}), ("system", {}), ("tool", {"tool_call_id": "c1"})):
        r = post(proxy, "/v1/chat/completions", {"model": "m", "messages": [{"role": role, **extra}]})
        assert "content" in openai_error(r, 400, "messages[0].content")
    calls = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    r = post(proxy, "/v1/chat/completions", {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "go [[len:2]]"}, calls, {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
    assert r.status_code == 200, r.text


def test_messages_errors_name_the_param_in_anthropics_shape(proxy):
    base = {"model": "m", "max_tokens": 8}
    message = anthropic_error(post(proxy, "/v1/messages", {**base, "messages": [None]}), 400, "invalid_request_error")
    assert message.startswith("messages.0: each message must be an object")
    tool = {"name": 5, "input_schema": {"type": "object"}}
    r = post(proxy, "/v1/messages", {**base, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]})
    assert "tools.0.name" in anthropic_error(r, 400, "invalid_request_error")


def test_messages_errors_of_the_middleware_are_in_anthropics_shape(proxy):
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        anthropic_error(post(proxy, path, body, headers={"x-api-key": ADMIN}), 401, "authentication_error")
        big = {**body, "messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}]}
        anthropic_error(post(proxy, path, big), 413, "request_too_large")


def test_count_tokens_has_the_limits_of_a_chat_request(proxy):
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "m"} for i in range(MAX_MESSAGES + 1)]
    r = post(proxy, "/v1/messages/count_tokens", {"model": "m", "messages": many})
    assert f"at most {MAX_MESSAGES}" in anthropic_error(r, 400, "invalid_request_error")
    r = post(proxy, "/v1/messages/count_tokens", {"model": "m", "messages": many[:MAX_MESSAGES - 1]})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


def test_a_wrong_admin_key_is_told_apart_from_a_missing_one(proxy):
    url = proxy.url + "/memci/conversations/x/prompt"
    wrong = httpx.get(url, headers={"Authorization": "Bearer not-the-admin-key"}, timeout=10)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_admin_key"
    assert "invalid admin key" in wrong.json()["error"]["message"]
    missing = httpx.get(url, timeout=10)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_admin_key"
    assert "admin key required" in missing.json()["error"]["message"]
