"""The Responses API as a codec: a `/v1/responses` body in, the chat-completions body the turn service takes out;
a chat completion in, the Response object out.

The translation is deterministic: the same items give the same messages byte for byte, so a client that resends its
`input` (or the proxy's own chain behind `previous_response_id`) continues the same conversation, and the upstream's
cached prefix survives. An answer's output items, resent as input, give back the assistant message the answer came
from (text and function calls in one message).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import xxhash

from memci_proxy.wire.chunks import Completion, text_of_parts, usage_numbers
from memci_proxy.wire.errors import bad_request

# Fields of a Responses request the codec consumes; every other field passes through to the upstream unchanged.
_CONSUMED = frozenset({
    "input", "instructions", "tools", "tool_choice", "max_output_tokens", "previous_response_id", "store",
    "include", "truncation", "background", "text", "reasoning", "stream", "stream_options", "conversation",
})
_ROLES = ("user", "assistant", "system", "developer")
# Tools the API's host runs itself: an engine behind chat completions cannot, so they are not offered to the model.
_CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string", "description": "The tool's input, "
                                                               "as free text."}}, "required": ["input"]}
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")  # what a function name may not hold
_HOSTED_TOOLS = ("web_search", "file_search", "code_interpreter", "image_generation", "computer_use", "mcp",
                 "local_shell")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------------------------------------- input
def input_messages(value: Any, names: ToolNames | None = None) -> list[dict[str, Any]]:
    """A request's `input` (a string, or a list of items) as chat-completions messages; ``names``: the upstream
    names of namespaced functions (``tool_names``), for calls that name their namespace."""
    if value is None:
        raise bad_request("'input' is a required property", param="input", code="missing_required_parameter")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad_request("'input' must be a string or an array of input items", param="input")
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []  # reasoning items wait for the assistant message they precede
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad_request(f"input[{i}] must be an object", param=f"input[{i}]")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise bad_request(f"input[{i}].role must be one of {', '.join(_ROLES)}", param=f"input[{i}].role")
            message: dict[str, Any] = {"role": role, "content": _content(item.get("content"), role, i)}
            if role == "assistant" and reasoning:
                message["reasoning_content"] = "".join(reasoning)
                reasoning = []
            messages.append(message)
        elif kind in ("function_call", "custom_tool_call"):  # a freeform tool's text: its one argument `input`
            custom = kind == "custom_tool_call"
            arguments = (custom_arguments(_text(item, "input", i)) if custom else _text(item, "arguments", i))
            call_id = _text(item, "call_id", i) or _text(item, "id", i)
            name = _text(item, "name", i)
            namespace = item.get("namespace")
            if names and isinstance(namespace, str):
                name = names.get((namespace, name), name)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and not reasoning:
                last.setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    message["reasoning_content"] = "".join(reasoning)
                    reasoning = []
                messages.append(message)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": _text(item, "call_id", i),
                             "content": output if isinstance(output, str) else _tool_output(output, i)})
        elif kind == "reasoning":
            reasoning.append(_reasoning_text(item, i))
        else:
            raise bad_request(f"input[{i}]: items of type {kind!r} are not supported by this proxy (message, "
                              "function_call, custom_tool_call, their outputs and reasoning are)", param=f"input[{i}].type",
                              code="unsupported_value")
    if reasoning:  # reasoning with nothing after it: kept on an empty assistant message
        messages.append({"role": "assistant", "content": "", "reasoning_content": "".join(reasoning)})
    return messages


def _content(content: Any, role: str, i: int) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"input[{i}].content must be a string or an array of content parts",
                          param=f"input[{i}].content")
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise bad_request(f"input[{i}].content[{j}] must be an object", param=f"input[{i}].content[{j}]")
    if role == "assistant":  # output_text / refusal parts: one string, as a chat completion answers
        return "".join(_text(p, "text", i, f".content[{j}]") or _text(p, "refusal", i, f".content[{j}]")
                       for j, p in enumerate(content))
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": _text(part, "text", i, f".content[{j}]")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise bad_request(f"input[{i}]: an input_image needs an image_url (file_id is not supported)",
                                  param=f"input[{i}].content")
            image: dict[str, Any] = {"url": url}
            if part.get("detail") and part["detail"] != "auto":
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            parts.append({"type": "file", "file": {k: v for k, v in part.items() if k != "type"}})
        else:
            raise bad_request(f"input[{i}]: content parts of type {kind!r} are not supported",
                              param=f"input[{i}].content", code="unsupported_value")
    return parts


def _tool_output(output: Any, i: int) -> str:
    if isinstance(output, list):
        return text_of_parts(output)
    raise bad_request(f"input[{i}].output must be a string or an array of content parts", param=f"input[{i}].output")


def _reasoning_text(item: dict[str, Any], i: int) -> str:
    texts = _part_texts(item, "content", i)
    if not any(texts):
        texts = _part_texts(item, "summary", i)
    return "\n".join(texts)


def _part_texts(item: dict[str, Any], key: str, i: int) -> list[str]:
    """The texts of a reasoning item's ``content`` or ``summary``: an array of objects with a string ``text``."""
    parts = item.get(key)
    if parts is None:
        return []
    if not isinstance(parts, list):
        raise bad_request(f"input[{i}].{key} must be an array of objects", param=f"input[{i}].{key}")
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise bad_request(f"input[{i}].{key}[{j}] must be an object", param=f"input[{i}].{key}[{j}]")
    return [_text(part, "text", i, f".{key}[{j}]") for j, part in enumerate(parts)]


