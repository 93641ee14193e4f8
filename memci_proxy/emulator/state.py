"""Shared state of one emulator process: tokenizer, radix cache, counters, the log of recent requests."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from memci_proxy.emulator.config import EmulatorConfig
from memci_proxy.emulator.radix import RadixCache
from memci_proxy.emulator.template import render_chat_pieces
from memci_proxy.emulator.tokenizer import Tokenizer


@dataclass
class Totals:
    requests: int = 0  # chat and text completions answered (faults excluded)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    errors: int = 0  # error replies, injected ones included
    embeddings: int = 0
    tokenized_texts: int = 0  # texts counted by POST /tokenize


class EmulatorState:
    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.tokenizer: Any = Tokenizer()
        self.render_chat_pieces: Any = render_chat_pieces
        if config.model_dir:
            from memci_proxy.emulator.model_files import load_model_files

            self.tokenizer, template = load_model_files(config.model_dir)
            self.render_chat_pieces = template.render_chat_pieces
        self.cache = RadixCache(config.cache_capacity_tokens)
        self.totals = Totals()
        self.recent: deque[dict[str, Any]] = deque(maxlen=config.request_log_size)
        self.running = 0
        self.started_at = time.time()

    def reset(self) -> None:
        self.cache.reset()
        self.totals = Totals()
        self.recent.clear()

    def account(self, prompt_tokens: int, cached_tokens: int, generation_tokens: int) -> None:
        totals = self.totals
        totals.requests += 1
        totals.prompt_tokens += prompt_tokens
        totals.cached_tokens += cached_tokens
        totals.generation_tokens += generation_tokens

    def log_request(self, body: Any, prompt_tokens: int | None, cached_tokens: int | None, **extra: Any) -> None:
        self.recent.append(
            {"received_at": time.time(), "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens, **extra, "body": body}
        )

    def last_requests(self, count: int) -> list[dict[str, Any]]:
        if count <= 0:
            return []
        items = list(self.recent)
        return items[-count:]

    @property
    def cache_hit_rate(self) -> float:
        prompt = self.totals.prompt_tokens
        return self.totals.cached_tokens / prompt if prompt else 0.0

    def stats(self) -> dict[str, Any]:
        totals = self.totals
        return {
            "model": self.config.model,
            "requests": totals.requests,
            "errors": totals.errors,
            "embeddings": totals.embeddings,
            "tokenized_texts": totals.tokenized_texts,
            "prompt_tokens": totals.prompt_tokens,
            "cached_tokens": totals.cached_tokens,
            "generation_tokens": totals.generation_tokens,
            "cache_hit_rate": self.cache_hit_rate,
            "cache_tokens": self.cache.total_tokens,
            "cache_capacity_tokens": self.cache.capacity_tokens,
            "cache_nodes": self.cache.node_count,
            "evicted_tokens": self.cache.evicted_tokens,
            "running": self.running,
            "vocabulary_size": self.tokenizer.vocabulary_size,
            "uptime_s": time.time() - self.started_at,
            "config": asdict(self.config),
        }

    def prometheus_text(self) -> str:
        totals = self.totals
        labels = '{model_name="' + self.config.model.replace('"', '\\"') + '"}'
        rows = [
            ("sglang:prompt_tokens_total", "counter", "Prompt tokens processed.", totals.prompt_tokens),
            ("sglang:cached_tokens_total", "counter", "Prompt tokens found in the prefix cache.", totals.cached_tokens),
            ("sglang:generation_tokens_total", "counter", "Generated tokens.", totals.generation_tokens),
            ("sglang:num_requests_total", "counter", "Requests answered.", totals.requests),
            ("sglang:cache_hit_rate", "gauge", "Cached prompt tokens over prompt tokens.", self.cache_hit_rate),
            ("sglang:num_running_reqs", "gauge", "Requests in flight.", self.running),
            ("sglang:token_usage", "gauge", "Fraction of the cache capacity in use.",
             self.cache.total_tokens / self.cache.capacity_tokens if self.cache.capacity_tokens else 0.0),
        ]
        lines: list[str] = []
        for name, kind, help_text, value in rows:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.append(f"{name}{labels} {float(value)!r}" if kind == "gauge" else f"{name}{labels} {value}")
        return "\n".join(lines) + "\n"
