"""Chat completions: from a decoded request body to a plan of the answer (no I/O here)."""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any

from memci_proxy.emulator.answers import (
    ToolCall,
    generated_tokens,
    make_tool_calls,
    select_calls,
    stable_hash,
    tool_result_text,
)
from memci_proxy.emulator.config import EmulatorConfig
from memci_proxy.emulator.errors import ErrorReply, bad_request
from memci_proxy.emulator.markers import Script, parse_markers, plain_text
from memci_proxy.emulator.state import EmulatorState
from memci_proxy.emulator.template import TemplateError, render_output

SYSTEM_FINGERPRINT = "fp_memci_emulator"
_ID_PREFIX = os.urandom(6).hex()
_id_counter = itertools.count(1)


def next_request_id(prefix: str) -> str:
    """Unique per process run: a random prefix and a counter (cheaper than uuid4 per request)."""
    return f"{prefix}{_ID_PREFIX}{next(_id_counter):012x}"


@dataclass
class ChoicePlan:
    index: int
    content: str | None
    content_tokens: list[str]  # token strings of `content`, for streaming in chunks
    tool_calls: list[ToolCall]
    finish_reason: str
    completion_tokens: int


@dataclass
class ChatPlan:
    request_id: str
    created: int
    model: str
    stream: bool
    include_usage: bool
    script: Script
    prompt_tokens: int = 0
    cached_tokens: int = 0
    choices: list[ChoicePlan] = field(default_factory=list)
    time_to_first_token_s: float = 0.0
    per_output_token_s: float = 0.0

    @property
    def completion_tokens(self) -> int:
        return sum(choice.completion_tokens for choice in self.choices)

    def usage(self) -> dict[str, Any]:
        completion = self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def _optional_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise bad_request(f"'{name}' must be an integer >= {minimum}", param=name)
    return value


def script_source(messages: list[dict[str, Any]]) -> tuple[str, bool]:
    """The text markers are read from, and whether it is made of tool results.

    Trailing tool messages (results of the previous tool calls) are the source when the conversation
    ends with them (system messages after them are skipped); otherwise the last user message is.
    """
    end = len(messages)
    while end > 0 and messages[end - 1].get("role") in ("system", "developer"):
        end -= 1
    tool_texts: list[str] = []
    for message in reversed(messages[:end]):
        if message.get("role") in ("tool", "function"):
            tool_texts.append(plain_text(message.get("content")))
        else:
            break
    if tool_texts:
        return "\n".join(reversed(tool_texts)), True
    for message in reversed(messages):
        if message.get("role") == "user":
            return plain_text(message.get("content")), False
    return "", False


def validate_chat_body(body: Any) -> None:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty array", param="messages")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request("each message must be an object with a string 'role'", param="messages")


def refuse_shapes(messages: list[dict[str, Any]], refuse: tuple[str, ...]) -> None:
    """The message shapes the emulator was told to refuse (``--refuse``), worded as the servers that do."""
    for i, message in enumerate(messages):
        if "null_content" in refuse and message.get("role") == "assistant" and message.get("content") is None:
            raise ErrorReply(500, f"1 validation error:\n  {{'type': 'string_type', 'loc': ('body', 'messages', {i}, "
                                  "'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a "
                                  "valid string', 'input': None}")
        if "tool_messages" in refuse and (message.get("role") == "tool" or message.get("tool_calls")):
            raise bad_request(f"messages[{i}]: tool calls and tool messages are not supported", param="messages")


def check_context(config: EmulatorConfig, prompt_tokens: int, max_tokens: int | None) -> None:
    """vLLM's and SGLang's checks, in their words: max_tokens alone over the window, the prompt filling it, or (strict)
    prompt + max_tokens over it."""
    window = config.max_model_len
    if max_tokens is not None and max_tokens > window and config.strict_context:
        raise bad_request(f"max_completion_tokens is too large: {max_tokens}.This model supports at most {window} "
                          "completion tokens.", param="max_completion_tokens")
    requested = prompt_tokens + ((max_tokens or 0) if config.strict_context else 0)
    if prompt_tokens >= window or requested > window:
        raise bad_request(
            f"Requested token count exceeds the model's maximum context length of {window} tokens. "
            f"You requested a total of {prompt_tokens + (max_tokens or 0)} tokens: {prompt_tokens} tokens from the "
            f"input messages and {max_tokens or 0} tokens for the completion. Please reduce the number of tokens in "
            "the input messages or the completion to fit within the limit.",
            param="messages",
            code="context_length_exceeded",
        )


