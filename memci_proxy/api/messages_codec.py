"""Anthropic's Messages API as a codec: a `/v1/messages` body in, the chat-completions body the turn service takes
out; a chat completion in, the Message out; errors in Anthropic's shape.

Deterministic like the Responses codec: a conversation resent turn after turn gives the same chat messages byte for
byte (tool_use inputs are written as JSON the same way every time), so the upstream's cached prefix survives.
`cache_control` is accepted and dropped: the proxy's own prompt layout decides what the upstream caches.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgspec

from memci_proxy.wire.chunks import Completion, text_of_parts, usage_numbers
from memci_proxy.wire.errors import ProxyError, bad_request

_encode = msgspec.json.Encoder().encode
# Fields of a Messages request the codec consumes; every other field passes through to the upstream unchanged.
_CONSUMED = frozenset({
    "system", "messages", "tools", "tool_choice", "max_tokens", "stop_sequences", "stream", "metadata", "thinking",
    "cache_control", "service_tier", "container", "mcp_servers", "context_management", "output_format", "output_config",
})
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                 "content_filter": "refusal"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def arguments_of(value: Any) -> str:
    """A tool_use input as the chat tool call's arguments: JSON, written the same way every time."""
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------------------- input
def system_text(system: Any) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    if isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in system):
        return "\n\n".join(str(b.get("text") or "") for b in system)
    raise bad_request("'system' must be a string or an array of text blocks", param="system")


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise bad_request("'messages' must be an array", param="messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"messages.{i}: each message must be an object with a role and content",
                              param=f"messages.{i}")
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise bad_request(f"messages.{i}.role: must be 'user', 'assistant' or 'system'", param=f"messages.{i}.role")
        content = message.get("content")
        if role == "system":  # Claude Code's reminders mid-conversation: kept in place, byte for byte
            out.append({"role": "system", "content": system_text(content)})
        elif isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out.extend(_assistant(content, i) if role == "assistant" else _user(content, i))
        else:
            raise bad_request(f"messages.{i}.content: must be a string or an array of content blocks",
                              param=f"messages.{i}.content")
    return out


def _blocks(content: list[Any], i: int) -> list[dict[str, Any]]:
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad_request(f"messages.{i}.content.{j}: a content block must be an object with a type",
                              param=f"messages.{i}.content.{j}")
    return content


def _assistant(content: list[Any], i: int) -> list[dict[str, Any]]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, i)):
        kind = block["type"]
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking") or ""))
        elif kind == "redacted_thinking":
            continue  # opaque to any engine but Anthropic's
        elif kind == "tool_use":
            calls.append({"id": str(block.get("id") or ""), "type": "function", "function": {
                "name": str(block.get("name") or ""), "arguments": arguments_of(block.get("input"))}})
        else:
            raise _unsupported(kind, i, j)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return [message]