def _text(item: dict[str, Any], key: str, i: int, where: str = "") -> str:
    """An input item's string field (``where``: the path to ``item`` inside input[i]); absent or null: ""."""
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        param = f"input[{i}]{where}.{key}"
        raise bad_request(f"{param} must be a string, not {type(value).__name__}", param=param)
    return value


ToolNames = dict[tuple[str, str], str]  # (namespace, function name) -> the name the upstream gets


def tool_names(tools: Any) -> ToolNames:
    """The upstream names of namespaced functions: their own, unless the same name is offered twice (two namespaces,
    or one and the top level), then ``<namespace>__<name>`` (only characters a function name may hold, at most 64)."""
    tools = [t for t in tools or () if isinstance(t, dict)] if isinstance(tools, list) else []
    spaced = [(tool["name"], t["name"]) for tool in tools if tool.get("type") == "namespace"
              and isinstance(tool.get("name"), str) and isinstance(tool.get("tools"), list)
              for t in tool["tools"] if isinstance(t, dict) and isinstance(t.get("name"), str)]
    plain = [t.get("name") for t in tools if t.get("type") in ("function", "custom")]
    seen = Counter([*plain, *(name for _, name in spaced)])
    return {(space, name): name if seen[name] == 1 else qualified_name(space, name) for space, name in spaced}


def qualified_name(namespace: str, name: str) -> str:
    full = _NOT_NAME.sub("_", f"{namespace}__{name}")
    return full if len(full) <= 64 else full[:55] + "_" + xxhash.xxh3_64_hexdigest(f"{namespace}\0{name}".encode())[:8]


def chat_tools(tools: Any, names: ToolNames | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
    """Function tools, and those of a `namespace` (a group of function tools), as chat tools (a namespaced one under
    its upstream name, ``tool_names``); the host's own tools (web_search, file_search, ...) are left out: the
    upstream engine cannot run them."""
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array", param="tools")
    if names is None and namespace is None:
        names = tool_names(tools)
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind.startswith(_HOSTED_TOOLS):
            continue
        if kind == "namespace" and isinstance(tool.get("tools"), list):
            out.extend(chat_tools(tool["tools"], names, tool.get("name") if isinstance(tool.get("name"), str) else ""))
            continue
        if kind == "custom" and tool.get("name"):  # freeform text in: one string argument
            description = str(tool.get("description") or "")
            out.append({"type": "function", "function": {"name": tool["name"], "description": description,
                                                         "parameters": _CUSTOM_PARAMETERS}})
            continue
        if kind != "function" or not tool.get("name"):
            raise bad_request(f"tools[{i}]: only function tools (and namespaces of them) are supported by this proxy "
                              f"(got {kind!r})", param=f"tools[{i}]", code="unsupported_value")
        function = {"name": (names or {}).get((namespace, tool["name"]), tool["name"]) if namespace else tool["name"]}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, names: ToolNames) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        name, namespace = choice.get("name"), choice.get("namespace")
        if isinstance(namespace, str) and isinstance(name, str):
            name = names.get((namespace, name), name)
        return {"type": "function", "function": {"name": name}}
    return choice


