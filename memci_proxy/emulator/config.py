"""Configuration of the upstream emulator."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EmulatorConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    model: str = "memci-emulator"
    max_model_len: int = 32768
    # As vLLM and SGLang: prompt + max_tokens over max_model_len is a 400. Off (--lenient-context): only a prompt
    # that fills the window is refused, and max_tokens is cut to the window's rest (as llama.cpp's server does).
    strict_context: bool = True
    # Message shapes refused as some servers do: "null_content" (an assistant message with content null: 500, as
    # llama-cpp-python's server), "tool_messages" (any tool call or tool message: 400, a server without tools).
    refuse: tuple[str, ...] = ()
    # A Hugging Face model's directory (tokenizer.json, chat template): prompts rendered and counted as that model's
    # server does (memci_proxy.emulator.model_files); None: the built-in ChatML template and word tokenizer.
    model_dir: str | None = None
    # Radix cache capacity in tokens; least recently used leaves are evicted above it.
    cache_capacity_tokens: int = 2_000_000
    embedding_dim: int = 64
    # Latency model, all zero by default (no sleeping at all then).
    per_uncached_token_s: float = 0.0  # time to first token, per prompt token not in the cache
    per_cached_token_s: float = 0.0  # time to first token, per prompt token found in the cache
    per_output_token_s: float = 0.0  # time between output tokens
    default_answer_tokens: int = 60
    # Output tokens per streamed content chunk.
    stream_chunk_tokens: int = 4
    # Size of the ring buffer behind GET /emulator/requests.
    request_log_size: int = 200
