"""ChatML rendering of chat messages, the way Qwen2.5's chat template does it.

Messages are plain decoded JSON (dicts), as the OpenAI API sends them.
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
IMAGE_PAD_TOKENS = 64
IMAGE_PLACEHOLDER = "<|vision_start|>" + "<|image_pad|>" * IMAGE_PAD_TOKENS + "<|vision_end|>"
GENERATION_PROMPT = "<|im_start|>assistant\n"

_TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)


class TemplateError(ValueError):
    """The messages cannot be rendered (wrong shapes)."""


def to_json(value: Any) -> str:
    """JSON as the template's ``tojson`` filter writes it."""
    return json.dumps(value, ensure_ascii=False)


def content_text(content: Any) -> str:
    """The text of a message content: a string, None, or a list of parts (text and image parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces: list[str] = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
                continue
            if not isinstance(part, dict):
                raise TemplateError("content parts must be objects")
            kind = part.get("type")
            if kind == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise TemplateError("a text part needs a string 'text'")
                pieces.append(text)
            elif kind in ("image_url", "image", "input_image"):
                pieces.append(IMAGE_PLACEHOLDER)
            else:
                raise TemplateError(f"unsupported content part type: {kind!r}")
        return "".join(pieces)
    raise TemplateError("content must be a string, a list of parts or null")


def _arguments_value(arguments: Any) -> Any:
    """Arguments as the template sees them: the OpenAI JSON string is parsed into an object first."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def render_tool_call(call: Any) -> str:
    if not isinstance(call, dict):
        raise TemplateError("tool_calls entries must be objects")
    function = call.get("function", call)
    if not isinstance(function, dict):
        raise TemplateError("tool_calls[].function must be an object")
    name = function.get("name", "")
    arguments = _arguments_value(function.get("arguments", {}))
    return '<tool_call>\n{"name": "' + str(name) + '", "arguments": ' + to_json(arguments) + "}\n</tool_call>"


def render_assistant_turn(content: Any, tool_calls: Any) -> str:
    """One assistant turn, from ``<|im_start|>assistant`` to ``<|im_end|>\\n``."""
    if not tool_calls:
        return "<|im_start|>assistant\n" + content_text(content) + "<|im_end|>\n"
    if not isinstance(tool_calls, list):
        raise TemplateError("tool_calls must be a list")
    pieces = ["<|im_start|>assistant"]
    text = content_text(content)
    if text:
        pieces.append("\n" + text)
    for call in tool_calls:
        pieces.append("\n" + render_tool_call(call))
    pieces.append("<|im_end|>\n")
    return "".join(pieces)


def render_output(content: str | None, tool_calls: list[dict[str, Any]] | None, finished: bool) -> str:
    """What the model generated after the generation prompt, as text.

    It is the assistant turn the template will render in the next request, minus the generation prompt
    and the final newline, so that prompt + output is a prefix of the next request's prompt. An answer cut
    by the token limit (``finished`` false) has no ``<|im_end|>``.
    """
    turn = render_assistant_turn(content, tool_calls)  # always starts with the generation prompt
    body = turn[len(GENERATION_PROMPT) : -1]  # the newline after <|im_end|> comes with the next turn's rendering
    if not finished:
        body = body[: -len("<|im_end|>")]
    return body


def _system_header(messages: list[dict[str, Any]], tools: list[Any] | None) -> str:
    first = messages[0] if messages else None
    has_system = first is not None and first.get("role") in ("system", "developer")
    system_text = content_text(first.get("content")) if has_system and first is not None else DEFAULT_SYSTEM_PROMPT
    if tools:
        body = "".join("\n" + to_json(tool) for tool in tools)
        return "<|im_start|>system\n" + system_text + _TOOLS_HEADER + body + _TOOLS_FOOTER
    return "<|im_start|>system\n" + system_text + "<|im_end|>\n"


def check_shapes(messages: Any, tools: Any) -> None:
    """TemplateError unless messages are a list of objects with a string role and tools a list (or None)."""
    if not isinstance(messages, list):
        raise TemplateError("messages must be a list")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise TemplateError("each message must be an object with a string 'role'")
    if tools is not None and not isinstance(tools, list):
        raise TemplateError("tools must be a list")


def render_chat_pieces(messages: list[Any], tools: list[Any] | None = None, add_generation_prompt: bool = True) -> list[str]:
    """The prompt of a chat request as pieces (one per turn) whose concatenation is the prompt text.

    Every piece boundary sits next to a special token or a newline, so tokenizing the pieces one by one
    gives the same tokens as tokenizing the whole prompt (which lets a tokenizer memoise pieces).
    """
    check_shapes(messages, tools)
    pieces = [_system_header(messages, tools)]
    last = len(messages) - 1
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "developer":
            role = "system"
        if role == "system" and index == 0:
            continue
        if role in ("user", "system"):
            pieces.append("<|im_start|>" + role + "\n" + content_text(message.get("content")) + "<|im_end|>\n")
        elif role == "assistant":
            pieces.append(render_assistant_turn(message.get("content"), message.get("tool_calls")))
        elif role in ("tool", "function"):
            if index == 0 or messages[index - 1].get("role") not in ("tool", "function"):
                pieces.append("<|im_start|>user")
            piece = "\n<tool_response>\n" + content_text(message.get("content")) + "\n</tool_response>"
            if index == last or messages[index + 1].get("role") not in ("tool", "function"):
                piece += "<|im_end|>\n"
            pieces.append(piece)
        else:
            raise TemplateError(f"unsupported message role: {role!r}")
    if add_generation_prompt:
        pieces.append(GENERATION_PROMPT)
    return pieces


def render_chat(messages: list[Any], tools: list[Any] | None = None, add_generation_prompt: bool = True) -> str:
    """The prompt text of a chat request, ending with the generation prompt."""
    return "".join(render_chat_pieces(messages, tools, add_generation_prompt))