def _user(content: list[Any], i: int) -> list[dict[str, Any]]:
    """Tool results first (as tool messages, in order), then the rest of the user's blocks as one user message."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, i)):
        kind = block["type"]
        if kind == "tool_result":
            inner = block.get("content")
            text = inner if isinstance(inner, str) else text_of_parts(inner)
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": str(block.get("text") or "")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), i, j)}})
        else:
            raise _unsupported(kind, i, j)
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        results.append({"role": "user", "content": parts[0]["text"] if only_text else parts})
    return results


def _image_url(source: Any, i: int, j: int) -> str:
    if isinstance(source, dict) and source.get("type") == "base64" and source.get("data"):
        return f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
    if isinstance(source, dict) and source.get("type") == "url" and source.get("url"):
        return str(source["url"])
    raise bad_request(f"messages.{i}.content.{j}.source: an image needs a base64 or url source",
                      param=f"messages.{i}.content.{j}.source")


def _unsupported(kind: str, i: int, j: int) -> ProxyError:
    return bad_request(f"messages.{i}.content.{j}: content blocks of type {kind!r} are not supported by this proxy "
                       "(text, image, tool_use, tool_result and thinking are)", param=f"messages.{i}.content.{j}.type")


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom") or not tool.get("name"):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise bad_request(f"tools.{i}: only client tools (name, input_schema) are supported by this proxy "
                              f"(got type {kind!r})", param=f"tools.{i}")
        _typed(tool, "name", str, "a string", f"tools.{i}")
        _typed(tool, "description", str, "a string", f"tools.{i}")
        _typed(tool, "input_schema", dict, "an object (a JSON schema)", f"tools.{i}")
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        function["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def _typed(value: dict[str, Any], key: str, kind: type, what: str, where: str) -> None:
    if value.get(key) is not None and not isinstance(value[key], kind):
        raise bad_request(f"{where}.{key}: must be {what}", param=f"{where}.{key}")


def _tool_choice(choice: Any) -> tuple[Any, bool]:
    """(chat tool_choice, parallel tool calls allowed)."""
    if not isinstance(choice, dict):
        raise bad_request("'tool_choice' must be an object", param="tool_choice")
    kind = choice.get("type")
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool":
        mapped = {"type": "function", "function": {"name": choice.get("name")}}
    if mapped is None:
        raise bad_request("tool_choice.type must be auto, any, tool or none", param="tool_choice.type")
    return mapped, not choice.get("disable_parallel_tool_use")


def chat_request(data: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions body of a Messages request."""
    max_tokens = data.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise bad_request("max_tokens: a positive integer is required", param="max_tokens")
    chat = {k: v for k, v in data.items() if k not in _CONSUMED}
    chat["messages"] = prompt_messages(data)
    chat["max_tokens"] = max_tokens
    if data.get("tools"):
        chat["tools"] = chat_tools(data["tools"])
    if data.get("tool_choice") is not None:
        chat["tool_choice"], parallel = _tool_choice(data["tool_choice"])
        if not parallel:
            chat["parallel_tool_calls"] = False
    if isinstance(data.get("stop_sequences"), list) and data["stop_sequences"]:
        chat["stop"] = data["stop_sequences"]
    metadata = data.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    effort = reasoning_effort(data)
    if effort is not None:
        chat["reasoning_effort"] = effort
    if data.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# A thinking budget as chat's reasoning_effort: under 4,096 tokens low, under 16,384 medium, else high.
_EFFORT_BUDGETS = ((4096, "low"), (16384, "medium"))
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


def reasoning_effort(data: dict[str, Any]) -> str | None:
    """Chat's ``reasoning_effort`` for a Messages request: ``output_config.effort`` when set, else the budget of
    ``thinking`` when it is enabled; None when neither asks for reasoning (the engine's default then)."""
    config = data.get("output_config")
    effort = config.get("effort") if isinstance(config, dict) else None
    if isinstance(effort, str) and effort in _EFFORTS:
        return _EFFORTS[effort]
    thinking = data.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        return None
    return next((name for limit, name in _EFFORT_BUDGETS if budget < limit), "high")


def prompt_messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    if "messages" not in data:
        raise bad_request("messages: Field required", param="messages")
    system = system_text(data.get("system"))
    return [*([{"role": "system", "content": system}] if system else []), *chat_messages(data["messages"])]


# --------------------------------------------------------------------------------------------------------- output
def message_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic counts the cached part of the prompt apart: input_tokens is what was not read from the cache."""
    prompt, cached, completion = usage_numbers(usage)
    return {"input_tokens": max(0, prompt - cached), "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": completion}


def stop_reason(finish_reason: str | None) -> str | None:
    return _STOP_REASONS.get(finish_reason or "", "end_turn") if finish_reason else None


def tool_input(arguments: str) -> Any:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"_arguments": arguments}  # the model wrote something that is not JSON: kept, not lost
    return value if isinstance(value, dict) else {"value": value}


def message_of(done: Completion, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if done.reasoning:
        content.append({"type": "thinking", "thinking": done.reasoning, "signature": ""})
    if done.content or not done.tool_calls:
        content.append({"type": "text", "text": done.content})
    for index in sorted(done.tool_calls):
        call = done.tool_calls[index]
        content.append({"type": "tool_use", "id": call.id or new_id("toolu"), "name": call.name,
                        "input": tool_input(call.arguments)})
    return {"id": new_id("msg"), "type": "message", "role": "assistant", "model": done.model or model,
            "content": content, "stop_reason": stop_reason(done.finish_reason) or "end_turn", "stop_sequence": None,
            "usage": message_usage(done.usage)}


def error_body(status: int, message: str) -> bytes:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return _encode({"type": "error", "error": {"type": kind, "message": message}})


def error_of_openai(status: int, body: bytes) -> bytes:
    """An OpenAI-style error body (the upstream's, or the proxy's own) in Anthropic's shape."""
    try:
        decoded = msgspec.json.decode(body)
        error = decoded.get("error") if isinstance(decoded, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
    except msgspec.DecodeError:
        message = None
    return error_body(status, str(message or body.decode("utf-8", "replace")[:500] or f"status {status}"))
