"""Legacy text completions (POST /v1/completions): a prompt string, no chat template."""

from __future__ import annotations

import time
from typing import Any

from memci_proxy.emulator.answers import generated_tokens, stable_hash
from memci_proxy.emulator.chat import SYSTEM_FINGERPRINT, check_context, next_request_id
from memci_proxy.emulator.errors import ErrorReply, bad_request
from memci_proxy.emulator.markers import Script, parse_markers
from memci_proxy.emulator.responses import DONE_EVENT, sse
from memci_proxy.emulator.state import EmulatorState


class CompletionPlan:
    def __init__(self, request_id: str, model: str, script: Script) -> None:
        self.request_id = request_id
        self.created = int(time.time())
        self.model = model
        self.script = script
        self.tokens: list[str] = []
        self.finish_reason = "stop"
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.stream = False
        self.include_usage = False
        self.time_to_first_token_s = 0.0
        self.per_output_token_s = 0.0

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def plan_completion(state: EmulatorState, body: Any) -> CompletionPlan:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_request("'prompt' must be a string", param="prompt")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise bad_request("'max_tokens' must be an integer >= 1", param="max_tokens")
    config = state.config
    script = parse_markers(prompt)
    model = body.get("model") if isinstance(body.get("model"), str) and body.get("model") else config.model
    plan = CompletionPlan(next_request_id("cmpl-"), model, script)
    prompt_ids = state.tokenizer.encode(prompt)
    plan.prompt_tokens = len(prompt_ids)
    check_context(config, plan.prompt_tokens, max_tokens)
    if max_tokens is not None and not config.strict_context:
        max_tokens = min(max_tokens, config.max_model_len - plan.prompt_tokens)
    if script.status is not None:
        raise ErrorReply(script.status, f"Injected fault: HTTP {script.status}", code="injected_fault")
    plan.cached_tokens = max(0, min(state.cache.match_prefix(prompt_ids), plan.prompt_tokens - 1))
    limit = max_tokens if max_tokens is not None else config.max_model_len - plan.prompt_tokens
    if script.say is not None:
        tokens = state.tokenizer.split(script.say)
    else:
        length = script.length if script.length is not None else config.default_answer_tokens
        tokens = list(generated_tokens(stable_hash(prompt), length))
    if len(tokens) + 1 > limit:
        tokens = tokens[:limit]
        plan.finish_reason = "length"
    plan.tokens = tokens
    output_ids = state.tokenizer.ids_of(tokens)
    plan.completion_tokens = len(output_ids) + (1 if plan.finish_reason == "stop" else 0)
    state.cache.insert(prompt_ids + output_ids)
    plan.stream = bool(body.get("stream"))
    options = body.get("stream_options")
    plan.include_usage = plan.stream and isinstance(options, dict) and bool(options.get("include_usage"))
    plan.time_to_first_token_s = (plan.prompt_tokens - plan.cached_tokens) * config.per_uncached_token_s + (
        plan.cached_tokens * config.per_cached_token_s
    )
    plan.per_output_token_s = config.per_output_token_s
    state.account(plan.prompt_tokens, plan.cached_tokens, plan.completion_tokens)
    return plan


def _head(plan: CompletionPlan) -> dict[str, Any]:
    return {
        "id": plan.request_id,
        "object": "text_completion",
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def completion_body(plan: CompletionPlan) -> dict[str, Any]:
    body = _head(plan)
    body["choices"] = [{"index": 0, "text": "".join(plan.tokens), "logprobs": None, "finish_reason": plan.finish_reason}]
    body["usage"] = plan.usage()
    return body


def completion_stream_events(plan: CompletionPlan, chunk_tokens: int) -> list[tuple[bytes, int]]:
    events: list[tuple[bytes, int]] = []
    step = max(1, chunk_tokens)
    for start in range(0, len(plan.tokens), step):
        piece = plan.tokens[start : start + step]
        chunk = _head(plan)
        chunk["choices"] = [{"index": 0, "text": "".join(piece), "logprobs": None, "finish_reason": None}]
        events.append((sse(chunk), len(piece)))
    final = _head(plan)
    final["choices"] = [{"index": 0, "text": "", "logprobs": None, "finish_reason": plan.finish_reason}]
    events.append((sse(final), 1))
    if plan.include_usage:
        usage_chunk = _head(plan)
        usage_chunk["choices"] = []
        usage_chunk["usage"] = plan.usage()
        events.append((sse(usage_chunk), 0))
    events.append((DONE_EVENT, 0))
    return events
