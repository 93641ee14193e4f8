"""The benchmarks' client through each API the proxy serves: a chat-completions request (the benchmarks' own
conversation) sent as chat completions, as a Responses request (the whole input resent, or only the new items after
`previous_response_id`), or as an Anthropic Messages request; the answer read back as a chat message.

Written as those APIs' own clients write them (Codex, the Agents SDK, Claude Code), independent of the proxy's codecs.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

APIS = ("chat", "responses", "responses-chained", "messages")
RESPONSES_STORE = None  # api_overhead --no-store: store false on stateless Responses requests


def _responses_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    return [{"type": "input_text", "text": p["text"]} if p.get("type") == "text"
            else {"type": "input_image", "image_url": p["image_url"]["url"]} for p in content]


def responses_items(messages: list[dict]) -> list[dict]:
    items: list[dict] = []
    for m in messages:
        if m["role"] == "user":
            items.append({"role": "user", "content": _responses_content(m["content"])})
        elif m["role"] == "assistant":
            if m.get("content"):
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": m["content"]}]})
            for call in m.get("tool_calls") or ():
                items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                              "arguments": call["function"]["arguments"]})
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
    return items


def _responses_tools(tools: list[dict]) -> list[dict]:
    return [{"type": "function", **t["function"]} for t in tools]


def _chat_of_response(data: dict) -> dict:
    text = "".join(part.get("text", "") for item in data["output"] if item["type"] == "message"
                   for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in data["output"] if item["type"] == "function_call"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    usage = data.get("usage") or {}
    return {"choices": [{"message": message}], "usage": {
        "prompt_tokens": usage.get("input_tokens", 0), "completion_tokens": usage.get("output_tokens", 0),
        "prompt_tokens_details": {"cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)}}}


def anthropic_messages(messages: list[dict]) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        if m["role"] == "system":
            continue
        if m["role"] == "assistant":
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            blocks += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                        "input": json.loads(c["function"]["arguments"] or "{}")} for c in m.get("tool_calls") or ()]
            role = "assistant"
        elif m["role"] == "tool":
            blocks, role = [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}], "user"
        else:
            content = m["content"]
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else [
                {"type": "text", "text": p["text"]} if p.get("type") == "text" else _anthropic_image(p)
                for p in content]
            role = "user"
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return out


def _anthropic_image(part: dict) -> dict:
    url = part["image_url"]["url"]
    if url.startswith("data:"):
        media, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _chat_of_message(data: dict) -> dict:
    text = "".join(b["text"] for b in data["content"] if b["type"] == "text")
    calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
             for b in data["content"] if b["type"] == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    usage = data.get("usage") or {}
    cached = usage.get("cache_read_input_tokens") or 0
    return {"choices": [{"message": message}], "usage": {
        "prompt_tokens": (usage.get("input_tokens") or 0) + cached, "completion_tokens": usage.get("output_tokens", 0),
        "prompt_tokens_details": {"cached_tokens": cached}}}


class ApiClient:
    """Sends the benchmarks' chat bodies through one API; ``post`` gives back (status, chat-shaped JSON, headers)."""

    def __init__(self, api: str, client: httpx.Client, store: bool | None = None) -> None:
        """``store``: the Responses requests' ``store`` field (None: RESPONSES_STORE; not sent when both are None)."""
        if api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}")
        self.api, self.client = api, client
        self.store = store
        self.previous: str | None = None  # responses-chained: the last answer's id
        self.sent = 0  # responses-chained: messages of the conversation the chain already holds

    def post(self, url: str, body: dict) -> tuple[int, dict, httpx.Headers]:
        if self.api == "chat":
            r = self.client.post(url + "/chat/completions", json=body)
            return r.status_code, r.json(), r.headers
        messages = body["messages"]
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        if self.api == "messages":
            request = {"model": body["model"], "max_tokens": body["max_tokens"], "system": system,
                       "messages": anthropic_messages(messages)}
            if body.get("tools"):
                request["tools"] = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                                     "input_schema": t["function"]["parameters"]} for t in body["tools"]]
            r = self.client.post(url + "/messages", json=request)
            return r.status_code, _chat_of_message(r.json()) if r.status_code == 200 else r.json(), r.headers
        rest = [m for m in messages if m["role"] != "system"]
        new = rest[self.sent:] if self.api == "responses-chained" else rest
        request = {"model": body["model"], "instructions": system, "input": responses_items(new),
                   "max_output_tokens": body["max_tokens"]}
        store = self.store if self.store is not None else RESPONSES_STORE
        if self.api == "responses" and store is not None:
            request["store"] = store
        if self.api == "responses-chained" and self.previous:
            request["previous_response_id"] = self.previous
        if body.get("tools"):
            request["tools"] = _responses_tools(body["tools"])
        r = self.client.post(url + "/responses", json=request)
        if r.status_code != 200:
            return r.status_code, r.json(), r.headers
        data = r.json()
        self.previous, self.sent = data["id"], len(rest) + 1  # the answer is in the chain too
        return 200, _chat_of_response(data), r.headers
