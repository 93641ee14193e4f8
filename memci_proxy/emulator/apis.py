"""The Responses API and Anthropic's Messages API, as an engine serving them natively (SGLang, vLLM) would: each
request becomes the chat the emulator renders and caches, each answer is planned like a chat completion, then
written in that API's shape (usage with its cached-token counts). No code is shared with the proxy's codecs: the
emulator is the independent end of what they are measured against.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from memci_proxy.emulator.jsontext import encode as _encode

from memci_proxy.emulator.chat import ChatPlan, ChoicePlan
from memci_proxy.emulator.errors import bad_request
from memci_proxy.emulator.tokenizer import Tokenizer

_STORED_RESPONSES = 2000


def _named(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _encode({"type": kind, **payload}) + b"\n\n"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


# ----------------------------------------------------------------------------------------------------- Responses
class ResponsesBook:
    """Stored responses' conversations (``previous_response_id``), newest kept."""

    def __init__(self) -> None:
        self.chains: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def history(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        previous = body.get("previous_response_id")
        if not previous:
            return []
        if previous not in self.chains:
            raise bad_request(f"Previous response with id '{previous}' not found.", "previous_response_id")
        return list(self.chains[previous])

    def keep(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        self.chains[response_id] = messages
        while len(self.chains) > _STORED_RESPONSES:
            self.chains.popitem(last=False)


def responses_chat(body: dict[str, Any], history: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict]]:
    """(the chat body to plan, the conversation without instructions: what a stored response keeps)."""
    raw = body.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    if not isinstance(items, list):
        raise bad_request("'input' must be a string or an array", "input")
    messages = list(history)
    for item in items:
        kind = item.get("type") or "message"
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                parts = []
                for part in content:
                    if part.get("type") == "input_image":
                        parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
                    else:
                        parts.append({"type": "text", "text": str(part.get("text") or part.get("refusal") or "")})
                content = _text(parts) if item.get("role") == "assistant" else parts
            messages.append({"role": item.get("role"), "content": content})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(item.get("output"))})
        elif kind != "reasoning":
            raise bad_request(f"input items of type {kind!r} are not supported", "input")
    system = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    chat: dict[str, Any] = {"model": body.get("model") or "", "messages": system + messages}
    if body.get("tools"):
        chat["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                             if k in t}} for t in body["tools"]]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("stream") is True:
        chat["stream"] = True
    return chat, messages


def _responses_usage(plan: ChatPlan) -> dict[str, Any]:
    completion = plan.completion_tokens
    return {"input_tokens": plan.prompt_tokens, "input_tokens_details": {"cached_tokens": plan.cached_tokens},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": plan.prompt_tokens + completion}


def _output(choice: ChoicePlan, ids: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if choice.content or not choice.tool_calls:
        items.append({"id": f"msg_{ids}", "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": choice.content or "", "annotations": []}]})
    for n, call in enumerate(choice.tool_calls):
        items.append({"id": f"fc_{ids}_{n}", "type": "function_call", "status": "completed", "call_id": call.id,
                      "name": call.name, "arguments": call.arguments})
    return items


def response_body(plan: ChatPlan, status: str = "completed", output: list | None = None) -> dict[str, Any]:
    choice = plan.choices[0]
    return {"id": "resp_" + plan.request_id, "object": "response", "created_at": plan.created, "status": status,
            "model": plan.model, "output": _output(choice, plan.request_id) if output is None else output,
            "usage": _responses_usage(plan) if status == "completed" else None, "error": None,
            "incomplete_details": None, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


def response_messages(plan: ChatPlan) -> list[dict[str, Any]]:
    """The answer as chat messages (what the next turn's history holds)."""
    choice = plan.choices[0]
    message: dict[str, Any] = {"role": "assistant", "content": choice.content}
    if choice.tool_calls:
        message["tool_calls"] = [c.as_openai() for c in choice.tool_calls]
    return [message]


def response_stream(plan: ChatPlan, tokenizer: Tokenizer, chunk: int) -> list[tuple[bytes, int]]:
    seq = iter(range(1_000_000))
    events: list[tuple[bytes, int]] = []

    def add(kind: str, tokens: int = 0, **payload: Any) -> None:
        events.append((_named(kind, {"sequence_number": next(seq), **payload}), tokens))

    add("response.created", response=response_body(plan, "in_progress", []))
    add("response.in_progress", response=response_body(plan, "in_progress", []))
    for index, item in enumerate(_output(plan.choices[0], plan.request_id)):
        if item["type"] == "message":
            add("response.output_item.added", output_index=index, item={**item, "status": "in_progress",
                                                                         "content": []})
            add("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                part={"type": "output_text", "text": "", "annotations": []})
            tokens = plan.choices[0].content_tokens
            for start in range(0, len(tokens), chunk):
                add("response.output_text.delta", len(tokens[start:start + chunk]), item_id=item["id"],
                    output_index=index, content_index=0, delta="".join(tokens[start:start + chunk]))
            text = item["content"][0]["text"]
            add("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text)
            add("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                part=item["content"][0])
        else:
            add("response.output_item.added", 1, output_index=index, item={**item, "arguments": "",
                                                                            "status": "in_progress"})
            pieces = tokenizer.split(item["arguments"])
            for start in range(0, len(pieces), chunk):
                add("response.function_call_arguments.delta", len(pieces[start:start + chunk]), item_id=item["id"],
                    output_index=index, delta="".join(pieces[start:start + chunk]))
            add("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                arguments=item["arguments"])
        add("response.output_item.done", output_index=index, item=item)
    add("response.completed", response=response_body(plan))
    return events


# ------------------------------------------------------------------------------------------------------ Messages
def messages_chat(body: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(body.get("max_tokens"), int) and not body.get("_count_only"):
        raise bad_request("max_tokens: Field required", "max_tokens")
    system = body.get("system")
    system_text = "\n\n".join(b.get("text", "") for b in system) if isinstance(system, list) else system
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_text}] if system_text else []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            messages.append({"role": message.get("role"), "content": content})
            continue
        texts, parts, calls = [], [], []
        for block in content or []:
            kind = block.get("type")
            if kind == "text":
                texts.append(block.get("text") or "")
                parts.append({"type": "text", "text": block.get("text") or ""})
            elif kind == "image":
                source = block.get("source") or {}
                url = source.get("url") or f"data:{source.get('media_type')};base64,{source.get('data')}"
                parts.append({"type": "image_url", "image_url": {"url": url}})
            elif kind == "tool_use":
                calls.append({"id": block.get("id"), "type": "function", "function": {
                    "name": block.get("name"), "arguments": json.dumps(block.get("input") or {})}})
            elif kind == "tool_result":
                messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                 "content": _text(block.get("content"))})
        if message.get("role") == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                out["tool_calls"] = calls
            messages.append(out)
        elif parts:
            messages.append({"role": "user", "content": parts})
    chat: dict[str, Any] = {"model": body.get("model") or "", "messages": messages}
    if body.get("tools"):
        chat["tools"] = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                                           "parameters": t.get("input_schema") or {}}}
                         for t in body["tools"]]
    if isinstance(body.get("max_tokens"), int):
        chat["max_tokens"] = body["max_tokens"]
    if body.get("stream") is True:
        chat["stream"] = True
    return chat