def plan_chat(state: EmulatorState, body: Any) -> ChatPlan:
    """Validate, render, account the cache and decide the answer. Raises ErrorReply for 4xx/5xx replies."""
    validate_chat_body(body)
    config = state.config
    messages: list[dict[str, Any]] = body["messages"]
    refuse_shapes(messages, config.refuse)
    n = _optional_int(body, "n", 1) or 1
    if n > 128:
        raise bad_request("'n' must be at most 128", param="n")
    max_tokens = _optional_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _optional_int(body, "max_tokens", 1)
    stream = bool(body.get("stream"))
    stream_options = body.get("stream_options")
    include_usage = stream and isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
    model = body.get("model") if isinstance(body.get("model"), str) and body.get("model") else config.model

    source_text, from_tools = script_source(messages)
    script = parse_markers(source_text)
    plan = ChatPlan(
        request_id=next_request_id("chatcmpl-"),
        created=int(time.time()),
        model=model,
        stream=stream,
        include_usage=include_usage,
        script=script,
    )
    try:
        prompt_pieces = state.render_chat_pieces(messages, body.get("tools") or None)
    except TemplateError as error:
        raise bad_request(str(error), param="messages") from None
    tokenizer = state.tokenizer
    prompt_ids = tokenizer.encode_pieces(prompt_pieces)
    prompt_tokens = len(prompt_ids)
    plan.prompt_tokens = prompt_tokens
    check_context(config, prompt_tokens, max_tokens)
    if max_tokens is not None and not config.strict_context:
        max_tokens = min(max_tokens, config.max_model_len - prompt_tokens)
    if script.status is not None:
        state.log_request(body, prompt_tokens, None, injected_status=script.status)
        raise ErrorReply(script.status, f"Injected fault: HTTP {script.status}", code="injected_fault")

    cached = max(0, min(state.cache.match_prefix(prompt_ids), prompt_tokens - 1))
    plan.cached_tokens = cached
    token_limit = max_tokens if max_tokens is not None else config.max_model_len - prompt_tokens

    calls = select_calls(script, body.get("tools"), body.get("tool_choice")) if (script.calls or not from_tools) else []
    seed_base = stable_hash(source_text)
    for index in range(n):
        choice = _plan_choice(state, index, script, calls, from_tools, source_text, seed_base, token_limit)
        plan.choices.append(choice)
        if choice.tool_calls:
            output_text = render_output(None, [call.as_openai() for call in choice.tool_calls], True)
            output_ids = tokenizer.encode(output_text)
        else:  # a text answer renders as itself followed by <|im_end|> (see template.render_output)
            output_ids = tokenizer.ids_of(choice.content_tokens)
            if choice.finish_reason != "length":
                output_ids.append(tokenizer.end_of_turn_id)
        choice.completion_tokens = len(output_ids)
        state.cache.insert(prompt_ids + output_ids)

    plan.time_to_first_token_s = (prompt_tokens - cached) * config.per_uncached_token_s + cached * config.per_cached_token_s
    plan.per_output_token_s = config.per_output_token_s
    state.account(prompt_tokens, cached, plan.completion_tokens)
    state.log_request(body, prompt_tokens, cached, completion_tokens=plan.completion_tokens, request_id=plan.request_id)
    return plan


def _plan_choice(
    state: EmulatorState,
    index: int,
    script: Script,
    calls: list[Any],
    from_tools: bool,
    source_text: str,
    seed_base: int,
    token_limit: int,
) -> ChoicePlan:
    if calls:
        tool_calls = make_tool_calls(calls, seed_base, index)
        return ChoicePlan(index, None, [], tool_calls, "tool_calls", 0)
    if script.say is not None:
        tokens: list[str] | tuple[str, ...] = state.tokenizer.split(script.say)
    elif from_tools:
        tokens = state.tokenizer.split(tool_result_text(source_text))
    else:
        length = script.length if script.length is not None else state.config.default_answer_tokens
        seed = seed_base if index == 0 else stable_hash(f"{index}:{source_text}")
        tokens = generated_tokens(seed, length)
    if len(tokens) + 1 <= token_limit:
        finish_reason = "stop"
    else:
        tokens = tokens[:token_limit]
        finish_reason = "length"
    token_list = list(tokens)
    return ChoicePlan(index, "".join(token_list), token_list, [], finish_reason, 0)