def chat_request(data: dict[str, Any], conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions body of a Responses request; ``conversation``: the messages `previous_response_id`
    names (none without one) and the request's `input` as messages (``input_messages``)."""
    chat = {k: v for k, v in data.items() if k not in _CONSUMED}
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string", param="instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    chat["messages"] = [*system, *conversation]
    if data.get("tools"):
        chat["tools"] = chat_tools(data["tools"])
    if data.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(data["tool_choice"], tool_names(data.get("tools")))
    if isinstance(data.get("max_output_tokens"), int):
        chat["max_tokens"] = data["max_output_tokens"]
    reasoning = data.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        chat["reasoning_effort"] = reasoning["effort"]
    text_format = (data.get("text") or {}).get("format") if isinstance(data.get("text"), dict) else None
    if isinstance(text_format, dict) and text_format.get("type") == "json_schema":
        schema = {k: v for k, v in text_format.items() if k in ("name", "schema", "strict", "description")}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(text_format, dict) and text_format.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    if data.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# --------------------------------------------------------------------------------------------------------- output
def custom_arguments(text: Any) -> str:
    return json.dumps({"input": text if isinstance(text, str) else ""}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """A freeform tool's text from the call's arguments (the arguments as they are if the model wrote no JSON)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value["input"] if isinstance(value, dict) and isinstance(value.get("input"), str) else arguments


@dataclass(frozen=True, slots=True)
class ToolKinds:
    """What a call's output item looks like: the namespace and the name a function came in with (by its upstream
    name), the freeform (custom) tools."""

    namespaces: dict[str, tuple[str, str]]
    custom: frozenset[str]


def tool_kinds(tools: Any) -> ToolKinds:
    names = tool_names(tools)
    tools = [t for t in tools or () if isinstance(t, dict)] if isinstance(tools, list) else []
    custom = frozenset(t["name"] for t in tools if t.get("type") == "custom" and isinstance(t.get("name"), str))
    return ToolKinds({upstream: key for key, upstream in names.items()}, custom)


def output_items(done: Completion, kinds: ToolKinds | None = None) -> list[dict[str, Any]]:
    """The Response's output items of a finished completion: reasoning, the message, the function calls."""
    items: list[dict[str, Any]] = []
    if done.reasoning:
        items.append(reasoning_item(new_id("rs"), done.reasoning))
    if done.content or not done.tool_calls:
        items.append(message_item(new_id("msg"), done.content, "completed"))
    for index in sorted(done.tool_calls):
        call = done.tool_calls[index]
        items.append(function_call_item(new_id("fc"), call.id, call.name, call.arguments, "completed", kinds))
    return items


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str,
                       kinds: ToolKinds | None = None) -> dict[str, Any]:
    """A function call's output item; a freeform tool's is a custom_tool_call with its text as ``input``."""
    if kinds is not None and name in kinds.custom:
        return {"id": "ctc_" + item_id.split("_", 1)[-1], "type": "custom_tool_call", "status": status,
                "call_id": call_id, "name": name, "input": custom_input(arguments) if arguments else ""}
    namespace = None
    if kinds is not None and name in kinds.namespaces:
        namespace, name = kinds.namespaces[name]  # the call comes back in the namespace the model chose
    item = {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}
    if namespace is not None:
        item["namespace"] = namespace
    return item


def assistant_messages(items: list[dict[str, Any]], names: ToolNames | None = None) -> list[dict[str, Any]]:
    """The output items as the messages a client resending them would give: the chain behind the next turn."""
    return input_messages([i for i in items if i.get("type") in ("message", "function_call", "custom_tool_call",
                                                                 "reasoning")], names)


def response_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    prompt, cached, completion = usage_numbers(usage)
    details = usage.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": int(reasoning or 0)},
            "total_tokens": prompt + completion}


def response_object(request: dict[str, Any], response_id: str, created_at: int, status: str, model: str,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                    finish_reason: str | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Response object: the request's settings echoed, as the API does."""
    incomplete = None
    if status == "completed" and finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    text = request.get("text") if isinstance(request.get("text"), dict) else {"format": {"type": "text"}}
    return {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "background": False, "error": error, "incomplete_details": incomplete,
        "instructions": request.get("instructions"), "max_output_tokens": request.get("max_output_tokens"),
        "model": model or request.get("model") or "", "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
        "store": request.get("store", True), "temperature": request.get("temperature"), "text": text,
        "tool_choice": request.get("tool_choice", "auto"), "tools": request.get("tools") or [],
        "top_p": request.get("top_p"), "truncation": request.get("truncation", "disabled"),
        "usage": response_usage(usage), "user": request.get("user"), "metadata": request.get("metadata") or {},
    }


def response_of(request: dict[str, Any], response_id: str, done: Completion) -> dict[str, Any]:
    """A whole (non-streamed) Response of a finished completion."""
    return response_object(request, response_id, done.created or int(time.time()), "completed", done.model,
                           output_items(done, tool_kinds(request.get("tools"))), done.usage, done.finish_reason)