def _anthropic_usage(plan: ChatPlan) -> dict[str, Any]:
    return {"input_tokens": plan.prompt_tokens - plan.cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": plan.cached_tokens, "output_tokens": plan.completion_tokens}


def _blocks(choice: ChoicePlan) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if choice.content or not choice.tool_calls:
        blocks.append({"type": "text", "text": choice.content or ""})
    for call in choice.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments or "{}")})
    return blocks


def _stop(choice: ChoicePlan) -> str:
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(choice.finish_reason, "end_turn")


def message_body(plan: ChatPlan) -> dict[str, Any]:
    choice = plan.choices[0]
    return {"id": "msg_" + plan.request_id, "type": "message", "role": "assistant", "model": plan.model,
            "content": _blocks(choice), "stop_reason": _stop(choice), "stop_sequence": None,
            "usage": _anthropic_usage(plan)}


def message_stream(plan: ChatPlan, tokenizer: Tokenizer, chunk: int) -> list[tuple[bytes, int]]:
    choice = plan.choices[0]
    start = {**message_body(plan), "content": [], "stop_reason": None,
             "usage": {**_anthropic_usage(plan), "output_tokens": 0}}
    events = [(_named("message_start", {"message": start}), 0)]
    for index, block in enumerate(_blocks(choice)):
        if block["type"] == "text":
            events.append((_named("content_block_start", {"index": index, "content_block": {"type": "text",
                                                                                          "text": ""}}), 0))
            tokens = choice.content_tokens
            for at in range(0, len(tokens), chunk):
                piece = tokens[at:at + chunk]
                events.append((_named("content_block_delta", {"index": index, "delta": {
                    "type": "text_delta", "text": "".join(piece)}}), len(piece)))
        else:
            events.append((_named("content_block_start", {"index": index, "content_block": {**block, "input": {}}}), 1))
            pieces = tokenizer.split(json.dumps(block["input"]))
            for at in range(0, len(pieces), chunk):
                piece = pieces[at:at + chunk]
                events.append((_named("content_block_delta", {"index": index, "delta": {
                    "type": "input_json_delta", "partial_json": "".join(piece)}}), len(piece)))
        events.append((_named("content_block_stop", {"index": index}), 0))
    events.append((_named("message_delta", {"delta": {"stop_reason": _stop(choice), "stop_sequence": None},
                                            "usage": _anthropic_usage(plan)}), 1))
    events.append((_named("message_stop", {}), 0))
    return events


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            429: "rate_limit_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


